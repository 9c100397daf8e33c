//! Log records out of process: `Microsoft-Extensions-Logging` messages joined to their scopes and
//! spans, the session settings that ask for them (dotnet-monitor's `LogLevel`, `FilterSpecs`,
//! `UseAppFilters`), and dotnet-monitor's `/logs` output formats.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::Deserialize;

use crate::providers::{encode_arguments, level};
use ipc::ProviderConfig;
use nettrace::events::LOGGING_PROVIDER;
use profile::guid::Guid;
use profile::log::{LogLevel, LogRecord, ScopeValues};

/// The JSON-message keyword (MessageJson and ActivityJson scopes). dotnet-monitor's `/logs` also
/// turns on FormattedMessage (0x4), which only doubles the events: MessageJson carries the
/// formatted text since .NET 5.
pub const JSON_MESSAGE_KEYWORD: u64 = 0x8;

/// Open logging scopes kept per process, as dotnet-monitor caps its scope tree.
pub const MAX_OPEN_SCOPES: usize = 10_000;
/// Scopes kept on one record (innermost last).
pub const MAX_SCOPE_DEPTH: usize = 16;

/// Which logs to ask a process for, as dotnet-monitor's `POST /logs` body and `CollectLogs` action
/// take them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LogsSettings {
    /// The level of the filter specs that give none, and of every category when there are no
    /// specs (without the app's filters, specs turn the categories they do not name off).
    #[serde(default = "default_level", deserialize_with = "level_name")]
    pub log_level: LogLevel,
    /// Category (`Name` or `Name*`) → level, or `null` for the default level.
    #[serde(default, deserialize_with = "filter_specs")]
    pub filter_specs: Vec<(String, Option<LogLevel>)>,
    /// Keep the app's own logging filters (`UseAppFilters`).
    #[serde(default = "yes")]
    pub use_app_filters: bool,
}

fn default_level() -> LogLevel {
    LogLevel::Warning
}

fn yes() -> bool {
    true
}

fn level_name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<LogLevel, D::Error> {
    let text = String::deserialize(d)?;
    LogLevel::parse(&text).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "unknown log level {text:?}: use Trace, Debug, Information, Warning, Error or Critical"
        ))
    })
}

/// The `filterSpecs` object, in its order (the first matching rule wins).
fn filter_specs<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Vec<(String, Option<LogLevel>)>, D::Error> {
    struct Specs;
    impl<'de> serde::de::Visitor<'de> for Specs {
        type Value = Vec<(String, Option<LogLevel>)>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object of category → log level name or null")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut specs = Vec::new();
            while let Some((category, level)) = map.next_entry::<String, Option<String>>()? {
                let level = match level {
                    Some(text) => Some(LogLevel::parse(&text).ok_or_else(|| {
                        serde::de::Error::custom(format!(
                            "unknown log level {text:?} for {category:?}: use Trace, Debug, \
                             Information, Warning, Error or Critical"
                        ))
                    })?),
                    None => None,
                };
                if category.is_empty() || category.contains([';', ':', '"']) {
                    return Err(serde::de::Error::custom(format!(
                        "filter spec category {category:?} must be non-empty without ';', ':' or '\"'"
                    )));
                }
                specs.push((category, level));
            }
            Ok(specs)
        }
    }
    d.deserialize_map(Specs)
}

impl Default for LogsSettings {
    fn default() -> Self {
        LogsSettings {
            log_level: default_level(),
            filter_specs: Vec::new(),
            use_app_filters: true,
        }
    }
}

impl LogsSettings {
    /// `GET /logs?level=X`: that level everywhere, the app's filters off; without a level, the
    /// app's filters at Trace (dotnet-monitor's `DiagController.Logs`).
    pub fn for_level(level: Option<LogLevel>) -> Self {
        LogsSettings {
            log_level: level.unwrap_or(LogLevel::Trace),
            filter_specs: Vec::new(),
            use_app_filters: level.is_none(),
        }
    }

    /// The lowest level any filter lets through.
    pub fn lowest_level(&self) -> LogLevel {
        self.filter_specs
            .iter()
            .filter_map(|(_, l)| *l)
            .chain([self.log_level])
            .min()
            .unwrap_or(self.log_level)
    }

