//! TplEventSource (`System.Threading.Tasks.TplEventSource`) `SetActivityId`, event id 25: written
//! by `EventSource.SetCurrentThreadActivityId` on the thread whose EventSource activity id is
//! about to change, when the `DebugActivityId` keyword (0x40000) is on. With `TasksFlowActivityIds`
//! (0x80) the runtime's `ActivityTracker` keeps that id equal to the innermost live Start/Stop
//! activity of the async flow running on the thread, and sets it on every execution-context switch
//! (`ActivityTracker.ActivityChanging`), so these events say which activity a thread runs from
//! when on. The header's activity id is the one being replaced; the payload is `Guid NewId`.

use super::PayloadReader;
use crate::error::NettraceError;
use profile::guid::Guid;

/// TplEventSource's event id of `SetActivityId` (fixed in `TplEventSource.cs` since .NET 4.6).
pub(crate) const SET_ACTIVITY_ID_EVENT: u32 = 25;

/// A thread's EventSource activity id changes to `new_id` (nil: no activity).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadActivityChange {
    pub new_id: Guid,
}

impl ThreadActivityChange {
    pub(crate) fn decode(mut r: PayloadReader<'_>) -> Result<Self, NettraceError> {
        Ok(ThreadActivityChange { new_id: r.guid()? })
    }
}
