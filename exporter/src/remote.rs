//! Sending profiles to a backend: OTLP over gRPC or HTTP, Pyroscope's Connect push, or
//! Pyroscope's legacy `/ingest`.
//!
//! An [`ExporterConfig`] (the agent's `Exporters.<name>` settings) gives a [`Client`]. The agent
//! [`Client::prepare`]s each interval's batches into [`Prepared`] requests, which it may queue
//! and retry; [`Client::send`] sends one and says whether a failure is worth retrying
//! ([`SendError::retryable`]).
//!
//! | kind | request | endpoint |
//! |---|---|---|
//! | `otlp-grpc` | `ProfilesService/Export` (tonic) | `http(s)://host:4317` |
//! | `otlp-http` | `POST /v1development/profiles`, `application/x-protobuf` | `http(s)://host:4318` (a URL with a path is used as it is) |
//! | `pyroscope` | `POST /push.v1.PusherService/Push`, Connect, `application/proto` | `http(s)://host:4040` |
//! | `pyroscope-ingest` | `POST /ingest?name=…&format=pprof`, one per profile | `http(s)://host:4040` |
//!
//! Bodies are gzip-compressed unless `Compression` is `none` (`/ingest` always sends a gzipped
//! pprof file, which is pprof's own file format). `https://` endpoints use TLS (rustls) with the
//! system's root certificates plus an optional CA file, and an optional client certificate.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use flate2::write::GzEncoder;
use flate2::Compression as GzLevel;
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_client::LogsServiceClient;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_client::ProfilesServiceClient;
use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::resource::v1::Resource;
use profile::guid::Guid;
use prost::Message;
use serde::Deserialize;
use tonic::codec::CompressionEncoding;
use tonic::metadata::{Ascii, MetadataKey, MetadataValue};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::otlp::traces::{traces_request, SpanExport};
use crate::otlp::{extend_resource, logs_request, ExportBatch, LogExport, RequestBuilder};
use crate::otlp_metrics::{metrics_request, MetricExport};
use crate::pyroscope::{self, SeriesProfile};

pub mod otel_env;

/// How long a request may take without `Timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the profiles go and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    OtlpGrpc,
    OtlpHttp,
    Pyroscope,
    PyroscopeIngest,
}

impl Kind {
    const ALL: [(Kind, &'static str); 4] = [
        (Kind::OtlpGrpc, "otlp-grpc"),
        (Kind::OtlpHttp, "otlp-http"),
        (Kind::Pyroscope, "pyroscope"),
        (Kind::PyroscopeIngest, "pyroscope-ingest"),
    ];

    pub fn name(self) -> &'static str {
        Kind::ALL
            .iter()
            .find(|(k, _)| *k == self)
            .map_or("", |(_, n)| n)
    }
}

impl FromStr for Kind {
    type Err = String;

    /// `otlp-grpc`, `OtlpGrpc`, `otlp_grpc`: case, `-` and `_` do not matter.
    fn from_str(s: &str) -> Result<Kind, String> {
        let squash = |t: &str| {
            t.chars()
                .filter(|c| *c != '-' && *c != '_')
                .collect::<String>()
                .to_ascii_lowercase()
        };
        Kind::ALL
            .iter()
            .find(|(_, name)| squash(name) == squash(s))
            .map(|(k, _)| *k)
            .ok_or_else(|| {
                format!(
                    "unknown exporter kind {s:?}: use otlp-grpc, otlp-http, pyroscope or \
                     pyroscope-ingest"
                )
            })
    }
}

impl<'de> Deserialize<'de> for Kind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Kind, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Body compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    #[default]
    Gzip,
    None,
}

impl<'de> Deserialize<'de> for Compression {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        match text.to_ascii_lowercase().as_str() {
            "gzip" => Ok(Compression::Gzip),
            "none" => Ok(Compression::None),
            _ => Err(serde::de::Error::custom(format!(
                "unknown compression {text:?}: use gzip or none"
            ))),
        }
    }
}

/// TLS settings of an `https://` endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file of CA certificates trusted besides the system's.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (chain) and its key, for servers that ask for one.
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    #[serde(default)]
    pub key_file: Option<PathBuf>,
}

