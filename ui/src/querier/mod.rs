//! Pyroscope's query API (`querier.v1.QuerierService`) over Connect, so that Grafana's
//! Pyroscope data source can browse the agent's store: the methods that data source calls
//! (`ProfileTypes`, `LabelNames`, `LabelValues`, `Series`, `SelectSeries`,
//! `SelectMergeStacktraces`, `SelectMergeSpanProfile`, `SelectMergeProfile`), each at
//! `POST /querier.v1.QuerierService/<Method>` ([`connect`] for the protocol, [`proto`] for the
//! messages).
//!
//! How clrscope's store looks through Pyroscope's eyes:
//!
//! - Profile types get Pyroscope's ids `<name>:<sample type>:<unit>:<period type>:<period unit>`
//!   with the names clrscope's Pyroscope exporter sends them under:
//!   `process_cpu:cpu:nanoseconds:cpu:nanoseconds`, `wall:wall:nanoseconds:wall:nanoseconds`,
//!   `alloc:alloc_samples:count:cpu:nanoseconds`, `exception:exception:count:cpu:nanoseconds`,
//!   `lock:lock_time:nanoseconds:cpu:nanoseconds`, … ([`pyroscope_type`]). A request's id is
//!   read by its sample type, so other spellings of the same type
//!   (`process_cpu:alloc_samples:count:cpu:nanoseconds`, as older .NET profilers name it)
//!   select it too.
//! - Every series carries, besides its labels (`service_name`, `process_id`, `host_name`),
//!   Pyroscope's profile-type labels `__name__`, `__profile_type__`, `__type__`, `__unit__`,
//!   `__period_type__` and `__period_unit__`; selectors may name them.
//! - Selectors (`{service_name="api"}`) take equalities only, as the rest of the API does.
//! - Label names, values and series come from the store's whole catalogue: it keeps no time
//!   index, so `start` and `end` of those calls narrow nothing.
//! - Times are Unix milliseconds; ranges are `[start, end)`.

mod connect;
mod proto;

use std::collections::BTreeSet;
use std::time::Duration;

use axum::Router;
use exporter::pprof::proto as pprof;
use exporter::pyroscope::pyroscope_name;
use exporter::tree::FlameGraph as Flamebearer;
use profile::{CallTree, LabelValue, Profile, ProfileBuilder, ValueType};
use store::tsdb::{self, parse_selector, SampleLabels};

use crate::admission::RouteClass;
use crate::error::ApiError;
use crate::query::{default_step, ProfileSelector};
use crate::server::{ApiState, StoreReader};
use connect::{ConnectError, Reply};
use proto::pprof_json;
use proto::querier::v1::*;
use proto::types::v1::*;

/// Flame graph nodes when a request names no `max_nodes`, and the most it may name: Pyroscope's
/// defaults.
const DEFAULT_MAX_NODES: usize = 8 << 10;
const MAX_MAX_NODES: i64 = 1 << 20;

/// Most span or trace ids one request may select (each is one store query).
const MAX_ID_SELECTORS: usize = 100;

/// The querier routes, for [`crate::router`] to merge. Other methods of the service are
/// unknown routes, which Connect clients read as `unimplemented`.
pub fn querier_routes() -> Router<ApiState> {
    Router::new()
        .route(
            "/querier.v1.QuerierService/ProfileTypes",
            connect::post(profile_types),
        )
        .route(
            "/querier.v1.QuerierService/LabelNames",
            connect::post(label_names),
        )
        .route(
            "/querier.v1.QuerierService/LabelValues",
            connect::post(label_values),
        )
        .route("/querier.v1.QuerierService/Series", connect::post(series))
        .route(
            "/querier.v1.QuerierService/SelectSeries",
            connect::post(select_series),
        )
        .route(
            "/querier.v1.QuerierService/SelectMergeStacktraces",
            connect::post(select_merge_stacktraces),
        )
        .route(
            "/querier.v1.QuerierService/SelectMergeSpanProfile",
            connect::post(select_merge_span_profile),
        )
        .route(
            "/querier.v1.QuerierService/SelectMergeProfile",
            connect::post(select_merge_profile),
        )
}

// ---------------------------------------------------------------------------------------------
// profile types and labels

