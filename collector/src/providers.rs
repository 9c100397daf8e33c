//! What a trace session enables: dotnet-monitor's trace profiles and dotnet-trace's provider syntax.
//!
//! Profiles carry the providers, keywords, levels and rundown of dotnet-monitor's `Cpu`, `Http`,
//! `Logs`, `Metrics` and `GcCollect` (its `TraceUtilities` and the `*Configuration` classes of
//! Microsoft.Diagnostics.Monitoring.EventPipe), so a trace taken by clrscope holds what a trace
//! taken by dotnet-monitor with the same profile holds.

use std::fmt;
use std::str::FromStr;

use ipc::{ProviderConfig, DEFAULT_RUNDOWN_KEYWORD};

pub const SAMPLE_PROFILER: &str = "Microsoft-DotNETCore-SampleProfiler";
pub const RUNTIME: &str = "Microsoft-Windows-DotNETRuntime";
pub const RUNTIME_PRIVATE: &str = "Microsoft-Windows-DotNETRuntimePrivate";
pub const DIAGNOSTIC_SOURCE: &str = "Microsoft-Diagnostics-DiagnosticSource";
pub const EXTENSIONS_LOGGING: &str = "Microsoft-Extensions-Logging";
pub const TPL: &str = nettrace::events::TPL_PROVIDER;

/// EventLevel values.
pub mod level {
    pub const LOG_ALWAYS: u32 = 0;
    pub const CRITICAL: u32 = 1;
    pub const ERROR: u32 = 2;
    pub const WARNING: u32 = 3;
    pub const INFORMATIONAL: u32 = 4;
    pub const VERBOSE: u32 = 5;
}

/// TraceEvent's `ClrTraceEventParser.Keywords.Default`: GC, loader, JIT, exceptions, contention,
/// thread pool and the other keywords a CPU investigation wants.
pub const RUNTIME_DEFAULT_KEYWORDS: u64 = 0x14_C14F_CCBD;
/// The runtime provider's GC keyword (GCAllocationTick at Verbose).
pub const RUNTIME_GC_KEYWORD: u64 = 0x1;
/// What names code as the runtime loads it: the runtime provider's Loader (0x8) and JIT (0x10)
/// keywords (method and module events) and CompilationDiagnostic (0x2000000000), whose
/// R2RGetEntryPoint names each ReadyToRun method as its precompiled code is bound (no MethodLoad
/// does, and a rundown lists only what was bound before it).
pub const RUNTIME_JIT_LOADER_KEYWORDS: u64 = 0x18 | 0x20_0000_0000;
/// The runtime provider's Contention keyword (ContentionStart/Stop).
pub const RUNTIME_CONTENTION_KEYWORD: u64 = 0x4000;
/// The runtime provider's Exception keyword (ExceptionThrown).
pub const RUNTIME_EXCEPTION_KEYWORD: u64 = 0x8000;
/// The keywords `EventPipeProvider` enables when none are given (all of 0xF00000000000).
const SAMPLE_PROFILER_KEYWORDS: u64 = 0xF000_0000_0000;
/// DiagnosticSourceEventSource: Messages | Events.
const DIAGNOSTIC_SOURCE_KEYWORDS: u64 = 0x3;
/// Microsoft-Extensions-Logging: FormattedMessage | JsonMessage.
const LOGGING_KEYWORDS: u64 = 0xC;
/// TplEventSource's TasksFlowActivityIds: lets activity ids follow async work.
const TPL_FLOW_ACTIVITY_IDS: u64 = 0x80;
/// TplEventSource's DebugActivityId: a `SetActivityId` event whenever a thread's id changes.
const TPL_DEBUG_ACTIVITY_ID: u64 = 0x40000;
/// DiagnosticSourceEventSource's Events keyword (the forwarded activities and writes).
const DIAGNOSTIC_SOURCE_EVENTS: u64 = 0x2;
/// What linkage asks of each ActivitySource (`[AS]<source>` before it): `ActivityStart` and
/// `ActivityStop` with the W3C ids (the operation name is the event's own `ActivityName` field).
/// `Propagate` is the least a listener can vote for (.NET 8 offers no "observe only"): a span the
/// service's own tracing records stays recorded, one nobody else wants is created unrecorded.
const LINKAGE_SOURCE_SPEC: &str = "/-Propagate:-TraceId;SpanId";
/// What span export asks of each ActivitySource, in one line for both its start and its stop:
/// .NET 9 and later keep one spec per source (per source and activity name), so a second line
/// for the same source, such as a stop spec after a start spec, is ignored (the runtime says so
/// in a `Message` event) and the stops never come. The ids and whether the app records the span
/// (`Recorded` and `IsAllDataRequested`, see [`nettrace::events::DiagnosticSourceEvent::recorded`]),
/// then every field of the finished span that the transforms can reach (the fields
/// dotnet-monitor's distributed-traces pipeline asks for, with `Recorded` for
/// `ActivityTraceFlags`: a bool's `ToString()` is a constant). Starts carry the same fields, a
/// price of the one line. Each transform is a property fetch, a `ToString()` and a key-value
/// pair in the payload, so fields nobody exports are not asked for. `Events` and `Links` are
/// absent: their items have no `ToString()` of their own, so `*Enumerate` would give type names
/// (dotnet/runtime#102924).
const SPAN_SOURCE_SPEC: &str = concat!(
    "/-Propagate:-TraceId;SpanId;ParentSpanId;Recorded;IsAllDataRequested;TraceStateString;Kind",
    ";DisplayName;StartTimeTicks=StartTimeUtc.Ticks;DurationTicks=Duration.Ticks;Status",
    ";StatusDescription;Tags=TagObjects.*Enumerate;ActivitySourceVersion=Source.Version",
);
/// EventCounter providers of the `Metrics` profile.
const METRIC_PROVIDERS: [&str; 3] = [
    "System.Runtime",
    "Microsoft.AspNetCore.Hosting",
    "Grpc.AspNetCore.Server",
];

