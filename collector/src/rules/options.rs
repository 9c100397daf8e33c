//! The `CollectionRules` and `CollectionRuleDefaults` sections, read as dotnet-monitor reads them
//! (its `CollectionRules/Options/**` classes): the same keys, defaults, bounds and required
//! settings, plus clrscope's `PreTriggerSeconds` (CollectTrace) and `RaiseSamplingRate` action.
//!
//! The sections deserialize as they are ([`CollectionRulesSection`],
//! [`CollectionRuleDefaultsSection`]); [`compile`] checks them together, since a default may
//! supply a setting a rule leaves out, and yields the [`CollectionRule`]s the engine runs.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::config::{ConfigError, Node};
use super::schedule::Schedule;
use crate::artifacts::{
    DumpKind, EventMetricsConfiguration, EventMetricsMeter, EventMetricsProvider,
    EventPipeProvider, StackFormat, StoppingEvent,
};
use crate::providers::TraceProfile;
use crate::signals::{
    ExceptionFilter, ExceptionFormat, ExceptionsFilters, LogFormat, LogsSettings,
};
use ipc::ProviderConfig;
use profile::log::LogLevel;

const SECOND: Duration = Duration::from_secs(1);
const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);

/// dotnet-monitor's `CollectionRuleLimitsOptionsDefaults.ActionCount`.
pub const DEFAULT_ACTION_COUNT: u32 = 5;
/// Triggers' `SlidingWindowDuration` default.
pub const DEFAULT_SLIDING_WINDOW: Duration = MINUTE;
/// AspNetRequestDuration's `RequestDuration` default.
pub const DEFAULT_REQUEST_DURATION: Duration = Duration::from_secs(5);
/// CollectTrace's `Duration` default.
pub const DEFAULT_TRACE_DURATION: Duration = Duration::from_secs(30);
/// RaiseSamplingRate's `Duration` default.
pub const DEFAULT_BOOST_DURATION: Duration = MINUTE;
/// The longest `PreTriggerSeconds`: the ring buffer holds at most this much history.
pub const MAX_PRE_TRIGGER: Duration = Duration::from_secs(300);

/// The `CollectionRules` section as written: rule name → its settings, checked by [`compile`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(transparent)]
pub struct CollectionRulesSection(pub BTreeMap<String, Value>);

/// The `CollectionRuleDefaults` section as written (`Actions`, `Triggers`, `Limits`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(transparent)]
pub struct CollectionRuleDefaultsSection(pub Value);

/// One checked rule.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectionRule {
    pub name: String,
    /// All must match (none: every process).
    pub filters: Vec<ProcessFilter>,
    pub trigger: Trigger,
    pub actions: Vec<Action>,
    pub limits: Limits,
}

/// Which process facts a filter looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterKey {
    ProcessId,
    ProcessName,
    CommandLine,
    ManagedEntryPointAssemblyName,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessFilter {
    pub key: FilterKey,
    pub value: String,
    /// `Contains` instead of `Exact`; both ignore case.
    pub contains: bool,
}

/// What filters compare against.
#[derive(Debug, Clone, Copy)]
pub struct ProcessFacts<'a> {
    pub pid: u64,
    /// The executable's name (`dotnet` for a framework-dependent app), as dotnet-monitor's
    /// `ProcessName` is.
    pub name: &'a str,
    pub command_line: &'a str,
    pub managed_entry_point_assembly_name: &'a str,
}

impl ProcessFilter {
    pub fn matches(&self, p: &ProcessFacts<'_>) -> bool {
        let pid = p.pid.to_string();
        let fact = match self.key {
            FilterKey::ProcessId => pid.as_str(),
            FilterKey::ProcessName => p.name,
            FilterKey::CommandLine => p.command_line,
            FilterKey::ManagedEntryPointAssemblyName => p.managed_entry_point_assembly_name,
        };
        let (fact, value) = (fact.to_lowercase(), self.value.to_lowercase());
        if self.contains {
            fact.contains(&value)
        } else {
            fact == value
        }
    }
}

impl CollectionRule {
    /// Whether the rule applies to this process (every filter matches).
    pub fn applies_to(&self, process: &ProcessFacts<'_>) -> bool {
        self.filters.iter().all(|f| f.matches(process))
    }
}

/// Request path filters: `**/` spans segments, `*` stays within one; exclusions win.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathFilter {
    pub include: Vec<String>,
    pub exclude: Vec<String>,
}

impl PathFilter {
    pub fn matches(&self, path: &str) -> bool {
        (self.include.is_empty() || self.include.iter().any(|g| glob_match(g, path)))
            && !self.exclude.iter().any(|g| glob_match(g, path))
    }
}

/// dotnet-monitor's GlobMatcher: case-insensitive, `**/` = any number of whole segments,
/// `*` = any characters but `/`, `?` = one character but `/`.
fn glob_match(pattern: &str, text: &str) -> bool {
    fn go(p: &[u8], t: &[u8]) -> bool {
        match p {
            [] => t.is_empty(),
            [b'*', b'*', b'/', rest @ ..] => {
                go(rest, t)
                    || t.iter()
                        .enumerate()
                        .filter(|(_, &c)| c == b'/')
                        .any(|(i, _)| go(rest, &t[i + 1..]))
            }
            [b'*', rest @ ..] => (0..=t.len())
                .take_while(|&i| i == 0 || t[i - 1] != b'/')
                .any(|i| go(rest, &t[i..])),
            [b'?', rest @ ..] => matches!(t, [c, ..] if *c != b'/') && go(rest, &t[1..]),
            [c, rest @ ..] => {
                matches!(t, [d, ..] if d.eq_ignore_ascii_case(c)) && go(rest, &t[1..])
            }
        }
    }
    go(pattern.as_bytes(), text.as_bytes())
}

