//! Running one rule on one process, as dotnet-monitor's `CollectionRulePipeline` does: start the
//! trigger's session, wait until the trigger is satisfied, stop the session, run the action list
//! unless the limits throttle it, and start again with a fresh trigger; until the ActionCount is
//! spent (no window), the RuleDuration passes, a Startup rule ran once, the process exits or the
//! agent stops. The actions themselves are the caller's ([`run_rule`] takes them as a closure),
//! since they write artifacts through egress, which lives downstream of the collector.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;
use tokio::task::JoinSet;

use super::options::{Action, CollectionRule, CounterSource, Trigger};
use super::schedule::Schedule;
use super::state::{Finish, PipelineState, RuleStates};
use super::trigger::{RequestEvent, TriggerInput, TriggerState};
use crate::client::DiagnosticsClient;
use crate::counters::{CounterDecoder, CounterSessionConfig, CounterUpdate};
use crate::providers::TraceProfile;
use crate::session::{self, EventObserver, ParsingWriter, SessionEnd, SessionError};
use crate::startup::ResumeHold;
use ipc::CollectTracing;
use nettrace::events::KnownEvent;
use nettrace::Event;

/// How often the wall clock is offered to triggers (hung-request detection).
const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long the runtime may take to end a trigger's session (no rundown is asked for).
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The session a trigger listens with.
#[derive(Debug, Clone, PartialEq)]
pub enum TriggerSession {
    /// Counter values (EventCounter, EventMeter and the shortcuts).
    Counters(CounterSessionConfig),
    /// ASP.NET Core's request activities through DiagnosticSourceEventSource, with the `Http`
    /// profile's FilterAndPayloadSpecs (the one dotnet-monitor's ASP.NET triggers use).
    AspNet(CollectTracing),
}

impl TriggerSession {
    /// What `trigger` listens to, or `None` for Startup and Schedule.
    pub fn for_trigger(trigger: &Trigger, counter_interval_seconds: u32) -> Option<Self> {
        match trigger {
            Trigger::Startup | Trigger::Schedule(_) => None,
            Trigger::Threshold(t) => {
                let config = CounterSessionConfig::new(counter_interval_seconds);
                Some(TriggerSession::Counters(match &t.source {
                    CounterSource::EventCounter { provider, .. } => {
                        config.with_event_counters(provider)
                    }
                    CounterSource::Meter {
                        meter, instrument, ..
                    } => config.with_meter(meter, &[instrument]),
                }))
            }
            _ => Some(TriggerSession::AspNet(
                CollectTracing::v2(TraceProfile::Http.providers(counter_interval_seconds))
                    .with_rundown(false),
            )),
        }
    }

    fn collect_tracing(&self) -> CollectTracing {
        match self {
            TriggerSession::Counters(c) => c.collect_tracing(),
            TriggerSession::AspNet(c) => c.clone(),
        }
    }
}

/// Feeds a trigger from a session's events and says when it is satisfied.
struct TriggerObserver {
    state: Arc<Mutex<TriggerState>>,
    decoder: Option<CounterDecoder>,
    fired: Arc<Fired>,
}

/// Whether and when the trigger was satisfied.
#[derive(Default)]
struct Fired {
    at: Mutex<Option<SystemTime>>,
    notify: Notify,
}

impl Fired {
    fn set(&self) {
        let mut at = self.at.lock().unwrap_or_else(|p| p.into_inner());
        if at.is_none() {
            *at = Some(SystemTime::now());
            self.notify.notify_one();
        }
    }

