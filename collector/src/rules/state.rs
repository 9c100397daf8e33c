//! A rule's life on one process: its state (Running, ActionExecuting, Throttled, Finished), its
//! executions and limits, and the two JSON shapes dotnet-monitor's `/collectionrules` and
//! `/collectionrules/{name}` answer with (`CollectionRuleDescription`,
//! `CollectionRuleDetailedDescription`; state reasons are its `Strings.resx` texts).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use serde::{Serialize, Serializer};

use super::config::format_timespan;
use super::options::Limits;

pub const REASON_RUNNING: &str =
    "This collection rule is active and waiting for its triggering conditions to be satisfied.";
pub const REASON_EXECUTING: &str = "This collection rule has had its triggering conditions \
     satisfied and is currently executing its action list.";
pub const REASON_THROTTLED: &str = "This collection rule is temporarily throttled because the \
     ActionCountLimit has been reached within the ActionCountSlidingWindowDuration.";
pub const REASON_FINISHED_STARTUP: &str =
    "The collection rule will no longer trigger because the Startup trigger only executes once.";
pub const REASON_FINISHED_ACTION_COUNT: &str =
    "The collection rule will no longer trigger because the ActionCount was reached.";
pub const REASON_FINISHED_RULE_DURATION: &str =
    "The collection rule will no longer trigger because the RuleDuration limit was reached.";
pub const REASON_FINISHED_FAILURE: &str =
    "The collection rule will no longer trigger because a failure occurred";

/// dotnet-monitor's `CollectionRuleState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RuleState {
    Running,
    ActionExecuting,
    Throttled,
    Finished,
}

/// Why a rule finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    Startup,
    ActionCount,
    RuleDuration,
    Failure(String),
}

/// `GET /collectionrules`: each rule's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CollectionRuleDescription {
    pub state: RuleState,
    pub state_reason: String,
}

/// `GET /collectionrules/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CollectionRuleDetailedDescription {
    pub state: RuleState,
    pub state_reason: String,
    pub lifetime_occurrences: u64,
    pub sliding_window_occurrences: u64,
    pub action_count_limit: u32,
    #[serde(serialize_with = "timespan")]
    pub action_count_sliding_window_duration_limit: Option<Duration>,
    #[serde(serialize_with = "timespan")]
    pub sliding_window_duration_countdown: Option<Duration>,
    #[serde(serialize_with = "timespan")]
    pub rule_finished_countdown: Option<Duration>,
}

/// TimeSpans as System.Text.Json writes them (`"00:01:00"`), or null.
fn timespan<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_str(&format_timespan(*d)),
        None => s.serialize_none(),
    }
}

/// The limits bookkeeping of one rule on one process (dotnet-monitor's
/// `CollectionRulePipelineState`).
#[derive(Debug, Clone)]
pub struct PipelineState {
    limits: Limits,
    started: SystemTime,
    /// Executions within the sliding window (all of them without a window), oldest first.
    window: VecDeque<SystemTime>,
    lifetime: u64,
    state: RuleState,
    reason: String,
}

impl PipelineState {
    pub fn new(limits: Limits, started: SystemTime) -> Self {
        PipelineState {
            limits,
            started,
            window: VecDeque::new(),
            lifetime: 0,
            state: RuleState::Running,
            reason: REASON_RUNNING.to_string(),
        }
    }

    pub fn state(&self) -> RuleState {
        self.state
    }

    pub fn lifetime_occurrences(&self) -> u64 {
        self.lifetime
    }

    fn set(&mut self, state: RuleState, reason: &str) {
        self.state = state;
        self.reason = reason.to_string();
    }

    fn drop_old(&mut self, now: SystemTime) {
        if let Some(window) = self.limits.action_count_window {
            let start = now.checked_sub(window).unwrap_or(SystemTime::UNIX_EPOCH);
            while self.window.front().is_some_and(|t| *t < start) {
                self.window.pop_front();
            }
        }
    }

    /// Throttled when the window holds ActionCount executions (only with a window); updates
    /// the state either way.
    pub fn check_throttling(&mut self, now: SystemTime) -> bool {
        self.drop_old(now);
        let throttled = self.limits.action_count_window.is_some()
            && self.window.len() as u64 >= u64::from(self.limits.action_count);
        if throttled {
            if self.state != RuleState::Finished {
                self.set(RuleState::Throttled, REASON_THROTTLED);
            }
        } else if self.state == RuleState::Throttled {
            self.set(RuleState::Running, REASON_RUNNING);
        }
        throttled
    }

    /// The trigger fired at `now`: true (and ActionExecuting) if the actions may run, false if
    /// throttled.
    pub fn begin_action_execution(&mut self, now: SystemTime) -> bool {
        if self.state == RuleState::Finished || self.check_throttling(now) {
            return false;
        }
        self.window.push_back(now);
        self.lifetime += 1;
        self.set(RuleState::ActionExecuting, REASON_EXECUTING);
        true
    }

    /// The action list ended (successfully or not): back to Running; true when the rule has
    /// now run its ActionCount without a window and so finishes.
    pub fn action_execution_completed(&mut self) -> bool {
        if self.state == RuleState::ActionExecuting {
            self.set(RuleState::Running, REASON_RUNNING);
        }
        let done = self.limits.action_count_window.is_none()
            && self.window.len() as u64 >= u64::from(self.limits.action_count);
        if done {
            self.finish(Finish::ActionCount);
        }
        done
    }

