//! The operations registry behind `/operations`: every artifact the API collects (streamed or
//! egressed) is an operation, counted against its kind's concurrency limit while it runs, and
//! kept a while after it ends so its status can be read.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use profile::artifact::ArtifactKind;
use profile::guid::Guid;
use profile::utc;
use serde::Serialize;
use tokio::sync::watch;

use crate::error::ApiError;

/// How long a finished operation's status stays readable.
pub const OPERATION_RETENTION: Duration = Duration::from_secs(3600);
/// The most operations kept (running ones are bounded by the kinds' limits, so this bounds the
/// finished ones; the oldest finished go first).
pub const MAX_OPERATIONS: usize = 1000;

/// dotnet-monitor's concurrency limit of each kind of artifact (its `ConfigureRequestLimits`).
pub fn concurrency_limit(kind: ArtifactKind) -> usize {
    match kind {
        ArtifactKind::Dump
        | ArtifactKind::GcDump
        | ArtifactKind::Stacks { .. }
        | ArtifactKind::Exceptions { .. } => 1,
        ArtifactKind::Trace | ArtifactKind::Logs { .. } | ArtifactKind::LiveMetrics => 3,
    }
}

/// dotnet-monitor's `OperationState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum OperationState {
    Running,
    Stopping,
    Succeeded,
    Failed,
    Cancelled,
}

impl OperationState {
    fn is_active(self) -> bool {
        matches!(self, OperationState::Running | OperationState::Stopping)
    }
}

/// The process an operation collects from (`OperationProcessInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OperationProcess {
    pub pid: u64,
    pub uid: String,
    pub name: String,
}

/// `OperationError`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OperationError {
    pub code: String,
    pub message: String,
}

/// `OperationStatus` (a superset of `OperationSummary`, which omits the last two fields).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationStatus {
    pub operation_id: String,
    pub created_date_time: String,
    pub status: OperationState,
    pub process: OperationProcess,
    pub egress_provider_name: Option<String>,
    pub is_stoppable: bool,
    pub tags: BTreeSet<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_location: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<OperationError>,
}

/// What the API asks a running operation to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Control {
    Run,
    /// End gracefully (a trace stops and gets its rundown).
    Stop,
    /// Give up; the artifact is discarded.
    Cancel,
}

#[derive(Debug)]
struct Entry {
    status: OperationStatus,
    kind: ArtifactKind,
    stoppable: bool,
    finished: Option<Instant>,
    /// Until its task ends, cancelled or not: what the kind's limit counts, since a cancelled
    /// dump goes on until createdump returns.
    working: bool,
    control: watch::Sender<Control>,
}

#[derive(Debug, Default)]
struct OperationTable {
    entries: HashMap<String, Entry>,
    /// Ids, oldest first.
    order: VecDeque<String>,
}

impl OperationTable {
    /// Forgets operations finished longer than [`OPERATION_RETENTION`] ago, and the oldest
    /// finished ones beyond [`MAX_OPERATIONS`]; never one whose work goes on (it holds a slot).
    fn prune(&mut self, now: Instant) {
        let entries = &mut self.entries;
        self.order.retain(|id| {
            let entry = &entries[id];
            let expired = !entry.working
                && entry
                    .finished
                    .is_some_and(|at| now.duration_since(at) > OPERATION_RETENTION);
            if expired {
                entries.remove(id);
            }
            !expired
        });
        let mut excess = self.order.len().saturating_sub(MAX_OPERATIONS);
        let entries = &mut self.entries;
        self.order.retain(|id| {
            if excess > 0 && entries[id].finished.is_some() && !entries[id].working {
                entries.remove(id);
                excess -= 1;
                return false;
            }
            true
        });
    }

    fn entry(&mut self, id: &str) -> Result<&mut Entry, ApiError> {
        self.entries
            .get_mut(id)
            .ok_or_else(|| ApiError::OperationNotFound { id: id.to_string() })
    }
}

/// The operations started through the API; cloning shares.
#[derive(Debug, Clone, Default)]
pub struct Operations {
    inner: Arc<Mutex<OperationTable>>,
}

/// Which operations `/operations` lists: those of a process (any of pid, uid and name given
/// must match) carrying every tag asked for.
#[derive(Debug, Clone, Default)]
pub struct OperationFilter {
    pub pid: Option<u64>,
    pub uid: Option<String>,
    pub name: Option<String>,
    pub tags: BTreeSet<String>,
}

