//! OTLP Profiles (`opentelemetry.proto.profiles.v1development`, proto v1.10): the request the
//! agent sends an OpenTelemetry Collector, Pyroscope or any OTLP profiles receiver.
//!
//! [`RequestBuilder`] turns the agent's store batches into one `ExportProfilesServiceRequest`:
//!
//! - one `ProfilesDictionary` for the whole request, every table starting with its zero entry
//!   (`Mapping{}`, `Location{}`, `Function{}`, a zero `Link`, `""`, `KeyValueAndUnit{}`,
//!   `Stack{}`) as the proto requires, each entry once;
//! - one `ResourceProfiles` per series (a process), with the OpenTelemetry resource attributes
//!   `service.name`, `process.pid` and `host.name` (other series labels as they are);
//! - one `Profile` per profile type of that process, its `sample_type` the store's type and unit
//!   (`cpu`/`nanoseconds`, `alloc_size`/`bytes`, ...), cpu and wall with a `period_type` of the
//!   same kind and the sampler's measured period;
//! - one `Sample` per stack, attributes and link, its values paired with timestamps: one value
//!   per batch the sample appeared in, stamped with the batch's time (the start of its sampler
//!   window, or of its event interval);
//! - a sample whose labels carry `trace_id` and `span_id` points at a `Link` with those ids; its
//!   other labels become attributes (`thread_id` as `thread.id`, `thread_name` as
//!   `thread.name`, the rest under their own names).
//!
//! Functions become one `Location` each (frames are symbolized already, no address is worth
//! keeping) with one `Line`, and the module of a function its `Mapping`, as in [`crate::pprof`].

pub mod traces;

use std::collections::HashMap;
use std::sync::Arc;

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::logs::v1::{LogRecord as LogsRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::profiles::v1development as otlp;
use opentelemetry_proto::tonic::resource::v1::Resource;
use profile::exception::ExceptionRecord;
use profile::labels;
use profile::log::LogLevel;
use profile::log::{IdsFrom, LogRecord};
use profile::signal::Signal;
use profile::{Batch, ProfileType};
use profile::{Function, LabelValue};

/// A store batch on its way to an exporter, with what the store does not keep.
#[derive(Debug, Clone)]
pub struct ExportBatch {
    pub batch: Arc<Batch>,
    /// The sampler period each sample of a cpu or wall batch stands for (its value is a count of
    /// samples times this), measured in its window; 0 for event profiles, which count events.
    pub period_nanos: i64,
}

impl ExportBatch {
    /// How many samples a value of this batch stands for: `value / period` for sampled profiles,
    /// `None` for event profiles.
    pub fn sample_count(&self, value: i64) -> Option<i64> {
        (self.period_nanos > 0).then(|| value / self.period_nanos)
    }
}

/// The instrumentation scope every profile is sent under.
pub const SCOPE_NAME: &str = "clrscope";

/// OpenTelemetry's name of a series label, where it has one.
fn resource_key(label: &str) -> &str {
    match label {
        labels::SERVICE_NAME => "service.name",
        labels::PROCESS_ID => "process.pid",
        labels::HOST_NAME => "host.name",
        other => other,
    }
}

/// OpenTelemetry's name of a sample label, where it has one.
fn attribute_key(label: &str) -> &str {
    match label {
        labels::THREAD_ID => "thread.id",
        labels::THREAD_NAME => "thread.name",
        other => other,
    }
}

pub(crate) fn any_string(value: &str) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(value.to_string())),
    }
}

fn any_int(value: i64) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::IntValue(value)),
    }
}

/// `service.name` etc. from series labels; `process.pid` as an integer as the semantic
/// conventions want it.
pub(crate) fn resource(series: &[(String, String)]) -> Resource {
    let attributes = series
        .iter()
        .map(|(key, value)| {
            let key = resource_key(key);
            let value = match (key, value.parse::<i64>()) {
                ("process.pid", Ok(pid)) => any_int(pid),
                _ => any_string(value),
            };
            KeyValue {
                key: key.to_string(),
                value: Some(value),
                ..KeyValue::default()
            }
        })
        .collect();
    Resource {
        attributes,
        ..Resource::default()
    }
}

