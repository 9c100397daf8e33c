//! Every consumer's demand for a process's logs, and the one setting its logging provider is kept
//! at: their union ([`LogsSettings::union`]).
//!
//! `LoggingEventSource` keeps one FilterSpecs for the whole process: each session that enables it
//! replaces the filters for every session, and each session that ends turns every logger off
//! (the runtime sends the EventSource `Disable` although other sessions remain). So a process has
//! one logs session of the agent's (the agent's `run_logs_session`), which asks for the union of
//! what the always-on collection (`--logs`), every `/logs` request and every `CollectLogs` asks;
//! each consumer picks its own messages out of it ([`LogsSettings::accepts`]). A demand that widens
//! the union has the session started again at once with the new union; the union narrows only
//! once no demand has come or gone for [`NARROW_AFTER`], so that requests coming and going do not
//! restart it each time: a restart loses what the app logs while it lasts (measured at about
//! 40 ms: events written after the old session left and before the new one is enabled reach no
//! session, then the loggers are off until the new session's `Enable`).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::signals::LogsSettings;
use ipc::CollectTracing;
use profile::log::LogLevel;

/// How long the union stays wider than its demands after one ended, before the session is
/// started again with the narrower one.
pub const NARROW_AFTER: Duration = Duration::from_secs(30);

/// A process's logging demands. Shared by its signals, its logs session and its requests.
#[derive(Debug)]
pub struct LogsDemand {
    /// The always-on collection (`--logs`), which the kept history and OTLP export serve.
    base: Option<LogsSettings>,
    state: Mutex<DemandState>,
    /// Wakes the logs session when the union changed.
    changed: Notify,
    /// Bumped when a session is enabled: requests waiting for it look again.
    enabled: watch::Sender<u64>,
}

#[derive(Debug)]
struct DemandState {
    /// Demands of requests, by id.
    requests: Vec<(u64, LogsSettings)>,
    next_id: u64,
    /// Bumped at each change of what the session asks for.
    generation: u64,
    /// The union of the demands.
    union: Option<LogsSettings>,
    /// What the session asks for: the union, or wider until a narrowing is due.
    held: Option<LogsSettings>,
    /// A wider `held` waits for the session to start again.
    widen: bool,
    /// When `held` becomes the narrower union, if it is wider.
    narrow_at: Option<Instant>,
    /// The union of the session being started, and its generation.
    starting: Option<(u64, LogsSettings)>,
    /// The union of the session enabled last (`None`: none runs).
    applied: Option<LogsSettings>,
}

impl LogsDemand {
    pub fn new(base: Option<LogsSettings>) -> Arc<LogsDemand> {
        let union = base.clone();
        Arc::new(LogsDemand {
            base,
            state: Mutex::new(DemandState {
                requests: Vec::new(),
                next_id: 0,
                generation: 1,
                held: union.clone(),
                union,
                widen: false,
                narrow_at: None,
                starting: None,
                applied: None,
            }),
            changed: Notify::new(),
            enabled: watch::channel(0).0,
        })
    }

    fn lock(&self) -> MutexGuard<'_, DemandState> {
        // Every change is made whole under the lock: a panic elsewhere cannot leave half of one.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The always-on collection's settings, if logs are collected.
    pub fn base(&self) -> Option<&LogsSettings> {
        self.base.as_ref()
    }

    /// Whether anything asks for the process's logs at all.
    pub fn wanted(&self) -> bool {
        self.lock().union.is_some()
    }

    /// Whether some demand selects a message of `level` in `category` (the union accepts it).
    pub fn accepts(&self, category: &str, level: LogLevel) -> bool {
        self.lock()
            .union
            .as_ref()
            .is_some_and(|u| u.accepts(category, level))
    }

    /// Adds a request's demand; the session is started again at once if what it asks for does
    /// not cover it. The demand lasts as long as the guard.
    pub fn add(self: &Arc<Self>, settings: LogsSettings) -> DemandGuard {
        let mut state = self.lock();
        state.next_id += 1;
        let id = state.next_id;
        state.requests.push((id, settings.clone()));
        self.recompute(&mut state);
        if state.held.as_ref().is_some_and(|h| h.covers(&settings)) {
            // Requests still come: a pending narrowing waits for them to stop.
            if state.narrow_at.is_some() {
                state.narrow_at = Some(Instant::now() + NARROW_AFTER);
            }
        } else {
            state.held = LogsSettings::union(state.held.iter().chain(&state.union));
            state.generation += 1;
            state.widen = true;
            self.changed.notify_one();
        }
        DemandGuard {
            demand: self.clone(),
            id,
            settings,
        }
    }

    fn remove(&self, id: u64) {
        let mut state = self.lock();
        state.requests.retain(|(i, _)| *i != id);
        self.recompute(&mut state);
        if state.union != state.held {
            // Narrower: once no demand has come or gone for a while.
            state.narrow_at = Some(Instant::now() + NARROW_AFTER);
            self.changed.notify_one();
        }
    }

