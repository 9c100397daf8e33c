//! The processes an agent profiles right now, shared between its per-process tasks (which add and
//! remove themselves) and its API (which lists them and boosts their samplers).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;

use crate::sampler::{SamplerControl, SamplerStatus};

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
}

/// [`AttachedProcess`] plus its sampler's state, for listing.
#[derive(Debug, Clone, Serialize)]
pub struct AttachedProcessStatus {
    #[serde(flatten)]
    pub process: AttachedProcess,
    pub sampler: SamplerStatus,
}

/// The attached processes by runtime cookie. Cloning shares.
#[derive(Debug, Clone, Default)]
pub struct AttachedProcesses {
    inner: Arc<Mutex<BTreeMap<String, AttachedProcess>>>,
}

/// Removes its process from the registry when dropped, however the process's task ends.
#[derive(Debug)]
pub struct Registration {
    registry: AttachedProcesses,
    cookie: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.cookie);
    }
}

impl AttachedProcesses {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, AttachedProcess>> {
        // Entries are replaced whole, so a panic elsewhere cannot leave one half-written.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a process; `None` if a process with that runtime cookie is already attached (the
    /// same runtime found through both its own socket and the listen socket).
    pub fn register(&self, process: AttachedProcess) -> Option<Registration> {
        let mut map = self.lock();
        if map.contains_key(&process.runtime_cookie) {
            return None;
        }
        let cookie = process.runtime_cookie.clone();
        map.insert(cookie.clone(), process);
        Some(Registration {
            registry: self.clone(),
            cookie,
        })
    }

    /// Every attached process, by pid.
    pub fn list(&self) -> Vec<AttachedProcessStatus> {
        let mut all: Vec<_> = self
            .lock()
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
        self.lock().values().find(|p| p.pid == pid).cloned()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
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
            attached_unix_ms: 0,
            sampler: SamplerControl::new(DutyCycle::default()),
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
}