/// A clrscope profile type as Pyroscope names it: as the Pyroscope exporter sends it
/// ([`exporter::pyroscope::pyroscope_name`]), so the ids are those a Pyroscope server fed by
/// clrscope shows; a type that exporter does not know keeps its own name, with a cpu period.
fn pyroscope_type(profile_type: &profile::ProfileType) -> ProfileType {
    let (name, (period_type, period_unit)) = pyroscope_name(profile_type)
        .unwrap_or((profile_type.name.as_str(), ("cpu", "nanoseconds")));
    ProfileType {
        id: format!(
            "{name}:{}:{}:{period_type}:{period_unit}",
            profile_type.name, profile_type.unit
        ),
        name: name.to_string(),
        sample_type: profile_type.name.clone(),
        sample_unit: profile_type.unit.clone(),
        period_type: period_type.to_string(),
        period_unit: period_unit.to_string(),
    }
}

/// The labels Pyroscope gives every series of a profile type.
fn profile_type_labels(profile_type: &profile::ProfileType) -> [(String, String); 6] {
    let t = pyroscope_type(profile_type);
    [
        ("__name__".to_string(), t.name),
        ("__period_type__".to_string(), t.period_type),
        ("__period_unit__".to_string(), t.period_unit),
        ("__profile_type__".to_string(), t.id),
        ("__type__".to_string(), t.sample_type),
        ("__unit__".to_string(), t.sample_unit),
    ]
}

fn is_profile_type_label(name: &str) -> bool {
    name.starts_with("__") && name.ends_with("__")
}

/// A series' labels as Pyroscope shows them (its own and its profile type's), sorted.
fn pyroscope_labels(series: &tsdb::Series) -> Vec<(String, String)> {
    let mut labels = series.labels.clone();
    labels.extend(profile_type_labels(&series.profile_type));
    labels.sort();
    labels
}

fn matches(labels: &[(String, String)], matchers: &[(String, String)]) -> bool {
    matchers.iter().all(|m| labels.contains(m))
}

/// The selectors of `LabelNames`, `LabelValues` and `Series`: a series is selected by any of
/// them, and by none when there are none.
fn parse_selectors(selectors: &[String]) -> Result<Vec<Vec<(String, String)>>, ConnectError> {
    selectors
        .iter()
        .map(|s| parse_selector(s).map_err(|e| ApiError::from(e).into()))
        .collect()
}

/// The label sets of the series any of `selectors` selects, as Pyroscope shows them.
async fn selected_label_sets(
    state: &ApiState,
    selectors: &[String],
) -> Result<Vec<Vec<(String, String)>>, ConnectError> {
    let selectors = parse_selectors(selectors)?;
    let series = state
        .query(RouteClass::Catalog, |store| Ok(store.series_list()))
        .await?;
    Ok(series
        .iter()
        .map(pyroscope_labels)
        .filter(|labels| selectors.is_empty() || selectors.iter().any(|m| matches(labels, m)))
        .collect())
}

async fn profile_types(
    state: ApiState,
    _: ProfileTypesRequest,
) -> Result<ProfileTypesResponse, ConnectError> {
    let types = state
        .query(RouteClass::Catalog, |store| Ok(store.profile_types()))
        .await?;
    let mut profile_types: Vec<ProfileType> = types.iter().map(pyroscope_type).collect();
    profile_types.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(ProfileTypesResponse { profile_types })
}

async fn label_names(
    state: ApiState,
    request: LabelNamesRequest,
) -> Result<LabelNamesResponse, ConnectError> {
    let sets = selected_label_sets(&state, &request.matchers).await?;
    let names: BTreeSet<String> = sets.into_iter().flatten().map(|(k, _)| k).collect();
    Ok(LabelNamesResponse {
        names: names.into_iter().collect(),
    })
}

async fn label_values(
    state: ApiState,
    request: LabelValuesRequest,
) -> Result<LabelValuesResponse, ConnectError> {
    if request.name.is_empty() {
        return Err(ConnectError::invalid_argument(
            "name is empty: name the label whose values to list, e.g. service_name",
        ));
    }
    let sets = selected_label_sets(&state, &request.matchers).await?;
    let values: BTreeSet<String> = sets
        .into_iter()
        .flatten()
        .filter(|(k, _)| *k == request.name)
        .map(|(_, v)| v)
        .collect();
    Ok(LabelValuesResponse {
        names: values.into_iter().collect(),
    })
}

