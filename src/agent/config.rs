//! The agent's configuration, from four sources, each overriding the one before:
//!
//! 1. a `settings.json` (`--config FILE`), with dotnet-monitor's keys where clrscope has the
//!    feature, so a team replacing dotnet-monitor keeps its file;
//! 2. a key-per-file directory (`--config-dir DIR`, e.g. a mounted Kubernetes Secret): each file
//!    name is a key path with `__` between levels, its content the value;
//! 3. environment variables `DOTNETMONITOR_…` and then `CLRSCOPE_…` (same `__` nesting, e.g.
//!    `CLRSCOPE_CollectionRules__HighCpu__Trigger__Type=CPUUsage`);
//! 4. command-line flags (see `agent::Args`).
//!
//! Sources 1–3 are merged as one JSON tree (keys matched without regard to letter case, as .NET
//! configuration does; array items addressed by index, `Actions__0__Type`) and then read into
//! [`AgentConfig`]: one field per top-level section, each section a type of the crate that uses
//! it. Values from the environment are strings; sections read numbers, booleans, durations and
//! sizes through `settings::lenient`, which takes both forms. A value of the wrong shape
//! is an error naming its key path; a top-level section clrscope does not read is logged and
//! ignored (dotnet-monitor files carry `Logging` and others).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use collector::rules::options::{CollectionRuleDefaultsSection, CollectionRulesSection};
use exporter::egress::EgressConfig;
use serde::Deserialize;
use serde_json::{Map, Value};
use settings::lenient;

/// Environment prefixes read, lowest precedence first.
const ENV_PREFIXES: [&str; 2] = ["DOTNETMONITOR_", "CLRSCOPE_"];

/// Every section clrscope reads. Add a section as a field here, with its type in the crate that
/// uses it.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct AgentConfig {
    /// Where the HTTP API listens (dotnet-monitor's `Urls`); `--urls` overrides it.
    #[serde(default)]
    pub urls: Option<String>,
    /// Host names the listeners answer to beyond their own address and localhost (ASP.NET
    /// Core's `AllowedHosts`: `;`-separated); `--allowed-hosts` overrides it.
    #[serde(default)]
    pub allowed_hosts: Option<String>,
    /// dotnet-monitor's `DiagnosticPort`: a socket path (listen mode), or
    /// `{ConnectionMode, EndpointName}`.
    #[serde(default)]
    pub diagnostic_port: Option<DiagnosticPortConfig>,
    /// What and how the agent profiles (clrscope's own).
    #[serde(default)]
    pub profiling: ProfilingConfig,
    /// Where and how long profiles are kept (clrscope's own).
    #[serde(default)]
    pub store: StoreConfig,
    /// The API key (dotnet-monitor's `Authentication:MonitorApiKey`).
    #[serde(default)]
    pub authentication: ui::auth::AuthenticationConfig,
    /// How many store queries of each route class the API runs and queues (clrscope's own).
    #[serde(default)]
    pub queries: ui::admission::QueriesConfig,
    /// The certificate for `https` URLs (Kestrel's `Kestrel:Certificates:Default`).
    #[serde(default)]
    pub kestrel: ui::tls::KestrelConfig,
    /// The metrics listener and the targets' runtime counters (dotnet-monitor's `Metrics`).
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// How often the targets' counters are published (dotnet-monitor's `GlobalCounter`).
    #[serde(default)]
    pub global_counter: GlobalCounterConfig,
    /// Backends the profiles are sent to, by name (clrscope's own; README, "Exporting").
    #[serde(default)]
    pub exporters: super::export::ExportersConfig,
    /// Where artifacts go when the API or a rule egresses them (dotnet-monitor's `Egress`:
    /// `FileSystem`, `S3Storage`), and clrscope's `Egress:DiskBudget`.
    #[serde(default)]
    pub egress: EgressConfig,
    /// dotnet-monitor's collection rules, checked with `CollectionRuleDefaults` by
    /// `collector::rules::options::compile`.
    #[serde(default)]
    pub collection_rules: CollectionRulesSection,
    /// dotnet-monitor's `CollectionRuleDefaults` (`Actions:Egress`, `Triggers`, `Limits`).
    #[serde(default)]
    pub collection_rule_defaults: CollectionRuleDefaultsSection,
}