    fn at(&self) -> Option<SystemTime> {
        *self.at.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn lock(state: &Mutex<TriggerState>) -> MutexGuard<'_, TriggerState> {
    // A trigger's state is changed by whole `observe` calls, which do not panic half-way.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl EventObserver for TriggerObserver {
    fn on_event(&mut self, event: &Event<'_>) {
        let satisfied = match &self.decoder {
            Some(decoder) => match decoder.decode(event) {
                Ok(Some(CounterUpdate::Sample(sample))) => {
                    lock(&self.state).observe(TriggerInput::Counter(&sample))
                }
                Ok(Some(CounterUpdate::MetricsError { message })) => {
                    tracing::warn!(%message, "the trigger's metrics session reports an error");
                    false
                }
                _ => false,
            },
            None => match event.known() {
                Ok(Some(KnownEvent::DiagnosticSource(d))) => {
                    RequestEvent::from_diagnostic_source(&d, event.unix_nanos())
                        .is_some_and(|r| lock(&self.state).observe(TriggerInput::Request(&r)))
                }
                _ => false,
            },
        };
        if satisfied {
            self.fired.set();
        }
    }
}

fn unix_nanos(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Waits until `trigger` is satisfied: `Ok(Some(when))`, or `Ok(None)` when `stop` resolved or
/// the process ended first. A Schedule counts its intervals from `since`, when the rule was
/// applied. `hold` is released once the trigger's session is enabled (at once for a trigger
/// without one).
pub async fn wait_for_trigger(
    client: &DiagnosticsClient,
    trigger: &Trigger,
    since: SystemTime,
    counter_interval_seconds: u32,
    stop: impl Future<Output = ()>,
    hold: Option<ResumeHold>,
) -> Result<Option<SystemTime>, SessionError> {
    let mut hold = hold;
    if let Trigger::Schedule(schedule) = trigger {
        drop(hold);
        return Ok(wait_for_schedule(schedule, since, stop).await);
    }
    let Some(session) = TriggerSession::for_trigger(trigger, counter_interval_seconds) else {
        return Ok(Some(SystemTime::now()));
    };
    let interval = Duration::from_secs(u64::from(counter_interval_seconds.max(1)));
    let state = Arc::new(Mutex::new(TriggerState::new(trigger, interval)));
    let fired = Arc::new(Fired::default());
    let decoder = match &session {
        TriggerSession::Counters(c) => Some(CounterDecoder::new(c)),
        TriggerSession::AspNet(_) => None,
    };
    let observer = TriggerObserver {
        state: state.clone(),
        decoder,
        fired: fired.clone(),
    };
    let mut sink = ParsingWriter::new(tokio::io::sink(), observer);
    let mut stopped = false;
    let until = async {
        tokio::pin!(stop);
        let mut heartbeat = tokio::time::interval(HEARTBEAT);
        loop {
            tokio::select! {
                () = fired.notify.notified() => return,
                () = &mut stop => { stopped = true; return },
                _ = heartbeat.tick() => {
                    let now = unix_nanos(SystemTime::now());
                    if lock(&state).observe(TriggerInput::Heartbeat { unix_nanos: now }) {
                        fired.set();
                        return;
                    }
                }
            }
        }
    };
    let summary = session::run(
        client,
        session.collect_tracing(),
        &mut sink,
        until,
        STOP_TIMEOUT,
        |_| drop(hold.take()),
    )
    .await?;
    if let Some(error) = sink.error() {
        tracing::warn!(%error, "a trigger's stream stopped parsing");
    }
    Ok(fired
        .at()
        .filter(|_| !stopped && summary.end == SessionEnd::Stopped))
}

/// The longest the schedule sleeps before looking at the wall clock again, so that a clock set
/// forward or back (NTP, a suspended VM) moves the firing with it.
const SCHEDULE_RECHECK: Duration = Duration::from_secs(60);

/// Sleeps until the schedule's next time and returns it; `None` when `stop` resolved first or the
/// schedule has no time left.
async fn wait_for_schedule(
    schedule: &Schedule,
    since: SystemTime,
    stop: impl Future<Output = ()>,
) -> Option<SystemTime> {
    let Some(next) = schedule.next_after(SystemTime::now(), since) else {
        tracing::warn!(
            ?schedule,
            "the schedule names no time to come: the rule will not fire"
        );
        stop.await;
        return None;
    };
    tokio::pin!(stop);
    loop {
        let Ok(left) = next.duration_since(SystemTime::now()) else {
            return Some(next);
        };
        if left.is_zero() {
            return Some(next);
        }
        tokio::select! {
            () = tokio::time::sleep(left.min(SCHEDULE_RECHECK)) => {}
            () = &mut stop => return None,
        }
    }
}

/// One firing of a rule, as its actions see it.
#[derive(Debug, Clone)]
pub struct Firing {
    pub rule: String,
    /// When the trigger was satisfied.
    pub time: SystemTime,
}

/// What the engine reports as it goes (for the agent's event history).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleEvent {
    /// The trigger was satisfied and the action list starts.
    Triggered,
    /// The trigger was satisfied but the limits held the actions back.
    Throttled,
    /// The rule will not trigger again.
    Finished,
}

/// An action's run, as the caller's closure returns it.
pub type ActionFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'static>>;

/// Runs `rule` on one process until it finishes, the process exits or `stop` resolves. Its state
/// is kept in `states` under the rule's name (what `/collectionrules` shows); `execute` starts an
/// action; `report` hears triggers, throttles and the end; `hold` is released once the first
/// trigger's session is enabled.
#[allow(clippy::too_many_arguments)]
pub async fn run_rule(
    client: &DiagnosticsClient,
    rule: &CollectionRule,
    states: &RuleStates,
    counter_interval_seconds: u32,
    mut execute: impl FnMut(&Action, &Firing) -> ActionFuture,
    mut report: impl FnMut(RuleEvent),
    stop: impl Future<Output = ()>,
    hold: Option<ResumeHold>,
) {
    let mut hold = hold;
    let started = SystemTime::now();
    states.insert(&rule.name, PipelineState::new(rule.limits, started));
    let deadline = rule
        .limits
        .rule_duration
        .map(|d| tokio::time::Instant::now() + d);
    tokio::pin!(stop);
    let mut stopped = false;
    loop {
        let until = async {
            match deadline {
                Some(d) => tokio::select! {
                    () = &mut stop => stopped = true,
                    () = tokio::time::sleep_until(d) => {}
                },
                None => {
                    (&mut stop).await;
                    stopped = true;
                }
            }
        };
        let fired = wait_for_trigger(
            client,
            &rule.trigger,
            started,
            counter_interval_seconds,
            until,
            hold.take(),
        )
        .await;
        let time = match fired {
            Ok(Some(time)) => time,
            Ok(None) => {
                if !stopped && deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                    states.update(&rule.name, |s| s.finish(Finish::RuleDuration));
                    report(RuleEvent::Finished);
                }
                return;
            }
            Err(error) => {
                tracing::warn!(rule = %rule.name, %error, "the rule's trigger failed");
                states.update(&rule.name, |s| s.finish(Finish::Failure(error.to_string())));
                report(RuleEvent::Finished);
                return;
            }
        };
        let run = states
            .update(&rule.name, |s| s.begin_action_execution(time))
            .unwrap_or(false);
        if run {
            report(RuleEvent::Triggered);
            let firing = Firing {
                rule: rule.name.clone(),
                time,
            };
            run_actions(rule, &firing, &mut execute).await;
            let done = states
                .update(&rule.name, |s| s.action_execution_completed())
                .unwrap_or(true);
            if done {
                report(RuleEvent::Finished);
                return;
            }
        } else {
            tracing::info!(rule = %rule.name, "collection rule throttled");
            report(RuleEvent::Throttled);
        }
        if rule.trigger == Trigger::Startup {
            states.update(&rule.name, |s| s.finish(Finish::Startup));
            report(RuleEvent::Finished);
            return;
        }
        if stopped {
            return;
        }
    }
}

/// Starts the actions in order, waiting where one asks for it, then waits for all; a failed
/// action is logged and does not stop the others.
async fn run_actions(
    rule: &CollectionRule,
    firing: &Firing,
    execute: &mut impl FnMut(&Action, &Firing) -> ActionFuture,
) {
    let mut running = JoinSet::new();
    for action in &rule.actions {
        let name = action.name.clone();
        let future = execute(action, firing);
        if action.wait_for_completion {
            log_outcome(&rule.name, &name, future.await);
        } else {
            running.spawn(async move { (name, future.await) });
        }
    }
    while let Some(joined) = running.join_next().await {
        match joined {
            Ok((name, outcome)) => log_outcome(&rule.name, &name, outcome),
            Err(error) => tracing::warn!(rule = %rule.name, %error, "an action task failed"),
        }
    }
}

fn log_outcome(rule: &str, action: &str, outcome: Result<(), String>) {
    match outcome {
        Ok(()) => tracing::info!(rule, action, "collection rule action completed"),
        Err(error) => tracing::warn!(rule, action, %error, "collection rule action failed"),
    }
}