/// One exporter of the agent's `Exporters` section (`Exporters.<name>`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct ExporterConfig {
    pub kind: Kind,
    /// `http://host:port` or `https://host:port` (see the module documentation).
    pub endpoint: String,
    /// Sent with every request: `Authorization`, `X-Scope-OrgID`, ...
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// How often a request is sent (default 15 s).
    #[serde(default, deserialize_with = "settings::lenient::opt_duration")]
    pub interval: Option<Duration>,
    /// How long one attempt may take (default 10 s).
    #[serde(default, deserialize_with = "settings::lenient::opt_duration")]
    pub timeout: Option<Duration>,
    #[serde(default)]
    pub compression: Compression,
    /// Requests kept while the backend is unreachable (default 8); past it the oldest is
    /// dropped.
    #[serde(default, deserialize_with = "settings::lenient::opt_number")]
    pub queue_size: Option<usize>,
    /// Bytes of requests kept while the backend is unreachable (default 16 MiB); past it the
    /// oldest are dropped.
    #[serde(default, deserialize_with = "settings::lenient::opt_bytes")]
    pub max_queue_bytes: Option<u64>,
    /// The longest wait between two attempts (default 30 s); waits double from 1 s up to it,
    /// with jitter.
    #[serde(default, deserialize_with = "settings::lenient::opt_duration")]
    pub max_retry_delay: Option<Duration>,
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// What it sends: `Profiles` (default) and, for OTLP, `Logs` (log records and exceptions,
    /// which the agent collects with `--logs` and `--exception-history`), `Traces` (the
    /// finished spans trace linkage follows) and `Metrics` (the runtime counters and meters the
    /// agent reads for `/metrics`).
    #[serde(default = "default_signals")]
    pub signals: Vec<ExportSignal>,
    /// OTLP/HTTP: a signal's full URL, used as it is, instead of its default route at the
    /// endpoint (`/v1development/profiles`, `/v1/logs`, `/v1/traces`).
    #[serde(default)]
    pub signal_endpoints: BTreeMap<ExportSignal, String>,
    /// OTLP: attributes added to every resource (process) sent, unless the process's own
    /// (`service.name`, `process.pid`, `host.name`) name the key.
    #[serde(default)]
    pub resource_attributes: BTreeMap<String, String>,
}

/// A kind of data an exporter sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
pub enum ExportSignal {
    Profiles,
    Logs,
    Traces,
    Metrics,
}

impl ExportSignal {
    pub const ALL: [ExportSignal; 4] = [
        ExportSignal::Profiles,
        ExportSignal::Logs,
        ExportSignal::Traces,
        ExportSignal::Metrics,
    ];

    /// Lower case, as metric labels and OpenTelemetry's variables name it.
    pub fn name(self) -> &'static str {
        match self {
            ExportSignal::Profiles => "profiles",
            ExportSignal::Logs => "logs",
            ExportSignal::Traces => "traces",
            ExportSignal::Metrics => "metrics",
        }
    }

    /// The OTLP/HTTP route of the signal at an endpoint.
    fn http_path(self) -> &'static str {
        match self {
            ExportSignal::Profiles => "/v1development/profiles",
            ExportSignal::Logs => "/v1/logs",
            ExportSignal::Traces => "/v1/traces",
            ExportSignal::Metrics => "/v1/metrics",
        }
    }
}

fn default_signals() -> Vec<ExportSignal> {
    vec![ExportSignal::Profiles]
}

impl ExporterConfig {
    pub fn sends(&self, signal: ExportSignal) -> bool {
        self.signals.contains(&signal)
    }
}

/// Why an exporter could not be set up, or a request not sent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    #[error("endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },

    #[error("header {name:?}: {reason}")]
    Header { name: String, reason: String },

    #[error("TLS: {0}")]
    Tls(String),

    #[error("reading {path}: {source}; check the path in the exporter's Tls settings")]
    TlsFile {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("building the HTTP client: {0}")]
    Client(String),

    #[error("environment variable {variable}: {reason}")]
    Environment { variable: String, reason: String },
}

/// Why a request failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct SendError {
    /// The backend may take it later (unreachable, overloaded, timed out); else it refused it.
    pub retryable: bool,
    /// How long the backend asked to wait (`Retry-After`), if it did.
    pub retry_after: Option<Duration>,
    pub message: String,
}

impl SendError {
    fn retry(message: String) -> SendError {
        SendError {
            retryable: true,
            retry_after: None,
            message,
        }
    }

    fn refused(message: String) -> SendError {
        SendError {
            retryable: false,
            retry_after: None,
            message,
        }
    }
}

/// A request ready to send (and to send again).
#[derive(Debug, Clone)]
pub struct Prepared {
    body: Body,
    /// Bytes it holds in memory (its encoded size).
    pub bytes: usize,
    /// What it carries.
    pub signal: ExportSignal,
    /// How many items, for accounting: profile sample values (one per sample per batch), log
    /// records and exceptions, spans, or metric points.
    pub values: u64,
}

/// The largest request [`Prepared::merge`] makes: half the 4 MiB a gRPC server (grpc-go's, so
/// the OpenTelemetry Collector's) takes by default, so that a merged request is never refused
/// for its size.
pub const MAX_MERGED_BYTES: usize = 2 << 20;

