//! Collection rules on the attached processes: one task per applicable rule and process (its
//! trigger sessions and action list, [`collector::rules::engine`]), plus one pre-trigger ring
//! task per CollectTrace action with `PreTriggerSeconds`; artifacts go through egress with
//! dotnet-monitor's file names. The tasks end when the process exits (their sessions end) or the
//! agent stops; the process task aborts any left when it returns.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use collector::artifacts::{LiveMetricsRequest, TraceRequest};
use collector::attached::{AttachedProcesses, ProcessEventKind};
use collector::client::DiagnosticsClient;
use collector::counters::CounterSelection;
use collector::gcdump::SnapshotOptions;
use collector::local::LocalProcess;
use collector::providers::SessionProviders;
use collector::rules::capture::{self, CaptureRequest};
use collector::rules::engine::{self, ActionFuture, Firing, RuleEvent};
use collector::rules::options::{
    Action, ActionKind, CollectionRule, CounterSource, ProcessFacts, TraceSource, Trigger,
};
use collector::rules::ring::RingLimits;
use collector::rules::state::RuleStates;
use collector::sampler::SamplerControl;
use collector::signals::{ExceptionsRequest, LogsRequest, ProcessSignals};
use collector::startup::{ResumeHold, ResumeHolds};
use exporter::egress::{ArtifactOrigin, Egress, EgressError, RuleActionOrigin, Upload};
use ipc::CollectTracing;
use nettrace::ParserOptions;
use profile::artifact::ArtifactKind;
use store::incidents::{CauseKind, IncidentCause, IncidentProcess, Incidents};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use ui::artifacts::{Artifact, ArtifactSource};

use super::grace::StartupGrace;
use super::stopped;

/// Most bytes a pre-trigger ring holds per action (before the blocks in flight), within the
/// process's share of the signal budget.
pub const RING_BYTES: usize = 64 << 20;
/// Chunks of a capture in flight between the ring task and the upload.
const CAPTURE_CHUNKS: usize = 8;

/// The rules from settings.json and what their actions need.
#[derive(Debug, Clone)]
pub struct RuleSettings {
    pub rules: Vec<CollectionRule>,
    /// EventCounter and meter interval of trigger sessions (`GlobalCounter:IntervalSeconds`).
    pub counter_interval_seconds: u32,
    /// What CollectLiveMetrics without settings collects: the `Metrics` section.
    pub live_metrics: CounterSelection,
    /// Where rule artifacts go (shared with the API: one disk budget).
    pub egress: Egress,
    /// Limits of the parser that watches a rule's trace (`--nettrace-budget`), as the API's.
    pub parser: ParserOptions,
}

impl RuleSettings {
    /// Refuses rules whose actions name an egress provider that is not configured.
    pub fn check_egress(&self) -> anyhow::Result<()> {
        for rule in &self.rules {
            for action in &rule.actions {
                let Some(name) = action.kind.egress() else {
                    continue;
                };
                self.egress.check(name).with_context(|| {
                    format!("CollectionRules:{}: action {}", rule.name, action.name)
                })?;
            }
        }
        Ok(())
    }
}

/// One process as the rules see it.
pub struct RuleTarget<'a> {
    pub client: &'a DiagnosticsClient,
    pub pid: u64,
    /// The runtime's process on this machine, when proven (CollectStacks reads its `/proc`).
    pub local: Option<&'a LocalProcess>,
    pub runtime_cookie: &'a str,
    pub service_name: &'a str,
    pub facts: ProcessFacts<'a>,
    pub sampler: SamplerControl,
    pub states: RuleStates,
    pub signals: ProcessSignals,
    /// Sessions start once it ends: triggers and pre-trigger rings enable EventSources.
    pub grace: StartupGrace,
    /// A runtime waiting to be resumed until its sessions are enabled: `Startup` rules run at
    /// once, without the grace, and it waits for their traces' sessions.
    pub before_resume: Option<&'a ResumeHolds>,
}