    /// The provider to enable: the JSON keyword, the EventSource level that gives the default log
    /// level, and the `FilterSpecs` argument (dotnet-monitor's `LoggingSourceConfiguration`).
    pub fn provider(&self) -> ProviderConfig {
        let mut specs = Vec::new();
        if self.use_app_filters {
            specs.push("UseAppFilters".to_string());
        }
        // Levels are written out: the EventSource's default level, which a spec without one and
        // an empty spec take, is the lowest any session asks (FilterSpecs are process-wide), and
        // never Trace (`LoggingEventSource.GetDefaultLevel` maps Verbose to Debug).
        let default = self.log_level.name();
        for (category, level) in &self.filter_specs {
            let level = level.map_or(default, |l| l.name());
            specs.push(format!("{category}:{level}"));
        }
        // No spec and no app filters: every category at the default level (a spec list that
        // names categories turns the others off, as `LoggingEventSource` does).
        if specs.is_empty() {
            specs.push(format!("*:{default}"));
        }
        let event_level = match self.log_level {
            LogLevel::Trace => level::LOG_ALWAYS,
            LogLevel::Debug => level::VERBOSE,
            LogLevel::Information => level::INFORMATIONAL,
            LogLevel::Warning => level::WARNING,
            LogLevel::Error => level::ERROR,
            LogLevel::Critical => level::CRITICAL,
        };
        ProviderConfig::new(LOGGING_PROVIDER, JSON_MESSAGE_KEYWORD, event_level)
            .with_arguments(encode_arguments(&[("FilterSpecs", &specs.join(";"))]))
    }

    /// Whether a message passes these settings, as the runtime's filters select (the spec
    /// `Microsoft.Extensions.Logging`'s rule selector picks: see [`matching_spec`]), else the
    /// default level. What a session receives is already filtered by the process-wide FilterSpecs;
    /// this selects one consumer's messages out of what the union of all of them lets through.
    pub fn accepts(&self, category: &str, level: LogLevel) -> bool {
        match matching_spec(&self.filter_specs, category) {
            Some((_, Some(min))) => level >= *min,
            Some((_, None)) => level >= self.log_level,
            // Specs without the app's filters turn other categories off, as the runtime does.
            None if !self.use_app_filters && !self.filter_specs.is_empty() => false,
            None => level >= self.log_level,
        }
    }

    /// Settings whose provider lets through every message any of `demands` selects, so that one
    /// session serves them all (the logging EventSource keeps one FilterSpecs for the whole
    /// process: the last session enabled sets it for every session). Per category, the lowest
    /// level any demand asks there; the app's own filters are kept (`UseAppFilters`) where no
    /// demand names the category when any demand keeps them. A demand that keeps the app's filters
    /// for a category another demand names is given that category at its own level (the app's
    /// filters cannot be applied afterwards). `None` without demands.
    pub fn union<'a>(demands: impl IntoIterator<Item = &'a LogsSettings>) -> Option<LogsSettings> {
        let demands: Vec<&LogsSettings> = demands.into_iter().collect();
        let log_level = demands.iter().map(|d| d.lowest_level()).min()?;
        let all: Vec<Vec<(String, Option<LogLevel>)>> =
            demands.iter().map(|d| d.effective_specs()).collect();
        let mut prefixes: Vec<&str> = Vec::new();
        for (name, _) in all.iter().flatten() {
            let prefix = spec_prefix(name);
            if !prefixes.iter().any(|p| p.eq_ignore_ascii_case(prefix)) {
                prefixes.push(prefix);
            }
        }
        // A spec's cell: the categories it is the longest match of. Each demand selects one level
        // in a cell, by its own longest spec that prefixes the cell's (a category of the cell
        // matches exactly those of its specs).
        let mut filter_specs = Vec::new();
        for prefix in prefixes {
            let level = demands
                .iter()
                .zip(&all)
                .filter_map(|(d, specs)| match d.cell_level(specs, prefix) {
                    CellLevel::Level(level) | CellLevel::App(level) => Some(level),
                    CellLevel::Off => None,
                })
                .min();
            if let Some(level) = level {
                filter_specs.push((format!("{prefix}*"), Some(level)));
            }
        }
        Some(LogsSettings {
            log_level,
            filter_specs,
            use_app_filters: demands.iter().any(|d| d.use_app_filters),
        })
    }
}