/// The FilterAndPayloadSpecs of the `Http` profile: ASP.NET Core incoming requests and HttpClient
/// outgoing requests as DiagnosticSource activities, with the fields dotnet-monitor asks for.
const HTTP_FILTER_AND_PAYLOAD_SPECS: &str = concat!(
    "Microsoft.AspNetCore/Microsoft.AspNetCore.Hosting.HttpRequestIn.Start@Activity1Start:-",
    "Request.Scheme;Request.Host;Request.PathBase;Request.QueryString;Request.Path;Request.Method",
    ";ActivityStartTime=*Activity.StartTimeUtc.Ticks;ActivityParentId=*Activity.ParentId",
    ";ActivityId=*Activity.Id;ActivitySpanId=*Activity.SpanId;ActivityTraceId=*Activity.TraceId",
    ";ActivityParentSpanId=*Activity.ParentSpanId;ActivityIdFormat=*Activity.IdFormat\r\n",
    "Microsoft.AspNetCore/Microsoft.AspNetCore.Hosting.HttpRequestIn.Stop@Activity1Stop:-",
    "ActivityId=*Activity.Id;Request.Path;Response.StatusCode",
    ";ActivityDuration=*Activity.Duration.Ticks\r\n",
    "HttpHandlerDiagnosticListener/System.Net.Http.HttpRequestOut@Event:-\r\n",
    "HttpHandlerDiagnosticListener/System.Net.Http.HttpRequestOut.Start@Activity2Start:-",
    "Request.RequestUri;Request.Method;Request.RequestUri.Host;Request.RequestUri.Port",
    ";ActivityStartTime=*Activity.StartTimeUtc.Ticks;ActivityId=*Activity.Id",
    ";ActivitySpanId=*Activity.SpanId;ActivityTraceId=*Activity.TraceId",
    ";ActivityParentSpanId=*Activity.ParentSpanId;ActivityIdFormat=*Activity.IdFormat",
    ";ActivityId=*Activity.Id\r\n",
    "HttpHandlerDiagnosticListener/System.Net.Http.HttpRequestOut.Stop@Activity2Stop:-",
    ";ActivityDuration=*Activity.Duration.Ticks;ActivityId=*Activity.Id\r\n",
);