impl Prepared {
    /// Appends `later`'s items to this request, when both carry OTLP logs, spans or metric
    /// points to the same place and together stay within [`MAX_MERGED_BYTES`]; else hands
    /// `later` back. Profiles never merge: each request has its own dictionary.
    pub fn merge(&mut self, later: Prepared) -> Option<Prepared> {
        if self.signal != later.signal
            || self.signal == ExportSignal::Profiles
            || self.bytes + later.bytes > MAX_MERGED_BYTES
        {
            return Some(later);
        }
        let unmerged = match (&mut self.body, later.body) {
            (Body::GrpcLogs(into), Body::GrpcLogs(from)) => {
                into.resource_logs.extend(from.resource_logs);
                None
            }
            (Body::GrpcTraces(into), Body::GrpcTraces(from)) => {
                into.resource_spans.extend(from.resource_spans);
                None
            }
            (Body::GrpcMetrics(into), Body::GrpcMetrics(from)) => {
                into.resource_metrics.extend(from.resource_metrics);
                None
            }
            // The export requests of logs, traces and metrics are one repeated field each, and
            // two encoded messages concatenated decode as one with both fields' items.
            (
                Body::Http { url, body: into },
                Body::Http {
                    url: to,
                    body: from,
                },
            ) if *url == to => {
                into.extend_from_slice(&from);
                None
            }
            (_, body) => Some(body),
        };
        if let Some(body) = unmerged {
            return Some(Prepared { body, ..later });
        }
        self.bytes += later.bytes;
        self.values += later.values;
        None
    }
}

#[derive(Debug, Clone)]
enum Body {
    Grpc(ExportProfilesServiceRequest),
    GrpcLogs(ExportLogsServiceRequest),
    GrpcTraces(ExportTraceServiceRequest),
    GrpcMetrics(ExportMetricsServiceRequest),
    Http {
        /// The full URL.
        url: String,
        body: Vec<u8>,
    },
}

/// What a successful send reports back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sent {
    /// Profiles the backend said it rejected (OTLP partial success).
    pub rejected_profiles: i64,
}

#[derive(Debug, Clone)]
enum Transport {
    Grpc(Box<GrpcClients>),
    Http(reqwest::Client),
}

/// One client per OTLP service, over the same channel.
#[derive(Debug, Clone)]
struct GrpcClients {
    profiles: ProfilesServiceClient<Channel>,
    logs: LogsServiceClient<Channel>,
    traces: TraceServiceClient<Channel>,
    metrics: MetricsServiceClient<Channel>,
}

/// A configured exporter's connection; cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    kind: Kind,
    transport: Transport,
    /// `scheme://authority` plus any base path, without a trailing `/`.
    base: String,
    headers: Vec<(String, String)>,
    gzip: bool,
    timeout: Duration,
    signal_endpoints: BTreeMap<ExportSignal, String>,
    resource_attributes: Vec<(String, String)>,
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::with_capacity(bytes.len() / 4), GzLevel::default());
    // Writing into a Vec cannot fail.
    let _ = gz.write_all(bytes);
    gz.finish().unwrap_or_default()
}

fn read(path: &PathBuf) -> Result<Vec<u8>, RemoteError> {
    std::fs::read(path).map_err(|source| RemoteError::TlsFile {
        path: path.clone(),
        source,
    })
}

/// A client certificate (chain) and its key, PEM.
struct IdentityPem {
    cert: Vec<u8>,
    key: Vec<u8>,
}

/// The client certificate and key, when both are given (one without the other is an error).
fn identity_files(tls: &TlsConfig) -> Result<Option<IdentityPem>, RemoteError> {
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => Ok(Some(IdentityPem {
            cert: read(cert)?,
            key: read(key)?,
        })),
        (None, None) => Ok(None),
        _ => Err(RemoteError::Tls(
            "CertFile and KeyFile go together: give both for a client certificate, or neither"
                .into(),
        )),
    }
}

/// rustls settings for the HTTP kinds: the system's roots, the CA file, the client identity.
fn rustls_config(tls: &TlsConfig) -> Result<rustls::ClientConfig, RemoteError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    if let Some(ca) = &tls.ca_file {
        let pem = read(ca)?;
        let certs: Vec<CertificateDer> = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<_, _>>()
            .map_err(|e| RemoteError::Tls(format!("{}: {e}", ca.display())))?;
        if certs.is_empty() {
            return Err(RemoteError::Tls(format!(
                "{}: no PEM certificate in it",
                ca.display()
            )));
        }
        roots.add_parsable_certificates(certs);
    }
    if roots.is_empty() {
        return Err(RemoteError::Tls(
            "no trusted root certificate: the system has none; give a CaFile".into(),
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| RemoteError::Tls(e.to_string()))?
        .with_root_certificates(roots);
    match identity_files(tls)? {
        None => Ok(builder.with_no_client_auth()),
        Some(IdentityPem { cert, key }) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert)
                .collect::<Result<_, _>>()
                .map_err(|e| RemoteError::Tls(format!("client certificate: {e}")))?;
            let key = PrivateKeyDer::from_pem_slice(&key)
                .map_err(|e| RemoteError::Tls(format!("client key: {e}")))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| RemoteError::Tls(format!("client certificate: {e}")))
        }
    }
}