/// What a setting lets through in one cell of categories (see [`LogsSettings::union`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CellLevel {
    /// Nothing.
    Off,
    /// This level and above, whatever the app's filters say.
    Level(LogLevel),
    /// What the app's own filters let through, of this level and above.
    App(LogLevel),
}

impl CellLevel {
    /// Whether a session at `self` receives every message `other` selects.
    fn covers(self, other: CellLevel) -> bool {
        match (self, other) {
            (_, CellLevel::Off) => true,
            (CellLevel::Level(a), CellLevel::Level(b) | CellLevel::App(b)) => a <= b,
            (CellLevel::App(a), CellLevel::App(b)) => a <= b,
            _ => false,
        }
    }
}

impl LogsSettings {
    /// The specs as the runtime applies them: a level for every category is a spec of `*`.
    fn effective_specs(&self) -> Vec<(String, Option<LogLevel>)> {
        if self.filter_specs.is_empty() && !self.use_app_filters {
            return vec![("*".to_string(), Some(self.log_level))];
        }
        self.filter_specs
            .iter()
            .map(|(name, l)| (name.clone(), Some(l.unwrap_or(self.log_level))))
            .collect()
    }

    /// What these settings let through in the cell of categories `prefix` is the longest spec of.
    fn cell_level(&self, specs: &[(String, Option<LogLevel>)], prefix: &str) -> CellLevel {
        match matching_spec(specs, prefix) {
            Some((_, Some(level))) => CellLevel::Level(*level),
            Some((_, None)) => CellLevel::Level(self.log_level),
            None if self.use_app_filters => CellLevel::App(self.log_level),
            None => CellLevel::Off,
        }
    }

    /// Whether a session with these settings receives every message `other` selects.
    pub fn covers(&self, other: &LogsSettings) -> bool {
        let (mine, theirs) = (self.effective_specs(), other.effective_specs());
        // Every cell either side names, and the categories neither names.
        let mut prefixes = mine.iter().chain(&theirs).map(|(n, _)| spec_prefix(n));
        let covered = prefixes.all(|p| {
            self.cell_level(&mine, p)
                .covers(other.cell_level(&theirs, p))
        });
        covered
            && self
                .cell_level(&mine, NO_CATEGORY)
                .covers(other.cell_level(&theirs, NO_CATEGORY))
    }
}

/// A category no spec names (no spec name starts with a control character).
const NO_CATEGORY: &str = "\u{1}";

/// The prefix a filter spec's name matches: `LoggingEventSource` drops a trailing `*`, and the
/// rule selector matches every name as a prefix.
fn spec_prefix(name: &str) -> &str {
    name.strip_suffix('*').unwrap_or(name)
}

/// The spec `Microsoft.Extensions.Logging`'s `LoggerRuleSelector` applies to `category`: of the
/// names that prefix it (ignoring ASCII case, as its ordinal-ignore-case comparison), the longest;
/// of equal ones, the last. (Not the first that matches, as `LoggingEventSource`'s comment says:
/// FilterSpecs become filter rules of the logger factory.)
pub fn matching_spec<'a>(
    specs: &'a [(String, Option<LogLevel>)],
    category: &str,
) -> Option<&'a (String, Option<LogLevel>)> {
    let mut best: Option<(usize, &(String, Option<LogLevel>))> = None;
    for spec in specs {
        let prefix = spec_prefix(&spec.0);
        let matches = category
            .as_bytes()
            .get(..prefix.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(prefix.as_bytes()));
        if matches && best.is_none_or(|(len, _)| prefix.len() >= len) {
            best = Some((prefix.len(), spec));
        }
    }
    best.map(|(_, spec)| spec)
}

/// Open `BeginScope`s by EventSource activity id, so a message can be given the scopes around it
/// and the span outside them.
#[derive(Debug, Default)]
pub struct ScopeTracker {
    open: HashMap<Guid, OpenScope>,
    /// Starts so far: each open scope's place in the order they started.
    started: u64,
    /// Open scopes let go, oldest first, to make room under [`MAX_OPEN_SCOPES`].
    pub evicted: u64,
}

#[derive(Debug)]
struct OpenScope {
    parent: Guid,
    values: ScopeValues,
    started: u64,
}