async fn series(state: ApiState, request: SeriesRequest) -> Result<SeriesResponse, ConnectError> {
    let sets = selected_label_sets(&state, &request.matchers).await?;
    let kept: BTreeSet<Vec<(String, String)>> = sets
        .into_iter()
        .map(|labels| {
            labels
                .into_iter()
                .filter(|(k, _)| request.label_names.is_empty() || request.label_names.contains(k))
                .collect()
        })
        .collect();
    Ok(SeriesResponse {
        labels_set: kept
            .into_iter()
            .map(|labels| Labels {
                labels: label_pairs(labels),
            })
            .collect(),
    })
}

fn label_pairs(labels: Vec<(String, String)>) -> Vec<LabelPair> {
    labels
        .into_iter()
        .map(|(name, value)| LabelPair { name, value })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// timelines and profiles

/// What a `Select*` request selects: a profile type, series, a time range.
struct Selected {
    /// The clrscope profile type name, from the id's sample type.
    type_name: String,
    /// Series label equalities the store answers.
    matchers: Vec<(String, String)>,
    /// Equalities on the profile-type labels, checked against the type.
    type_matchers: Vec<(String, String)>,
    /// Unix nanoseconds, `[from, until)`.
    from: i64,
    until: i64,
}

impl Selected {
    fn parse(
        profile_type_id: &str,
        label_selector: &str,
        start_ms: i64,
        end_ms: i64,
    ) -> Result<Selected, ConnectError> {
        let parts: Vec<&str> = profile_type_id.split(':').collect();
        if parts.len() < 5 || parts[1].is_empty() {
            return Err(ConnectError::invalid_argument(format!(
                "profile type id {profile_type_id:?} is not <name>:<sample type>:<sample unit>:\
                 <period type>:<period unit>, e.g. process_cpu:cpu:nanoseconds:cpu:nanoseconds; \
                 ProfileTypes lists the stored ones"
            )));
        }
        let (type_matchers, matchers) = parse_selector(label_selector)
            .map_err(ApiError::from)?
            .into_iter()
            .partition(|(k, _)| is_profile_type_label(k));
        let nanos = |ms: i64, name: &str| {
            ms.checked_mul(1_000_000).ok_or_else(|| {
                ConnectError::invalid_argument(format!("{name} {ms} is out of range (Unix ms)"))
            })
        };
        let (from, until) = (nanos(start_ms, "start")?, nanos(end_ms, "end")?);
        if from >= until {
            return Err(ConnectError::invalid_argument(format!(
                "empty time range: start {start_ms} is not before end {end_ms} (Unix ms)"
            )));
        }
        Ok(Selected {
            type_name: parts[1].to_string(),
            matchers,
            type_matchers,
            from,
            until,
        })
    }

    /// The store query keeping `sample_labels`, and whether the selector's profile-type labels
    /// let it select anything.
    fn query(
        &self,
        store: &StoreReader<'_>,
        sample_labels: SampleLabels,
    ) -> Result<(tsdb::Query, bool), ApiError> {
        let selector = ProfileSelector {
            type_name: self.type_name.clone(),
            matchers: self.matchers.clone(),
            sample_matchers: Vec::new(),
        };
        let query = tsdb::Query {
            sample_labels,
            ..selector.query(store, self.from, self.until)?
        };
        let selects = matches(
            &profile_type_labels(&query.profile_type),
            &self.type_matchers,
        );
        Ok((query, selects))
    }
}

/// The requests that select a profile type, series and a time range, all by the same fields.
trait Selecting {
    fn selected(&self) -> Result<Selected, ConnectError>;
}

macro_rules! selecting {
    ($($request:ty),*) => {$(
        impl Selecting for $request {
            fn selected(&self) -> Result<Selected, ConnectError> {
                Selected::parse(&self.profile_type_id, &self.label_selector, self.start, self.end)
            }
        }
    )*};
}

selecting!(
    SelectSeriesRequest,
    SelectMergeStacktracesRequest,
    SelectMergeSpanProfileRequest,
    SelectMergeProfileRequest
);

/// Refuses a stack trace selector that names a call site: clrscope cannot focus on one.
fn refuse_call_site(selector: &Option<StackTraceSelector>) -> Result<(), ConnectError> {
    match selector {
        Some(s) if !s.call_site.is_empty() => Err(ConnectError::unimplemented(
            "stack_trace_selector with a call site is not supported by clrscope: leave it out",
        )),
        _ => Ok(()),
    }
}

fn refuse_profile_ids(ids: &[String]) -> Result<(), ConnectError> {
    if ids.is_empty() {
        Ok(())
    } else {
        Err(ConnectError::unimplemented(
            "profile_id_selector is not supported: clrscope keeps no profile ids; select by \
             span_selector or trace_id_selector",
        ))
    }
}

async fn select_series(
    state: ApiState,
    request: SelectSeriesRequest,
) -> Result<SelectSeriesResponse, ConnectError> {
    refuse_call_site(&request.stack_trace_selector)?;
    if request.aggregation.unwrap_or(0) != 0 {
        return Err(ConnectError::unimplemented(
            "only TIME_SERIES_AGGREGATION_TYPE_SUM is supported",
        ));
    }
    let selected = request.selected()?;
    let step = if request.step.is_finite() && request.step > 0.0 {
        // Whole milliseconds, as the store's timelines count them.
        Duration::from_millis(((request.step * 1000.0).round() as u64).max(1))
    } else {
        default_step(selected.until - selected.from)
    };
    let group_by = request.group_by;
    let mut series = state
        .query(RouteClass::Series, move |store| {
            let (query, selects) = selected.query(&store, SampleLabels::All)?;
            if !selects {
                return Ok(Vec::new());
            }
            // One timeline per distinct value of the group-by labels among the selected series;
            // series without one of those labels are in no group.
            let groups: BTreeSet<Vec<(String, String)>> = store
                .series_list()
                .iter()
                .filter(|s| s.profile_type == query.profile_type)
                .map(pyroscope_labels)
                .filter(|labels| matches(labels, &query.matchers))
                .filter_map(|labels| {
                    group_by
                        .iter()
                        .map(|name| labels.iter().find(|(k, _)| k == name).cloned())
                        .collect::<Option<Vec<_>>>()
                })
                .collect();
            let mut series = Vec::with_capacity(groups.len());
            for group in groups {
                let mut matchers = query.matchers.clone();
                matchers.extend(
                    group
                        .iter()
                        .filter(|(k, _)| !is_profile_type_label(k))
                        .cloned(),
                );
                let group_query = tsdb::Query {
                    matchers,
                    ..query.clone()
                };
                let points = store.series(&group_query, step)?;
                let total: i64 = points.iter().map(|&(_, v)| v).sum();
                let points = points
                    .into_iter()
                    .map(|(t, v)| Point {
                        value: v as f64,
                        timestamp: t.div_euclid(1_000_000),
                        ..Point::default()
                    })
                    .collect();
                series.push((
                    total,
                    Series {
                        labels: label_pairs(group),
                        points,
                    },
                ));
            }
            Ok(series)
        })
        .await?;
    if let Some(limit) = request.limit.filter(|&l| l > 0) {
        // The largest first, as Pyroscope keeps the top series.
        series.sort_by_key(|s| std::cmp::Reverse(s.0));
        series.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    }
    Ok(SelectSeriesResponse {
        series: series.into_iter().map(|(_, s)| s).collect(),
    })
}

/// Sample label filters from span or trace ids: one per id, of which a sample must match one.
fn id_filters(
    label: &str,
    ids: &[String],
    hex_digits: usize,
) -> Result<Vec<(String, LabelValue)>, ConnectError> {
    if ids.len() > MAX_ID_SELECTORS {
        return Err(ConnectError::invalid_argument(format!(
            "{} ids selected, at most {MAX_ID_SELECTORS}: select fewer",
            ids.len()
        )));
    }
    ids.iter()
        .map(|id| {
            let id = id.trim().to_ascii_lowercase();
            if id.len() != hex_digits || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(ConnectError::invalid_argument(format!(
                    "{id:?} is no {label}: {hex_digits} hex digits expected"
                )));
            }
            Ok((label.to_string(), LabelValue::Str(id)))
        })
        .collect()
}

