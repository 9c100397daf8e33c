//! The profile query routes under `/api/v1/` (listed in the crate documentation).

use std::time::Duration;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use exporter::{folded, tree, Format};
use profile::labels::{THREAD_ID, THREAD_NAME};
use profile::{CallTree, LabelValue, Profile, ProfileType};
use serde::Serialize;
use settings::parse_duration;
use store::tsdb::{self, parse_selector, Store};

use crate::admission::RouteClass;
use crate::error::ApiError;
use crate::server::{ApiState, StoreReader};
use crate::time::{duration_nanos, parse_time};
use profile::clock::unix_nanos;
use profile::utc;

const SECOND: i64 = 1_000_000_000;
const MILLISECOND: i64 = 1_000_000;
/// How far back `/profile` and `/diff` look without `from`.
const PROFILE_SPAN: i64 = 60 * SECOND;
/// How far back `/series` (and `/events`, which marks its timeline) look without `from`.
pub(crate) const SERIES_SPAN: i64 = 3600 * SECOND;
/// The smallest default step of `/series`.
const MIN_DEFAULT_STEP: Duration = Duration::from_secs(10);
/// At most this many points without an explicit `step`.
const DEFAULT_MAX_POINTS: u64 = 1000;

/// The parameters every profile route takes: what [`ProfileSelector::parse`] reads and the range.
const COMMON_PARAMS: [&str; 6] = ["type", "query", "from", "until", "span_id", "trace_id"];
/// Sample labels a request can filter on, each a parameter of the same name.
const SAMPLE_FILTERS: [&str; 2] = ["span_id", "trace_id"];

/// The profile query routes, for [`crate::router`] to merge.
pub fn query_routes() -> Router<ApiState> {
    Router::new()
        .route("/api/v1/profile-types", get(profile_types))
        .route("/api/v1/labels", get(label_names))
        .route("/api/v1/labels/{name}/values", get(label_values))
        .route("/api/v1/series", get(series))
        .route("/api/v1/profile", get(profile))
        .route("/api/v1/diff", get(diff))
}

pub(crate) type QueryPairs = Result<Query<Vec<(String, String)>>, QueryRejection>;

async fn profile_types(
    State(state): State<ApiState>,
    params: QueryPairs,
) -> Result<Json<Vec<ProfileType>>, ApiError> {
    listing(state, params, Store::profile_types).await
}

async fn label_names(
    State(state): State<ApiState>,
    params: QueryPairs,
) -> Result<Json<Vec<String>>, ApiError> {
    listing(state, params, Store::label_names).await
}

async fn label_values(
    State(state): State<ApiState>,
    name: Result<Path<String>, PathRejection>,
    params: QueryPairs,
) -> Result<Json<Vec<String>>, ApiError> {
    let Path(name) = name?;
    listing(state, params, move |store| store.label_values(&name)).await
}

/// What a route without parameters lists: the store's whole catalogue, not filtered by series
/// or time (the store keeps no such index).
async fn listing<T: Send + 'static>(
    state: ApiState,
    params: QueryPairs,
    list: impl FnOnce(&Store) -> Vec<T> + Send + 'static,
) -> Result<Json<Vec<T>>, ApiError> {
    Params::new(params, &[])?;
    Ok(Json(
        state
            .query(RouteClass::Catalog, move |store| Ok(list(&store)))
            .await?,
    ))
}

#[derive(Debug, Serialize)]
struct SeriesBody {
    unit: String,
    step_ms: i64,
    /// `[start of step in Unix ms, total]`.
    points: Vec<(i64, i64)>,
}

async fn series(
    State(state): State<ApiState>,
    params: QueryPairs,
) -> Result<Json<SeriesBody>, ApiError> {
    let params = Params::new(params, &[&COMMON_PARAMS[..], &["step"]].concat())?;
    let selector = ProfileSelector::parse(&params)?;
    let now = unix_nanos();
    let (from, until) = params.range(["from", "until"], now, SERIES_SPAN, now)?;
    let step = params.step(until.saturating_sub(from))?;
    state
        .query(RouteClass::Series, move |store| {
            let query = selector.query(&store, from, until)?;
            let points = store.series(&query, step)?;
            drop(store);
            Ok(Json(SeriesBody {
                unit: query.profile_type.unit,
                step_ms: duration_nanos(step) / MILLISECOND,
                points: points
                    .into_iter()
                    .map(|(t, v)| (t.div_euclid(MILLISECOND), v))
                    .collect(),
            }))
        })
        .await
}