/// dotnet-monitor's `DiagnosticPort` section, or its short form (a path: listen mode).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum DiagnosticPortConfig {
    Path(PathBuf),
    Section(DiagnosticPortSection),
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct DiagnosticPortSection {
    #[serde(default)]
    pub connection_mode: ConnectionMode,
    #[serde(default)]
    pub endpoint_name: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
pub enum ConnectionMode {
    /// Find processes by their own diagnostic sockets (dotnet-monitor's default).
    #[default]
    Connect,
    /// Only accept runtimes that dial `EndpointName`.
    Listen,
}

impl DiagnosticPortConfig {
    /// The listen socket, if runtimes should dial one, and whether the agent also looks for
    /// processes' own sockets.
    pub fn listen_socket(&self) -> anyhow::Result<(Option<PathBuf>, bool)> {
        match self {
            DiagnosticPortConfig::Path(path) => Ok((Some(path.clone()), false)),
            DiagnosticPortConfig::Section(section) => match section.connection_mode {
                ConnectionMode::Connect => Ok((None, true)),
                ConnectionMode::Listen => match &section.endpoint_name {
                    Some(path) => Ok((Some(path.clone()), false)),
                    None => bail!(
                        "DiagnosticPort:ConnectionMode is Listen but DiagnosticPort:EndpointName \
                         is not set: give the socket path the runtimes dial \
                         (DOTNET_DiagnosticPorts=PATH,nosuspend)"
                    ),
                },
            },
        }
    }
}

/// The `Profiling` section: the same settings as the agent's flags of the same names.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct ProfilingConfig {
    #[serde(default, deserialize_with = "lenient::opt_duration")]
    pub sample_window: Option<Duration>,
    #[serde(default, deserialize_with = "lenient::opt_duration")]
    pub sample_period: Option<Duration>,
    /// A percent of one core.
    #[serde(default, deserialize_with = "lenient::opt_number")]
    pub sample_idle_below: Option<f64>,
    #[serde(default, deserialize_with = "lenient::opt_duration")]
    pub rescan_interval: Option<Duration>,
    #[serde(default, deserialize_with = "lenient::opt_duration")]
    pub startup_grace: Option<Duration>,
    #[serde(default, deserialize_with = "lenient::opt_boolean")]
    pub alloc: Option<bool>,
    #[serde(default, deserialize_with = "lenient::opt_boolean")]
    pub exceptions: Option<bool>,
    #[serde(default, deserialize_with = "lenient::opt_boolean")]
    pub locks: Option<bool>,
    #[serde(default, deserialize_with = "lenient::opt_boolean")]
    pub trace_linkage: Option<bool>,
    #[serde(default)]
    pub trace_sources: Vec<String>,
    #[serde(default, deserialize_with = "lenient::opt_number")]
    pub trace_rate_limit: Option<u32>,
    #[serde(default, deserialize_with = "lenient::numbers")]
    pub process_ids: Vec<u64>,
    #[serde(default)]
    pub process_names: Vec<String>,
    #[serde(default)]
    pub command_lines: Vec<String>,
    /// `--logs`: the level the always-on logs session collects at.
    #[serde(default, deserialize_with = "opt_log_level")]
    pub logs: Option<profile::log::LogLevel>,
    /// `--exception-history`.
    #[serde(default, deserialize_with = "lenient::opt_number")]
    pub exception_history: Option<usize>,
    /// `--nettrace-agent-budget`.
    #[serde(default, deserialize_with = "lenient::opt_bytes")]
    pub nettrace_agent_budget: Option<u64>,
    /// `--signal-budget`.
    #[serde(default, deserialize_with = "lenient::opt_bytes")]
    pub signal_budget: Option<u64>,
    /// `--signal-process-budget`.
    #[serde(default, deserialize_with = "lenient::opt_bytes")]
    pub signal_process_budget: Option<u64>,
}

/// A `Microsoft.Extensions.Logging` level by name (`Information`), as `--logs` takes it.
fn opt_log_level<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<profile::log::LogLevel>, D::Error> {
    let text = String::deserialize(d)?;
    profile::log::LogLevel::parse(&text)
        .map(Some)
        .ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown log level {text:?}: use Trace, Debug, Information, Warning, Error or \
                 Critical"
            ))
        })
}