/// The flame graph cut to `max_nodes`: Pyroscope's default when absent or 0.
fn max_nodes(requested: Option<i64>) -> Result<usize, ConnectError> {
    match requested.unwrap_or(0) {
        0 => Ok(DEFAULT_MAX_NODES),
        n if (1..=MAX_MAX_NODES).contains(&n) => Ok(n as usize),
        n => Err(ConnectError::invalid_argument(format!(
            "max_nodes {n} is out of range: 1 to {MAX_MAX_NODES}, or 0 for {DEFAULT_MAX_NODES}"
        ))),
    }
}

/// The store queries that answer `selected`: one per filter, each selecting the samples matching
/// it (one for all samples when there are no filters); `Err` with the whole query's empty range
/// when no series is selected.
fn selected_queries(
    store: &StoreReader<'_>,
    selected: &Selected,
    filters: &[(String, LabelValue)],
    sample_labels: SampleLabels,
) -> Result<Result<Vec<tsdb::Query>, tsdb::Query>, ApiError> {
    let (query, selects) = selected.query(store, sample_labels)?;
    if !selects {
        return Ok(Err(query));
    }
    if filters.is_empty() {
        return Ok(Ok(vec![query]));
    }
    Ok(Ok(filters
        .iter()
        .map(|filter| tsdb::Query {
            sample_matchers: vec![filter.clone()],
            ..query.clone()
        })
        .collect()))
}