impl ScopeTracker {
    /// A scope started: its activity id and the one it was started under. With
    /// [`MAX_OPEN_SCOPES`] open, the older half makes room: a scope whose stop never came (its
    /// stop written under another activity id, or while no session listened) stays open for
    /// good, and refusing new ones instead left every message after the first 10,000 such (45 s
    /// of a .NET 8 service at 200 requests/s) without its scopes and its span.
    pub fn start(&mut self, activity: Guid, parent: Guid, values: ScopeValues) {
        if activity.is_nil() {
            return;
        }
        if self.open.len() >= MAX_OPEN_SCOPES && !self.open.contains_key(&activity) {
            self.evict_older_half();
        }
        self.started += 1;
        let started = self.started;
        self.open.insert(
            activity,
            OpenScope {
                parent,
                values,
                started,
            },
        );
    }

    fn evict_older_half(&mut self) {
        let mut order: Vec<u64> = self.open.values().map(|s| s.started).collect();
        let middle = order.len() / 2;
        let (_, &mut newer_from, _) = order.select_nth_unstable(middle);
        let before = self.open.len();
        self.open.retain(|_, s| s.started >= newer_from);
        self.evicted += (before - self.open.len()) as u64;
    }

    pub fn stop(&mut self, activity: Guid) {
        self.open.remove(&activity);
    }

    /// The scopes around `activity` (outermost first) and the first activity outside them (the
    /// one a span tracker can know).
    pub fn resolve(&self, activity: Guid) -> (Vec<ScopeValues>, Guid) {
        let mut scopes = Vec::new();
        let mut current = activity;
        while let Some(scope) = self.open.get(&current) {
            if scopes.len() == MAX_SCOPE_DEPTH {
                break;
            }
            scopes.push(scope.values.clone());
            current = scope.parent;
        }
        scopes.reverse();
        (scopes, current)
    }
}

/// How `/logs` writes records, chosen by `Accept` as dotnet-monitor does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// `application/x-ndjson`: one JSON object per line.
    NdJson,
    /// `application/json-seq` (RFC 7464): each JSON text after a record separator (0x1E).
    JsonSeq,
    /// `text/plain`: the console formatter's layout.
    Text,
}

impl LogFormat {
    pub fn content_type(self) -> &'static str {
        match self {
            LogFormat::NdJson => "application/x-ndjson",
            LogFormat::JsonSeq => "application/json-seq",
            LogFormat::Text => "text/plain",
        }
    }

    /// The first of the types an `Accept` header lists that this serves (no header or `*/*`:
    /// NDJSON, dotnet-monitor's default); `None` when it lists only others.
    pub fn from_accept(accept: Option<&str>) -> Option<LogFormat> {
        let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
            return Some(LogFormat::NdJson);
        };
        accept
            .split(',')
            .find_map(|item| match item.split(';').next().unwrap_or("").trim() {
                "application/x-ndjson" | "*/*" | "application/*" => Some(LogFormat::NdJson),
                "application/json-seq" => Some(LogFormat::JsonSeq),
                "text/plain" | "text/*" => Some(LogFormat::Text),
                _ => None,
            })
    }

    /// The file extension for egress.
    pub fn extension(self) -> &'static str {
        match self {
            LogFormat::NdJson | LogFormat::JsonSeq => "json",
            LogFormat::Text => "txt",
        }
    }

    /// One record, terminated.
    pub fn write(self, record: &LogRecord, out: &mut String) {
        match self {
            LogFormat::NdJson => {
                out.push_str(&record_json(record).to_string());
                out.push('\n');
            }
            LogFormat::JsonSeq => {
                out.push('\u{1e}');
                out.push_str(&record_json(record).to_string());
                out.push('\n');
            }
            LogFormat::Text => write_text(record, out),
        }
    }
}