/// The `Store` section: the same settings as the agent's flags of the same names.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct StoreConfig {
    #[serde(default)]
    pub data_directory: Option<PathBuf>,
    #[serde(default, deserialize_with = "lenient::opt_duration")]
    pub retention: Option<Duration>,
    #[serde(default, deserialize_with = "lenient::opt_duration")]
    pub full_detail_retention: Option<Duration>,
    #[serde(default, deserialize_with = "lenient::opt_bytes")]
    pub retention_size: Option<u64>,
    #[serde(default, deserialize_with = "lenient::opt_duration")]
    pub flush_interval: Option<Duration>,
    #[serde(default, deserialize_with = "lenient::opt_duration")]
    pub incident_before: Option<Duration>,
    #[serde(default, deserialize_with = "lenient::opt_duration")]
    pub incident_after: Option<Duration>,
}

/// The `Metrics` section of settings.json, dotnet-monitor's keys: whether the metrics listener
/// and the targets' runtime counters are on, where the listener is, and which counters and
/// meters to read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct MetricsConfig {
    /// `false`: no metrics listener and no runtime counters (the API's `/metrics` still shows
    /// the agent's own numbers).
    #[serde(default, deserialize_with = "lenient::opt_boolean")]
    pub enabled: Option<bool>,
    /// The metrics listener's URL (`--metrics-urls`), one.
    #[serde(default)]
    pub endpoints: Option<String>,
    /// dotnet-monitor's count of samples kept per metric. Read so that its files load; clrscope
    /// serves each value's latest sample.
    #[serde(default, deserialize_with = "lenient::opt_number")]
    pub metric_count: Option<u32>,
    /// `false`: not `System.Runtime`, `Microsoft.AspNetCore.Hosting`, `Grpc.AspNetCore.Server`.
    #[serde(default, deserialize_with = "lenient::opt_boolean")]
    pub include_default_providers: Option<bool>,
    #[serde(default)]
    pub providers: Vec<MetricProvider>,
    #[serde(default)]
    pub meters: Vec<MetricMeter>,
}

/// dotnet-monitor's `GlobalCounter` section. One interval for every counter session of the
/// agent (/metrics, OTLP, /livemetrics, triggers, the Metrics trace profile): on .NET ≥ 8 a
/// process's metrics listeners share one aggregation, which refuses listeners that ask for
/// another interval or other limits.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct GlobalCounterConfig {
    /// Seconds between two published values, 1 to 86400 (default 5).
    #[serde(default, deserialize_with = "lenient::opt_number")]
    pub interval_seconds: Option<u32>,
    /// Histogram tag sets the runtime aggregates per process, 1 to 100000 (default 20).
    #[serde(default, deserialize_with = "lenient::opt_number")]
    pub max_histograms: Option<u32>,
    /// Tag sets of the other instruments, 1 to 1000000 (default 1000).
    #[serde(default, deserialize_with = "lenient::opt_number")]
    pub max_time_series: Option<u32>,
}

/// `Metrics:Providers:N`: an EventCounter source, and which of its counters (default: all).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct MetricProvider {
    pub provider_name: String,
    #[serde(default)]
    pub counter_names: Vec<String>,
}

/// `Metrics:Meters:N`: a System.Diagnostics.Metrics meter, and which of its instruments
/// (default: all).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct MetricMeter {
    pub meter_name: String,
    #[serde(default)]
    pub instrument_names: Vec<String>,
}

/// Where the configuration comes from, besides the environment.
#[derive(Debug, Clone, Default)]
pub struct ConfigSources<'a> {
    pub file: Option<&'a Path>,
    pub dir: Option<&'a Path>,
}

impl AgentConfig {
    /// Reads and merges the file, the directory and the process environment.
    pub fn load(sources: ConfigSources<'_>) -> anyhow::Result<AgentConfig> {
        AgentConfig::from_sources(
            sources,
            std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
        )
    }