/// Adds attributes the exporter's configuration gives every resource (`ResourceAttributes`,
/// `OTEL_RESOURCE_ATTRIBUTES`), except where the process's own labels name the key already:
/// `service.name` stays the process's.
pub fn extend_resource(resource: &mut Resource, extra: &[(String, String)]) {
    for (key, value) in extra {
        if !resource.attributes.iter().any(|kv| &kv.key == key) {
            resource.attributes.push(attribute(key, any_string(value)));
        }
    }
}

/// `0123…ef` to bytes: `len` bytes of lower- or upper-case hex, else `None`.
fn hex_bytes(text: &str, len: usize) -> Option<Vec<u8>> {
    if text.len() != len * 2 {
        return None;
    }
    (0..len)
        .map(|i| u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

/// The dictionary of one request; each `intern` returns the index of its entry, added on first
/// use.
#[derive(Debug)]
struct Dictionary {
    tables: otlp::ProfilesDictionary,
    strings: HashMap<String, i32>,
    mappings: HashMap<String, i32>,
    /// (name, module) → location index: one location (and function) per function.
    locations: HashMap<(String, String), i32>,
    links: HashMap<(Vec<u8>, Vec<u8>), i32>,
    attributes: HashMap<(String, LabelValue), i32>,
    stacks: HashMap<Vec<i32>, i32>,
}

impl Default for Dictionary {
    fn default() -> Self {
        let tables = otlp::ProfilesDictionary {
            mapping_table: vec![otlp::Mapping::default()],
            location_table: vec![otlp::Location::default()],
            function_table: vec![otlp::Function::default()],
            // The proto asks for a zero link of full length: 16 and 8 zero bytes.
            link_table: vec![otlp::Link {
                trace_id: vec![0; 16],
                span_id: vec![0; 8],
            }],
            string_table: vec![String::new()],
            attribute_table: vec![otlp::KeyValueAndUnit::default()],
            stack_table: vec![otlp::Stack::default()],
        };
        Dictionary {
            tables,
            strings: HashMap::from([(String::new(), 0)]),
            mappings: HashMap::new(),
            locations: HashMap::new(),
            links: HashMap::new(),
            attributes: HashMap::new(),
            stacks: HashMap::new(),
        }
    }
}

/// The next index of a table (tables of a request stay far below 2^31 entries).
fn next_index<T>(table: &[T]) -> i32 {
    i32::try_from(table.len()).unwrap_or(i32::MAX)
}

impl Dictionary {
    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = next_index(&self.tables.string_table);
        self.tables.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> otlp::ValueType {
        otlp::ValueType {
            type_strindex: self.string(kind),
            unit_strindex: self.string(unit),
        }
    }

    /// The location of a function: its module is its mapping, its name and `module!name` (the
    /// spelling of PerfView and WinDbg) its function's names, as in [`crate::pprof`].
    fn location(&mut self, function: &Function) -> i32 {
        let key = (function.name.clone(), function.module.clone());
        if let Some(&i) = self.locations.get(&key) {
            return i;
        }
        let name = self.string(&function.name);
        let (mapping_index, filename, system_name) = if function.module.is_empty() {
            (0, 0, name)
        } else {
            let filename = self.string(&function.module);
            let mapping = match self.mappings.get(&function.module) {
                Some(&m) => m,
                None => {
                    let m = next_index(&self.tables.mapping_table);
                    self.tables.mapping_table.push(otlp::Mapping {
                        filename_strindex: filename,
                        ..otlp::Mapping::default()
                    });
                    self.mappings.insert(function.module.clone(), m);
                    m
                }
            };
            let system_name = self.string(&format!("{}!{}", function.module, function.name));
            (mapping, filename, system_name)
        };
        let function_index = next_index(&self.tables.function_table);
        self.tables.function_table.push(otlp::Function {
            name_strindex: name,
            system_name_strindex: system_name,
            filename_strindex: filename,
            start_line: 0,
        });
        let i = next_index(&self.tables.location_table);
        self.tables.location_table.push(otlp::Location {
            mapping_index,
            address: 0,
            lines: vec![otlp::Line {
                function_index,
                line: 0,
                column: 0,
            }],
            attribute_indices: Vec::new(),
        });
        self.locations.insert(key, i);
        i
    }

    fn stack(&mut self, locations: Vec<i32>) -> i32 {
        if let Some(&i) = self.stacks.get(&locations) {
            return i;
        }
        let i = next_index(&self.tables.stack_table);
        self.tables.stack_table.push(otlp::Stack {
            location_indices: locations.clone(),
        });
        self.stacks.insert(locations, i);
        i
    }

    fn link(&mut self, trace_id: Vec<u8>, span_id: Vec<u8>) -> i32 {
        let key = (trace_id, span_id);
        if let Some(&i) = self.links.get(&key) {
            return i;
        }
        let i = next_index(&self.tables.link_table);
        self.tables.link_table.push(otlp::Link {
            trace_id: key.0.clone(),
            span_id: key.1.clone(),
        });
        self.links.insert(key, i);
        i
    }

    fn attribute(&mut self, key: &str, value: &LabelValue) -> i32 {
        let entry = (key.to_string(), value.clone());
        if let Some(&i) = self.attributes.get(&entry) {
            return i;
        }
        let key_strindex = self.string(attribute_key(key));
        let value = match value {
            LabelValue::Str(s) => any_string(s),
            LabelValue::Num(n) => any_int(*n),
        };
        let i = next_index(&self.tables.attribute_table);
        self.tables.attribute_table.push(otlp::KeyValueAndUnit {
            key_strindex,
            value: Some(value),
            unit_strindex: 0,
        });
        self.attributes.insert(entry, i);
        i
    }

    /// A sample's attribute indices (sorted, so equal label sets give equal lists) and its link
    /// index (0: none).
    fn labels(&mut self, labels: &[(String, LabelValue)]) -> (Vec<i32>, i32) {
        let text = |key: &str| {
            labels.iter().find_map(|(k, v)| match v {
                LabelValue::Str(s) if k == key => Some(s.as_str()),
                _ => None,
            })
        };
        let link = match (
            text(labels::TRACE_ID).and_then(|t| hex_bytes(t, 16)),
            text(labels::SPAN_ID).and_then(|s| hex_bytes(s, 8)),
        ) {
            (Some(trace_id), Some(span_id)) => Some(self.link(trace_id, span_id)),
            _ => None,
        };
        let mut attributes: Vec<i32> = labels
            .iter()
            .filter(|(key, _)| {
                link.is_none() || (key != labels::TRACE_ID && key != labels::SPAN_ID)
            })
            .map(|(key, value)| self.attribute(key, value))
            .collect();
        attributes.sort_unstable();
        (attributes, link.unwrap_or(0))
    }
}

/// What makes samples of one profile one sample: stack, attributes and link.
type SampleKey = (i32, Vec<i32>, i32);

/// One profile type of one process, as it fills.
#[derive(Debug)]
struct ProfileEntry {
    profile: otlp::Profile,
    samples: HashMap<SampleKey, usize>,
    first_time: i64,
    last_time: i64,
    /// Sum of the periods of sampled batches, weighted by their sample counts, and those counts:
    /// the profile's period is their quotient.
    period_weighted: i128,
    period_samples: i128,
}

/// The profiles of one process.
#[derive(Debug)]
struct ResourceEntry {
    resource: Resource,
    profiles: Vec<ProfileEntry>,
    by_type: HashMap<ProfileType, usize>,
}

/// Builds one `ExportProfilesServiceRequest` from batches; see the module documentation.
#[derive(Debug, Default)]
pub struct RequestBuilder {
    dictionary: Dictionary,
    resources: Vec<ResourceEntry>,
    by_series: HashMap<Vec<(String, String)>, usize>,
}

/// The period kind of a sampled profile type: what one sample's worth of time is.
fn period_kind(profile_type: &ProfileType) -> Option<&'static str> {
    match profile_type.name.as_str() {
        "cpu" => Some("cpu"),
        "wall" => Some("wall"),
        _ => None,
    }
}

impl RequestBuilder {
    pub fn new() -> Self {
        RequestBuilder::default()
    }

    fn profile_entry(&mut self, batch: &Batch) -> &mut ProfileEntry {
        let resource = match self.by_series.get(&batch.series) {
            Some(&r) => r,
            None => {
                self.resources.push(ResourceEntry {
                    resource: resource(&batch.series),
                    profiles: Vec::new(),
                    by_type: HashMap::new(),
                });
                self.by_series
                    .insert(batch.series.clone(), self.resources.len() - 1);
                self.resources.len() - 1
            }
        };
        let entry = &mut self.resources[resource];
        let index = match entry.by_type.get(&batch.profile_type) {
            Some(&p) => p,
            None => {
                let profile_type = &batch.profile_type;
                let sample_type = self
                    .dictionary
                    .value_type(&profile_type.name, &profile_type.unit);
                let period_type = period_kind(profile_type)
                    .map(|kind| self.dictionary.value_type(kind, &profile_type.unit));
                entry.profiles.push(ProfileEntry {
                    profile: otlp::Profile {
                        sample_type: Some(sample_type),
                        period_type,
                        ..otlp::Profile::default()
                    },
                    samples: HashMap::new(),
                    first_time: batch.timestamp_unix_nanos,
                    last_time: batch.timestamp_unix_nanos,
                    period_weighted: 0,
                    period_samples: 0,
                });
                entry
                    .by_type
                    .insert(profile_type.clone(), entry.profiles.len() - 1);
                entry.profiles.len() - 1
            }
        };
        &mut entry.profiles[index]
    }

    /// Adds a batch: its samples join their process's profile of the batch's type, each value
    /// stamped with the batch's time.
    pub fn add(&mut self, export: &ExportBatch) {
        let batch = &*export.batch;
        if batch.samples.is_empty() {
            return;
        }
        // Location of each of the batch's functions, interned on first use.
        let mut locations: Vec<i32> = vec![0; batch.functions.len()];
        let mut keyed = Vec::with_capacity(batch.samples.len());
        for sample in &batch.samples {
            let stack: Vec<i32> = sample
                .stack
                .iter()
                .filter_map(|&f| {
                    let function = batch.functions.get(f as usize)?;
                    let slot = &mut locations[f as usize];
                    if *slot == 0 {
                        *slot = self.dictionary.location(function);
                    }
                    Some(*slot)
                })
                .collect();
            let stack = self.dictionary.stack(stack);
            let (attributes, link) = self.dictionary.labels(&sample.labels);
            keyed.push(((stack, attributes, link), sample.value));
        }
        let time = batch.timestamp_unix_nanos;
        let entry = self.profile_entry(batch);
        entry.first_time = entry.first_time.min(time);
        entry.last_time = entry.last_time.max(time);
        let mut batch_samples: i64 = 0;
        for (key, value) in keyed {
            let index = match entry.samples.get(&key) {
                Some(&i) => i,
                None => {
                    entry.profile.samples.push(otlp::Sample {
                        stack_index: key.0,
                        attribute_indices: key.1.clone(),
                        link_index: key.2,
                        values: Vec::new(),
                        timestamps_unix_nano: Vec::new(),
                    });
                    entry.samples.insert(key, entry.profile.samples.len() - 1);
                    entry.profile.samples.len() - 1
                }
            };
            let sample = &mut entry.profile.samples[index];
            sample.values.push(value);
            sample
                .timestamps_unix_nano
                .push(u64::try_from(time).unwrap_or(0));
            batch_samples += export.sample_count(value).unwrap_or(0);
        }
        if export.period_nanos > 0 {
            entry.period_weighted += i128::from(export.period_nanos) * i128::from(batch_samples);
            entry.period_samples += i128::from(batch_samples);
        }
    }

    /// The request: every process's profiles, one dictionary.
    pub fn build(self) -> ExportProfilesServiceRequest {
        let scope = InstrumentationScope {
            name: SCOPE_NAME.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            ..InstrumentationScope::default()
        };
        let resource_profiles = self
            .resources
            .into_iter()
            .map(|entry| {
                let profiles = entry
                    .profiles
                    .into_iter()
                    .map(|p| {
                        let mut profile = p.profile;
                        profile.time_unix_nano = u64::try_from(p.first_time).unwrap_or(0);
                        // Timestamps fall in [time, time + duration), as the proto asks.
                        profile.duration_nano =
                            u64::try_from(p.last_time - p.first_time + 1).unwrap_or(1);
                        if p.period_samples > 0 {
                            profile.period =
                                i64::try_from(p.period_weighted / p.period_samples).unwrap_or(0);
                        }
                        profile
                    })
                    .collect();
                otlp::ResourceProfiles {
                    resource: Some(entry.resource),
                    scope_profiles: vec![otlp::ScopeProfiles {
                        scope: Some(scope.clone()),
                        profiles,
                        schema_url: String::new(),
                    }],
                    schema_url: String::new(),
                }
            })
            .collect();
        ExportProfilesServiceRequest {
            resource_profiles,
            dictionary: Some(self.dictionary.tables),
        }
    }
}

/// One log record or exception of a process, for an exporter that sends logs.
#[derive(Debug, Clone)]
pub struct LogExport {
    /// The process's series labels (`service_name`, `process_id`, `host_name`): the resource.
    pub series: Arc<[(String, String)]>,
    pub signal: Signal,
}

/// The instrumentation scope of exceptions (log records carry their category).
pub const EXCEPTION_SCOPE: &str = "clrscope.exceptions";

fn attribute(key: &str, value: AnyValue) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(value),
        ..KeyValue::default()
    }
}