/// tonic's TLS settings for gRPC: the same roots and identity.
fn tonic_tls(tls: &TlsConfig) -> Result<ClientTlsConfig, RemoteError> {
    let mut config = ClientTlsConfig::new().with_native_roots();
    if let Some(ca) = &tls.ca_file {
        config = config.ca_certificate(tonic::transport::Certificate::from_pem(read(ca)?));
    }
    if let Some(IdentityPem { cert, key }) = identity_files(tls)? {
        config = config.identity(tonic::transport::Identity::from_pem(cert, key));
    }
    Ok(config)
}

impl Client {
    /// Checks the settings and sets up the connection; nothing is dialled until the first
    /// send, so a backend that is down does not stop the agent from starting.
    pub fn new(config: &ExporterConfig) -> Result<Client, RemoteError> {
        let endpoint = config.endpoint.trim().trim_end_matches('/').to_string();
        let bad = |reason: &str| RemoteError::Endpoint {
            endpoint: config.endpoint.clone(),
            reason: reason.to_string(),
        };
        let https = if endpoint.starts_with("https://") {
            true
        } else if endpoint.starts_with("http://") {
            false
        } else {
            return Err(bad("use http://host:port or https://host:port"));
        };
        if config.tls.is_some() && !https {
            return Err(bad(
                "Tls settings are given, so the endpoint must be https://",
            ));
        }
        let tls = config.tls.clone().unwrap_or_default();
        let timeout = config.timeout.unwrap_or(DEFAULT_TIMEOUT);
        let mut headers = Vec::new();
        for (name, value) in &config.headers {
            let invalid = |reason: &str| RemoteError::Header {
                name: name.clone(),
                reason: reason.to_string(),
            };
            let lower = name.to_ascii_lowercase();
            MetadataKey::<Ascii>::from_bytes(lower.as_bytes())
                .map_err(|_| invalid("not a valid header name"))?;
            MetadataValue::<Ascii>::try_from(value.as_str())
                .map_err(|_| invalid("the value must be visible ASCII"))?;
            headers.push((lower, value.clone()));
        }
        let otlp = matches!(config.kind, Kind::OtlpGrpc | Kind::OtlpHttp);
        if (config.sends(ExportSignal::Logs) || config.sends(ExportSignal::Traces)) && !otlp {
            return Err(bad(
                "only otlp-grpc and otlp-http exporters send Logs and Traces",
            ));
        }
        if !config.signal_endpoints.is_empty() && config.kind != Kind::OtlpHttp {
            return Err(bad(
                "SignalEndpoints are OTLP/HTTP URLs: only otlp-http exporters take them",
            ));
        }
        for url in config.signal_endpoints.values() {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(RemoteError::Endpoint {
                    endpoint: url.clone(),
                    reason: "a SignalEndpoints URL must be http:// or https://".into(),
                });
            }
        }
        let transport = if config.kind == Kind::OtlpGrpc {
            let mut channel = Endpoint::from_shared(endpoint.clone())
                .map_err(|e| bad(&e.to_string()))?
                .timeout(timeout)
                .connect_timeout(timeout);
            if https {
                channel = channel
                    .tls_config(tonic_tls(&tls)?)
                    .map_err(|e| RemoteError::Tls(e.to_string()))?;
            }
            let channel = channel.connect_lazy();
            let mut client = ProfilesServiceClient::new(channel.clone());
            let mut logs = LogsServiceClient::new(channel.clone());
            let mut traces = TraceServiceClient::new(channel.clone());
            let mut metrics = MetricsServiceClient::new(channel);
            if config.compression == Compression::Gzip {
                client = client
                    .send_compressed(CompressionEncoding::Gzip)
                    .accept_compressed(CompressionEncoding::Gzip);
                logs = logs
                    .send_compressed(CompressionEncoding::Gzip)
                    .accept_compressed(CompressionEncoding::Gzip);
                traces = traces
                    .send_compressed(CompressionEncoding::Gzip)
                    .accept_compressed(CompressionEncoding::Gzip);
                metrics = metrics
                    .send_compressed(CompressionEncoding::Gzip)
                    .accept_compressed(CompressionEncoding::Gzip);
            }
            Transport::Grpc(Box::new(GrpcClients {
                profiles: client,
                logs,
                traces,
                metrics,
            }))
        } else {
            let url = reqwest::Url::parse(&endpoint).map_err(|e| bad(&e.to_string()))?;
            if url.host_str().is_none() {
                return Err(bad("no host"));
            }
            // reqwest builds a TLS setup even for http:// clients: give the process rustls'
            // ring provider (a no-op when one is installed already).
            let _ = rustls::crypto::ring::default_provider().install_default();
            let mut builder = reqwest::Client::builder()
                .timeout(timeout)
                .connect_timeout(timeout)
                .user_agent(concat!("clrscope/", env!("CARGO_PKG_VERSION")));
            if https {
                builder = builder.tls_backend_preconfigured(rustls_config(&tls)?);
            }
            Transport::Http(
                builder
                    .build()
                    .map_err(|e| RemoteError::Client(e.to_string()))?,
            )
        };
        Ok(Client {
            kind: config.kind,
            transport,
            base: endpoint,
            headers,
            gzip: config.compression == Compression::Gzip,
            timeout,
            signal_endpoints: config.signal_endpoints.clone(),
            resource_attributes: config
                .resource_attributes
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        })
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The requests that carry these batches: one per interval, or one per profile for
    /// `/ingest`. None when there is nothing to send.
    pub fn prepare(&self, batches: &[ExportBatch]) -> Vec<Prepared> {
        let values: u64 = batches.iter().map(|b| b.batch.samples.len() as u64).sum();
        if values == 0 {
            return Vec::new();
        }
        match self.kind {
            Kind::OtlpGrpc | Kind::OtlpHttp => {
                let mut builder = RequestBuilder::new();
                for batch in batches {
                    builder.add(batch);
                }
                let mut request = builder.build();
                for r in &mut request.resource_profiles {
                    self.extend(&mut r.resource);
                }
                let encoded = request.encoded_len();
                let body = if self.kind == Kind::OtlpGrpc {
                    Body::Grpc(request)
                } else {
                    Body::Http {
                        url: self.otlp_url(ExportSignal::Profiles),
                        body: request.encode_to_vec(),
                    }
                };
                vec![Prepared {
                    body,
                    bytes: encoded,
                    signal: ExportSignal::Profiles,
                    values,
                }]
            }
            Kind::Pyroscope => {
                let profiles = pyroscope::profiles(batches);
                let request = pyroscope::proto::PushRequest {
                    series: profiles
                        .iter()
                        .filter_map(|p| {
                            let pprof = crate::pprof::encode_pprof(&p.profile).ok()?;
                            Some(pyroscope::proto::RawProfileSeries {
                                labels: p.label_pairs(),
                                samples: vec![pyroscope::proto::RawSample {
                                    raw_profile: gzip(&pprof),
                                    id: uuid_v4(),
                                }],
                            })
                        })
                        .collect(),
                };
                let body = request.encode_to_vec();
                vec![Prepared {
                    bytes: body.len(),
                    body: Body::Http {
                        url: format!("{}/push.v1.PusherService/Push", self.base),
                        body,
                    },
                    signal: ExportSignal::Profiles,
                    values,
                }]
            }
            Kind::PyroscopeIngest => pyroscope::profiles(batches)
                .iter()
                .filter_map(|p| {
                    let pprof = gzip(&crate::pprof::encode_pprof(&p.profile).ok()?);
                    Some(Prepared {
                        bytes: pprof.len(),
                        signal: ExportSignal::Profiles,
                        values: p.profile.samples.len() as u64,
                        body: Body::Http {
                            url: format!("{}{}", self.base, ingest_path(p)),
                            body: pprof,
                        },
                    })
                })
                .collect(),
        }
    }

