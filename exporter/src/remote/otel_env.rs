//! OpenTelemetry's exporter environment variables (the OTLP exporter specification's
//! `OTEL_EXPORTER_OTLP_*`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SDK_DISABLED`,
//! `OTEL_{TRACES,LOGS,METRICS}_EXPORTER`) read into [`ExporterConfig`]s, so an agent deployed beside
//! OpenTelemetry-instrumented services takes the same settings they do.
//!
//! - Exporters exist only when an endpoint is set: `OTEL_EXPORTER_OTLP_ENDPOINT` for every signal
//!   (profiles, logs, traces, metrics), or a signal's own `OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT`. (An SDK
//!   defaults to `localhost`; an agent that sends nowhere unless told is the safer default.)
//! - Per signal, `OTEL_EXPORTER_OTLP_<SIGNAL>_X` wins over `OTEL_EXPORTER_OTLP_X`, for X in
//!   `ENDPOINT`, `PROTOCOL` (`grpc` or `http/protobuf`, the default; `http/json` is refused),
//!   `HEADERS` (`k=v,k2=v2`, percent-decoded), `TIMEOUT` (milliseconds, default 10000),
//!   `COMPRESSION` (`gzip` or `none`, the default), `CERTIFICATE`, `CLIENT_CERTIFICATE`,
//!   `CLIENT_KEY` (PEM files) and `INSECURE` (gRPC, an endpoint without a scheme: `true` for
//!   `http://`, else `https://`).
//! - OTLP/HTTP: a signal's own endpoint is its URL as it is; the generic one gets the signal's
//!   route appended to its path (`/v1/traces`, `/v1/logs`, `/v1development/profiles`). gRPC
//!   endpoints are used as they are.
//! - `OTEL_TRACES_EXPORTER` / `OTEL_LOGS_EXPORTER` / `OTEL_METRICS_EXPORTER` = `none` leave that signal out;
//!   `OTEL_SDK_DISABLED=true` leaves all out.
//! - `OTEL_RESOURCE_ATTRIBUTES` (`k=v,…`, percent-decoded) goes on every resource sent; the
//!   process's own `service.name`, `process.pid` and `host.name` win over it.
//!
//! Signals whose settings agree share one exporter, named `otel`; otherwise each group is named
//! `otel-<signals>`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::{Compression, ExportSignal, ExporterConfig, Kind, RemoteError, TlsConfig};

/// Where an exporter made from the environment sends one signal, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SignalTarget {
    kind: Kind,
    /// gRPC: the channel's endpoint; HTTP: the signal's URL.
    url: String,
    headers: BTreeMap<String, String>,
    timeout: Duration,
    compression: Compression,
    tls: Option<TlsConfig>,
}

impl SignalTarget {
    /// What signals sharing an exporter must agree on (HTTP URLs differ per signal).
    fn shares_with(&self, other: &SignalTarget) -> bool {
        self.kind == other.kind
            && self.headers == other.headers
            && self.timeout == other.timeout
            && self.compression == other.compression
            && self.tls == other.tls
            && (self.kind == Kind::OtlpHttp || self.url == other.url)
    }
}

fn bad(variable: &str, reason: impl Into<String>) -> RemoteError {
    RemoteError::Environment {
        variable: variable.to_string(),
        reason: reason.into(),
    }
}

/// `%XX` decoded (W3C baggage values); malformed escapes stay as they are.
pub fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `k=v,k2=v2` (the form of `_HEADERS` and `OTEL_RESOURCE_ATTRIBUTES`), values percent-decoded.
pub fn parse_pairs(variable: &str, text: &str) -> Result<BTreeMap<String, String>, RemoteError> {
    let mut pairs = BTreeMap::new();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| bad(variable, format!("{item:?} is not key=value")))?;
        let key = percent_decode(key.trim());
        if key.is_empty() {
            return Err(bad(variable, format!("{item:?} has an empty key")));
        }
        pairs.insert(key, percent_decode(value.trim()));
    }
    Ok(pairs)
}