/// The merged profile of `selected`, of the samples matching any of `filters`.
fn merged_profile(
    store: &StoreReader<'_>,
    selected: &Selected,
    filters: &[(String, LabelValue)],
    sample_labels: SampleLabels,
) -> Result<Profile, ApiError> {
    let queries = match selected_queries(store, selected, filters, sample_labels)? {
        Ok(queries) => queries,
        Err(query) => {
            // What the store answers when no sample matches.
            let value_type = ValueType::new(&query.profile_type.name, &query.profile_type.unit);
            let mut empty = ProfileBuilder::new(vec![value_type.clone()], value_type, 0);
            empty.set_time_range(query.from, query.until.saturating_sub(query.from));
            return Ok(empty.build());
        }
    };
    let profiles = queries
        .iter()
        .map(|query| store.profile(query))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(merge(profiles))
}

/// The merged call tree of `selected`, of the samples matching any of `filters`, each cut to
/// `max_nodes` by the store.
fn merged_call_tree(
    store: &StoreReader<'_>,
    selected: &Selected,
    filters: &[(String, LabelValue)],
    max_nodes: usize,
) -> Result<CallTree, ApiError> {
    // No sample labels: a flame graph does not show them.
    let no_labels = SampleLabels::Only(Vec::new());
    let queries = match selected_queries(store, selected, filters, no_labels)? {
        Ok(queries) => queries,
        Err(query) => {
            let value_type = ValueType::new(&query.profile_type.name, &query.profile_type.unit);
            let mut empty = CallTree::new(&value_type);
            empty.set_time_range(query.from, query.until.saturating_sub(query.from));
            return Ok(empty);
        }
    };
    let mut trees = queries
        .iter()
        .map(|query| store.call_tree(query, max_nodes));
    let mut merged = trees.next().expect("at least one query")?;
    for tree in trees {
        merged.merge(&tree?);
    }
    Ok(merged)
}

/// One profile of several of one type and range (samples of distinct spans, say).
fn merge(mut profiles: Vec<Profile>) -> Profile {
    if profiles.len() == 1 {
        return profiles.remove(0);
    }
    let first = &profiles[0];
    let mut builder = ProfileBuilder::new(
        first.sample_types.clone(),
        first.period_type.clone(),
        first.period,
    );
    builder.set_time_range(first.start_unix_nanos, first.duration_nanos);
    for profile in &profiles {
        for sample in &profile.samples {
            let stack = sample
                .stack
                .iter()
                .map(|&f| builder.function(profile.functions[f as usize].clone()))
                .collect();
            builder.add(stack, sample.labels.to_vec(), &sample.values);
        }
    }
    builder.build()
}

