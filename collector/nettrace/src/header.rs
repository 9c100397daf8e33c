//! The Trace object: what applies to the whole trace (clock, pointer size, process).

use super::cursor::Cursor;
use super::error::NettraceError;
use super::time::{Clock, SystemTime};

/// Size of the Trace object's fields in format V4/V5.
pub(crate) const TRACE_OBJECT_SIZE: usize = 48;

/// The fields of the Trace object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceInfo {
    /// Wall-clock time (UTC) at which `sync_time_qpc` was sampled.
    pub sync_time_utc: SystemTime,
    /// QPC value matching `sync_time_utc`.
    pub sync_time_qpc: i64,
    /// QPC ticks per second (1e9 on Linux).
    pub qpc_frequency: i64,
    /// 4 or 8: width of stack IPs and pointer-typed payload fields.
    pub pointer_size: u8,
    /// The traced process's id (as the runtime sees it: the namespace pid in a container).
    pub process_id: u32,
    /// Logical processors of the traced machine.
    pub number_of_processors: u32,
    /// The sample profiler interval in nanoseconds the runtime had when the trace started.
    pub expected_cpu_sampling_rate: u32,
    /// V6 trace properties (key/value strings); empty for V4/V5.
    pub properties: Vec<(String, String)>,
    /// NetTrace major version: 4 for the V4/V5 FastSerialization format, 6 for V6.
    pub format_version: u32,
    /// Stream offset of the Trace object.
    pub offset: u64,
    pub(crate) clock: Clock,
}

impl TraceInfo {
    /// Parses the 48 field bytes at `offset` (the object's type header already consumed).
    pub(crate) fn parse(body: &[u8], offset: u64) -> Result<TraceInfo, NettraceError> {
        let mut c = Cursor::new(body, offset);
        let bad =
            |f: super::cursor::ReadFault| NettraceError::malformed("Trace", f.offset, f.reason);
        let mut st = [0u16; 8];
        for v in &mut st {
            *v = c.u16().map_err(bad)?;
        }
        let sync_time_utc = SystemTime {
            year: st[0],
            month: st[1],
            day_of_week: st[2],
            day: st[3],
            hour: st[4],
            minute: st[5],
            second: st[6],
            millisecond: st[7],
        };
        let sync_time_qpc = c.i64().map_err(bad)?;
        let qpc_frequency = c.i64().map_err(bad)?;
        let pointer_size = c.i32().map_err(bad)?;
        let process_id = c.u32().map_err(bad)?;
        let number_of_processors = c.u32().map_err(bad)?;
        let expected_cpu_sampling_rate = c.u32().map_err(bad)?;
        TraceInfo::new(
            sync_time_utc,
            sync_time_qpc,
            qpc_frequency,
            pointer_size,
            [process_id, number_of_processors, expected_cpu_sampling_rate],
            Vec::new(),
            4,
            offset,
        )
    }

    /// Validates and assembles the fields; `[pid, processors, sampling rate]` in that order.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        sync_time_utc: SystemTime,
        sync_time_qpc: i64,
        qpc_frequency: i64,
        pointer_size: i32,
        [process_id, number_of_processors, expected_cpu_sampling_rate]: [u32; 3],
        properties: Vec<(String, String)>,
        format_version: u32,
        offset: u64,
    ) -> Result<TraceInfo, NettraceError> {
        let Some(sync_unix) = sync_time_utc.to_unix_nanos() else {
            return Err(NettraceError::malformed(
                "Trace",
                offset,
                format!("sync time {sync_time_utc:?} is not a valid UTC date"),
            ));
        };
        if qpc_frequency <= 0 {
            return Err(NettraceError::malformed(
                "Trace",
                offset + 24,
                format!("QPC frequency {qpc_frequency} is not positive"),
            ));
        }
        let pointer_size = match pointer_size {
            4 => 4,
            8 => 8,
            other => {
                return Err(NettraceError::malformed(
                    "Trace",
                    offset + 32,
                    format!("pointer size {other} is neither 4 nor 8"),
                ))
            }
        };
        Ok(TraceInfo {
            sync_time_utc,
            sync_time_qpc,
            qpc_frequency,
            pointer_size,
            process_id,
            number_of_processors,
            expected_cpu_sampling_rate,
            properties,
            format_version,
            offset,
            clock: Clock::new(sync_unix, sync_time_qpc, qpc_frequency),
        })
    }

    /// The converter from this trace's QPC timestamps to UTC.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// The sync time as Unix nanoseconds (UTC).
    pub fn sync_time_unix_nanos(&self) -> i64 {
        self.clock.unix_nanos(self.sync_time_qpc)
    }
}