/// The exporters the environment asks for; `get` reads a variable (empty counts as unset).
pub fn exporters_from_env(
    get: impl Fn(&str) -> Option<String>,
) -> Result<Vec<(String, ExporterConfig)>, RemoteError> {
    let var = |name: &str| {
        get(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(Vec::new());
    }
    let resource_attributes = match var("OTEL_RESOURCE_ATTRIBUTES") {
        Some(text) => parse_pairs("OTEL_RESOURCE_ATTRIBUTES", &text)?,
        None => BTreeMap::new(),
    };
    let mut targets: Vec<(ExportSignal, SignalTarget)> = Vec::new();
    for signal in ExportSignal::ALL {
        let upper = signal.name().to_ascii_uppercase();
        let selector = format!("OTEL_{upper}_EXPORTER");
        match var(&selector).map(|v| v.to_ascii_lowercase()).as_deref() {
            None | Some("otlp") => {}
            Some("none") => continue,
            Some(other) => {
                return Err(bad(
                    &selector,
                    format!("{other:?}: the agent exports OTLP only; use otlp or none"),
                ))
            }
        }
        if let Some(target) = signal_target(signal, &upper, &var)? {
            targets.push((signal, target));
        }
    }
    let mut groups: Vec<(
        Vec<ExportSignal>,
        SignalTarget,
        BTreeMap<ExportSignal, String>,
    )> = Vec::new();
    for (signal, target) in targets {
        let group = groups.iter_mut().find(|(_, t, _)| t.shares_with(&target));
        let url = target.url.clone();
        let kind = target.kind;
        let (signals, _, urls) = match group {
            Some(group) => group,
            None => {
                groups.push((Vec::new(), target, BTreeMap::new()));
                groups.last_mut().expect("just pushed")
            }
        };
        signals.push(signal);
        if kind == Kind::OtlpHttp {
            urls.insert(signal, url);
        }
    }
    let single = groups.len() == 1;
    Ok(groups
        .into_iter()
        .map(|(signals, target, signal_endpoints)| {
            let name = if single {
                "otel".to_string()
            } else {
                let names: Vec<&str> = signals.iter().map(|s| s.name()).collect();
                format!("otel-{}", names.join("-"))
            };
            let config = ExporterConfig {
                kind: target.kind,
                endpoint: target.url,
                headers: target.headers,
                interval: None,
                timeout: Some(target.timeout),
                compression: target.compression,
                queue_size: None,
                max_queue_bytes: None,
                max_retry_delay: None,
                tls: target.tls,
                signals,
                signal_endpoints,
                resource_attributes: resource_attributes.clone(),
            };
            (name, config)
        })
        .collect())
}

/// One signal's settings, its own variables over the generic ones; `None` without an endpoint.
fn signal_target(
    signal: ExportSignal,
    upper: &str,
    var: &impl Fn(&str) -> Option<String>,
) -> Result<Option<SignalTarget>, RemoteError> {
    // (the variable that was set, its value): the signal's own, else the generic one.
    let setting = |suffix: &str| {
        let own = format!("OTEL_EXPORTER_OTLP_{upper}_{suffix}");
        match var(&own) {
            Some(value) => Some((own, value)),
            None => {
                let generic = format!("OTEL_EXPORTER_OTLP_{suffix}");
                var(&generic).map(|value| (generic, value))
            }
        }
    };
    let Some((endpoint_var, endpoint)) = setting("ENDPOINT") else {
        return Ok(None);
    };
    let own_endpoint = endpoint_var != "OTEL_EXPORTER_OTLP_ENDPOINT";
    let kind = match setting("PROTOCOL") {
        None => Kind::OtlpHttp,
        Some((_, p)) if p == "http/protobuf" => Kind::OtlpHttp,
        Some((_, p)) if p == "grpc" => Kind::OtlpGrpc,
        Some((name, p)) => {
            return Err(bad(
                &name,
                format!("{p:?}: use grpc or http/protobuf (http/json is not supported)"),
            ))
        }
    };
    let insecure = setting("INSECURE").is_some_and(|(_, v)| v.eq_ignore_ascii_case("true"));
    let endpoint = if endpoint.contains("://") {
        endpoint
    } else if kind == Kind::OtlpGrpc {
        let scheme = if insecure { "http" } else { "https" };
        format!("{scheme}://{endpoint}")
    } else {
        return Err(bad(
            &endpoint_var,
            format!("{endpoint:?}: an OTLP/HTTP endpoint is a URL (http:// or https://)"),
        ));
    };
    let url = if kind == Kind::OtlpHttp && !own_endpoint {
        format!("{}{}", endpoint.trim_end_matches('/'), signal.http_path())
    } else {
        endpoint
    };
    let headers = match setting("HEADERS") {
        Some((name, text)) => parse_pairs(&name, &text)?,
        None => BTreeMap::new(),
    };
    let timeout = match setting("TIMEOUT") {
        Some((name, text)) => Duration::from_millis(
            text.parse::<u64>()
                .map_err(|_| bad(&name, format!("{text:?} is not a number of milliseconds")))?,
        ),
        None => super::DEFAULT_TIMEOUT,
    };
    let compression = match setting("COMPRESSION") {
        None => Compression::None,
        Some((_, c)) if c.eq_ignore_ascii_case("gzip") => Compression::Gzip,
        Some((_, c)) if c.eq_ignore_ascii_case("none") => Compression::None,
        Some((name, c)) => return Err(bad(&name, format!("{c:?}: use gzip or none"))),
    };
    let file = |suffix: &str| setting(suffix).map(|(_, path)| PathBuf::from(path));
    let tls = TlsConfig {
        ca_file: file("CERTIFICATE"),
        cert_file: file("CLIENT_CERTIFICATE"),
        key_file: file("CLIENT_KEY"),
    };
    let tls = (tls != TlsConfig::default() && url.starts_with("https://")).then_some(tls);
    Ok(Some(SignalTarget {
        kind,
        url,
        headers,
        timeout,
        compression,
        tls,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, ExporterConfig)> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        exporters_from_env(|name| map.get(name).cloned()).unwrap()
    }

    #[test]
    fn escapes_decode_and_malformed_ones_stay() {
        assert_eq!(percent_decode("a%2Cb%zz%"), "a,b%zz%");
    }

    #[test]
    fn nothing_without_an_endpoint() {
        assert!(env(&[]).is_empty());
        assert!(env(&[("OTEL_EXPORTER_OTLP_HEADERS", "a=b")]).is_empty());
        assert!(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_SDK_DISABLED", "true")
        ])
        .is_empty());
    }

    #[test]
    fn the_generic_http_endpoint_gets_each_signals_route() {
        let exporters = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/base/"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-token=a%20b, tenant=7"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_LOGS_EXPORTER", "none"),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod"),
        ]);
        assert_eq!(exporters.len(), 1);
        let (name, config) = &exporters[0];
        assert_eq!(name, "otel");
        assert_eq!(config.kind, Kind::OtlpHttp);
        assert_eq!(
            config.signals,
            [
                ExportSignal::Profiles,
                ExportSignal::Traces,
                ExportSignal::Metrics
            ]
        );
        assert_eq!(
            config.signal_endpoints[&ExportSignal::Traces],
            "http://c:4318/base/v1/traces"
        );
        assert_eq!(
            config.signal_endpoints[&ExportSignal::Metrics],
            "http://c:4318/base/v1/metrics"
        );
        assert_eq!(
            config.signal_endpoints[&ExportSignal::Profiles],
            "http://c:4318/base/v1development/profiles"
        );
        assert_eq!(config.headers["x-token"], "a b");
        assert_eq!(config.headers["tenant"], "7");
        assert_eq!(config.timeout, Some(Duration::from_millis(2500)));
        assert_eq!(config.compression, Compression::None);
        assert_eq!(config.resource_attributes["deployment.environment"], "prod");
        // What the environment gives, a client takes.
        super::super::Client::new(config).unwrap();
    }

    #[test]
    fn a_signals_own_settings_win_and_split_the_exporter() {
        let exporters = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "collector:4317"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "true"),
            (
                "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
                "http://l:4318/custom/logs",
            ),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
        ]);
        let names: Vec<&str> = exporters.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["otel-profiles-logs-metrics", "otel-traces"]);
        let http = &exporters[0].1;
        // A signal's own HTTP endpoint is used as it is.
        assert_eq!(
            http.signal_endpoints[&ExportSignal::Logs],
            "http://l:4318/custom/logs"
        );
        assert_eq!(http.compression, Compression::Gzip);
        let grpc = &exporters[1].1;
        assert_eq!(grpc.kind, Kind::OtlpGrpc);
        assert_eq!(grpc.endpoint, "http://collector:4317");
        assert!(grpc.signal_endpoints.is_empty());
    }

    #[test]
    fn unsupported_settings_name_their_variable() {
        let error = |pairs: &[(&str, &str)]| {
            let map: BTreeMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            exporters_from_env(|name| map.get(name).cloned())
                .unwrap_err()
                .to_string()
        };
        assert!(error(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        ])
        .contains("OTEL_EXPORTER_OTLP_PROTOCOL"));
        assert!(error(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "5s")
        ])
        .contains("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"));
        assert!(
            error(&[("OTEL_RESOURCE_ATTRIBUTES", "novalue")]).contains("OTEL_RESOURCE_ATTRIBUTES")
        );
        assert!(error(&[("OTEL_TRACES_EXPORTER", "zipkin")]).contains("OTEL_TRACES_EXPORTER"));
    }
}