/// The providers that let [`crate::activity::SpanTracker`] link samples to spans: the spans of
/// `activity_sources` (every ActivitySource when empty) from DiagnosticSourceEventSource, and
/// TplEventSource's activity-id flow with a `SetActivityId` event at every change of a thread's
/// activity id. Add them to a session that runs while sampling (any session of the same process:
/// timestamps are shared).
///
/// Listening changes what the service does: libraries that create spans only when someone
/// listens (HttpClient, ASP.NET Core hosting) create them, unrecorded, and send `traceparent`
/// with the sampled flag off where they sent nothing before. Naming the sources the service
/// traces itself avoids that. The DiagnosticSourceEventSource arguments are process-wide:
/// another session enabling that provider with other `FilterAndPayloadSpecs` replaces these for
/// every session until it ends.
///
/// With `spans`, each stop also carries the finished span (kind, times, status, tags, source
/// version) for span export ([`profile::span::SpanRecord`]).
pub fn linkage(
    activity_sources: &[&str],
    spans: bool,
) -> Result<Vec<ProviderConfig>, ProviderSpecError> {
    // These characters delimit a spec line, its source and its transforms, or the quoted
    // argument: a name holding one would select something else.
    if let Some(bad) = activity_sources
        .iter()
        .find(|s| s.is_empty() || s.contains(['/', ':', '+', '*', '"', '\r', '\n']))
    {
        return Err(ProviderSpecError::BadActivitySource(bad.to_string()));
    }
    // One line per source: .NET 9 and later ignore a later line naming a source again (names
    // compared without case).
    let mut sources: Vec<&str> = Vec::new();
    for source in activity_sources {
        if !sources.iter().any(|s| s.eq_ignore_ascii_case(source)) {
            sources.push(source);
        }
    }
    if sources.is_empty() {
        sources.push("*");
    }
    let spec = if spans {
        SPAN_SOURCE_SPEC
    } else {
        LINKAGE_SOURCE_SPEC
    };
    let specs = sources
        .iter()
        .map(|source| format!("[AS]{source}{spec}"))
        .collect::<Vec<_>>()
        .join("\r\n");
    Ok(vec![
        ProviderConfig::new(
            DIAGNOSTIC_SOURCE,
            DIAGNOSTIC_SOURCE_EVENTS,
            level::INFORMATIONAL,
        )
        .with_arguments(encode_arguments(&[("FilterAndPayloadSpecs", &specs)])),
        ProviderConfig::new(
            TPL,
            TPL_FLOW_ACTIVITY_IDS | TPL_DEBUG_ACTIVITY_ID,
            level::INFORMATIONAL,
        ),
    ])
}

/// Why a provider specification or profile name was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderSpecError {
    #[error("unknown trace profile {0:?}; known: Cpu, Http, Logs, Metrics, GcCollect")]
    UnknownProfile(String),
    #[error("provider name missing in {0:?} (expected Name[:keywords[:level[:key=value;...]]])")]
    MissingName(String),
    #[error(
        "keywords {keywords:?} of provider {provider} are not a hex number (e.g. 0x14C14FCCBD)"
    )]
    BadKeywords { provider: String, keywords: String },
    #[error(
        "level {level:?} of provider {provider} is not one of LogAlways, Critical, Error, \
         Warning, Informational, Verbose or 0-5"
    )]
    BadLevel { provider: String, level: String },
    #[error("argument {argument:?} of provider {provider} has no '=' (expected key=value;...)")]
    BadArgument { provider: String, argument: String },
    #[error("provider {0} is given twice with arguments; give its arguments once")]
    ConflictingArguments(String),
    #[error(
        "activity source name {0:?} is empty or holds one of / : + * \" or a line break, which \
         DiagnosticSourceEventSource's FilterAndPayloadSpecs would read as syntax"
    )]
    BadActivitySource(String),
}

/// dotnet-monitor's trace profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceProfile {
    /// CPU samples plus the runtime's default events (needed to name the frames).
    Cpu,
    /// Incoming and outgoing HTTP requests.
    Http,
    /// ILogger messages, with activity correlation.
    Logs,
    /// EventCounters of the runtime, ASP.NET Core hosting and gRPC.
    Metrics,
    /// GC events only.
    GcCollect,
}

impl TraceProfile {
    pub const ALL: [TraceProfile; 5] = [
        TraceProfile::Cpu,
        TraceProfile::Http,
        TraceProfile::Logs,
        TraceProfile::Metrics,
        TraceProfile::GcCollect,
    ];