fn span_ids(span: Option<&profile::span::Span>) -> (Vec<u8>, Vec<u8>, u32) {
    match span {
        // Flags: W3C sampled; the span was recorded (its ActivitySource listener sampled it).
        Some(s) => (s.trace_id.0.to_vec(), s.span_id.0.to_vec(), 1),
        None => (Vec::new(), Vec::new(), 0),
    }
}

/// An OTLP log record: severity from the level, body the formatted message, the category as the
/// scope, the arguments as attributes (`{OriginalFormat}` as `message.template`, OpenTelemetry
/// .NET's name for it), the logged exception as `exception.*`; its trace and span ids, with
/// `clrscope.ids_from` saying where they came from (`event`: the event's own, with its trace
/// flags; `linkage`: trace linkage's inference).
fn log_record(record: &LogRecord) -> LogsRecord {
    let m = &record.message;
    let mut attributes = vec![
        attribute("event.id", any_int(i64::from(m.event_id))),
        attribute("event.name", any_string(&m.event_name)),
    ];
    for (key, value) in &m.arguments {
        let key = if key == "{OriginalFormat}" {
            "message.template"
        } else {
            key.as_str()
        };
        attributes.push(attribute(key, any_string(value)));
    }
    if let Some(e) = &m.exception {
        attributes.push(attribute("exception.type", any_string(&e.type_name)));
        attributes.push(attribute("exception.message", any_string(&e.message)));
        attributes.push(attribute(
            "exception.stacktrace",
            any_string(&e.verbose_message),
        ));
    }
    for (depth, scope) in record.scopes.iter().enumerate() {
        for (key, value) in scope.iter() {
            attributes.push(attribute(
                &format!("scope.{depth}.{key}"),
                any_string(value),
            ));
        }
    }
    let (trace_id, span_id, mut flags) = span_ids(record.span.as_ref());
    if let Some(from) = record.ids_from {
        attributes.push(attribute("clrscope.ids_from", any_string(from.name())));
        if let IdsFrom::Event { flags: event_flags } = from {
            flags = u32::from(event_flags);
        }
    }
    let at = u64::try_from(record.unix_nanos).unwrap_or(0);
    LogsRecord {
        time_unix_nano: at,
        observed_time_unix_nano: at,
        severity_number: m.level.severity_number(),
        severity_text: m.level.name().to_string(),
        body: Some(any_string(&m.message)),
        attributes,
        trace_id,
        span_id,
        flags,
        ..LogsRecord::default()
    }
}