    /// `/v1development/profiles` under the endpoint, unless the endpoint has a path of its own
    /// (as OpenTelemetry's signal-specific endpoint settings do).
    fn otlp_http_path(&self) -> String {
        let has_path = reqwest::Url::parse(&self.base)
            .map(|u| u.path() != "/" && !u.path().is_empty())
            .unwrap_or(false);
        if has_path {
            String::new()
        } else {
            "/v1development/profiles".into()
        }
    }

    /// Adds the configured resource attributes.
    fn extend(&self, resource: &mut Option<Resource>) {
        if let Some(resource) = resource {
            extend_resource(resource, &self.resource_attributes);
        }
    }

    /// The request that carries these log records and exceptions (OTLP exporters only).
    pub fn prepare_logs(&self, records: &[LogExport]) -> Option<Prepared> {
        if records.is_empty() {
            return None;
        }
        let mut request = logs_request(records);
        for r in &mut request.resource_logs {
            self.extend(&mut r.resource);
        }
        let bytes = request.encoded_len();
        let body = match self.kind {
            Kind::OtlpGrpc => Body::GrpcLogs(request),
            Kind::OtlpHttp => Body::Http {
                url: self.otlp_url(ExportSignal::Logs),
                body: request.encode_to_vec(),
            },
            Kind::Pyroscope | Kind::PyroscopeIngest => return None,
        };
        Some(Prepared {
            body,
            bytes,
            signal: ExportSignal::Logs,
            values: records.len() as u64,
        })
    }