async fn profile(State(state): State<ApiState>, params: QueryPairs) -> Result<Response, ApiError> {
    let params = Params::new(
        params,
        &[&COMMON_PARAMS[..], &["format", "max_nodes"]].concat(),
    )?;
    let selector = ProfileSelector::parse(&params)?;
    let output = Output::parse(params.get("format"), Output::PROFILE)?;
    let max_nodes = params.max_nodes(output)?;
    let now = unix_nanos();
    let (from, until) = params.range(["from", "until"], now, PROFILE_SPAN, now)?;
    let name = selector.type_name.clone();
    let body = state
        .query(RouteClass::Profile, move |store| {
            let query = tsdb::Query {
                sample_labels: output.sample_labels(),
                ..selector.query(&store, from, until)?
            };
            match max_nodes {
                Some(max_nodes) => {
                    let call_tree = store.call_tree(&query, max_nodes)?;
                    drop(store);
                    output.render_call_tree(&call_tree)
                }
                None => {
                    let profile = store.profile(&query)?;
                    drop(store);
                    output.render(&profile)
                }
            }
        })
        .await?;
    Ok(output.respond(&name, body))
}

async fn diff(State(state): State<ApiState>, params: QueryPairs) -> Result<Response, ApiError> {
    let params = Params::new(
        params,
        &[&COMMON_PARAMS[..], &["base_from", "base_until", "format"]].concat(),
    )?;
    let selector = ProfileSelector::parse(&params)?;
    let output = Output::parse(params.get("format"), Output::DIFF)?;
    let now = unix_nanos();
    let (from, until) = params.range(["from", "until"], now, PROFILE_SPAN, now)?;
    // Without a base range: the range of equal length just before.
    let (base_from, base_until) = params.range(
        ["base_from", "base_until"],
        from,
        until.saturating_sub(from),
        now,
    )?;
    let name = format!("{}-diff", selector.type_name);
    let body = state
        .query(RouteClass::Profile, move |store| {
            let new = tsdb::Query {
                sample_labels: output.sample_labels(),
                ..selector.query(&store, from, until)?
            };
            let base = tsdb::Query {
                from: base_from,
                until: base_until,
                ..new.clone()
            };
            let (base, new) = (store.profile(&base)?, store.profile(&new)?);
            drop(store);
            output.render_diff(&profile::diff(&base, &new, 0))
        })
        .await?;
    Ok(output.respond(&name, body))
}

/// A route's query parameters: only those it takes, each at most once.
pub(crate) struct Params(Vec<(String, String)>);

impl Params {
    pub(crate) fn new(query: QueryPairs, allowed: &[&str]) -> Result<Params, ApiError> {
        let Query(pairs) = query?;
        for (i, (name, _)) in pairs.iter().enumerate() {
            if !allowed.contains(&name.as_str()) {
                let takes = if allowed.is_empty() {
                    "no query parameters".to_string()
                } else {
                    allowed.join(", ")
                };
                return Err(ApiError::BadRequest(format!(
                    "unknown query parameter `{name}`: this route takes {takes}"
                )));
            }
            if pairs[..i].iter().any(|(earlier, _)| earlier == name) {
                return Err(ApiError::BadRequest(format!(
                    "query parameter `{name}` is given more than once"
                )));
            }
        }
        Ok(Params(pairs))
    }

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn invalid(&self, name: &'static str, reason: String) -> ApiError {
        ApiError::InvalidParameter {
            name,
            value: self.get(name).unwrap_or_default().to_string(),
            reason,
        }
    }

    /// A time parameter in Unix nanoseconds, `default` when absent.
    pub(crate) fn time(&self, name: &'static str, default: i64, now: i64) -> Result<i64, ApiError> {
        match self.get(name) {
            None => Ok(default),
            Some(text) => parse_time(text, now).map_err(|reason| self.invalid(name, reason)),
        }
    }