    fn recompute(&self, state: &mut DemandState) {
        state.union = LogsSettings::union(
            self.base
                .iter()
                .chain(state.requests.iter().map(|(_, s)| s)),
        );
    }

    /// Whether the session asking for `held` as of `generation` should start again now: a wider
    /// `held`, or a narrowing that is due.
    fn renewal_due(state: &DemandState, generation: u64) -> Option<Instant> {
        if state.widen && state.generation != generation {
            return Some(Instant::now());
        }
        state.narrow_at.filter(|_| state.union != state.held)
    }

    /// The session to run now: what it asks for and its generation; `None` while nobody asks for
    /// logs. A narrowing that is due takes effect.
    pub fn session(&self) -> Option<(u64, CollectTracing)> {
        let mut state = self.lock();
        state.widen = false;
        if state.narrow_at.is_some_and(|at| at <= Instant::now()) {
            state.narrow_at = None;
            if state.held != state.union {
                state.held = state.union.clone();
                state.generation += 1;
            }
        }
        let held = state.held.clone()?;
        // No stack walks: a message's stack is never read.
        let config = CollectTracing::v2(vec![held.provider()])
            .with_rundown(false)
            .with_stackwalk(false);
        state.starting = Some((state.generation, held));
        Some((state.generation, config))
    }

    /// The session started for `generation` is enabled: requests waiting for it are served.
    pub fn enabled(&self, generation: u64) {
        {
            let mut state = self.lock();
            if let Some((g, union)) = state.starting.take() {
                if g == generation {
                    state.applied = Some(union);
                }
            }
        }
        self.enabled.send_modify(|n| *n += 1);
    }

    /// The session is gone (it ended, or is being started again): nothing is applied.
    pub fn ended(&self) {
        self.lock().applied = None;
    }

    /// Whether the session enabled last asks for everything `settings` select.
    fn covered(&self, settings: &LogsSettings) -> bool {
        self.lock()
            .applied
            .as_ref()
            .is_some_and(|a| a.covers(settings))
    }

    /// Resolves when the session running with `generation` should be started again: at once
    /// when it must ask for more, [`NARROW_AFTER`] after the last demand came or went when it may
    /// ask for less.
    pub async fn changed(&self, generation: u64) {
        loop {
            let notified = self.changed.notified();
            let due = Self::renewal_due(&self.lock(), generation);
            match due {
                Some(due) if due <= Instant::now() => return,
                Some(due) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(due) => {}
                        () = notified => {}
                    }
                }
                None => notified.await,
            }
        }
    }
}

/// A request's demand: it widened the union if it had to, and ends with this guard.
#[derive(Debug)]
pub struct DemandGuard {
    demand: Arc<LogsDemand>,
    id: u64,
    settings: LogsSettings,
}

impl DemandGuard {
    /// Resolves once the process's logs session asks for everything this demand selects.
    pub async fn applied(&self) {
        let mut enabled = self.demand.enabled.subscribe();
        while !self.demand.covered(&self.settings) {
            if enabled.changed().await.is_err() {
                return;
            }
        }
    }
}

impl Drop for DemandGuard {
    fn drop(&mut self) {
        self.demand.remove(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn wider_at_once_narrower_later() {
        let demand = LogsDemand::new(Some(LogsSettings::for_level(Some(LogLevel::Information))));
        let (first, _) = demand.session().unwrap();
        demand.enabled(first);
        assert!(!demand.accepts("Logs", LogLevel::Debug));
        // Covered: no change, served at once.
        let warning = demand.add(LogsSettings::for_level(Some(LogLevel::Warning)));
        tokio::time::timeout(Duration::from_millis(1), warning.applied())
            .await
            .unwrap();
        // Wider: the session is due at once, and the request waits for it.
        let debug = demand.add(LogsSettings::for_level(Some(LogLevel::Debug)));
        assert!(demand.accepts("Logs", LogLevel::Debug));
        tokio::time::timeout(Duration::from_millis(1), demand.changed(first))
            .await
            .unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(1), debug.applied())
                .await
                .is_err()
        );
        let (second, config) = demand.session().unwrap();
        assert_eq!(
            config.providers[0].arguments.as_deref(),
            Some("FilterSpecs=*:Debug")
        );
        demand.enabled(second);
        debug.applied().await;
        // Narrower: only after NARROW_AFTER; a session started again meanwhile (quiet) keeps
        // the wider union.
        drop(debug);
        drop(warning);
        let (_, config) = demand.session().unwrap();
        assert_eq!(
            config.providers[0].arguments.as_deref(),
            Some("FilterSpecs=*:Debug")
        );
        assert!(
            tokio::time::timeout(NARROW_AFTER / 2, demand.changed(second))
                .await
                .is_err()
        );
        tokio::time::timeout(NARROW_AFTER, demand.changed(second))
            .await
            .unwrap();
        let (_, config) = demand.session().unwrap();
        assert_eq!(
            config.providers[0].arguments.as_deref(),
            Some("FilterSpecs=*:Information")
        );
    }
}