/// dotnet-monitor's JSON fields, in its order (`StreamingLogger`), plus `TraceId`, `SpanId`,
/// `IdsFrom` (where those came from: `event` or `linkage`) and `UnixNanos` (the full-precision
/// time), which its scripts ignore.
pub fn record_json(record: &LogRecord) -> serde_json::Value {
    let m = &record.message;
    let mut object = serde_json::Map::new();
    let mut put = |k: &str, v: serde_json::Value| {
        object.insert(k.to_string(), v);
    };
    put(
        "Timestamp",
        profile::utc::format(record.unix_nanos, profile::utc::Form::Universal).into(),
    );
    put("LogLevel", m.level.name().into());
    put("EventId", m.event_id.into());
    put("EventName", m.event_name.clone().into());
    put("Category", m.category.clone().into());
    put("Message", m.message.clone().into());
    if let Some(e) = &m.exception {
        put("Exception", exception_text(e).into());
    }
    let mut state = serde_json::Map::new();
    state.insert("Message".into(), m.message.clone().into());
    for (k, v) in &m.arguments {
        state.insert(k.clone(), v.clone().into());
    }
    put("State", state.into());
    if !record.scopes.is_empty() {
        let scopes = record
            .scopes
            .iter()
            .map(|values| {
                values
                    .iter()
                    .map(|(k, v)| (k.clone(), serde_json::Value::from(v.clone())))
                    .collect::<serde_json::Map<_, _>>()
                    .into()
            })
            .collect::<Vec<serde_json::Value>>();
        put("Scopes", scopes.into());
    }
    if let Some(span) = &record.span {
        put("TraceId", span.trace_id.to_string().into());
        put("SpanId", span.span_id.to_string().into());
    }
    if let Some(from) = record.ids_from {
        put("IdsFrom", from.name().into());
    }
    put("UnixNanos", record.unix_nanos.into());
    object.into()
}

fn exception_text(e: &profile::log::LoggedException) -> String {
    if e.verbose_message.is_empty() {
        format!("{}: {}", e.type_name, e.message)
    } else {
        e.verbose_message.clone()
    }
}