/// What makes a rule fire.
#[derive(Debug, Clone, PartialEq)]
pub enum Trigger {
    /// Fires once, as soon as the rule is applied.
    Startup,
    /// Fires on a schedule (clrscope's own): every interval, or at a cron expression's times.
    Schedule(Schedule),
    /// `RequestCount` requests started within the window.
    AspNetRequestCount {
        request_count: u32,
        window: Duration,
        paths: PathFilter,
    },
    /// `RequestCount` requests took at least `RequestDuration` (or still run after it) within
    /// the window.
    AspNetRequestDuration {
        request_count: u32,
        request_duration: Duration,
        window: Duration,
        paths: PathFilter,
    },
    /// `ResponseCount` responses with one of the status codes within the window.
    AspNetResponseStatus {
        /// Inclusive ranges.
        status_codes: Vec<(u16, u16)>,
        response_count: u32,
        window: Duration,
        paths: PathFilter,
    },
    /// A counter or instrument stays beyond a threshold for the window (EventCounter,
    /// EventMeter, CPUUsage, GCHeapSize, ThreadpoolQueueLength).
    Threshold(ThresholdTrigger),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ThresholdTrigger {
    pub source: CounterSource,
    /// Strictly greater than (dotnet-monitor compares strictly, whatever its docs say).
    pub greater_than: Option<f64>,
    /// Strictly less than.
    pub less_than: Option<f64>,
    pub window: Duration,
}

impl ThresholdTrigger {
    pub fn passes(&self, value: f64) -> bool {
        self.greater_than.is_none_or(|g| value > g) && self.less_than.is_none_or(|l| value < l)
    }
}

/// Which published value a threshold trigger watches.
#[derive(Debug, Clone, PartialEq)]
pub enum CounterSource {
    EventCounter {
        provider: String,
        counter: String,
    },
    Meter {
        meter: String,
        instrument: String,
        /// For histograms: which published percentile (50, 95, 99 by default).
        percentile: Option<u32>,
    },
}

/// The action list's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub action_count: u32,
    /// Count executions within this window (throttling); none: over the rule's whole life
    /// (the rule finishes at the count).
    pub action_count_window: Option<Duration>,
    /// The rule stops after this long.
    pub rule_duration: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            action_count: DEFAULT_ACTION_COUNT,
            action_count_window: None,
            rule_duration: None,
        }
    }
}

/// One entry of a rule's action list.
#[derive(Debug, Clone, PartialEq)]
pub struct Action {
    /// `Name`, or `ActionN` by position as dotnet-monitor names unnamed actions.
    pub name: String,
    /// Wait for it before starting the next action.
    pub wait_for_completion: bool,
    pub kind: ActionKind,
}

/// Where a trace's events come from.
#[derive(Debug, Clone, PartialEq)]
pub enum TraceSource {
    Profiles(Vec<TraceProfile>),
    Providers {
        providers: Vec<ProviderConfig>,
        request_rundown: bool,
        buffer_mb: u32,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum ActionKind {
    CollectTrace {
        source: TraceSource,
        duration: Duration,
        egress: String,
        stopping_event: Option<StoppingEvent>,
        /// clrscope: the trace starts this long before the trigger (from the ring buffer).
        pre_trigger: Option<Duration>,
    },
    CollectGCDump {
        egress: String,
    },
    CollectDump {
        dump_type: DumpKind,
        egress: String,
    },
    CollectStacks {
        format: StackFormat,
        egress: String,
    },
    /// The process's log messages for `duration`, from the agent's own collection of them.
    CollectLogs {
        settings: LogsSettings,
        format: LogFormat,
        duration: Duration,
        egress: String,
        /// clrscope: also the messages of this long before the trigger (kept by the agent).
        pre_trigger: Duration,
    },
    /// Counter and meter values as published, for `duration`.
    CollectLiveMetrics {
        /// `IncludeDefaultProviders`, `Providers`, `Meters`; `None` when none is set: the
        /// agent's `Metrics` section then says what to collect (as dotnet-monitor ≥ 8).
        metrics: Option<EventMetricsConfiguration>,
        duration: Duration,
        egress: String,
    },
    /// The process's kept first-chance exceptions at the firing (thrown before it, up to
    /// `--exception-history`), filtered.
    CollectExceptions {
        filters: ExceptionsFilters,
        format: ExceptionFormat,
        egress: String,
    },
    Execute {
        path: String,
        arguments: Option<String>,
        ignore_exit_code: bool,
    },
    /// clrscope: the continuous sampler samples without pause for `duration`.
    RaiseSamplingRate {
        duration: Duration,
    },
}

impl ActionKind {
    /// The `Type` it is configured with.
    pub fn type_name(&self) -> &'static str {
        match self {
            ActionKind::CollectTrace { .. } => "CollectTrace",
            ActionKind::CollectGCDump { .. } => "CollectGCDump",
            ActionKind::CollectDump { .. } => "CollectDump",
            ActionKind::CollectStacks { .. } => "CollectStacks",
            ActionKind::CollectLogs { .. } => "CollectLogs",
            ActionKind::CollectLiveMetrics { .. } => "CollectLiveMetrics",
            ActionKind::CollectExceptions { .. } => "CollectExceptions",
            ActionKind::Execute { .. } => "Execute",
            ActionKind::RaiseSamplingRate { .. } => "RaiseSamplingRate",
        }
    }

    /// The egress provider it writes to, if it writes an artifact.
    pub fn egress(&self) -> Option<&str> {
        match self {
            ActionKind::CollectTrace { egress, .. }
            | ActionKind::CollectGCDump { egress }
            | ActionKind::CollectDump { egress, .. }
            | ActionKind::CollectStacks { egress, .. }
            | ActionKind::CollectLogs { egress, .. }
            | ActionKind::CollectLiveMetrics { egress, .. } => Some(egress),
            ActionKind::CollectExceptions { egress, .. } => Some(egress),
            ActionKind::Execute { .. } | ActionKind::RaiseSamplingRate { .. } => None,
        }
    }
}

/// What `CollectionRuleDefaults` supplies.
struct Defaults<'a> {
    egress: Option<String>,
    sliding_window: Option<Duration>,
    request_count: Option<u32>,
    response_count: Option<u32>,
    limits: Option<Node<'a>>,
}