/// An exception as a log record with the semantic conventions' `exception.*` attributes, the
/// throwing stack in .NET's `   at Method` form; severity ERROR (a first-chance exception: it may
/// have been caught).
fn exception_record(record: &ExceptionRecord) -> LogsRecord {
    let stack: Vec<String> = record
        .frames
        .iter()
        .map(|f| format!("   at {}", f.method_name))
        .collect();
    let mut attributes = vec![
        attribute("exception.type", any_string(&record.type_name)),
        attribute("exception.message", any_string(&record.message)),
        attribute("exception.stacktrace", any_string(&stack.join("\n"))),
        attribute(
            "thread.id",
            any_int(i64::try_from(record.thread_id).unwrap_or(i64::MAX)),
        ),
        attribute(
            "exception.id",
            any_int(i64::try_from(record.id).unwrap_or(i64::MAX)),
        ),
    ];
    if let Some(inner) = record.inner_id {
        attributes.push(attribute(
            "exception.inner_id",
            any_int(i64::try_from(inner).unwrap_or(i64::MAX)),
        ));
    }
    let (trace_id, span_id, flags) = span_ids(record.span.as_ref());
    let at = u64::try_from(record.unix_nanos).unwrap_or(0);
    LogsRecord {
        time_unix_nano: at,
        observed_time_unix_nano: at,
        severity_number: LogLevel::Error.severity_number(),
        severity_text: LogLevel::Error.name().to_string(),
        body: Some(any_string(&format!(
            "{}: {}",
            record.type_name, record.message
        ))),
        attributes,
        trace_id,
        span_id,
        flags,
        ..LogsRecord::default()
    }
}