    fn from_sources(
        sources: ConfigSources<'_>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> anyhow::Result<AgentConfig> {
        let mut tree = match sources.file {
            Some(path) => read_settings_file(path)?,
            None => Value::Object(Map::new()),
        };
        if let Some(dir) = sources.dir {
            for (key, value) in read_key_per_file(dir)? {
                overlay(&mut tree, &key, value)
                    .with_context(|| format!("{}: file {key}", dir.display()))?;
            }
        }
        let from_files: Vec<String> = tree
            .as_object()
            .map(|sections| sections.keys().cloned().collect())
            .unwrap_or_default();
        let env: Vec<(String, String)> = env.into_iter().collect();
        for prefix in ENV_PREFIXES {
            let mut vars: Vec<(&str, &str)> = env
                .iter()
                .filter_map(|(name, value)| {
                    let rest = name.get(..prefix.len())?.eq_ignore_ascii_case(prefix);
                    rest.then(|| (&name[prefix.len()..], value.as_str()))
                })
                .collect();
            vars.sort();
            for (key, value) in vars {
                overlay(&mut tree, key, value.to_string())
                    .with_context(|| format!("environment variable {prefix}{key}"))?;
            }
        }
        indexed_objects_to_arrays(&mut tree, "")?;
        AgentConfig::from_tree(tree, &from_files)
    }

    /// `from_files`: the top-level names the file or key-per-file directory set (an unknown one
    /// there is likely a typo; one only the environment set is as likely another tool's
    /// variable under the same prefix, such as the test bed's `CLRSCOPE_DOTNET`).
    fn from_tree(mut tree: Value, from_files: &[String]) -> anyhow::Result<AgentConfig> {
        let Value::Object(sections) = &mut tree else {
            bail!("the configuration must be a JSON object of sections, e.g. {{\"Urls\": \"http://127.0.0.1:52323\"}}");
        };
        // Top-level section names in any letter case; sections this agent does not read are
        // skipped with a warning rather than refused, so dotnet-monitor's files load.
        let known = section_names();
        let mut read = Map::new();
        for (name, value) in std::mem::take(sections) {
            match known.iter().find(|k| k.eq_ignore_ascii_case(&name)) {
                Some(k) => {
                    read.insert((*k).to_string(), value);
                }
                None if from_files.contains(&name) => tracing::warn!(
                    section = %name,
                    "ignoring a configuration section clrscope does not read (it reads: {})",
                    known.join(", ")
                ),
                None => tracing::debug!(
                    section = %name,
                    "ignoring environment variables of a section clrscope does not read"
                ),
            }
        }
        serde_path_to_error::deserialize(Value::Object(read)).map_err(|e| {
            let path = e.path().to_string().replace('.', ":");
            anyhow::anyhow!("configuration key {path}: {}", e.into_inner())
        })
    }
}

fn read_settings_file(path: &Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the configuration file {}", path.display()))?;
    let tree: Value = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not valid JSON (a settings.json object of sections)",
            path.display()
        )
    })?;
    if !tree.is_object() {
        bail!(
            "{}: the configuration must be a JSON object of sections, e.g. {{\"Urls\": \"http://127.0.0.1:52323\"}}",
            path.display()
        );
    }
    Ok(tree)
}

/// Every regular file of `dir` as (key path, content without its final line break), in name order.
fn read_key_per_file(dir: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("reading the configuration directory {}", dir.display()))?;
    let mut keys = BTreeMap::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // Kubernetes projects a Secret as links to `..data/NAME`; its own entries start with `..`.
        if name.starts_with('.') || !entry.path().is_file() {
            continue;
        }
        let content = std::fs::read_to_string(entry.path())
            .with_context(|| format!("reading {}", entry.path().display()))?;
        let content = content.strip_suffix('\n').unwrap_or(&content);
        let content = content.strip_suffix('\r').unwrap_or(content);
        keys.insert(name, content.to_string());
    }
    Ok(keys)
}