/// Checks every rule against dotnet-monitor's schema, with `defaults` filling in what rules
/// leave out. The first problem is reported with its key path.
pub fn compile(
    rules: &CollectionRulesSection,
    defaults: &CollectionRuleDefaultsSection,
) -> Result<Vec<CollectionRule>, ConfigError> {
    let defaults_root = Node::new(&defaults.0, "CollectionRuleDefaults");
    let actions = defaults_root.get("Actions");
    let triggers = defaults_root.get("Triggers");
    let limits = defaults_root.get("Limits");
    let opt_count = |key: &str| -> Result<Option<u32>, ConfigError> {
        triggers
            .as_ref()
            .and_then(|t| t.node().get(key))
            .map(|c| c.node().integer(1, i64::from(i32::MAX)).map(|n| n as u32))
            .transpose()
    };
    let d = Defaults {
        egress: actions
            .as_ref()
            .and_then(|a| a.node().get("Egress"))
            .map(|c| c.node().string())
            .transpose()?,
        sliding_window: triggers
            .as_ref()
            .and_then(|t| t.node().get("SlidingWindowDuration"))
            .map(|c| c.node().timespan(SECOND, DAY))
            .transpose()?,
        request_count: opt_count("RequestCount")?,
        response_count: opt_count("ResponseCount")?,
        limits: limits.as_ref().map(|l| l.node()),
    };
    rules
        .0
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(name, value)| {
            let path = format!("CollectionRules:{name}");
            compile_rule(name, Node::new(value, &path), &d)
        })
        .collect()
}