    /// The request that carries these spans (OTLP exporters only).
    pub fn prepare_traces(&self, spans: &[SpanExport]) -> Option<Prepared> {
        if spans.is_empty() {
            return None;
        }
        let mut request = traces_request(spans);
        for r in &mut request.resource_spans {
            self.extend(&mut r.resource);
        }
        let bytes = request.encoded_len();
        let body = match self.kind {
            Kind::OtlpGrpc => Body::GrpcTraces(request),
            Kind::OtlpHttp => Body::Http {
                url: self.otlp_url(ExportSignal::Traces),
                body: request.encode_to_vec(),
            },
            Kind::Pyroscope | Kind::PyroscopeIngest => return None,
        };
        Some(Prepared {
            body,
            bytes,
            signal: ExportSignal::Traces,
            values: spans.len() as u64,
        })
    }

    /// Where OTLP/HTTP sends `signal`: its `SignalEndpoints` URL as it is; else profiles at
    /// the endpoint plus `/v1development/profiles` (an endpoint with a path is the profiles'
    /// route itself), logs and traces at `/v1/logs` and `/v1/traces` of the endpoint's host.
    fn otlp_url(&self, signal: ExportSignal) -> String {
        if let Some(url) = self.signal_endpoints.get(&signal) {
            return url.clone();
        }
        if signal == ExportSignal::Profiles {
            return format!("{}{}", self.base, self.otlp_http_path());
        }
        match reqwest::Url::parse(&self.base) {
            Ok(mut url) => {
                url.set_path(signal.http_path());
                url.set_query(None);
                url.to_string()
            }
            Err(_) => format!("{}{}", self.base, signal.http_path()),
        }
    }

    /// The request that carries these metric points (OTLP exporters only).
    pub fn prepare_metrics(&self, points: &[MetricExport]) -> Option<Prepared> {
        if points.is_empty() {
            return None;
        }
        let mut request = metrics_request(points);
        for r in &mut request.resource_metrics {
            self.extend(&mut r.resource);
        }
        let bytes = request.encoded_len();
        let body = match self.kind {
            Kind::OtlpGrpc => Body::GrpcMetrics(request),
            Kind::OtlpHttp => Body::Http {
                url: self.otlp_url(ExportSignal::Metrics),
                body: request.encode_to_vec(),
            },
            Kind::Pyroscope | Kind::PyroscopeIngest => return None,
        };
        Some(Prepared {
            body,
            bytes,
            signal: ExportSignal::Metrics,
            values: points.len() as u64,
        })
    }

    /// Sends one prepared request once.
    pub async fn send(&self, prepared: &Prepared) -> Result<Sent, SendError> {
        match (&self.transport, &prepared.body) {
            (Transport::Grpc(clients), Body::Grpc(message)) => {
                self.send_grpc(clients.profiles.clone(), message.clone())
                    .await
            }
            (Transport::Grpc(clients), Body::GrpcLogs(message)) => {
                let mut client = clients.logs.clone();
                accepted(client.export(self.grpc_request(message.clone())).await)
            }
            (Transport::Grpc(clients), Body::GrpcTraces(message)) => {
                let mut client = clients.traces.clone();
                accepted(client.export(self.grpc_request(message.clone())).await)
            }
            (Transport::Grpc(clients), Body::GrpcMetrics(message)) => {
                let mut client = clients.metrics.clone();
                accepted(client.export(self.grpc_request(message.clone())).await)
            }
            (Transport::Http(client), Body::Http { url, body }) => {
                // Compressed per attempt, so that queued bodies stay mergeable (protobuf
                // messages concatenate; gzip streams are not worth relying on to).
                let body = if self.gzip && self.kind != Kind::PyroscopeIngest {
                    gzip(body)
                } else {
                    body.clone()
                };
                self.send_http(client, url, body).await
            }
            _ => Err(SendError::refused(
                "request prepared by another kind of exporter".into(),
            )),
        }
    }

    /// `message` with the exporter's timeout and headers.
    fn grpc_request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.timeout);
        for (name, value) in &self.headers {
            // Checked in `new`.
            if let (Ok(key), Ok(value)) = (
                MetadataKey::<Ascii>::from_bytes(name.as_bytes()),
                MetadataValue::<Ascii>::try_from(value.as_str()),
            ) {
                request.metadata_mut().insert(key, value);
            }
        }
        request
    }

    async fn send_grpc(
        &self,
        mut client: ProfilesServiceClient<Channel>,
        message: ExportProfilesServiceRequest,
    ) -> Result<Sent, SendError> {
        match client.export(self.grpc_request(message)).await {
            Ok(response) => Ok(partial_success(response.into_inner())),
            Err(status) => Err(grpc_error(&status)),
        }
    }

    async fn send_http(
        &self,
        client: &reqwest::Client,
        url: &str,
        body: Vec<u8>,
    ) -> Result<Sent, SendError> {
        let mut request = client.post(url);
        request = match self.kind {
            Kind::OtlpHttp => request.header("content-type", "application/x-protobuf"),
            Kind::Pyroscope => request
                .header("content-type", "application/proto")
                .header("connect-protocol-version", "1"),
            _ => request.header("content-type", "application/octet-stream"),
        };
        if self.gzip && self.kind != Kind::PyroscopeIngest {
            request = request.header("content-encoding", "gzip");
        }
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        let response = request.body(body).send().await.map_err(|e| {
            // Unreachable, reset or timed out: the backend may be back later.
            SendError::retry(format!("POST {url}: {}", crate::error_chain(&e)))
        })?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let bytes = response.bytes().await.map_err(|e| {
            SendError::retry(format!(
                "POST {url}: reading the answer: {}",
                crate::error_chain(&e)
            ))
        })?;
        if status.is_success() {
            if self.kind == Kind::OtlpHttp {
                if let Ok(answer) = ExportProfilesServiceResponse::decode(bytes.as_ref()) {
                    return Ok(partial_success(answer));
                }
            }
            return Ok(Sent::default());
        }
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned();
        let retryable = matches!(status.as_u16(), 408 | 429 | 500 | 502 | 503 | 504);
        Err(SendError {
            retryable,
            retry_after,
            message: format!("POST {url}: HTTP {status}: {}", text.trim()),
        })
    }
}