/// The flame graph answer to `selected` and `filters`: an empty graph when nothing matches.
async fn flame_graph_reply(
    state: ApiState,
    selected: Selected,
    filters: Vec<(String, LabelValue)>,
    max_nodes: usize,
) -> Result<FlameGraph, ConnectError> {
    let graph = state
        .query(RouteClass::Profile, move |store| {
            // The store's call trees, cut to max_nodes, then Pyroscope's cut of the graph: the
            // trees of several spans merged may exceed it, and what the store cut folds into one
            // `other` per node.
            let call_tree = merged_call_tree(&store, &selected, &filters, max_nodes)?;
            drop(store);
            Ok(Flamebearer::of(&call_tree, max_nodes))
        })
        .await?;
    Ok(FlameGraph {
        names: graph.names,
        levels: graph
            .levels
            .into_iter()
            .map(|values| Level { values })
            .collect(),
        total: graph.total,
        max_self: graph.max_self,
    })
}

fn refuse_formats_but_flame_graph(format: i32) -> Result<(), ConnectError> {
    let name = match ProfileFormat::try_from(format) {
        Ok(ProfileFormat::Unspecified | ProfileFormat::Flamegraph) => return Ok(()),
        Ok(other) => other.as_str_name(),
        Err(_) => "an unknown format",
    };
    Err(ConnectError::unimplemented(format!(
        "{name} is not supported: clrscope answers PROFILE_FORMAT_FLAMEGRAPH; SelectMergeProfile \
         gives pprof"
    )))
}

async fn select_merge_stacktraces(
    state: ApiState,
    request: SelectMergeStacktracesRequest,
) -> Result<SelectMergeStacktracesResponse, ConnectError> {
    refuse_formats_but_flame_graph(request.format)?;
    refuse_call_site(&request.stack_trace_selector)?;
    refuse_profile_ids(&request.profile_id_selector)?;
    let filters = match (&request.span_selector[..], &request.trace_id_selector[..]) {
        ([], traces) => id_filters("trace_id", traces, 32)?,
        (spans, []) => id_filters("span_id", spans, 16)?,
        _ => {
            return Err(ConnectError::invalid_argument(
                "span_selector and trace_id_selector cannot be combined",
            ))
        }
    };
    let selected = request.selected()?;
    let max_nodes = max_nodes(request.max_nodes)?;
    let flamegraph = flame_graph_reply(state, selected, filters, max_nodes).await?;
    Ok(SelectMergeStacktracesResponse {
        flamegraph: Some(flamegraph),
        ..Default::default()
    })
}

async fn select_merge_span_profile(
    state: ApiState,
    request: SelectMergeSpanProfileRequest,
) -> Result<SelectMergeSpanProfileResponse, ConnectError> {
    refuse_formats_but_flame_graph(request.format)?;
    if request.span_selector.is_empty() {
        return Err(ConnectError::invalid_argument(
            "span_selector is empty: name the span ids (16 hex digits) whose samples to merge",
        ));
    }
    let filters = id_filters("span_id", &request.span_selector, 16)?;
    let selected = request.selected()?;
    let max_nodes = max_nodes(request.max_nodes)?;
    let flamegraph = flame_graph_reply(state, selected, filters, max_nodes).await?;
    Ok(SelectMergeSpanProfileResponse {
        flamegraph: Some(flamegraph),
        ..Default::default()
    })
}

/// `google.v1.Profile`: pprof, uncompressed (the exporter's message, which has its fields).
struct PprofReply(pprof::Profile);

impl Reply for PprofReply {
    fn to_proto(&self) -> Vec<u8> {
        prost::Message::encode_to_vec(&self.0)
    }

    fn to_json(&self) -> Vec<u8> {
        pprof_json(&self.0).to_string().into_bytes()
    }
}

async fn select_merge_profile(
    state: ApiState,
    request: SelectMergeProfileRequest,
) -> Result<PprofReply, ConnectError> {
    refuse_call_site(&request.stack_trace_selector)?;
    refuse_profile_ids(&request.profile_id_selector)?;
    let filters = id_filters("trace_id", &request.trace_id_selector, 32)?;
    let selected = request.selected()?;
    let profile = state
        .query(RouteClass::Profile, move |store| {
            // pprof carries every sample label (threads, spans), as /api/v1/profile's does.
            let profile = merged_profile(&store, &selected, &filters, SampleLabels::All)?;
            drop(store);
            Ok(exporter::pprof::to_proto(&profile)?)
        })
        .await?;
    Ok(PprofReply(profile))
}
