//! The accept loop of the API and metrics listeners: HTTP/1.1 (over TLS when configured) on a
//! TCP listener, guarded against clients that hold connections without sending requests.
//!
//! - At most [`ConnectionLimits::max_connections`] connections per listener. When a new one
//!   arrives at the cap, the connection that has waited longest without a request in flight is
//!   closed to make room (as nginx drains its idle keep-alive connections when it runs out), so
//!   a flood of idle or slow connections cannot lock out a client that sends its request at
//!   once; the new one waits until that one is closed, or, while every connection is answering
//!   a request, until one ends.
//! - Kestrel's two timeouts: a connection with nothing in flight and no bytes of a next request
//!   is closed after [`ConnectionLimits::keep_alive_timeout`]; once the first byte of a request
//!   (or of a TLS handshake) has come, its head must be complete within
//!   [`ConnectionLimits::request_headers_timeout`]. While a request is being answered there is
//!   no timeout: a dump may take minutes before its first byte. (hyper's own
//!   `header_read_timeout` starts when a connection goes idle, which would make one timeout of
//!   the two.)
//! - Accept errors (out of file descriptors) close the longest-idle connection and pause the
//!   loop briefly instead of spinning on an error the next `accept` would repeat.
//!
//! Every request first goes through [`crate::hosts`]: a `Host` the listener does not answer to
//! gets 400, a cross-site browser request 403.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::middleware::from_fn_with_state;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use settings::lenient;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tower_service::Service;

use crate::hosts::{check_request_site, AllowedHosts, SiteCheck};

/// Connections per listener unless configured (`Kestrel:Limits:MaxConcurrentConnections`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// How long a connection may wait for its next request unless configured
/// (`Kestrel:Limits:KeepAliveTimeout`; Kestrel's default).
pub const DEFAULT_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(130);

/// How long a request head (or TLS handshake) may take from its first byte unless configured
/// (`Kestrel:Limits:RequestHeadersTimeout`).
pub const DEFAULT_REQUEST_HEADERS_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the accept loop pauses after an accept error such as EMFILE.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// At most one warning about accept errors, or about evicting connections, this often.
const WARN_INTERVAL: Duration = Duration::from_secs(10);

/// How a listener bounds the connections clients hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open connections at most.
    pub max_connections: usize,
    /// A connection with no request in flight and no bytes of a next one is closed after this.
    pub keep_alive_timeout: Duration,
    /// A request head, or a TLS handshake, must be complete this long after its first byte.
    pub request_headers_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            keep_alive_timeout: DEFAULT_KEEP_ALIVE_TIMEOUT,
            request_headers_timeout: DEFAULT_REQUEST_HEADERS_TIMEOUT,
        }
    }
}

/// `Kestrel:Limits`, with Kestrel's key names, so a dotnet-monitor settings.json keeps them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct LimitsConfig {
    #[serde(default, deserialize_with = "lenient::opt_number")]
    pub max_concurrent_connections: Option<usize>,
    #[serde(default, deserialize_with = "lenient::opt_duration")]
    pub keep_alive_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "lenient::opt_duration")]
    pub request_headers_timeout: Option<Duration>,
}

/// How [`serve`] runs one listener.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    pub limits: ConnectionLimits,
    /// The `Host` names answered beyond the listener's own address and `localhost`.
    pub allowed_hosts: AllowedHosts,
    /// Serve HTTPS with this configuration.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// Serves `router` on `listener` as `options` say until `shutdown` completes, then stops