/// The outcome of a logs or traces call (their partial successes are not read).
fn accepted<T>(result: Result<tonic::Response<T>, tonic::Status>) -> Result<Sent, SendError> {
    result
        .map(|_| Sent::default())
        .map_err(|status| grpc_error(&status))
}

/// A failed gRPC call, retryable when the status says the backend may take it later.
fn grpc_error(status: &tonic::Status) -> SendError {
    use tonic::Code;
    let retryable = matches!(
        status.code(),
        Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Aborted
            | Code::OutOfRange
            | Code::Unavailable
            | Code::DataLoss
            | Code::ResourceExhausted
    );
    SendError {
        retryable,
        retry_after: None,
        message: format!("gRPC {:?}: {}", status.code(), status.message()),
    }
}

/// What the backend rejected of a request it accepted; logged, not retried (the OTLP spec
/// says not to).
fn partial_success(response: ExportProfilesServiceResponse) -> Sent {
    let rejected = response.partial_success.map_or(0, |p| {
        if p.rejected_profiles > 0 || !p.error_message.is_empty() {
            tracing::warn!(
                rejected_profiles = p.rejected_profiles,
                message = %p.error_message,
                "the OTLP receiver rejected part of a request"
            );
        }
        p.rejected_profiles
    });
    Sent {
        rejected_profiles: rejected,
    }
}

/// `/ingest?name=…&from=…&until=…&format=pprof&spyName=clrscope` for one profile, times in
/// Unix seconds.
fn ingest_path(profile: &SeriesProfile) -> String {
    let seconds = |nanos: i64| nanos.div_euclid(1_000_000_000).to_string();
    let mut url = reqwest::Url::parse("http://pyroscope/ingest").expect("a valid URL");
    url.query_pairs_mut()
        .append_pair("name", &pyroscope::ingest_name(profile))
        .append_pair("from", &seconds(profile.from))
        // `until` is exclusive there: one second past the last batch.
        .append_pair("until", &seconds(profile.until + 1_000_000_000))
        .append_pair("format", "pprof")
        .append_pair("spyName", "clrscope");
    format!("{}?{}", url.path(), url.query().unwrap_or_default())
}