    /// dotnet-monitor's default for `/trace`: every profile but Logs.
    pub const DEFAULT: [TraceProfile; 4] = [
        TraceProfile::Cpu,
        TraceProfile::Http,
        TraceProfile::Metrics,
        TraceProfile::GcCollect,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TraceProfile::Cpu => "Cpu",
            TraceProfile::Http => "Http",
            TraceProfile::Logs => "Logs",
            TraceProfile::Metrics => "Metrics",
            TraceProfile::GcCollect => "GcCollect",
        }
    }

    /// The profile's providers; `counter_interval_seconds` paces EventCounters (dotnet-monitor's
    /// GlobalCounter interval, 5 s by default).
    pub fn providers(self, counter_interval_seconds: u32) -> Vec<ProviderConfig> {
        match self {
            TraceProfile::Cpu => vec![
                ProviderConfig::new(
                    SAMPLE_PROFILER,
                    SAMPLE_PROFILER_KEYWORDS,
                    level::INFORMATIONAL,
                ),
                ProviderConfig::new(RUNTIME, RUNTIME_DEFAULT_KEYWORDS, level::INFORMATIONAL),
            ],
            TraceProfile::Http => vec![ProviderConfig::new(
                DIAGNOSTIC_SOURCE,
                DIAGNOSTIC_SOURCE_KEYWORDS,
                level::VERBOSE,
            )
            .with_arguments(encode_arguments(&[(
                "FilterAndPayloadSpecs",
                HTTP_FILTER_AND_PAYLOAD_SPECS,
            )]))],
            TraceProfile::Logs => vec![
                ProviderConfig::new(EXTENSIONS_LOGGING, LOGGING_KEYWORDS, level::LOG_ALWAYS)
                    .with_arguments(encode_arguments(&[("FilterSpecs", "UseAppFilters")])),
                ProviderConfig::new(TPL, TPL_FLOW_ACTIVITY_IDS, level::INFORMATIONAL),
            ],
            TraceProfile::Metrics => METRIC_PROVIDERS
                .iter()
                .map(|name| {
                    let interval = counter_interval_seconds.to_string();
                    ProviderConfig::new(*name, 0, level::INFORMATIONAL).with_arguments(
                        encode_arguments(&[("EventCounterIntervalSec", interval.as_str())]),
                    )
                })
                .collect(),
            TraceProfile::GcCollect => vec![
                ProviderConfig::new(RUNTIME, RUNTIME_GC_KEYWORD, level::INFORMATIONAL),
                ProviderConfig::new(RUNTIME_PRIVATE, RUNTIME_GC_KEYWORD, level::INFORMATIONAL),
            ],
        }
    }

    /// The rundown this profile asks for at the end of the session (0 = none).
    pub fn rundown_keyword(self) -> u64 {
        match self {
            TraceProfile::Cpu | TraceProfile::Http => DEFAULT_RUNDOWN_KEYWORD,
            TraceProfile::Logs | TraceProfile::Metrics => 0,
            TraceProfile::GcCollect => RUNTIME_GC_KEYWORD,
        }
    }
}

impl fmt::Display for TraceProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TraceProfile {
    type Err = ProviderSpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TraceProfile::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| ProviderSpecError::UnknownProfile(s.to_string()))
    }
}

/// The providers and rundown of one session, built from profiles and explicit providers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionProviders {
    pub providers: Vec<ProviderConfig>,
    /// OR of what every part asked for; 0 = no rundown.
    pub rundown_keyword: u64,
}

impl SessionProviders {
    /// Adds a profile's providers and rundown.
    pub fn add_profile(
        &mut self,
        profile: TraceProfile,
        counter_interval_seconds: u32,
    ) -> Result<(), ProviderSpecError> {
        self.rundown_keyword |= profile.rundown_keyword();
        for provider in profile.providers(counter_interval_seconds) {
            self.add(provider)?;
        }
        Ok(())
    }

    /// Adds a provider; one named twice is merged (keywords OR-ed, the more verbose level kept),
    /// since the runtime would otherwise see two configurations of one provider in one session.
    pub fn add(&mut self, provider: ProviderConfig) -> Result<(), ProviderSpecError> {
        let Some(existing) = self
            .providers
            .iter_mut()
            .find(|p| p.name.eq_ignore_ascii_case(&provider.name))
        else {
            self.providers.push(provider);
            return Ok(());
        };
        if existing.arguments.is_some() && provider.arguments.is_some() {
            if existing.arguments == provider.arguments {
                existing.keywords |= provider.keywords;
                existing.level = merge_level(existing.level, provider.level);
                return Ok(());
            }
            return Err(ProviderSpecError::ConflictingArguments(provider.name));
        }
        existing.keywords |= provider.keywords;
        existing.level = merge_level(existing.level, provider.level);
        if existing.arguments.is_none() {
            existing.arguments = provider.arguments;
        }
        Ok(())
    }
}