/// accepting connections and returns once the requests in flight are answered.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let local = listener.local_addr()?;
    let site = Arc::new(SiteCheck::new(local.ip(), options.allowed_hosts));
    let router = router.layer(from_fn_with_state(site, check_request_site));
    let limits = options.limits;
    let tls = options.tls.map(TlsAcceptor::from);
    tracing::info!(
        addr = %local,
        max_connections = limits.max_connections,
        "serving HTTP{}",
        if tls.is_some() { "S" } else { "" }
    );
    let open = Arc::new(OpenConnections::new(limits.max_connections));
    let (closing, closing_signal) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut shutdown = pin!(shutdown);
    let mut warned: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            // The client gave up before it was accepted: nothing to do.
            Err(error) if is_connection_error(&error) => continue,
            Err(error) => {
                let evicted = open.evict_longest_waiting();
                if warned.is_none_or(|at| at.elapsed() >= WARN_INTERVAL) {
                    warned = Some(Instant::now());
                    tracing::warn!(
                        %error,
                        %local,
                        evicted,
                        "accepting a connection failed (out of file descriptors?); \
                         closed the longest idle connection and pausing"
                    );
                }
                tokio::select! {
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                }
            }
        };
        let connection = loop {
            if let Some(connection) = open.admit() {
                break Some(connection);
            }
            // At the cap: this one waits until the connection told to close has closed, or, while
            // every connection is answering a request, until one ends or goes idle (more wait in
            // the kernel's backlog meanwhile).
            tokio::select! {
                () = &mut shutdown => break None,
                () = open.changed.notified() => {}
            }
        };
        let Some(connection) = connection else { break };
        tasks.spawn(serve_connection(
            tcp,
            peer,
            connection,
            router.clone(),
            tls.clone(),
            limits,
            closing_signal.clone(),
        ));
    }
    drop(listener);
    let _ = closing.send(true);
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// An accept error that concerns one connection, not the listener.
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// One connection from accept to close: the TLS handshake if any, then HTTP/1.1 until the
/// client closes, a timeout or eviction closes it, or the server shuts down.
async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    connection: Admitted,
    router: Router,
    tls: Option<TlsAcceptor>,
    limits: ConnectionLimits,
    closing: watch::Receiver<bool>,
) {
    let _ = tcp.set_nodelay(true);
    let state = Arc::clone(&connection.state);
    let io = Tracked {
        inner: tcp,
        state: Arc::clone(&state),
    };
    let mut expired = pin!(state.expired(limits));
    match tls {
        None => serve_http(io, router, &state, expired, closing).await,
        Some(acceptor) => {
            let handshake = tokio::select! {
                handshake = acceptor.accept(io) => handshake,
                () = expired.as_mut() => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
                () = closed(closing.clone()) => return,
            };
            match handshake {
                Ok(stream) => serve_http(stream, router, &state, expired, closing).await,
                Err(error) => tracing::debug!(%peer, %error, "TLS handshake failed"),
            }
        }
    }
    drop(connection);
}

async fn serve_http<I>(
    io: I,
    router: Router,
    state: &Arc<ConnectionState>,
    mut expired: Pin<&mut impl Future<Output = ()>>,
    closing: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service_state = Arc::clone(state);
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let in_flight = InFlight::begin(&service_state);
        let mut router = router.clone();
        async move {
            let Ok(response) = router.call(request.map(Body::new)).await;
            Ok::<_, Infallible>(response.map(|body| {
                Body::new(Answer {
                    body,
                    _in_flight: in_flight,
                })
            }))
        }
    });
    let mut http = pin!(
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(io), service)
    );
    let mut closing = pin!(closed(closing));
    let mut shutting_down = false;
    loop {
        tokio::select! {
            result = http.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%error, "an HTTP connection ended with an error");
                }
                return;
            }
            // Dropping the connection closes it.
            () = expired.as_mut() => return,
            () = closing.as_mut(), if !shutting_down => {
                // Nothing in flight: close now (hyper would wait for a head being received).
                if state.waiting_since().is_some() {
                    return;
                }
                shutting_down = true;
                http.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Completes once the server is closing.
async fn closed(mut closing: watch::Receiver<bool>) {
    let _ = closing.wait_for(|closing| *closing).await;
}

/// What a connection is doing, for its timeouts and for eviction.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// No request in flight since `since` (accepted, or the last answer ended); `first_byte`
    /// once the next request (or the TLS handshake) has begun to arrive.
    Waiting {
        since: Instant,
        first_byte: Option<Instant>,
    },
    /// Requests being answered (at most one with HTTP/1.1, but counted all the same).
    Busy { requests: usize },
}

/// One connection's [`Phase`], shared by its IO (bytes read), its requests (begin and end), its
/// watchdog ([`ConnectionState::expired`]) and [`OpenConnections`] (eviction).
#[derive(Debug)]
struct ConnectionState {
    phase: Mutex<Phase>,
    evicted: AtomicBool,
    /// Wakes the watchdog: the phase or eviction changed.
    wake: Notify,
    /// [`OpenConnections::changed`]: a connection went idle, so a waiting one may get a slot.
    went_idle: Arc<Notify>,
}

impl ConnectionState {
    fn phase(&self) -> MutexGuard<'_, Phase> {
        // A panic elsewhere cannot leave a Phase half-written: it is Copy, assigned whole.
        self.phase.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn waiting_since(&self) -> Option<Instant> {
        match *self.phase() {
            Phase::Waiting { since, .. } => Some(since),
            Phase::Busy { .. } => None,
        }
    }

    fn bytes_arrived(&self) {
        let mut phase = self.phase();
        if let Phase::Waiting {
            first_byte: first_byte @ None,
            ..
        } = &mut *phase
        {
            *first_byte = Some(Instant::now());
            drop(phase);
            self.wake.notify_one();
        }
    }

    fn is_evicted(&self) -> bool {
        self.evicted.load(Ordering::Acquire)
    }

    fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// Completes when the connection must close: evicted, or past the deadline of its phase.
    async fn expired(&self, limits: ConnectionLimits) {
        loop {
            if self.is_evicted() {
                return;
            }
            let deadline = match *self.phase() {
                Phase::Busy { .. } => None,
                Phase::Waiting {
                    first_byte: Some(first_byte),
                    ..
                } => Some(first_byte + limits.request_headers_timeout),
                Phase::Waiting {
                    since,
                    first_byte: None,
                } => Some(since + limits.keep_alive_timeout),
            };
            match deadline {
                Some(deadline) if Instant::now() >= deadline => return,
                Some(deadline) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(deadline) => {}
                        () = self.wake.notified() => {}
                    }
                }
                None => self.wake.notified().await,
            }
        }
    }
}

/// A request being answered, from its head until its answer's body is dropped (sent, or the
/// connection gone).
struct InFlight(Arc<ConnectionState>);

impl InFlight {
    fn begin(state: &Arc<ConnectionState>) -> InFlight {
        let mut phase = state.phase();
        *phase = match *phase {
            Phase::Waiting { .. } => Phase::Busy { requests: 1 },
            Phase::Busy { requests } => Phase::Busy {
                requests: requests + 1,
            },
        };
        InFlight(Arc::clone(state))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let state = &self.0;
        let mut phase = state.phase();
        *phase = match *phase {
            Phase::Busy { requests } if requests > 1 => Phase::Busy {
                requests: requests - 1,
            },
            _ => Phase::Waiting {
                since: Instant::now(),
                first_byte: None,
            },
        };
        drop(phase);
        state.wake.notify_one();
        state.went_idle.notify_one();
    }
}

/// An answer's body, holding its request [`InFlight`] until hyper drops it.
struct Answer {
    body: Body,
    /// Held for its drop.
    _in_flight: InFlight,
}

impl http_body::Body for Answer {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A connection's byte stream, telling its [`ConnectionState`] when bytes arrive.
struct Tracked {
    inner: TcpStream,
    state: Arc<ConnectionState>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.state.bytes_arrived();
        }
        result
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A listener's open connections, by id.
#[derive(Debug)]
struct OpenConnections {
    max: usize,
    inner: Mutex<Slots>,
    /// A connection closed or went idle.
    changed: Arc<Notify>,
}

#[derive(Debug, Default)]
struct Slots {
    next_id: u64,
    open: HashMap<u64, Arc<ConnectionState>>,
    /// When a warning about evicting connections was last logged.
    warned: Option<Instant>,
}

/// A connection's slot in [`OpenConnections`], given back on drop.
struct Admitted {
    id: u64,
    state: Arc<ConnectionState>,
    open: Arc<OpenConnections>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.open.slots().open.remove(&self.id);
        self.open.changed.notify_one();
    }
}

impl OpenConnections {
    fn new(max: usize) -> OpenConnections {
        OpenConnections {
            max: max.max(1),
            inner: Mutex::default(),
            changed: Arc::new(Notify::new()),
        }
    }

    fn slots(&self) -> MutexGuard<'_, Slots> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a new connection, if one is free. At the cap, the connection that has waited
    /// longest without a request in flight is told to close, and none is given: its slot frees
    /// when its task has closed it ([`OpenConnections::changed`] says so), so a listener never
    /// holds more descriptors than its cap, even while thousands of connections churn.
    fn admit(self: &Arc<Self>) -> Option<Admitted> {
        let mut slots = self.slots();
        if slots.open.len() >= self.max {
            let closing = slots.open.values().any(|state| state.is_evicted());
            if !closing
                && slots.evict_longest_waiting()
                && slots.warned.is_none_or(|at| at.elapsed() >= WARN_INTERVAL)
            {
                slots.warned = Some(Instant::now());
                tracing::warn!(
                    max_connections = self.max,
                    "a listener is at its connection cap: closing the connections that wait \
                     longest without a request to admit new ones (Kestrel:Limits:\
                     MaxConcurrentConnections, --max-connections)"
                );
            }
            return None;
        }
        let id = slots.next_id;
        slots.next_id += 1;
        let state = Arc::new(ConnectionState {
            phase: Mutex::new(Phase::Waiting {
                since: Instant::now(),
                first_byte: None,
            }),
            evicted: AtomicBool::new(false),
            wake: Notify::new(),
            went_idle: Arc::clone(&self.changed),
        });
        slots.open.insert(id, Arc::clone(&state));
        Some(Admitted {
            id,
            state,
            open: Arc::clone(self),
        })
    }

    /// Closes the connection that has waited longest without a request, if any; whether one was.
    fn evict_longest_waiting(&self) -> bool {
        self.slots().evict_longest_waiting()
    }
}

impl Slots {
    /// Tells the connection that has waited longest without a request to close (it stays
    /// counted until it has); whether there was one.
    fn evict_longest_waiting(&mut self) -> bool {
        let longest = self
            .open
            .values()
            .filter(|state| !state.is_evicted())
            .filter_map(|state| state.waiting_since().map(|since| (since, state)))
            .min_by_key(|(since, _)| *since);
        match longest {
            Some((_, state)) => {
                state.evict();
                true
            }
            None => false,
        }
    }
}