/// A random (version 4) UUID, as Pyroscope's `RawSample.ID` expects.
fn uuid_v4() -> String {
    Guid::new_v4(fastrand::u128(..).to_le_bytes()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: &str) -> ExporterConfig {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn settings_take_numbers_as_text_and_kinds_in_any_spelling() {
        let c = config(
            r#"{"Kind": "OtlpGrpc", "Endpoint": "http://127.0.0.1:4317",
                "Interval": "00:00:05", "QueueSize": "3", "MaxQueueBytes": "1MiB",
                "Headers": {"X-Scope-OrgID": "team"}, "Compression": "none"}"#,
        );
        assert_eq!(c.kind, Kind::OtlpGrpc);
        assert_eq!(c.interval, Some(Duration::from_secs(5)));
        assert_eq!(c.queue_size, Some(3));
        assert_eq!(c.max_queue_bytes, Some(1 << 20));
        assert_eq!(c.compression, Compression::None);
        assert_eq!(
            "pyroscope_ingest".parse::<Kind>(),
            Ok(Kind::PyroscopeIngest)
        );
        let unknown: Result<ExporterConfig, _> =
            serde_json::from_str(r#"{"Kind": "zipkin", "Endpoint": "http://x"}"#);
        assert!(unknown.unwrap_err().to_string().contains("otlp-grpc"));
        let typo: Result<ExporterConfig, _> = serde_json::from_str(
            r#"{"Kind": "pyroscope", "Endpoint": "http://x", "Intervall": 5}"#,
        );
        assert!(typo.is_err());
    }

    #[tokio::test]
    async fn endpoints_and_headers_are_checked_up_front() {
        let bad = |json: &str| Client::new(&config(json)).unwrap_err().to_string();
        assert!(bad(r#"{"Kind": "otlp-http", "Endpoint": "collector:4318"}"#).contains("http://"));
        assert!(bad(
            r#"{"Kind": "otlp-http", "Endpoint": "http://x", "Tls": {"CaFile": "/ca.pem"}}"#
        )
        .contains("https://"));
        assert!(bad(
            r#"{"Kind": "pyroscope", "Endpoint": "http://x", "Headers": {"Bad Name": "v"}}"#
        )
        .contains("Bad Name"));
        assert!(bad(
            r#"{"Kind": "pyroscope", "Endpoint": "https://x", "Tls": {"CaFile": "/nonexistent.pem"}}"#
        )
        .contains("/nonexistent.pem"));
        let http = Client::new(&config(
            r#"{"Kind": "otlp-http", "Endpoint": "http://h:4318/"}"#,
        ))
        .unwrap();
        assert_eq!(http.otlp_http_path(), "/v1development/profiles");
        let custom = Client::new(&config(
            r#"{"Kind": "otlp-http", "Endpoint": "http://h:4318/custom/profiles"}"#,
        ))
        .unwrap();
        assert_eq!(custom.otlp_http_path(), "");
    }

    fn spans(ids: &[&str]) -> Vec<SpanExport> {
        use profile::span::{Span, SpanId, SpanKind, SpanRecord, SpanStatus, TraceId};
        let series: Arc<[(String, String)]> = Arc::from(vec![("process_id".into(), "7".into())]);
        ids.iter()
            .map(|id| SpanExport {
                series: series.clone(),
                span: Arc::new(SpanRecord {
                    span: Span {
                        trace_id: TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap(),
                        span_id: SpanId::from_hex(id).unwrap(),
                        name: "op".into(),
                    },
                    parent_span_id: None,
                    display_name: String::new(),
                    kind: SpanKind::Server,
                    start_unix_nanos: 1_000,
                    duration_nanos: 500,
                    status: SpanStatus::Unset,
                    status_description: String::new(),
                    trace_state: String::new(),
                    source_name: "s".into(),
                    source_version: String::new(),
                    tags: Vec::new(),
                    dropped_tags: 0,
                }),
            })
            .collect()
    }

    fn span_ids(request: &ExportTraceServiceRequest) -> Vec<String> {
        request
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
            .map(|s| s.span_id.iter().map(|b| format!("{b:02x}")).collect())
            .collect()
    }

    /// Two requests' spans in one, as the backend decodes it: over HTTP (gzipped per attempt,
    /// so the queued bodies concatenate) and gRPC; never profiles, never past the size cap.
    #[tokio::test]
    async fn requests_of_one_signal_merge_into_one_the_backend_decodes_whole() {
        let (a, b) = (
            spans(&["00000000000000a1"]),
            spans(&["00000000000000b2", "00000000000000b3"]),
        );
        for kind in ["otlp-http", "otlp-grpc"] {
            let client = Client::new(&config(&format!(
                r#"{{"Kind": "{kind}", "Endpoint": "http://127.0.0.1:4318"}}"#
            )))
            .unwrap();
            let (first, second) = (
                client.prepare_traces(&a).unwrap(),
                client.prepare_traces(&b).unwrap(),
            );
            let mut merged = first.clone();
            assert!(merged.merge(second.clone()).is_none());
            assert_eq!(
                (merged.values, merged.bytes),
                (3, first.bytes + second.bytes)
            );
            let decoded = match &merged.body {
                Body::Http { body, .. } => {
                    ExportTraceServiceRequest::decode(body.as_slice()).unwrap()
                }
                Body::GrpcTraces(request) => request.clone(),
                other => panic!("{kind}: {other:?}"),
            };
            assert_eq!(decoded.encoded_len(), merged.bytes, "{kind}");
            assert_eq!(
                span_ids(&decoded),
                ["00000000000000a1", "00000000000000b2", "00000000000000b3"],
                "{kind}"
            );
            let mut big = first.clone();
            big.bytes = MAX_MERGED_BYTES;
            assert!(big.merge(second.clone()).is_some(), "{kind}: past the cap");
        }
        let client = Client::new(&config(
            r#"{"Kind": "otlp-http", "Endpoint": "http://h:4318"}"#,
        ))
        .unwrap();
        let profiles = Prepared {
            body: Body::Http {
                url: "http://h:4318/v1development/profiles".into(),
                body: vec![1],
            },
            bytes: 1,
            signal: ExportSignal::Profiles,
            values: 1,
        };
        assert!(profiles.clone().merge(profiles.clone()).is_some());
        let traces = client.prepare_traces(&a).unwrap();
        assert!(traces.clone().merge(profiles).is_some(), "another signal");
    }

    #[test]
    fn uuids_have_the_version_4_shape() {
        let id = uuid_v4();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"));
        assert_ne!(id, uuid_v4());
    }
}