fn compile_rule(
    name: &str,
    rule: Node<'_>,
    d: &Defaults<'_>,
) -> Result<CollectionRule, ConfigError> {
    rule.object()?;
    let filters = match rule.get("Filters") {
        Some(f) => f
            .node()
            .list()?
            .iter()
            .map(|c| filter(c.node()))
            .collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    let trigger_child = rule
        .get("Trigger")
        .ok_or_else(|| rule.error("a rule needs a Trigger (Type and Settings)"))?;
    let trigger = trigger(trigger_child.node(), d)?;
    let actions = match rule.get("Actions") {
        Some(a) => a
            .node()
            .list()?
            .iter()
            .enumerate()
            .map(|(i, c)| action(c.node(), i, d))
            .collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };
    let mut names = std::collections::HashSet::new();
    for a in &actions {
        if !names.insert(a.name.to_lowercase()) {
            return Err(rule.error(format!("two actions are named {:?}", a.name)));
        }
    }
    let mut limits = Limits::default();
    for source in [d.limits, rule.get("Limits").as_ref().map(|c| c.node())]
        .into_iter()
        .flatten()
    {
        read_limits(source, &mut limits)?;
    }
    Ok(CollectionRule {
        name: name.to_string(),
        filters,
        trigger,
        actions,
        limits,
    })
}

fn read_limits(node: Node<'_>, limits: &mut Limits) -> Result<(), ConfigError> {
    node.object()?;
    if let Some(c) = node.get("ActionCount") {
        limits.action_count = c.node().integer(1, i64::from(i32::MAX))? as u32;
    }
    if let Some(c) = node.get("ActionCountSlidingWindowDuration") {
        limits.action_count_window = Some(c.node().timespan(SECOND, DAY)?);
    }
    if let Some(c) = node.get("RuleDuration") {
        limits.rule_duration = Some(c.node().timespan(SECOND, 365 * DAY)?);
    }
    Ok(())
}

const FILTER_KEYS: [(&str, FilterKey); 4] = [
    ("ProcessId", FilterKey::ProcessId),
    ("ProcessName", FilterKey::ProcessName),
    ("CommandLine", FilterKey::CommandLine),
    (
        "ManagedEntryPointAssemblyName",
        FilterKey::ManagedEntryPointAssemblyName,
    ),
];

fn filter(node: Node<'_>) -> Result<ProcessFilter, ConfigError> {
    let contains = match node.get("MatchType") {
        None => false,
        Some(c) => c.node().one_of(&[("Exact", false), ("Contains", true)])?,
    };
    if let Some(v) = node.get("Value") {
        let key = match node.get("Key") {
            None => FilterKey::ProcessId,
            Some(k) => k.node().one_of(&FILTER_KEYS)?,
        };
        return Ok(ProcessFilter {
            key,
            value: v.node().string()?,
            contains,
        });
    }
    // The shorthand `{ "ProcessName": "x" }`.
    FILTER_KEYS
        .iter()
        .find_map(|(name, key)| {
            node.get(name).map(|v| {
                Ok(ProcessFilter {
                    key: *key,
                    value: v.node().string()?,
                    contains,
                })
            })
        })
        .unwrap_or_else(|| {
            Err(node.error(
                "a filter needs Key and Value, or one of ProcessId, ProcessName, CommandLine, \
                 ManagedEntryPointAssemblyName",
            ))
        })
}

/// The trigger's `Settings` (an absent one reads as empty).
fn settings(trigger: Node<'_>) -> Result<(Value, String), ConfigError> {
    match trigger.get("Settings") {
        Some(c) => {
            c.node().object()?;
            Ok((c.value.clone(), c.path))
        }
        None => Ok((
            Value::Object(Default::default()),
            format!("{}:Settings", trigger.path()),
        )),
    }
}

fn trigger(node: Node<'_>, d: &Defaults<'_>) -> Result<Trigger, ConfigError> {
    let ty = node
        .get("Type")
        .ok_or_else(|| node.error("a trigger needs a Type"))?
        .node()
        .string()?;
    let (value, path) = settings(node)?;
    let s = Node::new(&value, &path);
    let window = |s: Node<'_>| -> Result<Duration, ConfigError> {
        match s.get("SlidingWindowDuration") {
            Some(c) => c.node().timespan(SECOND, DAY),
            None => Ok(d.sliding_window.unwrap_or(DEFAULT_SLIDING_WINDOW)),
        }
    };
    let count = |s: Node<'_>, key: &str, default: Option<u32>| -> Result<u32, ConfigError> {
        match s.get(key) {
            Some(c) => Ok(c.node().integer(1, i64::from(i32::MAX))? as u32),
            None => default.ok_or_else(|| {
                s.error(format!(
                    "{key} is required (here or in CollectionRuleDefaults:Triggers:{key})"
                ))
            }),
        }
    };
    let paths = |s: Node<'_>| -> Result<PathFilter, ConfigError> {
        let list = |key| -> Result<Vec<String>, ConfigError> {
            s.get(key).map_or(Ok(Vec::new()), |c| c.node().strings())
        };
        Ok(PathFilter {
            include: list("IncludePaths")?,
            exclude: list("ExcludePaths")?,
        })
    };
    let threshold = |s: Node<'_>,
                     source: CounterSource,
                     default_greater: Option<f64>,
                     range: Option<(f64, f64)>|
     -> Result<Trigger, ConfigError> {
        let bound = |key: &str| -> Result<Option<f64>, ConfigError> {
            let Some(c) = s.get(key) else { return Ok(None) };
            let v = c.node().f64()?;
            if let Some((lo, hi)) = range {
                if !(lo..=hi).contains(&v) {
                    return Err(c
                        .node()
                        .error(format!("must be between {lo} and {hi}, got {v}")));
                }
            }
            Ok(Some(v))
        };
        let less_than = bound("LessThan")?;
        // A shortcut's GreaterThan default applies only when LessThan is not set.
        let greater_than = bound("GreaterThan")?.or(if less_than.is_none() {
            default_greater
        } else {
            None
        });
        match (greater_than, less_than) {
            (None, None) => return Err(s.error("GreaterThan or LessThan is required")),
            (Some(g), Some(l)) if l < g => {
                return Err(s.error(format!(
                    "GreaterThan ({g}) must be less than LessThan ({l})"
                )))
            }
            _ => {}
        }
        Ok(Trigger::Threshold(ThresholdTrigger {
            source,
            greater_than,
            less_than,
            window: window(s)?,
        }))
    };
    let required = |s: Node<'_>, key: &str| -> Result<String, ConfigError> {
        let v = s
            .get(key)
            .ok_or_else(|| s.error(format!("{key} is required")))?
            .node()
            .string()?;
        if v.is_empty() {
            return Err(s.error(format!("{key} must not be empty")));
        }
        Ok(v)
    };
    let runtime = |counter: &str| CounterSource::EventCounter {
        provider: "System.Runtime".into(),
        counter: counter.into(),
    };
    Ok(match ty.to_ascii_lowercase().as_str() {
        "startup" => Trigger::Startup,
        "schedule" => {
            let interval = s
                .get("Interval")
                .map(|c| c.node().timespan(SECOND, 31 * DAY))
                .transpose()?;
            let cron = s.get("Cron");
            match (interval, cron) {
                (Some(interval), None) => Trigger::Schedule(Schedule::Every(interval)),
                (None, Some(c)) => {
                    let expression = c.node().string()?;
                    let schedule = Schedule::cron(&expression).map_err(|reason| {
                        c.node().error(format!(
                            "{expression:?} is not a cron expression (minute hour day-of-month \
                             month day-of-week, in UTC, optionally with seconds first): {reason}"
                        ))
                    })?;
                    Trigger::Schedule(schedule)
                }
                _ => {
                    return Err(s.error(
                        "a Schedule trigger needs exactly one of Interval (e.g. \"01:00:00\") \
                         and Cron (e.g. \"*/15 * * * *\", in UTC)",
                    ))
                }
            }
        }
        "aspnetrequestcount" => Trigger::AspNetRequestCount {
            request_count: count(s, "RequestCount", d.request_count)?,
            window: window(s)?,
            paths: paths(s)?,
        },
        "aspnetrequestduration" => Trigger::AspNetRequestDuration {
            request_count: count(s, "RequestCount", d.request_count)?,
            request_duration: match s.get("RequestDuration") {
                Some(c) => c.node().timespan(Duration::ZERO, HOUR)?,
                None => DEFAULT_REQUEST_DURATION,
            },
            window: window(s)?,
            paths: paths(s)?,
        },
        "aspnetresponsestatus" => {
            let codes = s
                .get("StatusCodes")
                .ok_or_else(|| s.error("StatusCodes is required (e.g. [\"500-599\"])"))?;
            let ranges = codes
                .node()
                .strings()?
                .iter()
                .map(|text| {
                    status_range(text).ok_or_else(|| {
                        codes.node().error(format!(
                            "a status code is 100-599 or a range like 400-499, got {text:?}"
                        ))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            if ranges.is_empty() {
                return Err(codes.node().error("at least one status code is required"));
            }
            Trigger::AspNetResponseStatus {
                status_codes: ranges,
                response_count: count(s, "ResponseCount", d.response_count)?,
                window: window(s)?,
                paths: paths(s)?,
            }
        }
        "eventcounter" => {
            let source = CounterSource::EventCounter {
                provider: required(s, "ProviderName")?,
                counter: required(s, "CounterName")?,
            };
            threshold(s, source, None, None)?
        }
        "eventmeter" => {
            let percentile = s
                .get("HistogramPercentile")
                .map(|c| c.node().integer(0, 100).map(|p| p as u32))
                .transpose()?;
            let source = CounterSource::Meter {
                meter: required(s, "MeterName")?,
                instrument: required(s, "InstrumentName")?,
                percentile,
            };
            threshold(s, source, None, None)?
        }
        "cpuusage" => threshold(s, runtime("cpu-usage"), Some(50.0), Some((0.0, 100.0)))?,
        "gcheapsize" => threshold(s, runtime("gc-heap-size"), Some(10.0), None)?,
        "threadpoolqueuelength" => {
            threshold(s, runtime("threadpool-queue-length"), Some(200.0), None)?
        }
        _ => {
            return Err(node.error(format!(
                "unknown trigger Type {ty:?}; known: Startup, Schedule, AspNetRequestCount, \
                 AspNetRequestDuration, AspNetResponseStatus, EventCounter, EventMeter, CPUUsage, \
                 GCHeapSize, ThreadpoolQueueLength"
            )))
        }
    })
}

/// `"500"` or `"400-499"`, each code 100–599.
fn status_range(text: &str) -> Option<(u16, u16)> {
    let code = |s: &str| -> Option<u16> {
        let s = s.trim();
        (s.len() == 3)
            .then(|| s.parse().ok())
            .flatten()
            .filter(|c| (100..600).contains(c))
    };
    match text.split_once('-') {
        Some((a, b)) => {
            let (a, b) = (code(a)?, code(b)?);
            (a <= b).then_some((a, b))
        }
        None => code(text).map(|c| (c, c)),
    }
}

fn action(node: Node<'_>, index: usize, d: &Defaults<'_>) -> Result<Action, ConfigError> {
    node.object()?;
    let ty = node
        .get("Type")
        .ok_or_else(|| node.error("an action needs a Type"))?
        .node()
        .string()?;
    let name = match node.get("Name") {
        Some(c) => c.node().string()?,
        None => format!("Action{}", index + 1),
    };
    let wait_for_completion = node
        .get("WaitForCompletion")
        .map(|c| c.node().bool())
        .transpose()?
        .unwrap_or(false);
    let (value, path) = settings(node)?;
    let s = Node::new(&value, &path);
    let egress = || -> Result<String, ConfigError> {
        match s.get("Egress") {
            Some(c) => c.node().string(),
            None => d.egress.clone().ok_or_else(|| {
                s.error("Egress is required (here or in CollectionRuleDefaults:Actions:Egress)")
            }),
        }
    };
    let duration = |default: Duration| -> Result<Duration, ConfigError> {
        match s.get("Duration") {
            Some(c) => c.node().timespan(SECOND, DAY),
            None => Ok(default),
        }
    };
    let kind = match ty.to_ascii_lowercase().as_str() {
        "collecttrace" => collect_trace(s, egress()?, duration(DEFAULT_TRACE_DURATION)?)?,
        "collectgcdump" => ActionKind::CollectGCDump { egress: egress()? },
        "collectdump" => ActionKind::CollectDump {
            dump_type: match s.get("Type") {
                None => DumpKind::WithHeap,
                Some(c) => c.node().one_of(&DumpKind::ALL.map(|k| (k.name(), k)))?,
            },
            egress: egress()?,
        },
        "collectstacks" => ActionKind::CollectStacks {
            format: match s.get("Format") {
                None => StackFormat::Json,
                Some(c) => c.node().one_of(&[
                    ("Json", StackFormat::Json),
                    ("PlainText", StackFormat::PlainText),
                    ("Speedscope", StackFormat::Speedscope),
                ])?,
            },
            egress: egress()?,
        },
        "collectlogs" => collect_logs(s, egress()?, duration(DEFAULT_TRACE_DURATION)?)?,
        "collectlivemetrics" => ActionKind::CollectLiveMetrics {
            metrics: live_metrics(s)?,
            duration: duration(DEFAULT_TRACE_DURATION)?,
            egress: egress()?,
        },
        "collectexceptions" => collect_exceptions(s, egress()?)?,
        "execute" => ActionKind::Execute {
            path: s
                .get("Path")
                .ok_or_else(|| s.error("Path is required"))?
                .node()
                .string()?,
            arguments: s.get("Arguments").map(|c| c.node().string()).transpose()?,
            ignore_exit_code: s
                .get("IgnoreExitCode")
                .map(|c| c.node().bool())
                .transpose()?
                .unwrap_or(false),
        },
        "raisesamplingrate" => ActionKind::RaiseSamplingRate {
            duration: duration(DEFAULT_BOOST_DURATION)?,
        },
        _ => {
            return Err(node.error(format!(
                "unknown action Type {ty:?}; known: CollectTrace, CollectGCDump, CollectDump, \
                 CollectStacks, CollectLogs, CollectExceptions, CollectLiveMetrics, Execute, RaiseSamplingRate"
            )))
        }
    };
    Ok(Action {
        name,
        wait_for_completion,
        kind,
    })
}

/// CollectLiveMetrics' `IncludeDefaultProviders`, `Providers` (`{ProviderName, CounterNames}`)
/// and `Meters` (`{MeterName, InstrumentNames}`); `None` when none of them is set.
fn live_metrics(s: Node<'_>) -> Result<Option<EventMetricsConfiguration>, ConfigError> {
    let include = s.get("IncludeDefaultProviders");
    let providers = s.get("Providers");
    let meters = s.get("Meters");
    if include.is_none() && providers.is_none() && meters.is_none() {
        return Ok(None);
    }
    let names = |n: Node<'_>, key: &str| -> Result<Vec<String>, ConfigError> {
        n.get(key)
            .map(|c| c.node().strings())
            .unwrap_or(Ok(Vec::new()))
    };
    let required = |n: Node<'_>, key: &str| -> Result<String, ConfigError> {
        n.get(key)
            .ok_or_else(|| n.error(format!("{key} is required")))?
            .node()
            .string()
    };
    let mut config = EventMetricsConfiguration {
        include_default_providers: include
            .map(|c| c.node().bool())
            .transpose()?
            .unwrap_or(true),
        ..EventMetricsConfiguration::default()
    };
    if let Some(p) = providers {
        for c in p.node().list()? {
            let n = c.node();
            config.providers.push(EventMetricsProvider {
                provider_name: required(n, "ProviderName")?,
                counter_names: names(n, "CounterNames")?,
            });
        }
    }
    if let Some(m) = meters {
        for c in m.node().list()? {
            let n = c.node();
            config.meters.push(EventMetricsMeter {
                meter_name: required(n, "MeterName")?,
                instrument_names: names(n, "InstrumentNames")?,
            });
        }
    }
    Ok(Some(config))
}

/// dotnet-monitor's CollectLogs settings (`DefaultLevel`, `FilterSpecs`, `UseAppFilters`,
/// `Format`), plus clrscope's `PreTriggerSeconds`.
fn collect_logs(
    s: Node<'_>,
    egress: String,
    duration: Duration,
) -> Result<ActionKind, ConfigError> {
    let level = |c: Node<'_>| -> Result<LogLevel, ConfigError> {
        let text = c.string()?;
        LogLevel::parse(&text).ok_or_else(|| {
            c.error(format!(
                "unknown level {text:?}: use Trace, Debug, Information, Warning, Error or Critical"
            ))
        })
    };
    let mut settings = LogsSettings::default();
    if let Some(c) = s.get("DefaultLevel") {
        settings.log_level = level(c.node())?;
    }
    if let Some(c) = s.get("FilterSpecs") {
        for (category, value) in c.node().object()? {
            let value = value.node();
            let spec = if value.value.is_null() {
                None
            } else {
                Some(level(value)?)
            };
            settings.filter_specs.push((category, spec));
        }
    }
    if let Some(c) = s.get("UseAppFilters") {
        settings.use_app_filters = c.node().bool()?;
    }
    let format = match s.get("Format") {
        None => LogFormat::Text,
        Some(c) => c.node().one_of(&[
            ("NewlineDelimitedJson", LogFormat::NdJson),
            ("JsonSequence", LogFormat::JsonSeq),
            ("PlainText", LogFormat::Text),
        ])?,
    };
    let pre_trigger = match s.get("PreTriggerSeconds") {
        None => Duration::ZERO,
        Some(c) => {
            Duration::from_secs(c.node().integer(1, MAX_PRE_TRIGGER.as_secs() as i64)? as u64)
        }
    };
    Ok(ActionKind::CollectLogs {
        settings,
        format,
        duration,
        egress,
        pre_trigger,
    })
}