/// Starts the rules that apply to `target`; the returned set owns their tasks.
pub fn start(
    settings: &RuleSettings,
    target: RuleTarget<'_>,
    processes: &AttachedProcesses,
    incidents: &Incidents,
    shutdown: &watch::Receiver<bool>,
) -> JoinSet<()> {
    let mut tasks = JoinSet::new();
    for rule in settings
        .rules
        .iter()
        .filter(|r| r.applies_to(&target.facts))
    {
        let mut captures = HashMap::new();
        for action in &rule.actions {
            let ActionKind::CollectTrace {
                source,
                pre_trigger: Some(pre_trigger),
                ..
            } = &action.kind
            else {
                continue;
            };
            let config = match session_config(source, settings.counter_interval_seconds) {
                Ok(config) => config,
                Err(error) => {
                    tracing::warn!(rule = %rule.name, action = %action.name, error = %crate::describe(&error), "no pre-trigger ring");
                    continue;
                }
            };
            let (requests, mut received) = mpsc::channel(1);
            captures.insert(action.name.clone(), requests);
            let limits = RingLimits {
                max_bytes: RING_BYTES,
                max_age: *pre_trigger + Duration::from_secs(5),
            };
            let client = target.client.clone();
            let stop = stopped(shutdown.clone());
            let (rule_name, pid) = (rule.name.clone(), target.pid);
            let grace = target.grace;
            let share = target.signals.share().clone();
            tasks.spawn(async move {
                let mut stop = std::pin::pin!(stop);
                if !grace.wait_or(&mut stop).await {
                    return;
                }
                let ring = capture::run_ring(&client, config, limits, &share, &mut received, stop);
                if let Err(error) = ring.await {
                    tracing::warn!(pid, rule = %rule_name, %error, "the pre-trigger ring stopped");
                }
            });
        }
        // A Startup rule on a runtime that waits: its first trace starts before the resume.
        let hold = target
            .before_resume
            .filter(|_| rule.trigger == Trigger::Startup && has_trace(rule))
            .and_then(ResumeHolds::hold);
        let context = Arc::new(ActionContext {
            client: target.client.clone(),
            pid: target.pid,
            runtime_cookie: target.runtime_cookie.to_string(),
            local: target.local.cloned(),
            sampler: target.sampler.clone(),
            egress: settings.egress.clone(),
            counter_interval_seconds: settings.counter_interval_seconds,
            live_metrics: settings.live_metrics.clone(),
            parser: settings.parser.clone(),
            captures,
            signals: target.signals.clone(),
            hold: std::sync::Mutex::new(None),
        });
        let rule = rule.clone();
        let client = target.client.clone();
        let states = target.states.clone();
        let processes = processes.clone();
        let incidents = incidents.clone();
        let process = IncidentProcess {
            pid: target.pid,
            service_name: target.service_name.to_string(),
        };
        let cookie = target.runtime_cookie.to_string();
        let interval = settings.counter_interval_seconds;
        let stop = stopped(shutdown.clone());
        let grace = target.grace;
        tracing::info!(pid = target.pid, rule = %rule.name, before_resume = hold.is_some(), "collection rule applied");
        tasks.spawn(async move {
            let mut stop = std::pin::pin!(stop);
            match hold {
                Some(hold) => context.hold_for_trace(hold),
                None if !grace.wait_or(&mut stop).await => return,
                None => {}
            }
            let execute = |action: &Action, firing: &Firing| -> ActionFuture {
                let context = context.clone();
                let index = rule.actions.iter().position(|a| a.name == action.name);
                let (action, firing) = (action.clone(), firing.clone());
                Box::pin(async move {
                    context
                        .run(&action, index.unwrap_or_default(), &firing)
                        .await
                        .map_err(|e| crate::describe(&e))
                })
            };
            let report = |event: RuleEvent| {
                let (kind, cause) = match event {
                    RuleEvent::Triggered => (
                        ProcessEventKind::CollectionRuleTriggered,
                        CauseKind::RuleTriggered,
                    ),
                    RuleEvent::Throttled => (
                        ProcessEventKind::CollectionRuleThrottled,
                        CauseKind::RuleThrottled,
                    ),
                    RuleEvent::Finished => return,
                };
                processes.record_rule_event(&cookie, kind, &rule.name);
                let unix_ms = profile::clock::unix_millis();
                let (trigger, judged) = trigger_summary(&rule.trigger, interval);
                let judged_ms = judged.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
                record_incident(
                    &incidents,
                    IncidentCause {
                        unix_ms,
                        kind: cause,
                        rule: Some(rule.name.clone()),
                        note: None,
                        trigger: Some(trigger),
                        trigger_from_unix_ms: judged_ms.map(|ms| unix_ms.saturating_sub(ms)),
                        processes: vec![process.clone()],
                    },
                );
            };
            engine::run_rule(
                &client, &rule, &states, interval, execute, report, stop, None,
            )
            .await;
        });
    }
    tasks
}