    /// The range named `[from, until]`: until defaults to `default_until`, from to `span`
    /// before until; from must come first.
    pub(crate) fn range(
        &self,
        [from_name, until_name]: [&'static str; 2],
        default_until: i64,
        span: i64,
        now: i64,
    ) -> Result<(i64, i64), ApiError> {
        let until = self.time(until_name, default_until, now)?;
        let from = self.time(from_name, until.saturating_sub(span), now)?;
        if from >= until {
            return Err(ApiError::EmptyRange {
                from_name,
                from: utc::format(from, utc::Form::Auto),
                until_name,
                until: utc::format(until, utc::Form::Auto),
            });
        }
        Ok((from, until))
    }

    /// `max_nodes`: cut the profile to its largest call-tree nodes, what was cut showing as
    /// `other` (`Store::call_tree`); only for the outputs that show no sample labels.
    fn max_nodes(&self, output: Output) -> Result<Option<usize>, ApiError> {
        let Some(text) = self.get("max_nodes") else {
            return Ok(None);
        };
        let max_nodes = text
            .parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                self.invalid("max_nodes", "a positive number of nodes, e.g. 8192".into())
            })?;
        if output.sample_labels() != tsdb::SampleLabels::Only(Vec::new()) {
            return Err(self.invalid(
                "max_nodes",
                "a cut call tree has no per-sample labels: use it with format json, folded or svg"
                    .into(),
            ));
        }
        Ok(Some(max_nodes))
    }

    /// `step`, whole milliseconds; by default 10 s, or longer so that a range gives at most
    /// [`DEFAULT_MAX_POINTS`] points.
    fn step(&self, span: i64) -> Result<Duration, ApiError> {
        let Some(text) = self.get("step") else {
            return Ok(default_step(span));
        };
        let step = parse_duration(text).map_err(|reason| self.invalid("step", reason))?;
        if step.is_zero() || step.as_nanos() % MILLISECOND as u128 != 0 {
            return Err(self.invalid(
                "step",
                "the step must be a positive whole number of milliseconds, e.g. 10s".into(),
            ));
        }
        Ok(step)
    }
}

/// The step of a timeline over `span` nanoseconds when none is asked for: 10 s, or longer so
/// that it has at most [`DEFAULT_MAX_POINTS`] points.
pub(crate) fn default_step(span: i64) -> Duration {
    let seconds = span
        .unsigned_abs()
        .div_ceil(DEFAULT_MAX_POINTS)
        .div_ceil(SECOND.unsigned_abs());
    Duration::from_secs(seconds).max(MIN_DEFAULT_STEP)
}

/// The profile type and the series and samples a request selects, before the store names the
/// type's unit ([`ProfileSelector::query`] makes the store's query of it).
pub(crate) struct ProfileSelector {
    /// A clrscope profile type name, e.g. `cpu`.
    pub(crate) type_name: String,
    /// Series label equalities.
    pub(crate) matchers: Vec<(String, String)>,
    /// Sample label equalities.
    pub(crate) sample_matchers: Vec<(String, LabelValue)>,
}

impl ProfileSelector {
    /// Reads `type`, `query` and the sample filters (`span_id`, `trace_id`).
    fn parse(params: &Params) -> Result<ProfileSelector, ApiError> {
        let type_name = params.get("type").ok_or(ApiError::MissingParameter {
            name: "type",
            hint: "name the profile type, e.g. type=cpu; GET /api/v1/profile-types lists those stored",
        })?;
        Ok(ProfileSelector {
            type_name: type_name.to_string(),
            matchers: parse_selector(params.get("query").unwrap_or_default())?,
            sample_matchers: SAMPLE_FILTERS
                .iter()
                .filter_map(|&key| {
                    let value = params.get(key)?;
                    Some((key.to_string(), LabelValue::Str(value.to_string())))
                })
                .collect(),
        })
    }

    /// The store query over `[from, until)`: a profile type the store holds, else one clrscope
    /// records (which then selects nothing); cancelled with the request `store` reads for.
    pub(crate) fn query(
        self,
        store: &StoreReader<'_>,
        from: i64,
        until: i64,
    ) -> Result<tsdb::Query, ApiError> {
        let profile_type = profile_type(store, &self.type_name)?;
        Ok(tsdb::Query {
            from,
            until,
            profile_type,
            matchers: self.matchers,
            sample_matchers: self.sample_matchers,
            sample_labels: tsdb::SampleLabels::All,
            control: store.control.clone(),
        })
    }
}

/// The profile type named `name`: one the store holds, else one clrscope records (which then
/// selects nothing).
pub(crate) fn profile_type(store: &Store, name: &str) -> Result<ProfileType, ApiError> {
    let stored = store.profile_types();
    stored
        .iter()
        .find(|t| t.name == name)
        .cloned()
        .or_else(|| ProfileType::known(name))
        .ok_or_else(|| {
            let names = |types: Vec<&str>| {
                if types.is_empty() {
                    "none".to_string()
                } else {
                    types.join(", ")
                }
            };
            let stored: Vec<&str> = stored.iter().map(|t| t.name.as_str()).collect();
            let others = ProfileType::KNOWN_NAMES
                .into_iter()
                .filter(|n| !stored.contains(n))
                .collect();
            ApiError::UnknownProfileType {
                name: name.to_string(),
                known: format!(
                    "the store holds {}; clrscope also records {}",
                    names(stored.clone()),
                    names(others)
                ),
            }
        })
}

