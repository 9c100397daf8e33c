//! The processes an agent profiles right now, shared between its per-process tasks (which add and
//! remove themselves) and its API (which lists them, boosts their samplers and shows their
//! collection rules), and the recent history of their attaching and detaching and of their
//! rules firing, for markers on the web UI's timeline.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;

use crate::rules::state::RuleStates;
use crate::sampler::{SamplerControl, SamplerStatus};
use crate::signals::ProcessSignals;

/// How many [`ProcessEvent`]s the registry keeps, oldest dropped first: enough for days of a
/// node's restarts, little enough memory (a few MB) for a crash-looping service.
pub const MAX_EVENTS: usize = 10_000;

/// One attached process, as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct AttachedProcess {
    /// The pid as seen from the agent (listen mode: the pid the runtime advertised).
    pub pid: u64,
    /// The entry assembly's name, else the kernel's process name.
    pub name: String,
    pub service_name: String,
    pub command_line: String,
    pub runtime_version: Option<String>,
    /// Identifies one runtime instance: a restarted process gets a new one.
    pub runtime_cookie: String,
    /// `connect` or `listen`.
    pub transport: &'static str,
    pub attached_unix_ms: i64,
    #[serde(skip)]
    pub sampler: SamplerControl,
    /// The collection rules applied to it and their states.
    #[serde(skip)]
    pub rules: RuleStates,
    /// Its logs and exceptions.
    #[serde(skip)]
    pub signals: ProcessSignals,
}

/// [`AttachedProcess`] plus its sampler's state, for listing.
#[derive(Debug, Clone, Serialize)]
pub struct AttachedProcessStatus {
    #[serde(flatten)]
    pub process: AttachedProcess,
    pub sampler: SamplerStatus,
}

/// What happened to a process, as far as the agent saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessEventKind {
    /// The agent started profiling it: it started, or the agent found it.
    Attached,
    /// The agent stopped profiling it: it exited, or its diagnostic connection broke.
    Detached,
    /// A collection rule's trigger was satisfied and its actions ran (`rule` names it).
    CollectionRuleTriggered,
    /// A collection rule's trigger was satisfied but its limits held the actions back.
    CollectionRuleThrottled,
}

/// A process attaching or detaching, at `unix_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessEvent {
    pub unix_ms: i64,
    pub kind: ProcessEventKind,
    pub pid: u64,
    pub name: String,
    pub service_name: String,
    pub runtime_cookie: String,
    /// The collection rule, for rule events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
}

impl ProcessEvent {
    fn new(kind: ProcessEventKind, unix_ms: i64, process: &AttachedProcess) -> ProcessEvent {
        ProcessEvent {
            unix_ms,
            kind,
            pid: process.pid,
            name: process.name.clone(),
            service_name: process.service_name.clone(),
            runtime_cookie: process.runtime_cookie.clone(),
            rule: None,
        }
    }
}

#[derive(Debug, Default)]
struct Registry {
    by_cookie: BTreeMap<String, AttachedProcess>,
    /// Oldest first, at most [`MAX_EVENTS`].
    events: VecDeque<ProcessEvent>,
}

impl Registry {
    fn record(&mut self, event: ProcessEvent) {
        if self.events.len() == MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(event);
    }
}

/// The attached processes by runtime cookie, and their recent events. Cloning shares.
#[derive(Debug, Clone, Default)]
pub struct AttachedProcesses {
    inner: Arc<Mutex<Registry>>,
}

/// Removes its process from the registry when dropped, however the process's task ends.
#[derive(Debug)]
pub struct Registration {
    registry: AttachedProcesses,
    cookie: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut registry = self.registry.lock();
        if let Some(process) = registry.by_cookie.remove(&self.cookie) {
            let event = ProcessEvent::new(
                ProcessEventKind::Detached,
                profile::clock::unix_millis(),
                &process,
            );
            registry.record(event);
        }
    }
}

impl AttachedProcesses {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        // Entries are replaced whole, so a panic elsewhere cannot leave one half-written.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a process, recording that it attached at its `attached_unix_ms`; `None` if a
    /// process with that runtime cookie is already attached (the same runtime found through
    /// both its own socket and the listen socket).
    pub fn register(&self, process: AttachedProcess) -> Option<Registration> {
        let mut registry = self.lock();
        if registry.by_cookie.contains_key(&process.runtime_cookie) {
            return None;
        }
        let cookie = process.runtime_cookie.clone();
        let event = ProcessEvent::new(
            ProcessEventKind::Attached,
            process.attached_unix_ms,
            &process,
        );
        registry.record(event);
        registry.by_cookie.insert(cookie.clone(), process);
        Some(Registration {
            registry: self.clone(),
            cookie,
        })
    }

    /// Records that collection rule `rule` of the process with runtime cookie `cookie` fired
    /// (`CollectionRuleTriggered` or `CollectionRuleThrottled`), now.
    pub fn record_rule_event(&self, cookie: &str, kind: ProcessEventKind, rule: &str) {
        let mut registry = self.lock();
        let Some(process) = registry.by_cookie.get(cookie) else {
            return;
        };
        let mut event = ProcessEvent::new(kind, profile::clock::unix_millis(), process);
        event.rule = Some(rule.to_string());
        registry.record(event);
    }