impl Operations {
    fn lock(&self) -> MutexGuard<'_, OperationTable> {
        // Entries change field by field under the lock, each change complete before the next.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a running operation, unless `kind` already runs as often as its limit allows
    /// (429, as dotnet-monitor answers). Cancelled operations whose work goes on still count.
    pub fn start(
        &self,
        kind: ArtifactKind,
        process: OperationProcess,
        egress_provider: Option<String>,
        tags: BTreeSet<String>,
    ) -> Result<OperationHandle, ApiError> {
        let mut registry = self.lock();
        registry.prune(Instant::now());
        let limit = concurrency_limit(kind);
        let running = registry
            .entries
            .values()
            .filter(|e| e.kind.name() == kind.name() && e.working)
            .count();
        if running >= limit {
            return Err(ApiError::TooManyRequests {
                kind: kind.name(),
                limit,
            });
        }
        let id = new_operation_id();
        let (control, watch) = watch::channel(Control::Run);
        let stoppable = kind == ArtifactKind::Trace;
        registry.entries.insert(
            id.clone(),
            Entry {
                status: OperationStatus {
                    operation_id: id.clone(),
                    created_date_time: utc::format(
                        utc::unix_nanos(SystemTime::now()),
                        utc::Form::Micros,
                    ),
                    status: OperationState::Running,
                    process,
                    egress_provider_name: egress_provider,
                    is_stoppable: stoppable,
                    tags,
                    resource_location: None,
                    error: None,
                },
                kind,
                stoppable,
                finished: None,
                working: true,
                control,
            },
        );
        registry.order.push_back(id.clone());
        Ok(OperationHandle {
            id,
            operations: self.clone(),
            control: watch,
            ended: false,
        })
    }

    pub fn list(&self, filter: &OperationFilter) -> Vec<OperationStatus> {
        let mut registry = self.lock();
        registry.prune(Instant::now());
        registry
            .order
            .iter()
            .map(|id| &registry.entries[id].status)
            .filter(|s| {
                filter.pid.is_none_or(|pid| s.process.pid == pid)
                    && filter
                        .uid
                        .as_deref()
                        .is_none_or(|uid| s.process.uid.eq_ignore_ascii_case(uid))
                    && filter.name.as_deref().is_none_or(|n| s.process.name == n)
                    && filter.tags.is_subset(&s.tags)
            })
            .map(|s| OperationStatus {
                resource_location: None,
                error: None,
                ..s.clone()
            })
            .collect()
    }

    pub fn status(&self, id: &str) -> Result<OperationStatus, ApiError> {
        let mut registry = self.lock();
        registry.prune(Instant::now());
        Ok(registry.entry(id)?.status.clone())
    }

    /// Cancels a running operation: it reads `Cancelled` at once and its artifact is discarded
    /// (a partial file deleted, an upload aborted); it holds its kind's slot until its task has
    /// ended.
    pub fn cancel(&self, id: &str) -> Result<(), ApiError> {
        let mut registry = self.lock();
        let entry = registry.entry(id)?;
        if !entry.status.status.is_active() {
            return Err(ApiError::OperationNotRunning {
                id: id.to_string(),
                state: entry.status.status,
            });
        }
        entry.status.status = OperationState::Cancelled;
        entry.status.is_stoppable = false;
        entry.finished = Some(Instant::now());
        entry.control.send_replace(Control::Cancel);
        Ok(())
    }

    /// Asks a running trace to end early; it keeps what it has (with the rundown).
    pub fn stop(&self, id: &str) -> Result<(), ApiError> {
        let mut registry = self.lock();
        let entry = registry.entry(id)?;
        if entry.status.status != OperationState::Running {
            return Err(ApiError::OperationNotRunning {
                id: id.to_string(),
                state: entry.status.status,
            });
        }
        if !entry.stoppable {
            return Err(ApiError::BadRequest(format!(
                "operation {id} does not support being stopped (only traces do); DELETE without \
                 stop=true cancels it"
            )));
        }
        entry.status.status = OperationState::Stopping;
        entry.status.is_stoppable = false;
        entry.control.send_replace(Control::Stop);
        Ok(())
    }

    fn end(&self, id: &str, result: Result<Option<String>, String>) {
        let mut registry = self.lock();
        let Some(entry) = registry.entries.get_mut(id) else {
            return;
        };
        entry.working = false;
        if !entry.status.status.is_active() {
            // Cancelled meanwhile: it stays so.
            return;
        }
        entry.finished = Some(Instant::now());
        entry.status.is_stoppable = false;
        match result {
            Ok(location) => {
                entry.status.status = OperationState::Succeeded;
                entry.status.resource_location = location;
            }
            Err(message) => {
                entry.status.status = OperationState::Failed;
                entry.status.error = Some(OperationError {
                    code: "400".into(),
                    message,
                });
            }
        }
    }
}