/// LogAlways (0) enables every level, so it wins; otherwise the more verbose (higher) level.
fn merge_level(a: u32, b: u32) -> u32 {
    if a == level::LOG_ALWAYS || b == level::LOG_ALWAYS {
        level::LOG_ALWAYS
    } else {
        a.max(b)
    }
}

/// Parses dotnet-trace's `Name[:keywords[:level[:key=value;...]]]`. Keywords are hex (with or
/// without `0x`), the level a name or 0-5 (default Informational); values holding `;` or `=` are
/// written in double quotes.
///
/// Omitted keywords mean every event of the provider (all bits set), because on .NET 8 an
/// EventSource enabled with keywords 0 writes nothing (measured on 8.0.4; dotnet-trace sends 0).
/// The runtime's own providers are the exception: all their bits would induce GCs and heap dumps,
/// so there omitted keywords mean TraceEvent's default set.
pub fn parse_provider(spec: &str) -> Result<ProviderConfig, ProviderSpecError> {
    let mut parts = spec.splitn(4, ':');
    let name = parts.next().unwrap_or_default().trim();
    if name.is_empty() {
        return Err(ProviderSpecError::MissingName(spec.to_string()));
    }
    let keywords = match parts.next().map(str::trim).filter(|k| !k.is_empty()) {
        None => default_keywords(name),
        Some(k) => {
            let digits = k
                .strip_prefix("0x")
                .or_else(|| k.strip_prefix("0X"))
                .unwrap_or(k);
            u64::from_str_radix(digits, 16).map_err(|_| ProviderSpecError::BadKeywords {
                provider: name.to_string(),
                keywords: k.to_string(),
            })?
        }
    };
    let level = match parts.next().map(str::trim).filter(|l| !l.is_empty()) {
        None => level::INFORMATIONAL,
        Some(l) => parse_level(l).ok_or_else(|| ProviderSpecError::BadLevel {
            provider: name.to_string(),
            level: l.to_string(),
        })?,
    };
    let mut provider = ProviderConfig::new(name, keywords, level);
    if let Some(arguments) = parts.next().filter(|a| !a.trim().is_empty()) {
        let pairs =
            parse_arguments(arguments).map_err(|argument| ProviderSpecError::BadArgument {
                provider: name.to_string(),
                argument,
            })?;
        let pairs: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        provider = provider.with_arguments(encode_arguments(&pairs));
    }
    Ok(provider)
}

/// Parses a comma-separated list of provider specs, as `--providers` takes them. Commas inside
/// double quotes belong to an argument value.
pub fn parse_providers(list: &str) -> Result<Vec<ProviderConfig>, ProviderSpecError> {
    split_unquoted(list, ',')
        .into_iter()
        .filter(|s| !s.trim().is_empty())
        .map(parse_provider)
        .collect()
}

fn default_keywords(provider: &str) -> u64 {
    if provider.eq_ignore_ascii_case(RUNTIME) || provider.eq_ignore_ascii_case(RUNTIME_PRIVATE) {
        RUNTIME_DEFAULT_KEYWORDS
    } else {
        u64::MAX
    }
}

/// An EventLevel by name (case-insensitive) or number (above 5 means Verbose).
pub(crate) fn parse_level(level: &str) -> Option<u32> {
    if let Ok(n) = level.parse::<u32>() {
        return Some(n.min(level::VERBOSE));
    }
    Some(match level.to_ascii_lowercase().as_str() {
        "logalways" => level::LOG_ALWAYS,
        "critical" => level::CRITICAL,
        "error" => level::ERROR,
        "warning" => level::WARNING,
        "informational" => level::INFORMATIONAL,
        "verbose" => level::VERBOSE,
        _ => return None,
    })
}

/// Splits `key=value;key="v;a=l"` into pairs, unquoting quoted values. Returns the offending
/// piece when one has no `=`.
fn parse_arguments(text: &str) -> Result<Vec<(String, String)>, String> {
    split_unquoted(text, ';')
        .into_iter()
        .filter(|piece| !piece.is_empty())
        .map(|piece| {
            let (key, value) = split_unquoted_once(piece, '=').ok_or_else(|| piece.to_string())?;
            Ok((unquote(key).to_string(), unquote(value).to_string()))
        })
        .collect()
}