    pub fn finish(&mut self, why: Finish) {
        let reason = match &why {
            Finish::Startup => REASON_FINISHED_STARTUP.to_string(),
            Finish::ActionCount => REASON_FINISHED_ACTION_COUNT.to_string(),
            Finish::RuleDuration => REASON_FINISHED_RULE_DURATION.to_string(),
            Finish::Failure(message) => format!("{REASON_FINISHED_FAILURE}: {message}"),
        };
        self.set(RuleState::Finished, &reason);
    }

    /// When the rule's RuleDuration ends, if it has one.
    pub fn deadline(&self) -> Option<SystemTime> {
        self.limits.rule_duration.map(|d| self.started + d)
    }

    pub fn description(&mut self, now: SystemTime) -> CollectionRuleDescription {
        self.check_throttling(now);
        CollectionRuleDescription {
            state: self.state,
            state_reason: self.reason.clone(),
        }
    }

    pub fn detailed_description(&mut self, now: SystemTime) -> CollectionRuleDetailedDescription {
        self.check_throttling(now);
        let finished = self.state == RuleState::Finished;
        // Countdowns are whole seconds, and absent once they reach zero.
        let whole = |d: Duration| (d.as_secs() > 0).then(|| Duration::from_secs(d.as_secs()));
        let sliding_window_duration_countdown = match (self.limits.action_count_window, finished) {
            (Some(window), false)
                if self.window.len() as u64 >= u64::from(self.limits.action_count) =>
            {
                self.window
                    .front()
                    .and_then(|first| (*first + window).duration_since(now).ok())
                    .and_then(whole)
            }
            _ => None,
        };
        let rule_finished_countdown = match (self.deadline(), finished) {
            (Some(deadline), false) => deadline.duration_since(now).ok().and_then(whole),
            _ => None,
        };
        CollectionRuleDetailedDescription {
            state: self.state,
            state_reason: self.reason.clone(),
            lifetime_occurrences: self.lifetime,
            sliding_window_occurrences: self.window.len() as u64,
            action_count_limit: self.limits.action_count,
            action_count_sliding_window_duration_limit: self.limits.action_count_window,
            sliding_window_duration_countdown,
            rule_finished_countdown,
        }
    }
}

/// The rules applied to one process, by name, shared between the rule tasks and the API.
/// Cloning shares.
#[derive(Debug, Clone, Default)]
pub struct RuleStates {
    inner: Arc<Mutex<BTreeMap<String, PipelineState>>>,
}

impl RuleStates {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, PipelineState>> {
        // Each state is updated by whole method calls, which cannot panic half-way.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a rule as applied (Running).
    pub fn insert(&self, name: &str, state: PipelineState) {
        self.lock().insert(name.to_string(), state);
    }

    /// Runs `f` on a rule's state.
    pub fn update<R>(&self, name: &str, f: impl FnOnce(&mut PipelineState) -> R) -> Option<R> {
        self.lock().get_mut(name).map(f)
    }

    /// Every rule's state, by name (`GET /collectionrules`).
    pub fn descriptions(&self, now: SystemTime) -> BTreeMap<String, CollectionRuleDescription> {
        self.lock()
            .iter_mut()
            .map(|(name, state)| (name.clone(), state.description(now)))
            .collect()
    }

    /// One rule's details (`GET /collectionrules/{name}`), matched exactly like dotnet-monitor.
    pub fn detailed(
        &self,
        name: &str,
        now: SystemTime,
    ) -> Option<CollectionRuleDetailedDescription> {
        self.lock()
            .get_mut(name)
            .map(|state| state.detailed_description(now))
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
    }

    #[test]
    fn a_window_throttles_and_releases() {
        let limits = Limits {
            action_count: 1,
            action_count_window: Some(Duration::from_secs(60)),
            rule_duration: None,
        };
        let mut s = PipelineState::new(limits, at(0));
        assert!(s.begin_action_execution(at(10)));
        assert_eq!(s.state(), RuleState::ActionExecuting);
        assert!(!s.action_execution_completed());
        let d = s.detailed_description(at(20));
        assert_eq!(d.state, RuleState::Throttled);
        assert_eq!(
            d.sliding_window_duration_countdown,
            Some(Duration::from_secs(50))
        );
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "state": "Throttled",
                "stateReason": REASON_THROTTLED,
                "lifetimeOccurrences": 1,
                "slidingWindowOccurrences": 1,
                "actionCountLimit": 1,
                "actionCountSlidingWindowDurationLimit": "00:01:00",
                "slidingWindowDurationCountdown": "00:00:50",
                "ruleFinishedCountdown": null
            })
        );
        assert!(!s.begin_action_execution(at(30)), "throttled");
        assert_eq!(s.lifetime_occurrences(), 1);
        assert_eq!(s.description(at(71)).state, RuleState::Running);
        assert!(s.begin_action_execution(at(72)));
    }

    #[test]
    fn without_a_window_the_action_count_finishes_the_rule() {
        let limits = Limits {
            action_count: 2,
            action_count_window: None,
            rule_duration: Some(Duration::from_secs(600)),
        };
        let mut s = PipelineState::new(limits, at(0));
        assert_eq!(
            s.detailed_description(at(100)).rule_finished_countdown,
            Some(Duration::from_secs(500))
        );
        assert!(s.begin_action_execution(at(1)));
        assert!(!s.action_execution_completed());
        assert!(s.begin_action_execution(at(2)));
        assert!(s.action_execution_completed());
        let d = s.detailed_description(at(3));
        assert_eq!(
            (d.state, d.state_reason.as_str()),
            (RuleState::Finished, REASON_FINISHED_ACTION_COUNT)
        );
        assert_eq!(d.rule_finished_countdown, None);
        assert!(!s.begin_action_execution(at(4)));
    }
}