/// What a profile route answers with: the web UI's JSON tree or one of the exporter's files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    Tree,
    File(Format),
}

impl Output {
    /// The formats of `/profile`, the first the default, and their names for messages.
    const PROFILE: (&[Output], &str) = (
        &[
            Output::Tree,
            Output::File(Format::Pprof),
            Output::File(Format::Folded),
            Output::File(Format::Svg),
            Output::File(Format::Speedscope),
        ],
        "json, pprof, folded, svg, speedscope",
    );
    /// The formats of `/diff`, which hold both sides of a comparison.
    const DIFF: (&[Output], &str) = (
        &[
            Output::Tree,
            Output::File(Format::Pprof),
            Output::File(Format::Folded),
        ],
        "json, pprof, folded",
    );

    fn parse(
        name: Option<&str>,
        (allowed, names): (&[Output], &'static str),
    ) -> Result<Output, ApiError> {
        let Some(name) = name else {
            return Ok(allowed[0]);
        };
        let output = match name.to_ascii_lowercase().as_str() {
            "json" => Some(Output::Tree),
            other => other.parse().ok().map(Output::File),
        };
        output
            .filter(|o| allowed.contains(o))
            .ok_or_else(|| ApiError::UnknownFormat {
                format: name.to_string(),
                formats: names,
            })
    }

    /// The sample labels the output shows. Merging without the others is much cheaper over
    /// long ranges: one sample per stack instead of one per stack and thread.
    fn sample_labels(self) -> tsdb::SampleLabels {
        match self {
            Output::Tree | Output::File(Format::Folded | Format::Svg) => {
                tsdb::SampleLabels::Only(Vec::new())
            }
            Output::File(Format::Speedscope) => {
                tsdb::SampleLabels::Only(vec![THREAD_ID.to_string(), THREAD_NAME.to_string()])
            }
            Output::File(Format::Pprof) => tsdb::SampleLabels::All,
        }
    }

    fn render(self, profile: &Profile) -> Result<Vec<u8>, ApiError> {
        let mut out = Vec::new();
        match self {
            Output::Tree => tree::write_tree(profile, None, &mut out)?,
            Output::File(format) => exporter::write(profile, format, &mut out)?,
        }
        Ok(out)
    }

    /// Writes a call tree cut by the store: the JSON tree as it is, files from its profile.
    fn render_call_tree(self, call_tree: &CallTree) -> Result<Vec<u8>, ApiError> {
        let mut out = Vec::new();
        match self {
            Output::Tree => tree::write_call_tree(call_tree, &mut out)?,
            Output::File(format) => exporter::write(&call_tree.to_profile(), format, &mut out)?,
        }
        Ok(out)
    }

    /// Writes a profile of [`profile::diff`]; only the [`Output::DIFF`] formats reach here.
    fn render_diff(self, diff: &Profile) -> Result<Vec<u8>, ApiError> {
        let mut out = Vec::new();
        match self {
            Output::Tree => tree::write_diff_tree(diff, &mut out)?,
            Output::File(Format::Folded) => folded::write_diff_folded(diff, &mut out)?,
            Output::File(format) => exporter::write(diff, format, &mut out)?,
        }
        Ok(out)
    }

    /// The body with its content type; pprof as a download named after `name`.
    fn respond(self, name: &str, body: Vec<u8>) -> Response {
        let content_type = match self {
            Output::Tree | Output::File(Format::Speedscope) => "application/json",
            Output::File(Format::Pprof) => "application/octet-stream",
            Output::File(Format::Folded) => "text/plain; charset=utf-8",
            Output::File(Format::Svg) => "image/svg+xml",
        };
        let mut headers: Vec<(HeaderName, HeaderValue)> =
            vec![(header::CONTENT_TYPE, HeaderValue::from_static(content_type))];
        if self == Output::File(Format::Pprof) {
            let file: String = name
                .chars()
                .map(|c| match c {
                    'a'..='z' | 'A'..='Z' | '0'..='9' | '_' | '-' => c,
                    _ => '_',
                })
                .collect();
            let disposition = format!("attachment; filename=\"{file}.pb.gz\"");
            if let Ok(value) = HeaderValue::try_from(disposition) {
                headers.push((header::CONTENT_DISPOSITION, value));
            }
        }
        (axum::http::HeaderMap::from_iter(headers), body).into_response()
    }
}