/// The provider argument string the runtime parses: `key=value` joined by `;`, with keys and
/// values that hold `;` or `=` in double quotes.
pub fn encode_arguments(pairs: &[(&str, &str)]) -> String {
    let quote = |s: &str| {
        if s.contains(';') || s.contains('=') {
            format!("\"{s}\"")
        } else {
            s.to_string()
        }
    };
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", quote(k), quote(v)))
        .collect::<Vec<_>>()
        .join(";")
}

fn unquote(s: &str) -> &str {
    s.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s)
}

fn split_unquoted(text: &str, separator: char) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut in_quotes = false;
    for (i, c) in text.char_indices() {
        if c == '"' {
            in_quotes = !in_quotes;
        } else if c == separator && !in_quotes {
            pieces.push(&text[start..i]);
            start = i + c.len_utf8();
        }
    }
    pieces.push(&text[start..]);
    pieces
}

fn split_unquoted_once(text: &str, separator: char) -> Option<(&str, &str)> {
    let mut in_quotes = false;
    for (i, c) in text.char_indices() {
        if c == '"' {
            in_quotes = !in_quotes;
        } else if c == separator && !in_quotes {
            return Some((&text[..i], &text[i + c.len_utf8()..]));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotnet_trace_syntax() {
        let p = parse_provider("Microsoft-Windows-DotNETRuntime:0x14C14FCCBD:Verbose").unwrap();
        assert_eq!(p.name, RUNTIME);
        assert_eq!(p.keywords, 0x14_C14F_CCBD);
        assert_eq!(p.level, 5);
        assert_eq!(p.arguments, None);

        let p = parse_provider("System.Runtime").unwrap();
        assert_eq!((p.keywords, p.level), (u64::MAX, level::INFORMATIONAL));
        let p = parse_provider("Microsoft-Windows-DotNETRuntime").unwrap();
        assert_eq!(p.keywords, RUNTIME_DEFAULT_KEYWORDS);
        let p = parse_provider("System.Runtime:0").unwrap();
        assert_eq!(p.keywords, 0, "an explicit 0 stays 0");

        let p = parse_provider("MyProvider:ff::EventCounterIntervalSec=1").unwrap();
        assert_eq!((p.keywords, p.level), (0xff, level::INFORMATIONAL));
        assert_eq!(p.arguments.as_deref(), Some("EventCounterIntervalSec=1"));

        let p = parse_provider("P:1:9").unwrap();
        assert_eq!(p.level, level::VERBOSE, "levels above 5 clamp to Verbose");
    }

    #[test]
    fn quoted_arguments_keep_separators() {
        let p = parse_provider(r#"P:1:4:A=1;Specs="x/y:-a;b=c";B=2"#).unwrap();
        assert_eq!(
            p.arguments.as_deref(),
            Some(r#"A=1;Specs="x/y:-a;b=c";B=2"#)
        );
        let list = parse_providers(r#"A:1:4:k="a,b",B:2"#).unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].arguments.as_deref(), Some("k=a,b"));
        assert_eq!(list[1].name, "B");
    }

    #[test]
    fn bad_specs_name_the_problem() {
        assert_eq!(
            parse_provider(":1"),
            Err(ProviderSpecError::MissingName(":1".into()))
        );
        assert!(matches!(
            parse_provider("P:zz"),
            Err(ProviderSpecError::BadKeywords { .. })
        ));
        assert!(matches!(
            parse_provider("P:1:loud"),
            Err(ProviderSpecError::BadLevel { .. })
        ));
        assert!(matches!(
            parse_provider("P:1:4:novalue"),
            Err(ProviderSpecError::BadArgument { .. })
        ));
        assert!("cpu".parse::<TraceProfile>().is_ok());
        assert!("Disk".parse::<TraceProfile>().is_err());
    }

    #[test]
    fn profiles_match_dotnet_monitor() {
        let mut session = SessionProviders::default();
        for profile in TraceProfile::DEFAULT {
            session.add_profile(profile, 5).unwrap();
        }
        assert_eq!(
            session.rundown_keyword,
            DEFAULT_RUNDOWN_KEYWORD | RUNTIME_GC_KEYWORD
        );
        let names: Vec<&str> = session.providers.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            [
                SAMPLE_PROFILER,
                RUNTIME,
                DIAGNOSTIC_SOURCE,
                "System.Runtime",
                "Microsoft.AspNetCore.Hosting",
                "Grpc.AspNetCore.Server",
                RUNTIME_PRIVATE
            ]
        );
        // Cpu and GcCollect both enable the runtime provider: merged, not sent twice.
        assert_eq!(session.providers[1].keywords, RUNTIME_DEFAULT_KEYWORDS);
        let http = &session.providers[2];
        let args = http.arguments.as_deref().unwrap();
        assert!(args.starts_with("FilterAndPayloadSpecs=\"Microsoft.AspNetCore/"));
        assert!(args.ends_with("\r\n\""));
        assert_eq!(
            session.providers[3].arguments.as_deref(),
            Some("EventCounterIntervalSec=5")
        );
    }

    #[test]
    fn linkage_asks_for_span_events_and_activity_id_changes() {
        let providers = linkage(&[], false).unwrap();
        assert_eq!(providers.len(), 2);
        let ds = &providers[0];
        assert_eq!((ds.name.as_str(), ds.keywords), (DIAGNOSTIC_SOURCE, 0x2));
        assert_eq!(
            ds.arguments.as_deref(),
            Some(r#"FilterAndPayloadSpecs="[AS]*/-Propagate:-TraceId;SpanId""#)
        );
        let tpl = &providers[1];
        assert_eq!((tpl.name.as_str(), tpl.keywords), (TPL, 0x40080));
        assert_eq!(tpl.level, level::INFORMATIONAL);
        // The agent adds them to a session that has other providers.
        let mut session = SessionProviders::default();
        session.add_profile(TraceProfile::Cpu, 5).unwrap();
        for p in linkage(&[], false).unwrap() {
            session.add(p).unwrap();
        }
        assert_eq!(session.providers.len(), 4);

        // Named sources: one spec line each.
        let named = linkage(&["shop-orders", "Microsoft.AspNetCore"], false).unwrap();
        assert_eq!(
            named[0].arguments.as_deref(),
            Some(concat!(
                r#"FilterAndPayloadSpecs="[AS]shop-orders/-Propagate:-TraceId;SpanId"#,
                "\r\n",
                r#"[AS]Microsoft.AspNetCore/-Propagate:-TraceId;SpanId""#
            ))
        );
        // Span export: one line per source for start and stop, the whole span in both (.NET 9+
        // honour only the first line naming a source); a source named twice is one line.
        let spans = linkage(&["shop", "billing", "SHOP"], true).unwrap();
        let line = concat!(
            "-Propagate:-TraceId;SpanId;ParentSpanId;Recorded;IsAllDataRequested;",
            "TraceStateString;Kind;DisplayName;StartTimeTicks=StartTimeUtc.Ticks;",
            "DurationTicks=Duration.Ticks;Status;StatusDescription;Tags=TagObjects.*Enumerate;",
            "ActivitySourceVersion=Source.Version"
        );
        assert_eq!(
            spans[0].arguments.as_deref().unwrap(),
            format!("FilterAndPayloadSpecs=\"[AS]shop/{line}\r\n[AS]billing/{line}\"")
        );
        let every = linkage(&[], true).unwrap();
        assert_eq!(
            every[0].arguments.as_deref().unwrap(),
            format!("FilterAndPayloadSpecs=\"[AS]*/{line}\"")
        );
        for bad in ["", "a/b", "a:b", "a+op", "*", "a\"b", "a\nb"] {
            assert_eq!(
                linkage(&[bad], false),
                Err(ProviderSpecError::BadActivitySource(bad.to_string()))
            );
        }
    }

    #[test]
    fn merging_keeps_the_widest_configuration() {
        let mut session = SessionProviders::default();
        session.add(ProviderConfig::new("P", 0x1, 4)).unwrap();
        session
            .add(ProviderConfig::new("p", 0x4, 5).with_arguments("a=1"))
            .unwrap();
        session.add(ProviderConfig::new("P", 0, 0)).unwrap();
        assert_eq!(session.providers.len(), 1);
        let p = &session.providers[0];
        assert_eq!((p.keywords, p.level), (0x5, level::LOG_ALWAYS));
        assert_eq!(p.arguments.as_deref(), Some("a=1"));
        assert_eq!(
            session.add(ProviderConfig::new("P", 0, 4).with_arguments("a=2")),
            Err(ProviderSpecError::ConflictingArguments("P".into()))
        );
    }
}