/// `trigger` as an incident's cause shows it, and how far back what satisfied it reaches: its
/// sliding window, and for counters also the interval the first value it judged averages.
fn trigger_summary(trigger: &Trigger, counter_interval_seconds: u32) -> (String, Option<Duration>) {
    match trigger {
        Trigger::Startup => ("Startup".into(), None),
        Trigger::Schedule(_) => ("Schedule".into(), None),
        Trigger::AspNetRequestCount {
            request_count,
            window,
            ..
        } => (
            format!("AspNetRequestCount: {request_count} requests within {window:?}"),
            Some(*window),
        ),
        Trigger::AspNetRequestDuration {
            request_count,
            request_duration,
            window,
            ..
        } => (
            format!(
                "AspNetRequestDuration: {request_count} requests of {request_duration:?} or more within {window:?}"
            ),
            Some(*window),
        ),
        Trigger::AspNetResponseStatus {
            status_codes,
            response_count,
            window,
            ..
        } => {
            let codes: Vec<String> = status_codes
                .iter()
                .map(|(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") })
                .collect();
            (
                format!(
                    "AspNetResponseStatus: {response_count} responses {} within {window:?}",
                    codes.join(",")
                ),
                Some(*window),
            )
        }
        Trigger::Threshold(t) => {
            let source = match &t.source {
                CounterSource::EventCounter { provider, counter } => format!("{provider}/{counter}"),
                CounterSource::Meter {
                    meter,
                    instrument,
                    percentile,
                } => match percentile {
                    Some(p) => format!("{meter}/{instrument} p{p}"),
                    None => format!("{meter}/{instrument}"),
                },
            };
            let mut bounds = Vec::new();
            if let Some(g) = t.greater_than {
                bounds.push(format!("> {g}"));
            }
            if let Some(l) = t.less_than {
                bounds.push(format!("< {l}"));
            }
            let interval = Duration::from_secs(u64::from(counter_interval_seconds.max(1)));
            (
                format!("{source} {} throughout {:?}", bounds.join(" and "), t.window),
                Some(t.window + interval),
            )
        }
    }
}

/// Records `cause` in the store's incidents on the blocking pool (the file is fsynced), so
/// the rule's task goes on at once; a failure is logged (the firing is in the event history).
fn record_incident(incidents: &Incidents, cause: IncidentCause) {
    let incidents = incidents.clone();
    tokio::task::spawn_blocking(move || match incidents.record(cause) {
        Ok(incident) => {
            tracing::info!(incident = incident.id, rules = ?incident.rules, "incident recorded")
        }
        Err(error) => tracing::warn!(%error, "cannot record the incident"),
    });
}

/// Whether a rule collects a trace of its own (not from a pre-trigger ring).
fn has_trace(rule: &CollectionRule) -> bool {
    rule.actions.iter().any(|a| {
        matches!(
            a.kind,
            ActionKind::CollectTrace {
                pre_trigger: None,
                ..
            }
        )
    })
}

/// The session a CollectTrace action's providers make.
fn session_config(source: &TraceSource, counter_interval: u32) -> anyhow::Result<CollectTracing> {
    let request = trace_request(source, counter_interval)?;
    Ok(CollectTracing::v2(request.session.providers.clone())
        .with_rundown_keyword(request.session.rundown_keyword)
        .with_circular_buffer_mb(request.buffer_mb))
}

fn trace_request(source: &TraceSource, counter_interval: u32) -> anyhow::Result<TraceRequest> {
    Ok(match source {
        TraceSource::Profiles(profiles) => TraceRequest::profiles(profiles, counter_interval)?,
        TraceSource::Providers {
            providers,
            request_rundown,
            buffer_mb,
        } => {
            let mut session = SessionProviders::default();
            for p in providers {
                session.add(p.clone())?;
            }
            if *request_rundown {
                session.rundown_keyword = ipc::DEFAULT_RUNDOWN_KEYWORD;
            }
            let mut request = TraceRequest::new(session)?;
            request.buffer_mb = *buffer_mb;
            request
        }
    })
}

/// The action being run, its place in its rule's list, and the firing that started it.
struct By<'a> {
    action: &'a Action,
    index: usize,
    firing: &'a Firing,
}

/// What a rule's actions on one process share.
struct ActionContext {
    client: DiagnosticsClient,
    pid: u64,
    runtime_cookie: String,
    local: Option<LocalProcess>,
    sampler: SamplerControl,
    egress: Egress,
    counter_interval_seconds: u32,
    live_metrics: CounterSelection,
    parser: ParserOptions,
    /// Pre-trigger rings by action name.
    captures: HashMap<String, mpsc::Sender<CaptureRequest>>,
    /// The process's logs, for CollectLogs.
    signals: ProcessSignals,
    /// The runtime waits for the first trace's session (a `Startup` rule before the resume).
    hold: std::sync::Mutex<Option<ResumeHold>>,
}

impl ActionContext {
    fn hold_for_trace(&self, hold: ResumeHold) {
        *self.hold.lock().unwrap_or_else(|p| p.into_inner()) = Some(hold);
    }

    /// The hold of a runtime waiting for this trace, once.
    fn take_hold(&self) -> Option<ResumeHold> {
        self.hold.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Collects `artifact` into the egress provider `egress`, named for the time of the firing.
    async fn collect(&self, artifact: Artifact, egress: &str, by: &By<'_>) -> anyhow::Result<()> {
        let hold = matches!(artifact, Artifact::Trace(_))
            .then(|| self.take_hold())
            .flatten();
        let mut upload = self.upload(egress, artifact.kind(), by).await?;
        let source = ArtifactSource {
            client: &self.client,
            pid: self.pid,
            local: self.local.as_ref(),
        };
        let written = artifact
            .write(source, &mut upload, std::future::pending(), hold)
            .await;
        match upload.conclude(written).await {
            Ok(_) => Ok(()),
            // Not a failure: e.g. CollectExceptions while the app threw none.
            Err(EgressError::Empty) => {
                tracing::info!(pid = self.pid, rule = %by.firing.rule, action = %by.action.name, "the action collected nothing: no artifact written");
                Ok(())
            }
            Err(error) => Err(error.into()),
        }
    }

    async fn upload(
        &self,
        egress: &str,
        kind: ArtifactKind,
        by: &By<'_>,
    ) -> anyhow::Result<Upload> {
        let mut origin = ArtifactOrigin {
            pid: self.pid,
            runtime_cookie: Some(self.runtime_cookie.clone()),
            rule: Some(RuleActionOrigin {
                rule: by.firing.rule.clone(),
                action_index: by.index,
                action: by.action.name.clone(),
            }),
            environment: Vec::new(),
        };
        if self.egress.needs_environment(egress) {
            origin.environment = self.client.environment().await.unwrap_or_else(|error| {
                tracing::warn!(pid = self.pid, %error, "cannot read the environment for blob metadata");
                Vec::new()
            });
        }
        let name = kind.file_name(self.pid, by.firing.time);
        Ok(self.egress.start(egress, &name, &origin)?)
    }

    async fn run(&self, action: &Action, index: usize, firing: &Firing) -> anyhow::Result<()> {
        let by = By {
            action,
            index,
            firing,
        };
        match &action.kind {
            ActionKind::CollectTrace {
                source,
                duration,
                egress,
                stopping_event,
                pre_trigger,
            } => match (pre_trigger, self.captures.get(&action.name)) {
                (Some(pre), Some(ring)) => {
                    let upload = self.upload(egress, ArtifactKind::Trace, &by).await?;
                    self.capture(upload, ring, firing.time, *pre, *duration)
                        .await
                }
                _ => {
                    let request = trace_request(source, self.counter_interval_seconds)?
                        .with_parser(self.parser.clone())
                        .with_duration(Some(*duration))
                        .with_stopping_event(stopping_event.clone());
                    self.collect(Artifact::Trace(request), egress, &by).await
                }
            },
            ActionKind::CollectGCDump { egress } => {
                let artifact = Artifact::GcDump(SnapshotOptions::default());
                self.collect(artifact, egress, &by).await
            }
            ActionKind::CollectDump { dump_type, egress } => {
                let artifact = Artifact::Dump {
                    kind: *dump_type,
                    temp_dir: std::env::temp_dir(),
                };
                self.collect(artifact, egress, &by).await
            }
            ActionKind::CollectStacks { format, egress } => {
                self.collect(Artifact::Stacks(*format), egress, &by).await
            }
            ActionKind::CollectLogs {
                settings,
                format,
                duration,
                egress,
                pre_trigger,
            } => {
                let request = LogsRequest {
                    signals: self.signals.clone(),
                    settings: settings.clone(),
                    format: *format,
                    duration: Some(*duration),
                    before: *pre_trigger + firing.time.elapsed().unwrap_or_default(),
                };
                self.collect(Artifact::Logs(request), egress, &by).await
            }
            ActionKind::CollectExceptions {
                filters,
                format,
                egress,
            } => {
                let request = ExceptionsRequest {
                    signals: self.signals.clone(),
                    filters: filters.clone(),
                    format: *format,
                };
                self.collect(Artifact::Exceptions(request), egress, &by)
                    .await
            }
            ActionKind::CollectLiveMetrics {
                metrics,
                duration,
                egress,
            } => {
                let selection = match metrics {
                    Some(config) => config.selection(self.counter_interval_seconds),
                    None => self.live_metrics.clone(),
                };
                let request = LiveMetricsRequest {
                    selection,
                    duration: Some(*duration),
                    share: self.signals.share().clone(),
                };
                self.collect(Artifact::LiveMetrics(request), egress, &by)
                    .await
            }
            ActionKind::Execute {
                path,
                arguments,
                ignore_exit_code,
            } => {
                let args = split_arguments(arguments.as_deref().unwrap_or_default());
                let status = tokio::process::Command::new(path)
                    .args(&args)
                    .kill_on_drop(true)
                    .status()
                    .await
                    .with_context(|| format!("starting {path}"))?;
                anyhow::ensure!(
                    status.success() || *ignore_exit_code,
                    "{path} exited with {status} (set IgnoreExitCode to accept that)"
                );
                Ok(())
            }
            ActionKind::RaiseSamplingRate { duration } => {
                self.sampler.boost(*duration);
                Ok(())
            }
        }
    }

    /// A trace from the pre-trigger ring: from `pre` before the trigger, `duration` on.
    async fn capture(
        &self,
        mut upload: Upload,
        ring: &mpsc::Sender<CaptureRequest>,
        trigger: SystemTime,
        pre: Duration,
        duration: Duration,
    ) -> anyhow::Result<()> {
        let from = trigger
            .checked_sub(pre)
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        let (chunks, mut received) = mpsc::channel(CAPTURE_CHUNKS);
        let (reply, outcome) = tokio::sync::oneshot::channel();
        ring.send(CaptureRequest {
            from_unix_nanos: from,
            duration,
            out: chunks,
            reply,
        })
        .await
        .map_err(|_| anyhow::anyhow!("the pre-trigger ring has stopped"))?;
        let copied = async {
            while let Some(chunk) = received.recv().await {
                upload.write_all(&chunk).await?;
            }
            Ok::<_, std::io::Error>(())
        }
        .await;
        let summary = outcome
            .await
            .map_err(|_| anyhow::anyhow!("the pre-trigger ring stopped during the capture"))
            .and_then(|r| r.map_err(anyhow::Error::from));
        match (copied, summary) {
            (Ok(()), Ok(summary)) => {
                let location = upload.finish().await?;
                let reach = summary
                    .first_event_unix_nanos
                    .map(|first| (from as f64 - first as f64) / -1e9);
                tracing::info!(pid = self.pid, %location, bytes = summary.bytes, starts_after_cut_s = ?reach, "pre-trigger trace written");
                Ok(())
            }
            (copied, summary) => {
                let _ = upload.abort().await;
                copied?;
                summary.map(|_| ())
            }
        }
    }
}

/// Splits Execute's `Arguments` like a command line: whitespace separates, double quotes group.
fn split_arguments(text: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in text.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    args.push(std::mem::take(&mut current));
                    any = false;
                }
            }
            c => {
                current.push(c);
                any = true;
            }
        }
    }
    if any {
        args.push(current);
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_split_like_a_command_line() {
        assert_eq!(
            split_arguments(r#"-c "echo a b"  x "" "#),
            ["-c", "echo a b", "x", ""]
        );
        assert!(split_arguments("  ").is_empty());
    }
}