/// Sets `key` (levels separated by `__`) in `tree` to the string `value`, reusing existing keys
/// whatever their letter case and indexing into existing arrays.
fn overlay(tree: &mut Value, key: &str, value: String) -> anyhow::Result<()> {
    let segments: Vec<&str> = key.split("__").collect();
    if segments.iter().any(|s| s.is_empty()) {
        bail!("the key {key:?} has an empty level: use Section__Key");
    }
    let mut node = tree;
    for segment in segments {
        if let Value::Array(items) = node {
            let index: usize = segment.parse().with_context(|| {
                format!("{key}: {segment:?} addresses an array, which takes an index (0, 1, …)")
            })?;
            if index > items.len() {
                bail!(
                    "{key}: index {index} skips items (the array has {}): number items from 0 without gaps",
                    items.len()
                );
            }
            if index == items.len() {
                items.push(Value::Null);
            }
            node = &mut items[index];
            continue;
        }
        if !node.is_object() {
            *node = Value::Object(Map::new());
        }
        let Value::Object(map) = node else {
            unreachable!("made an object above")
        };
        let existing = map
            .keys()
            .find(|k| k.eq_ignore_ascii_case(segment))
            .cloned()
            .unwrap_or_else(|| segment.to_string());
        node = map.entry(existing).or_insert(Value::Null);
    }
    *node = Value::String(value);
    Ok(())
}