/// One request for `records`: a resource per process, a scope per category (exceptions under
/// [`EXCEPTION_SCOPE`]), records in their order.
pub fn logs_request(records: &[LogExport]) -> ExportLogsServiceRequest {
    // (resource attributes, [(category, records)]) in first-seen order.
    type Resource = (Arc<[(String, String)]>, Vec<(String, Vec<LogsRecord>)>);
    let mut resources: Vec<Resource> = Vec::new();
    for export in records {
        let at = match resources
            .iter()
            .position(|(series, _)| series == &export.series)
        {
            Some(at) => at,
            None => {
                resources.push((export.series.clone(), Vec::new()));
                resources.len() - 1
            }
        };
        let (scope, record) = match &export.signal {
            Signal::Log(r) => (r.message.category.as_str(), log_record(r)),
            Signal::Exception(e) => (EXCEPTION_SCOPE, exception_record(e)),
        };
        let scopes = &mut resources[at].1;
        match scopes.iter_mut().find(|(name, _)| name == scope) {
            Some((_, list)) => list.push(record),
            None => scopes.push((scope.to_string(), vec![record])),
        }
    }
    ExportLogsServiceRequest {
        resource_logs: resources
            .into_iter()
            .map(|(series, scopes)| ResourceLogs {
                resource: Some(resource(&series)),
                scope_logs: scopes
                    .into_iter()
                    .map(|(name, log_records)| ScopeLogs {
                        scope: Some(InstrumentationScope {
                            name,
                            ..InstrumentationScope::default()
                        }),
                        log_records,
                        ..ScopeLogs::default()
                    })
                    .collect(),
                ..ResourceLogs::default()
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profile::BatchSample;
    use prost::Message;

    fn batch(profile_type: &str, time: i64, samples: Vec<BatchSample>) -> ExportBatch {
        ExportBatch {
            batch: Arc::new(Batch {
                series: vec![
                    ("host_name".into(), "box".into()),
                    ("process_id".into(), "42".into()),
                    ("service_name".into(), "shop".into()),
                ],
                profile_type: ProfileType::known(profile_type).unwrap(),
                timestamp_unix_nanos: time,
                functions: vec![
                    Function {
                        name: "Shop.Hot()".into(),
                        module: "Shop.dll".into(),
                    },
                    Function {
                        name: "Shop.Main()".into(),
                        module: "Shop.dll".into(),
                    },
                ],
                samples,
            }),
            period_nanos: if profile_type == "cpu" { 1_000_000 } else { 0 },
        }
    }

    fn sample(stack: Vec<u32>, value: i64, labels: &[(&str, LabelValue)]) -> BatchSample {
        BatchSample {
            stack,
            value,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        }
    }

    const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
    const SPAN: &str = "b7ad6b7169203331";

    #[test]
    fn batches_become_one_dictionary_and_a_profile_per_type() {
        let thread = ("thread_id", LabelValue::Num(7));
        let spanned = [
            thread.clone(),
            (labels::TRACE_ID, LabelValue::Str(TRACE.into())),
            (labels::SPAN_ID, LabelValue::Str(SPAN.into())),
        ];
        let mut builder = RequestBuilder::new();
        builder.add(&batch(
            "cpu",
            1_000,
            vec![
                sample(vec![0, 1], 3_000_000, std::slice::from_ref(&thread)),
                sample(vec![0, 1], 2_000_000, &spanned),
            ],
        ));
        builder.add(&batch(
            "cpu",
            2_000,
            vec![sample(vec![0, 1], 1_000_000, std::slice::from_ref(&thread))],
        ));
        builder.add(&batch(
            "exception",
            1_500,
            vec![sample(vec![1], 4, std::slice::from_ref(&thread))],
        ));
        let request = builder.build();
        // What a receiver decodes is what was built.
        let request =
            ExportProfilesServiceRequest::decode(request.encode_to_vec().as_slice()).unwrap();

        let dict = request.dictionary.as_ref().unwrap();
        assert_eq!(dict.string_table[0], "");
        assert_eq!(dict.mapping_table[0], otlp::Mapping::default());
        assert_eq!(dict.location_table[0], otlp::Location::default());
        assert_eq!(dict.function_table[0], otlp::Function::default());
        assert_eq!(dict.stack_table[0], otlp::Stack::default());
        assert_eq!(dict.attribute_table[0], otlp::KeyValueAndUnit::default());
        assert_eq!(dict.link_table[0].trace_id, vec![0; 16]);
        // Two functions in one module, two distinct stacks, one link, one attribute.
        assert_eq!(dict.mapping_table.len(), 2);
        assert_eq!(dict.function_table.len(), 3);
        assert_eq!(dict.location_table.len(), 3);
        assert_eq!(dict.stack_table.len(), 3);
        assert_eq!(dict.link_table.len(), 2);
        assert_eq!(dict.attribute_table.len(), 2);
        let s = |i: i32| dict.string_table[i as usize].as_str();
        let link = &dict.link_table[1];
        assert_eq!(link.trace_id, hex_bytes(TRACE, 16).unwrap());
        assert_eq!(link.span_id, hex_bytes(SPAN, 8).unwrap());
        assert_eq!(s(dict.attribute_table[1].key_strindex), "thread.id");

        assert_eq!(request.resource_profiles.len(), 1);
        let resource = &request.resource_profiles[0];
        let attributes: Vec<(String, Option<any_value::Value>)> = resource
            .resource
            .as_ref()
            .unwrap()
            .attributes
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.clone().unwrap().value))
            .collect();
        assert_eq!(
            attributes,
            [
                (
                    "host.name".to_string(),
                    Some(any_value::Value::StringValue("box".into()))
                ),
                (
                    "process.pid".to_string(),
                    Some(any_value::Value::IntValue(42))
                ),
                (
                    "service.name".to_string(),
                    Some(any_value::Value::StringValue("shop".into()))
                ),
            ]
        );
        let profiles = &resource.scope_profiles[0].profiles;
        assert_eq!(profiles.len(), 2);
        let cpu = &profiles[0];
        let sample_type = cpu.sample_type.as_ref().unwrap();
        assert_eq!(
            (s(sample_type.type_strindex), s(sample_type.unit_strindex)),
            ("cpu", "nanoseconds")
        );
        let period_type = cpu.period_type.as_ref().unwrap();
        assert_eq!(s(period_type.type_strindex), "cpu");
        assert_eq!(cpu.period, 1_000_000);
        assert_eq!(cpu.time_unix_nano, 1_000);
        assert_eq!(cpu.duration_nano, 1_001);
        // The unlinked stack appears in both batches: one sample, two stamped values.
        assert_eq!(cpu.samples.len(), 2);
        let plain = &cpu.samples[0];
        assert_eq!(plain.values, [3_000_000, 1_000_000]);
        assert_eq!(plain.timestamps_unix_nano, [1_000, 2_000]);
        assert_eq!(plain.link_index, 0);
        let linked = &cpu.samples[1];
        assert_eq!(linked.link_index, 1);
        assert_eq!(linked.attribute_indices, [1]);
        assert_eq!(linked.stack_index, plain.stack_index);
        let stack = &dict.stack_table[plain.stack_index as usize];
        let leaf = &dict.location_table[stack.location_indices[0] as usize];
        let function = &dict.function_table[leaf.lines[0].function_index as usize];
        assert_eq!(s(function.name_strindex), "Shop.Hot()");
        assert_eq!(s(function.system_name_strindex), "Shop.dll!Shop.Hot()");
        let mapping = &dict.mapping_table[leaf.mapping_index as usize];
        assert_eq!(s(mapping.filename_strindex), "Shop.dll");

        let exceptions = &profiles[1];
        assert_eq!(exceptions.period_type, None);
        assert_eq!(exceptions.samples[0].values, [4]);
        assert_eq!(exceptions.samples[0].timestamps_unix_nano, [1_500]);
    }

    #[test]
    fn malformed_trace_ids_stay_attributes() {
        let mut builder = RequestBuilder::new();
        builder.add(&batch(
            "cpu",
            1,
            vec![sample(
                vec![0],
                1_000_000,
                &[
                    (labels::TRACE_ID, LabelValue::Str("not-hex".into())),
                    (labels::SPAN_ID, LabelValue::Str(SPAN.into())),
                ],
            )],
        ));
        let request = builder.build();
        let dict = request.dictionary.unwrap();
        assert_eq!(dict.link_table.len(), 1);
        let sample = &request.resource_profiles[0].scope_profiles[0].profiles[0].samples[0];
        assert_eq!(sample.link_index, 0);
        assert_eq!(sample.attribute_indices.len(), 2);
    }
}