/// dotnet-monitor's CollectExceptions settings: `Format` (default `PlainText`) and `Filters`
/// (`Include`/`Exclude` lists of `ExceptionFilter`s).
fn collect_exceptions(s: Node<'_>, egress: String) -> Result<ActionKind, ConfigError> {
    let format = match s.get("Format") {
        None => ExceptionFormat::Text,
        Some(c) => c.node().one_of(&[
            ("NewlineDelimitedJson", ExceptionFormat::NdJson),
            ("JsonSequence", ExceptionFormat::JsonSeq),
            ("PlainText", ExceptionFormat::Text),
        ])?,
    };
    let mut filters = ExceptionsFilters::default();
    if let Some(c) = s.get("Filters") {
        let f = c.node();
        f.object()?;
        for (key, list) in [
            ("Include", &mut filters.include),
            ("Exclude", &mut filters.exclude),
        ] {
            let Some(items) = f.get(key) else { continue };
            for item in items.node().list()? {
                list.push(exception_filter(item.node())?);
            }
        }
        for (key, child) in f.object()? {
            if !["Include", "Exclude"]
                .iter()
                .any(|k| k.eq_ignore_ascii_case(&key))
            {
                return Err(child
                    .node()
                    .error("unknown key; Filters takes Include and Exclude"));
            }
        }
    }
    Ok(ActionKind::CollectExceptions {
        filters,
        format,
        egress,
    })
}