/// Objects whose keys are all indices (`{"0": …, "1": …}`, how flat sources spell arrays) become
/// arrays, in index order; indices must run from 0 without gaps. `path` names `tree` in errors.
fn indexed_objects_to_arrays(tree: &mut Value, path: &str) -> anyhow::Result<()> {
    match tree {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                let path = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}:{key}")
                };
                indexed_objects_to_arrays(value, &path)?;
            }
            let mut indices: Vec<usize> = Vec::with_capacity(map.len());
            for key in map.keys() {
                match key.parse::<usize>() {
                    Ok(i) if i.to_string() == *key => indices.push(i),
                    _ => return Ok(()),
                }
            }
            indices.sort_unstable();
            if map.is_empty() {
                return Ok(());
            }
            if indices.iter().enumerate().any(|(n, &i)| n != i) {
                bail!(
                    "configuration key {path}: array items {indices:?} are numbered with gaps: \
                     number them from 0 without gaps"
                );
            }
            let mut map = std::mem::take(map);
            *tree = Value::Array(
                indices
                    .iter()
                    .map(|i| map.remove(&i.to_string()).unwrap_or(Value::Null))
                    .collect(),
            );
        }
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                indexed_objects_to_arrays(item, &format!("{path}:{i}"))?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// The top-level section names [`AgentConfig`] reads, as serde sees them.
fn section_names() -> &'static [&'static str] {
    use serde::de::{self, Visitor};

    /// A deserializer that only records the field names a struct asks for.
    struct FieldNames(Option<&'static [&'static str]>);

    #[derive(Debug)]
    struct Recorded;
    impl std::fmt::Display for Recorded {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("field names recorded")
        }
    }
    impl std::error::Error for Recorded {}
    impl de::Error for Recorded {
        fn custom<T: std::fmt::Display>(_: T) -> Self {
            Recorded
        }
    }

    impl<'de> de::Deserializer<'de> for &mut FieldNames {
        type Error = Recorded;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Recorded> {
            Err(Recorded)
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Recorded> {
            self.0 = Some(fields);
            Err(Recorded)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }

    let mut names = FieldNames(None);
    let _ = AgentConfig::deserialize(&mut names);
    names.0.unwrap_or(&[])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(file: Option<&str>, env: &[(&str, &str)]) -> anyhow::Result<AgentConfig> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        if let Some(text) = file {
            std::fs::write(&path, text).unwrap();
        }
        AgentConfig::from_sources(
            ConfigSources {
                file: file.map(|_| path.as_path()),
                dir: None,
            },
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
    }

    #[test]
    fn sections_are_introspected() {
        let names = section_names();
        for section in [
            "Urls",
            "DiagnosticPort",
            "Profiling",
            "Store",
            "Exporters",
            "Egress",
            "CollectionRules",
            "CollectionRuleDefaults",
        ] {
            assert!(names.contains(&section), "{section} not in {names:?}");
        }
    }

    #[test]
    fn file_then_environment() {
        let config = load(
            Some(
                r#"{
                  "Logging": {"LogLevel": {"Default": "Information"}},
                  "urls": "http://127.0.0.1:9000",
                  "DiagnosticPort": {"ConnectionMode": "Listen", "EndpointName": "/diag/a.sock"},
                  "Profiling": {"SampleWindow": "00:00:00.5", "Alloc": false, "ProcessNames": ["Shop"]},
                  "Store": {"RetentionSize": "2GiB"}
                }"#,
            ),
            &[
                ("CLRSCOPE_Profiling__SamplePeriod", "20s"),
                ("CLRSCOPE_Profiling__SampleIdleBelow", "0.5"),
                ("clrscope_PROFILING__ALLOC", "true"),
                ("DOTNETMONITOR_Store__Retention", "1.00:00:00"),
                ("CLRSCOPE_Profiling__ProcessIds__0", "42"),
                ("CLRSCOPE_Profiling__ProcessIds__1", "43"),
                ("CLRSCOPE_Profiling__ProcessNames__1", "Billing"),
                ("HOME", "/root"),
            ],
        )
        .unwrap();
        assert_eq!(config.urls.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(
            config.diagnostic_port.unwrap().listen_socket().unwrap(),
            (Some(PathBuf::from("/diag/a.sock")), false)
        );
        let p = config.profiling;
        assert_eq!(p.sample_window, Some(Duration::from_millis(500)));
        assert_eq!(p.sample_period, Some(Duration::from_secs(20)));
        assert_eq!(p.sample_idle_below, Some(0.5));
        assert_eq!(p.alloc, Some(true), "the environment overrides the file");
        assert_eq!(p.process_ids, [42, 43]);
        assert_eq!(p.process_names, ["Shop", "Billing"]);
        assert_eq!(config.store.retention, Some(Duration::from_secs(86_400)));
        assert_eq!(config.store.retention_size, Some(2 << 30));
    }

    #[test]
    fn exporters_by_name_from_file_and_environment() {
        let config = load(
            Some(r#"{"Exporters": {"otel": {"Kind": "otlp-grpc", "Endpoint": "http://c:4317"}}}"#),
            &[
                ("CLRSCOPE_Exporters__otel__QueueSize", "3"),
                ("CLRSCOPE_Exporters__otel__Headers__X-Scope-OrgID", "team"),
                ("CLRSCOPE_Exporters__pyro__Kind", "pyroscope"),
                ("CLRSCOPE_Exporters__pyro__Endpoint", "http://p:4040"),
                ("CLRSCOPE_Exporters__pyro__Interval", "00:00:05"),
            ],
        )
        .unwrap();
        let otel = &config.exporters["otel"];
        assert_eq!(otel.kind, exporter::remote::Kind::OtlpGrpc);
        assert_eq!(otel.queue_size, Some(3));
        assert_eq!(otel.headers["X-Scope-OrgID"], "team");
        let pyro = &config.exporters["pyro"];
        assert_eq!(pyro.kind, exporter::remote::Kind::Pyroscope);
        assert_eq!(pyro.interval, Some(Duration::from_secs(5)));
        let m = format!(
            "{:#}",
            load(None, &[("CLRSCOPE_Exporters__x__Kind", "zipkin")]).unwrap_err()
        );
        assert!(m.contains("Exporters:x") && m.contains("otlp-grpc"), "{m}");
    }

    #[test]
    fn diagnostic_port_forms() {
        let short = load(Some(r#"{"DiagnosticPort": "/diag/p.sock"}"#), &[]).unwrap();
        assert_eq!(
            short.diagnostic_port.unwrap().listen_socket().unwrap(),
            (Some(PathBuf::from("/diag/p.sock")), false)
        );
        let connect = load(
            None,
            &[("CLRSCOPE_DiagnosticPort__ConnectionMode", "Connect")],
        )
        .unwrap();
        assert_eq!(
            connect.diagnostic_port.unwrap().listen_socket().unwrap(),
            (None, true)
        );
        let listen = load(
            None,
            &[("CLRSCOPE_DiagnosticPort__ConnectionMode", "Listen")],
        )
        .unwrap();
        let error = listen.diagnostic_port.unwrap().listen_socket().unwrap_err();
        assert!(error.to_string().contains("EndpointName"), "{error}");
    }

    #[test]
    fn errors_name_the_key() {
        let message = |file: Option<&str>, env: &[(&str, &str)]| {
            format!("{:#}", load(file, env).unwrap_err())
        };
        let m = message(Some(r#"{"Profiling": {"SampleWindow": "soon"}}"#), &[]);
        assert!(
            m.contains("Profiling:SampleWindow") && m.contains("invalid"),
            "{m}"
        );
        let m = message(None, &[("CLRSCOPE_Store__RetentionSize", "lots")]);
        assert!(m.contains("Store:RetentionSize"), "{m}");
        let m = message(Some(r#"{"Profiling": {"SampleWindows": "1s"}}"#), &[]);
        assert!(
            m.contains("SampleWindows") && m.contains("SampleWindow"),
            "{m}"
        );
        let m = message(Some("{not json"), &[]);
        assert!(m.contains("not valid JSON"), "{m}");
        let m = message(Some("[1]"), &[]);
        assert!(m.contains("JSON object"), "{m}");
        let m = message(None, &[("CLRSCOPE_Profiling__ProcessIds__3", "1")]);
        assert!(
            m.contains("Profiling:ProcessIds") && m.contains("gaps"),
            "{m}"
        );
        let m = message(
            Some(r#"{"Profiling": {"ProcessIds": [1]}}"#),
            &[("CLRSCOPE_Profiling__ProcessIds__3", "1")],
        );
        assert!(
            m.contains("CLRSCOPE_Profiling__ProcessIds__3") && m.contains("skips"),
            "{m}"
        );
        let m = message(None, &[("CLRSCOPE_Profiling____Alloc", "1")]);
        assert!(m.contains("empty level"), "{m}");
    }

    #[test]
    fn key_per_file_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("Store__DataDirectory"),
            "/var/lib/clrscope\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("..data"), "ignored").unwrap();
        let config = AgentConfig::from_sources(
            ConfigSources {
                file: None,
                dir: Some(dir.path()),
            },
            [(
                "CLRSCOPE_Urls".to_string(),
                "http://127.0.0.1:1".to_string(),
            )],
        )
        .unwrap();
        assert_eq!(
            config.store.data_directory,
            Some(PathBuf::from("/var/lib/clrscope"))
        );
        assert_eq!(config.urls.as_deref(), Some("http://127.0.0.1:1"));
    }

    #[test]
    fn arrays_from_flat_keys() {
        let mut tree = serde_json::json!({"A": {"0": "x", "1": {"1": 2, "0": 1}}, "C": {"00": 1}});
        indexed_objects_to_arrays(&mut tree, "").unwrap();
        assert_eq!(
            tree,
            serde_json::json!({"A": ["x", [1, 2]], "C": {"00": 1}})
        );
        let mut gaps = serde_json::json!({"B": {"X": {"0": 1, "2": 2}}});
        let error = indexed_objects_to_arrays(&mut gaps, "")
            .unwrap_err()
            .to_string();
        assert!(error.contains("B:X") && error.contains("gaps"), "{error}");
    }

    #[test]
    fn the_metrics_section_reads_dotnet_monitors_keys() {
        let config: MetricsConfig = serde_json::from_str(
            r#"{"Enabled": "true", "Endpoints": "http://+:52325", "MetricCount": 3,
                "IncludeDefaultProviders": false,
                "Providers": [{"ProviderName": "System.Runtime", "CounterNames": ["cpu-usage"]}],
                "Meters": [{"MeterName": "AsyncWeb"}]}"#,
        )
        .unwrap();
        assert_eq!(config.enabled, Some(true));
        assert_eq!(config.include_default_providers, Some(false));
        assert_eq!(config.providers[0].counter_names, ["cpu-usage"]);
        assert!(config.meters[0].instrument_names.is_empty());
        assert!(serde_json::from_str::<MetricsConfig>(r#"{"Enable": true}"#).is_err());
    }

    #[test]
    fn logs_and_exception_history_keys() {
        let config = load(
            Some(r#"{"Profiling": {"Logs": "Information", "ExceptionHistory": "250"}}"#),
            &[],
        )
        .unwrap();
        assert_eq!(
            config.profiling.logs,
            Some(profile::log::LogLevel::Information)
        );
        assert_eq!(config.profiling.exception_history, Some(250));
        let config = load(None, &[("CLRSCOPE_Profiling__ExceptionHistory", "0")]).unwrap();
        assert_eq!(config.profiling.exception_history, Some(0));
        let error = format!(
            "{:#}",
            load(Some(r#"{"Profiling": {"Logs": "Loud"}}"#), &[]).unwrap_err()
        );
        assert!(
            error.contains("Profiling:Logs") && error.contains("Loud"),
            "{error}"
        );
    }
}