/// dotnet-monitor's text layout (`StreamingLogger`, after the simple console formatter, with the
/// event name after the id): `<time> <lvl>: Category[EventId][EventName]`, the scopes on one
/// line (`      => k:v, k:v => k:v`), the message and the exception, indented.
fn write_text(record: &LogRecord, out: &mut String) {
    let m = &record.message;
    let _ = write!(
        out,
        "{} {}: {}[{}]",
        profile::utc::format(record.unix_nanos, profile::utc::Form::Universal),
        m.level.short_name(),
        m.category,
        m.event_id
    );
    if !m.event_name.is_empty() {
        let _ = write!(out, "[{}]", m.event_name);
    }
    out.push('\n');
    if !record.scopes.is_empty() {
        let scopes: Vec<String> = record
            .scopes
            .iter()
            .map(|scope| {
                let values: Vec<String> = scope.iter().map(|(k, v)| format!("{k}:{v}")).collect();
                format!("=> {}", values.join(", "))
            })
            .collect();
        let _ = writeln!(out, "      {}", scopes.join(" "));
    }
    for line in m.message.lines() {
        let _ = writeln!(out, "      {line}");
    }
    if let Some(e) = &m.exception {
        for line in exception_text(e).lines() {
            let _ = writeln!(out, "      {line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profile::log::LogMessage;
    use std::sync::Arc;

    #[test]
    fn settings_give_dotnet_monitors_filter_specs() {
        let get = LogsSettings::for_level(Some(LogLevel::Information));
        let p = get.provider();
        assert_eq!(p.keywords, JSON_MESSAGE_KEYWORD);
        assert_eq!(p.level, level::INFORMATIONAL);
        assert_eq!(p.arguments.as_deref(), Some("FilterSpecs=*:Information"));
        let body: LogsSettings = serde_json::from_str(
            r#"{"logLevel":"Error","filterSpecs":{"Logs.Orders":"Debug","Logs.Pay*":null}}"#,
        )
        .unwrap();
        assert_eq!(
            body.provider().arguments.as_deref(),
            Some("FilterSpecs=\"UseAppFilters;Logs.Orders:Debug;Logs.Pay*:Error\"")
        );
        assert!(body.accepts("Logs.Orders", LogLevel::Debug));
        assert!(!body.accepts("Logs.Payments", LogLevel::Warning));
        assert!(body.accepts("Other", LogLevel::Error));
        assert_eq!(body.lowest_level(), LogLevel::Debug);
        assert!(serde_json::from_str::<LogsSettings>(r#"{"logLevel":"Loud"}"#).is_err());
        // Trace is written out: the provider's default level stops at Debug.
        assert_eq!(
            LogsSettings::for_level(Some(LogLevel::Trace))
                .provider()
                .arguments
                .as_deref(),
            Some("FilterSpecs=*:Trace")
        );
        let body: LogsSettings = serde_json::from_str(
            r#"{"logLevel":"Trace","filterSpecs":{"Logs.Orders":"Error","Logs.Pay*":null},"useAppFilters":false}"#,
        )
        .unwrap();
        assert_eq!(
            body.provider().arguments.as_deref(),
            Some("FilterSpecs=\"Logs.Orders:Error;Logs.Pay*:Trace\"")
        );
        // Without the app's filters, categories the specs do not name are off.
        assert!(body.accepts("Logs.Payments", LogLevel::Trace));
        assert!(!body.accepts("Other", LogLevel::Critical));
    }

    /// FilterSpecs become rules of the app's logger factory, which applies the longest name that
    /// prefixes a category (ignoring case), not the first listed; an exact-looking name is a
    /// prefix too.
    #[test]
    fn specs_select_as_the_runtimes_rule_selector() {
        let body: LogsSettings = serde_json::from_str(
            r#"{"logLevel":"Critical","filterSpecs":{"Logs*":"Trace","Logs.Pay*":"Error","logs.orders":"Warning"},"useAppFilters":false}"#,
        )
        .unwrap();
        // Logs.Pay is longer than Logs: Error, although Logs* comes first.
        assert!(!body.accepts("Logs.Payments", LogLevel::Warning));
        assert!(body.accepts("Logs.Payments", LogLevel::Error));
        // Case is ignored; a name without `*` matches longer categories too.
        assert!(!body.accepts("Logs.Orders", LogLevel::Information));
        assert!(body.accepts("Logs.OrdersArchive", LogLevel::Warning));
        assert!(body.accepts("Logs.Other", LogLevel::Trace));
        assert!(!body.accepts("Other", LogLevel::Critical));
        // Of equal names, the last.
        let specs = vec![
            ("A*".to_string(), Some(LogLevel::Trace)),
            ("a".to_string(), Some(LogLevel::Error)),
        ];
        assert_eq!(
            matching_spec(&specs, "Abc").unwrap().1,
            Some(LogLevel::Error)
        );
    }

    /// The union lets through what every demand selects, each category at the lowest level any
    /// demand asks there, and nothing no demand asks.
    #[test]
    fn the_union_serves_every_demand() {
        let always = LogsSettings::for_level(Some(LogLevel::Information));
        let debug_orders: LogsSettings = serde_json::from_str(
            r#"{"logLevel":"Critical","filterSpecs":{"Logs.Orders":"Debug","Logs.Pay*":null},"useAppFilters":false}"#,
        )
        .unwrap();
        let warning = LogsSettings::for_level(Some(LogLevel::Warning));
        let demands = [always.clone(), debug_orders.clone(), warning.clone()];
        let union = LogsSettings::union(&demands).unwrap();
        assert_eq!(
            union.provider().arguments.as_deref(),
            Some("FilterSpecs=\"*:Information;Logs.Orders*:Debug;Logs.Pay*:Information\"")
        );
        assert_eq!(union.provider().level, level::VERBOSE);
        let categories = ["Logs.Orders", "Logs.Payments", "Other", "Logs.OrdersX"];
        for category in categories {
            for level in LogLevel::ALL {
                let wanted = demands.iter().any(|d| d.accepts(category, level));
                assert_eq!(
                    union.accepts(category, level),
                    wanted,
                    "{category} {level:?}"
                );
            }
        }
        // Specs alone: what no demand names stays off.
        let alone = LogsSettings::union([&debug_orders]).unwrap();
        assert!(!alone.accepts("Other", LogLevel::Critical));
        assert!(alone.accepts("Logs.Payments", LogLevel::Critical));
        // The app's filters are kept where no demand names the category.
        let app = LogsSettings::for_level(None);
        let union = LogsSettings::union([&app, &debug_orders]).unwrap();
        assert_eq!(
            union.provider().arguments.as_deref(),
            Some("FilterSpecs=\"UseAppFilters;Logs.Orders*:Trace;Logs.Pay*:Trace\"")
        );
        assert_eq!(LogsSettings::union([]), None);
        // What a union covers.
        let union = LogsSettings::union(&demands).unwrap();
        for d in &demands {
            assert!(union.covers(d));
        }
        assert!(!always.covers(&debug_orders));
        assert!(always.covers(&warning) && !warning.covers(&always));
        let orders_warning: LogsSettings =
            serde_json::from_str(r#"{"logLevel":"Critical","filterSpecs":{"Logs.Orders":"Warning"},"useAppFilters":false}"#)
                .unwrap();
        assert!(union.covers(&orders_warning));
        // The app's filters cannot be undone: an app-filtered union does not cover a level.
        assert!(!app.covers(&warning));
        assert!(warning.covers(&LogsSettings {
            log_level: LogLevel::Error,
            ..LogsSettings::default()
        }));
    }

    /// dotnet-monitor's text: the event name after the id, the scopes on one line.
    #[test]
    fn text_names_the_event_and_its_scopes() {
        let record = LogRecord {
            unix_nanos: 1_700_000_000_000_000_000,
            message: LogMessage {
                level: LogLevel::Warning,
                factory_id: 1,
                category: "Logs.Orders".into(),
                event_id: 1003,
                event_name: "OrderLogged".into(),
                message: "Order 7".into(),
                exception: None,
                arguments: Vec::new(),
                trace: None,
            },
            scopes: [
                vec![
                    ("Batch".into(), "4".into()),
                    ("{OriginalFormat}".into(), "Batch {Batch}".into()),
                ],
                vec![("Inner".into(), "x".into())],
            ]
            .map(|values| {
                let unlimited = profile::budget::SharedBudget::unlimited();
                Arc::new(profile::budget::Charged::new(
                    values,
                    unlimited.hold_nothing(),
                ))
            })
            .into(),
            span: None,
            ids_from: None,
        };
        let mut text = String::new();
        LogFormat::Text.write(&record, &mut text);
        assert_eq!(
            text,
            "2023-11-14 22:13:20Z warn: Logs.Orders[1003][OrderLogged]\n      => Batch:4, \
             {OriginalFormat}:Batch {Batch} => Inner:x\n      Order 7\n"
        );
    }

    #[test]
    fn accept_picks_the_format() {
        assert_eq!(LogFormat::from_accept(None), Some(LogFormat::NdJson));
        assert_eq!(
            LogFormat::from_accept(Some("text/html, application/json-seq;q=0.9")),
            Some(LogFormat::JsonSeq)
        );
        assert_eq!(
            LogFormat::from_accept(Some("text/plain")),
            Some(LogFormat::Text)
        );
        assert_eq!(LogFormat::from_accept(Some("image/png")), None);
    }

    #[test]
    fn scopes_resolve_to_the_activity_outside_them() {
        let id = |n: u8| Guid::from_bytes_le([n; 16]);
        let share = crate::signals::SignalShare::unlimited();
        let values = |k: &str, v: &str| {
            let values = vec![(k.to_string(), v.to_string())];
            let scope = crate::signals::SignalKind::Scopes;
            Arc::new(share.charged(scope, values, 0).unwrap())
        };
        let mut t = ScopeTracker::default();
        t.start(id(2), id(1), values("Batch", "4"));
        t.start(id(3), id(2), values("Inner", "x"));
        let (scopes, outside) = t.resolve(id(3));
        assert_eq!(outside, id(1));
        assert_eq!(scopes[0][0].0, "Batch");
        assert_eq!(scopes[1][0].0, "Inner");
        t.stop(id(3));
        assert_eq!(t.resolve(id(3)), (Vec::new(), id(3)));
    }

    /// Scopes whose stop never came must not keep newer ones out: the tracker lets the oldest go.
    #[test]
    fn scopes_never_stopped_make_room_for_new_ones() {
        let id = |n: u64| {
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&(n + 1).to_le_bytes());
            Guid::from_bytes_le(bytes)
        };
        let share = crate::signals::SignalShare::unlimited();
        let scope = crate::signals::SignalKind::Scopes;
        let values = || {
            Arc::new(
                share
                    .charged(scope, vec![("K".into(), "v".into())], 0)
                    .unwrap(),
            )
        };
        let span_activity = id(1 << 40);
        let mut t = ScopeTracker::default();
        for n in 0..MAX_OPEN_SCOPES as u64 {
            t.start(id(n), span_activity, values());
        }
        let fresh = id(1 << 41);
        t.start(fresh, span_activity, values());
        let (scopes, outside) = t.resolve(fresh);
        assert_eq!((scopes.len(), outside), (1, span_activity));
        assert_eq!(t.evicted, MAX_OPEN_SCOPES as u64 / 2);
        // The newer half is still open.
        assert_eq!(t.resolve(id(MAX_OPEN_SCOPES as u64 - 1)).0.len(), 1);
        assert_eq!(t.resolve(id(0)), (Vec::new(), id(0)));
    }
}