    /// Every attached process, by pid.
    pub fn list(&self) -> Vec<AttachedProcessStatus> {
        let mut all: Vec<_> = self
            .lock()
            .by_cookie
            .values()
            .map(|p| AttachedProcessStatus {
                sampler: p.sampler.status(),
                process: p.clone(),
            })
            .collect();
        all.sort_by_key(|p| p.process.pid);
        all
    }

    /// The attached process with this pid, if any.
    pub fn by_pid(&self, pid: u64) -> Option<AttachedProcess> {
        self.lock()
            .by_cookie
            .values()
            .find(|p| p.pid == pid)
            .cloned()
    }

    /// The logs and exceptions of the attached process with this runtime cookie.
    pub fn signals_of(&self, cookie: &str) -> Option<ProcessSignals> {
        // The API spells cookies in lower case, the runtime as it likes.
        self.lock()
            .by_cookie
            .values()
            .find(|p| p.runtime_cookie.eq_ignore_ascii_case(cookie))
            .map(|p| p.signals.clone())
    }

    /// The recorded events in `[from_ms, until_ms)` that `keep` accepts, oldest first (the
    /// last [`MAX_EVENTS`] since the agent started).
    pub fn events(
        &self,
        from_ms: i64,
        until_ms: i64,
        keep: impl Fn(&ProcessEvent) -> bool,
    ) -> Vec<ProcessEvent> {
        self.lock()
            .events
            .iter()
            .filter(|e| (from_ms..until_ms).contains(&e.unix_ms) && keep(e))
            .cloned()
            .collect()
    }

    pub fn len(&self) -> usize {
        self.lock().by_cookie.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().by_cookie.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::DutyCycle;

    fn process(pid: u64, cookie: &str) -> AttachedProcess {
        AttachedProcess {
            pid,
            name: "App".into(),
            service_name: "app".into(),
            command_line: "dotnet App.dll".into(),
            runtime_version: None,
            runtime_cookie: cookie.into(),
            transport: "connect",
            attached_unix_ms: 1000 + pid as i64,
            sampler: SamplerControl::new(DutyCycle::default()),
            rules: RuleStates::default(),
            signals: ProcessSignals::default(),
        }
    }

    #[test]
    fn one_entry_per_runtime_removed_on_drop() {
        let registry = AttachedProcesses::default();
        let first = registry.register(process(7, "a")).unwrap();
        assert!(registry.register(process(7, "a")).is_none());
        let second = registry.register(process(3, "b")).unwrap();
        let pids: Vec<u64> = registry.list().iter().map(|p| p.process.pid).collect();
        assert_eq!(pids, [3, 7]);
        assert_eq!(registry.by_pid(7).unwrap().runtime_cookie, "a");
        drop(first);
        assert!(registry.by_pid(7).is_none());
        drop(second);
        assert!(registry.is_empty());
    }

    #[test]
    fn attaching_and_detaching_are_recorded_in_order() {
        let registry = AttachedProcesses::default();
        let first = registry.register(process(7, "a")).unwrap();
        // A second find of the same runtime is no event.
        assert!(registry.register(process(7, "a")).is_none());
        let _second = registry.register(process(3, "b")).unwrap();
        drop(first);
        let all = registry.events(i64::MIN, i64::MAX, |_| true);
        let seen: Vec<(ProcessEventKind, u64)> = all.iter().map(|e| (e.kind, e.pid)).collect();
        use ProcessEventKind::{Attached, CollectionRuleTriggered, Detached};
        assert_eq!(seen, [(Attached, 7), (Attached, 3), (Detached, 7)]);
        registry.record_rule_event("b", CollectionRuleTriggered, "SlowRequests");
        registry.record_rule_event("a", CollectionRuleTriggered, "gone");
        let last = registry.events(i64::MIN, i64::MAX, |_| true).pop().unwrap();
        assert_eq!((last.kind, last.pid), (CollectionRuleTriggered, 3));
        assert_eq!(
            serde_json::to_value(&last).unwrap()["rule"],
            serde_json::json!("SlowRequests")
        );
        assert_eq!(all[0].unix_ms, 1007);
        assert!(all[2].unix_ms >= all[1].unix_ms);
        // The range is half-open and the filter applies.
        assert_eq!(registry.events(1003, 1007, |_| true).len(), 1);
        assert!(registry
            .events(i64::MIN, i64::MAX, |e| e.pid == 9)
            .is_empty());
    }

    #[test]
    fn the_history_is_bounded() {
        let registry = AttachedProcesses::default();
        for pid in 0..MAX_EVENTS as u64 / 2 + 1 {
            drop(registry.register(process(pid, &pid.to_string())));
        }
        let events = registry.events(i64::MIN, i64::MAX, |_| true);
        assert_eq!(events.len(), MAX_EVENTS);
        // The oldest two, pid 0 attaching and detaching, went first.
        assert_eq!(
            (events[0].kind, events[0].pid),
            (ProcessEventKind::Attached, 1)
        );
    }
}