/// A running operation, held by the task that collects its artifact; dropped without an end, it
/// is marked failed.
#[derive(Debug)]
pub struct OperationHandle {
    id: String,
    operations: Operations,
    control: watch::Receiver<Control>,
    ended: bool,
}

impl OperationHandle {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Resolves once the operation is cancelled.
    pub async fn cancelled(&self) {
        let mut control = self.control.clone();
        let _ = control.wait_for(|c| *c == Control::Cancel).await;
    }

    /// Resolves once the operation is asked to stop (or is cancelled).
    pub async fn stop_requested(&self) {
        let mut control = self.control.clone();
        let _ = control.wait_for(|c| *c != Control::Run).await;
    }

    pub fn is_cancelled(&self) -> bool {
        *self.control.borrow() == Control::Cancel
    }

    pub fn succeed(mut self, resource_location: Option<String>) {
        self.ended = true;
        self.operations.end(&self.id, Ok(resource_location));
    }

    pub fn fail(mut self, message: String) {
        self.ended = true;
        self.operations.end(&self.id, Err(message));
    }
}

impl Drop for OperationHandle {
    fn drop(&mut self) {
        if !self.ended {
            self.operations
                .end(&self.id, Err("the operation ended unexpectedly".into()));
        }
    }
}

/// A random (version 4) GUID, as dotnet-monitor's operation ids are.
fn new_operation_id() -> String {
    let mut bytes = [0u8; 16];
    let filled = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .is_ok();
    if !filled {
        // Unique within this agent, which is all an id needs to be.
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        bytes = nanos.to_le_bytes();
    }
    Guid::new_v4(bytes).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process() -> OperationProcess {
        OperationProcess {
            pid: 7,
            uid: "u".into(),
            name: "dotnet".into(),
        }
    }

    #[test]
    fn limits_cancel_and_expiry() {
        let ops = Operations::default();
        let dump = ops
            .start(ArtifactKind::Dump, process(), None, BTreeSet::new())
            .unwrap();
        assert!(matches!(
            ops.start(ArtifactKind::Dump, process(), None, BTreeSet::new()),
            Err(ApiError::TooManyRequests { limit: 1, .. })
        ));
        let traces: Vec<_> = (0..3)
            .map(|_| {
                ops.start(
                    ArtifactKind::Trace,
                    process(),
                    None,
                    ["a".to_string()].into(),
                )
                .unwrap()
            })
            .collect();
        assert!(ops
            .start(ArtifactKind::Trace, process(), None, BTreeSet::new())
            .is_err());
        ops.cancel(dump.id()).unwrap();
        assert!(dump.is_cancelled());
        assert_eq!(
            ops.status(dump.id()).unwrap().status,
            OperationState::Cancelled
        );
        assert!(matches!(
            ops.cancel(dump.id()),
            Err(ApiError::OperationNotRunning { .. })
        ));
        // The cancelled dump holds its slot until its work has ended.
        assert!(matches!(
            ops.start(ArtifactKind::Dump, process(), None, BTreeSet::new()),
            Err(ApiError::TooManyRequests { limit: 1, .. })
        ));
        let dump_id = dump.id().to_string();
        dump.succeed(None);
        let second = ops
            .start(
                ArtifactKind::Dump,
                process(),
                Some("out".into()),
                BTreeSet::new(),
            )
            .unwrap();
        // Finishing after a cancel does not revive it.
        assert_eq!(
            ops.status(&dump_id).unwrap().status,
            OperationState::Cancelled
        );
        second.succeed(Some("/out/core_1".into()));
        let filter = OperationFilter {
            tags: ["a".to_string()].into(),
            ..OperationFilter::default()
        };
        assert_eq!(ops.list(&filter).len(), 3);
        ops.stop(traces[0].id()).unwrap();
        assert_eq!(
            ops.status(traces[0].id()).unwrap().status,
            OperationState::Stopping
        );
        let dropped = traces[1].id().to_string();
        drop(traces);
        assert_eq!(ops.status(&dropped).unwrap().status, OperationState::Failed);
        assert!(ops.status("nope").is_err());

        // Finished operations expire.
        ops.lock().prune(Instant::now() + OPERATION_RETENTION * 2);
        assert!(ops.list(&OperationFilter::default()).is_empty());
    }

    #[test]
    fn ids_are_v4_guids() {
        let id = new_operation_id();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert_ne!(id, new_operation_id());
    }
}