/// One `ExceptionFilter`: `MethodName`, `TypeName`, `ModuleName`, `ExceptionType`.
fn exception_filter(node: Node<'_>) -> Result<ExceptionFilter, ConfigError> {
    let mut filter = ExceptionFilter::default();
    for (key, child) in node.object()? {
        let value = Some(child.node().string()?);
        match key.to_ascii_lowercase().as_str() {
            "methodname" => filter.method_name = value,
            "typename" => filter.type_name = value,
            "modulename" => filter.module_name = value,
            "exceptiontype" => filter.exception_type = value,
            _ => {
                return Err(child.node().error(
                    "unknown key; an exception filter takes MethodName, TypeName, ModuleName and \
                     ExceptionType",
                ))
            }
        }
    }
    Ok(filter)
}

fn collect_trace(
    s: Node<'_>,
    egress: String,
    duration: Duration,
) -> Result<ActionKind, ConfigError> {
    let profiles = s.get("Profile");
    let providers = s.get("Providers");
    let source = match (profiles, providers) {
        (Some(_), Some(_)) | (None, None) => {
            return Err(s.error("exactly one of Profile and Providers is required"))
        }
        (Some(p), None) => {
            let text = p.node().strings()?.join(",");
            let list = text
                .split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(|t| {
                    t.parse::<TraceProfile>().map_err(|_| {
                        p.node().error(format!(
                            "unknown profile {t:?}; known: Cpu, Http, Logs, Metrics, GcCollect"
                        ))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            if list.is_empty() {
                return Err(p.node().error("at least one profile is required"));
            }
            TraceSource::Profiles(list)
        }
        (None, Some(p)) => {
            let providers = p
                .node()
                .list()?
                .iter()
                .map(|c| event_provider(c.node()))
                .collect::<Result<Vec<_>, _>>()?;
            if providers.is_empty() {
                return Err(p.node().error("at least one provider is required"));
            }
            TraceSource::Providers {
                providers,
                request_rundown: s
                    .get("RequestRundown")
                    .map(|c| c.node().bool())
                    .transpose()?
                    .unwrap_or(true),
                buffer_mb: s
                    .get("BufferSizeMegabytes")
                    .map(|c| c.node().integer(1, 1024).map(|n| n as u32))
                    .transpose()?
                    .unwrap_or(256),
            }
        }
    };
    let stopping_event = s
        .get("StoppingEvent")
        .map(|c| -> Result<StoppingEvent, ConfigError> {
            let n = c.node();
            let text = |key: &str| -> Result<String, ConfigError> {
                n.get(key)
                    .ok_or_else(|| n.error(format!("{key} is required")))?
                    .node()
                    .string()
            };
            let payload_filter = match n.get("PayloadFilter") {
                Some(f) => f
                    .node()
                    .object()?
                    .iter()
                    .map(|(k, v)| Ok((k.clone(), v.node().string()?)))
                    .collect::<Result<BTreeMap<_, _>, ConfigError>>()?,
                None => BTreeMap::new(),
            };
            Ok(StoppingEvent {
                provider_name: text("ProviderName")?,
                event_name: text("EventName")?,
                payload_filter,
            })
        })
        .transpose()?;
    if stopping_event.is_some() && matches!(source, TraceSource::Profiles(_)) {
        return Err(s.error("StoppingEvent can only be used with Providers"));
    }
    let pre_trigger = s
        .get("PreTriggerSeconds")
        .map(|c| {
            c.node()
                .integer(1, MAX_PRE_TRIGGER.as_secs() as i64)
                .map(|n| Duration::from_secs(n as u64))
        })
        .transpose()?;
    Ok(ActionKind::CollectTrace {
        source,
        duration,
        egress,
        stopping_event,
        pre_trigger,
    })
}

/// One of CollectTrace's `Providers` (`{Name, Keywords, EventLevel, Arguments}`), read as the
/// HTTP API's `POST /trace` reads it.
fn event_provider(n: Node<'_>) -> Result<ProviderConfig, ConfigError> {
    serde_json::from_value::<EventPipeProvider>(n.value.clone())
        .map(|p| p.to_config())
        .map_err(|e| n.error(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules(v: Value) -> Result<Vec<CollectionRule>, ConfigError> {
        compile(
            &serde_json::from_value(v).unwrap(),
            &CollectionRuleDefaultsSection::default(),
        )
    }

    #[test]
    fn live_metrics_take_dotnet_monitors_settings_or_the_metrics_section() {
        let all = rules(json!({"Live": {
            "Trigger": {"Type": "Startup"},
            "Actions": [
                {"Type": "CollectLiveMetrics", "Settings": {
                    "IncludeDefaultProviders": "false",
                    "Providers": [{"ProviderName": "System.Runtime", "CounterNames": ["cpu-usage"]}],
                    "Meters": [{"MeterName": "Shop"}],
                    "Duration": "00:00:10", "Egress": "out"}},
                {"Type": "CollectLiveMetrics", "Settings": {"Egress": "out"}}]}}))
        .unwrap();
        let ActionKind::CollectLiveMetrics {
            metrics: Some(config),
            duration,
            egress,
        } = &all[0].actions[0].kind
        else {
            panic!("{:?}", all[0].actions[0])
        };
        assert!(!config.include_default_providers);
        assert_eq!(config.providers[0].counter_names, ["cpu-usage"]);
        assert_eq!(config.meters[0].meter_name, "Shop");
        assert!(config.meters[0].instrument_names.is_empty());
        assert_eq!(
            (*duration, egress.as_str()),
            (Duration::from_secs(10), "out")
        );
        assert!(matches!(
            &all[0].actions[1].kind,
            ActionKind::CollectLiveMetrics { metrics: None, duration, .. }
                if *duration == DEFAULT_TRACE_DURATION
        ));
        let missing = rules(json!({"Live": {
            "Trigger": {"Type": "Startup"},
            "Actions": [{"Type": "CollectLiveMetrics", "Settings": {
                "Egress": "out", "Meters": [{"InstrumentNames": ["x"]}]}}]}}));
        assert!(missing.unwrap_err().to_string().contains("MeterName"));
    }

    #[test]
    fn the_seed_rules_read_as_dotnet_monitor_reads_them() {
        let all = rules(json!({
            "SlowRequests": {
                "Filters": [{"Key": "ProcessName", "Value": "asyncweb", "MatchType": "Exact"}],
                "Trigger": {"Type": "AspNetRequestDuration",
                            "Settings": {"RequestCount": "3", "RequestDuration": "00:00:00.200",
                                         "IncludePaths": ["/alpha"]}},
                "Actions": [{"Type": "CollectTrace",
                             "Settings": {"Profile": "Cpu,Http", "Egress": "artifacts",
                                          "Duration": "00:00:05", "PreTriggerSeconds": 10}}],
                "Limits": {"ActionCount": 1, "ActionCountSlidingWindowDuration": "01:00:00"}
            },
            "P95": {
                "Trigger": {"Type": "EventMeter",
                            "Settings": {"MeterName": "AsyncWeb",
                                         "InstrumentName": "asyncweb.request.duration",
                                         "HistogramPercentile": 95, "GreaterThan": 100,
                                         "SlidingWindowDuration": "00:00:10"}},
                "Actions": [{"Name": "heap", "Type": "CollectGCDump", "Settings": {"Egress": "artifacts"}}]
            }
        }))
        .unwrap();
        let p95 = &all[0];
        assert_eq!(p95.name, "P95");
        assert_eq!(p95.limits, Limits::default());
        assert_eq!(p95.actions[0].name, "heap");
        let Trigger::Threshold(t) = &p95.trigger else {
            panic!()
        };
        assert_eq!((t.greater_than, t.less_than), (Some(100.0), None));
        assert!(!t.passes(100.0), "thresholds are strict");
        assert!(t.passes(100.5));
        let slow = &all[1];
        assert_eq!(
            slow.trigger,
            Trigger::AspNetRequestDuration {
                request_count: 3,
                request_duration: Duration::from_millis(200),
                window: DEFAULT_SLIDING_WINDOW,
                paths: PathFilter {
                    include: vec!["/alpha".into()],
                    exclude: vec![]
                },
            }
        );
        assert_eq!(slow.actions[0].name, "Action1");
        let ActionKind::CollectTrace {
            pre_trigger,
            source,
            ..
        } = &slow.actions[0].kind
        else {
            panic!()
        };
        assert_eq!(*pre_trigger, Some(Duration::from_secs(10)));
        assert_eq!(
            *source,
            TraceSource::Profiles(vec![TraceProfile::Cpu, TraceProfile::Http])
        );
        assert_eq!(slow.limits.action_count, 1);
        let facts = |name| ProcessFacts {
            pid: 7,
            name,
            command_line: "dotnet AsyncWeb.dll",
            managed_entry_point_assembly_name: name,
        };
        assert!(slow.applies_to(&facts("AsyncWeb")));
        assert!(!slow.applies_to(&facts("Other")));
    }

    #[test]
    fn collect_exceptions_reads_dotnet_monitors_settings() {
        let rule = |settings: Value| {
            rules(json!({"R": {
                "Trigger": {"Type": "Startup"},
                "Actions": [{"Type": "CollectExceptions", "Settings": settings}]
            }}))
        };
        let all = rule(json!({
            "Egress": "blob", "Format": "NewlineDelimitedJson",
            "Filters": {"Include": [{"ExceptionType": "System.TimeoutException"}],
                        "exclude": [{"methodName": "Charge", "typeName": "Logs.Payments.Gateway",
                                     "moduleName": "Logs.dll"}]}
        }))
        .unwrap();
        let ActionKind::CollectExceptions {
            filters,
            format,
            egress,
        } = &all[0].actions[0].kind
        else {
            panic!()
        };
        assert_eq!(
            (egress.as_str(), *format),
            ("blob", ExceptionFormat::NdJson)
        );
        assert_eq!(
            filters.include[0].exception_type.as_deref(),
            Some("System.TimeoutException")
        );
        assert_eq!(filters.exclude[0].method_name.as_deref(), Some("Charge"));
        assert_eq!(filters.exclude[0].module_name.as_deref(), Some("Logs.dll"));
        // Plain text by default; unknown filter keys are refused with their path.
        let all = rule(json!({"Egress": "blob"})).unwrap();
        assert!(matches!(
            all[0].actions[0].kind,
            ActionKind::CollectExceptions {
                format: ExceptionFormat::Text,
                ..
            }
        ));
        let error = rule(json!({"Egress": "blob", "Filters": {"Include": [{"Method": "x"}]}}))
            .unwrap_err()
            .to_string();
        assert!(error.contains("Filters:Include:0:Method"), "{error}");
    }

    #[test]
    fn shortcuts_and_defaults() {
        let defaults: CollectionRuleDefaultsSection = serde_json::from_value(json!({
            "Actions": {"Egress": "files"},
            "Triggers": {"RequestCount": 7, "SlidingWindowDuration": "00:00:30"},
            "Limits": {"ActionCount": 2}
        }))
        .unwrap();
        let section: CollectionRulesSection = serde_json::from_value(json!({
            "Cpu": {"Trigger": {"Type": "CPUUsage"},
                    "Actions": {"0": {"Type": "CollectDump"}},
                    "Limits": {"RuleDuration": "00:10:00"}},
            "Low": {"Trigger": {"Type": "CPUUsage", "Settings": {"LessThan": "5"}}},
            "Count": {"trigger": {"type": "AspNetRequestCount"}}
        }))
        .unwrap();
        let all = compile(&section, &defaults).unwrap();
        let Trigger::Threshold(cpu) = &all[1].trigger else {
            panic!()
        };
        assert_eq!(
            (cpu.greater_than, cpu.window),
            (Some(50.0), Duration::from_secs(30))
        );
        assert_eq!(
            all[1].actions[0].kind,
            ActionKind::CollectDump {
                dump_type: DumpKind::WithHeap,
                egress: "files".into()
            }
        );
        assert_eq!(all[1].limits.action_count, 2);
        assert_eq!(all[1].limits.rule_duration, Some(Duration::from_secs(600)));
        let Trigger::Threshold(low) = &all[2].trigger else {
            panic!()
        };
        assert_eq!((low.greater_than, low.less_than), (None, Some(5.0)));
        assert!(matches!(
            all[0].trigger,
            Trigger::AspNetRequestCount {
                request_count: 7,
                ..
            }
        ));
    }

    #[test]
    fn custom_providers_and_a_stopping_event() {
        let all = rules(json!({"R": {
            "Trigger": {"Type": "Startup"},
            "Actions": [{"Type": "CollectTrace", "Settings": {
                "Providers": [{"Name": "Microsoft-Windows-DotNETRuntime", "Keywords": "0x1",
                               "EventLevel": "Informational"}],
                "RequestRundown": "false", "BufferSizeMegabytes": 64, "Egress": "e",
                "StoppingEvent": {"ProviderName": "Microsoft-Windows-DotNETRuntime",
                                  "EventName": "GCStart", "PayloadFilter": {"Depth": "2"}}}}]
        }}))
        .unwrap();
        let ActionKind::CollectTrace {
            source,
            stopping_event,
            duration,
            ..
        } = &all[0].actions[0].kind
        else {
            panic!()
        };
        assert_eq!(*duration, DEFAULT_TRACE_DURATION);
        let TraceSource::Providers {
            providers,
            request_rundown,
            buffer_mb,
        } = source
        else {
            panic!("{source:?}")
        };
        assert_eq!((providers[0].keywords, providers[0].level), (1, 4));
        assert_eq!((*request_rundown, *buffer_mb), (false, 64));
        let stop = stopping_event.as_ref().unwrap();
        assert_eq!(stop.event_name, "GCStart");
        assert_eq!(stop.payload_filter["Depth"], "2");
    }

    #[test]
    fn schedules_every_interval_or_cron() {
        let all = rules(json!({
            "Hourly": {"Trigger": {"Type": "Schedule", "Settings": {"Interval": "01:00:00"}}},
            "Quarter": {"trigger": {"type": "schedule", "settings": {"cron": "*/15 * * * *"}}}
        }))
        .unwrap();
        let by_name = |name: &str| &all.iter().find(|r| r.name == name).unwrap().trigger;
        assert_eq!(*by_name("Hourly"), Trigger::Schedule(Schedule::Every(HOUR)));
        assert_eq!(
            *by_name("Quarter"),
            Trigger::Schedule(Schedule::cron("*/15 * * * *").unwrap())
        );
        let err = |settings: Value| {
            rules(json!({"R": {"Trigger": {"Type": "Schedule", "Settings": settings}}}))
                .unwrap_err()
                .to_string()
        };
        assert!(err(json!({})).contains("exactly one of Interval"));
        assert!(err(json!({"Interval": "00:01:00", "Cron": "* * * * *"}))
            .contains("exactly one of Interval"));
        assert!(err(json!({"Interval": "00:00:00"})).contains("must be between"));
        assert!(err(json!({"Cron": "hourly"}))
            .starts_with("CollectionRules:R:Trigger:Settings:Cron: \"hourly\" is not a cron"));
    }

    #[test]
    fn errors_name_the_key() {
        let err = |v: Value| rules(v).unwrap_err().to_string();
        assert_eq!(
            err(json!({"R": {"Trigger": {"Type": "AspNetRequestDuration", "Settings": {}}}})),
            "CollectionRules:R:Trigger:Settings: RequestCount is required (here or in \
             CollectionRuleDefaults:Triggers:RequestCount)"
        );
        assert!(err(json!({"R": {"Trigger": {"Type": "EventCounter",
            "Settings": {"ProviderName": "System.Runtime", "CounterName": "cpu-usage"}}}}))
        .ends_with("GreaterThan or LessThan is required"));
        assert_eq!(
            err(json!({"R": {"Trigger": {"Type": "Startup"},
                "Limits": {"ActionCountSlidingWindowDuration": "2.00:00:00"}}})),
            "CollectionRules:R:Limits:ActionCountSlidingWindowDuration: must be between \
             00:00:01 and 1.00:00:00, got 2.00:00:00"
        );
        assert!(err(json!({"R": {"Trigger": {"Type": "Startup"},
            "Actions": [{"Type": "CollectTrace", "Settings": {"Egress": "e"}}]}}))
        .contains("exactly one of Profile and Providers"));
        assert!(err(json!({"R": {"Trigger": {"Type": "AspNetResponseStatus",
            "Settings": {"StatusCodes": ["5xx"], "ResponseCount": 1}}}}))
        .contains("StatusCodes"));
        assert!(err(json!({"R": {"Trigger": {"Type": "Sometimes"}}})).contains("unknown trigger"));
    }

    #[test]
    fn path_globs_follow_dotnet_monitor() {
        let f = PathFilter {
            include: vec!["/api/**/orders".into(), "/alpha".into(), "/b*".into()],
            exclude: vec!["/api/internal/**/*".into()],
        };
        assert!(f.matches("/alpha"));
        assert!(f.matches("/ALPHA"));
        assert!(f.matches("/bravo"));
        assert!(!f.matches("/bravo/x"), "* stays in a segment");
        assert!(f.matches("/api/orders"));
        assert!(f.matches("/api/v1/x/orders"));
        assert!(!f.matches("/api/internal/x/orders"));
        assert!(!f.matches("/charlie"));
        assert!(PathFilter::default().matches("/anything"));
        assert_eq!(status_range("400-499"), Some((400, 499)));
        assert_eq!(status_range("500"), Some((500, 500)));
        assert_eq!(status_range("499-400"), None);
        assert_eq!(status_range("600"), None);
    }
}
