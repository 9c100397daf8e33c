//! Running one EventPipe session to its end: start, copy the stream, stop, drain the rundown;
//! [`ParsingWriter`], which parses a stream while it is being copied; and [`rundown`], a session
//! that only lists the code a process has loaded, which is how every live profiler (the
//! `record` and `top` commands, the agent) names code loaded before it attached.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::client::{ClientError, DiagnosticsClient};
use crate::providers::{level, RUNTIME};
use crate::timer_grid;
use ipc::{CollectTracing, CollectTracingVersion, ProviderConfig};
use nettrace::{Event, NettraceError, Parser, ParserOptions};

/// The most of a stream read at a time ...
const CHUNK: usize = 64 * 1024;
/// ... and the least (see [`ReadBuffer`]).
const FIRST_CHUNK: usize = 4 * 1024;
/// How long a rundown-only session may take to list a process's code.
const RUNDOWN_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a session run failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    #[error("starting the session: {0}")]
    Start(#[source] ClientError),
    #[error("reading the trace stream after {bytes} bytes: {source}")]
    Read {
        bytes: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("writing the trace after {bytes} bytes: {source}")]
    Write {
        bytes: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("stopping the session: {0}")]
    Stop(#[source] ClientError),
    /// The stream went past the parser's limits (see [`ParsingWriter`]); the session was ended.
    #[error("the trace stream was ended after {bytes} bytes: {source}")]
    OverLimit {
        bytes: u64,
        #[source]
        source: NettraceError,
    },
    #[error(
        "the runtime did not end the stream within {0:?} of StopTracing; the file ends without \
         the rundown (try again with a longer --stop-timeout)"
    )]
    DrainTimeout(Duration),
}

/// Why a [`rundown`] did not name the code already loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RundownError {
    #[error("naming the code already loaded in pid {pid} (rundown)")]
    Session {
        pid: u32,
        #[source]
        source: SessionError,
    },
    #[error("the rundown of pid {pid} did not parse: {reason}")]
    Parse { pid: u32, reason: String },
}

/// Why the stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// We stopped it (duration reached, Ctrl-C, a stopping event) and the runtime closed the
    /// stream after its rundown.
    Stopped,
    /// The runtime closed the stream on its own: the process exited or the session was stopped
    /// by someone else.
    EndedByRuntime,
}

/// Where a session run stands, for progress displays.
#[derive(Debug, Clone, Copy)]
pub struct SessionProgress {
    /// The runtime's id of the session (what StopTracing takes).
    pub session_id: u64,
    /// The command the runtime took it with (see [`start`]).
    pub version: CollectTracingVersion,
    pub bytes: u64,
    pub elapsed: Duration,
    /// StopTracing was sent; what arrives now is the tail and rundown.
    pub stopping: bool,
}

/// What a finished run did.
#[derive(Debug, Clone, Copy)]
pub struct SessionSummary {
    pub session_id: u64,
    pub version: CollectTracingVersion,
    pub bytes: u64,
    pub elapsed: Duration,
    pub end: SessionEnd,
}

/// Starts a session, asking with the lowest command version its options need; a runtime too old
/// for that version (no per-session stack walks before .NET 9, no custom rundown keyword) gets
/// CollectTracing2 with stack walks and the default rundown instead, so a trace is still taken.
/// What the runtime does not know is learnt once per process (the client remembers it) and
/// logged at debug: later sessions of that process ask CollectTracing2 at once.
pub async fn start(
    client: &DiagnosticsClient,
    config: CollectTracing,
) -> Result<(crate::client::EventPipeSession, CollectTracingVersion), SessionError> {
    let config = config.with_lowest_version();
    let version = config.version;
    if version > CollectTracingVersion::V2 && !client.collect_tracing_unknown(version) {
        match client.start_tracing(config.clone()).await {
            Ok(session) => return Ok((session, version)),
            Err(e) if e.is_unknown_command() => {
                if client.learn_collect_tracing_unknown(version) {
                    tracing::debug!(
                        asked = version.name(),
                        stackwalk = config.request_stackwalk,
                        rundown_keyword = config.rundown_keyword,
                        "the runtime does not know this CollectTracing version; its sessions ask \
                         CollectTracing2 (stack walks on, default rundown) from now on"
                    );
                }
            }
            Err(e) => return Err(SessionError::Start(e)),
        }
    }
    let config = fallback(config);
    let version = config.version;
    let session = client
        .start_tracing(config)
        .await
        .map_err(SessionError::Start)?;
    Ok((session, version))
}

/// What a runtime that knows only CollectTracing2 is asked for `config` (unchanged if it needs
/// no more).
fn fallback(config: CollectTracing) -> CollectTracing {
    if config.version <= CollectTracingVersion::V2 {
        return config;
    }
    let rundown = config.rundown_keyword != 0;
    let mut fallback = config.with_rundown(rundown).with_stackwalk(true);
    fallback.version = CollectTracingVersion::V2;
    fallback
}

/// Runs a session: copies its stream byte for byte into `out` until `stop` resolves, then stops
/// it on a new connection and copies the rest (the rundown) until the runtime ends the stream or
/// `stop_timeout` passes. `progress` is called once the runtime has enabled the session (0
/// bytes), then after every chunk. The stream is read as it arrives ([`Reading::AsItComes`]).
pub async fn run<W: AsyncWrite + Unpin>(
    client: &DiagnosticsClient,
    config: CollectTracing,
    out: &mut W,
    stop: impl Future<Output = ()>,
    stop_timeout: Duration,
    progress: impl FnMut(SessionProgress),
) -> Result<SessionSummary, SessionError> {
    let reading = Reading::AsItComes;
    run_reading(client, config, out, stop, stop_timeout, progress, reading).await
}

/// When a session's stream is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reading {
    /// As it arrives, so that the writer has it at once.
    AsItComes,
    /// At the instants of the [`timer_grid`], for a long-lived session. The runtime flushes every
    /// 100 ms a session has events, and a node agent's long-lived sessions woke it about as often
    /// as everything else together. Parked on the grid, they are read together, when the
    /// sampling loops' timers wake the agent anyway; what arrives in between waits in the
    /// socket, or in the session's buffers in the runtime once the socket is full. A read that
    /// brings a burst (a process starting, a rundown) is followed by the next at once.
    OnTimerGrid,
    /// Once `stop` resolved, when the runtime has stopped the session: for a short session (a
    /// sampling window). Every flush would wake the agent to read it: ten times a window, a
    /// hundred times a second on a node of 110 processes. Until then the stream is out of the
    /// reactor, and what the socket cannot hold waits in the session's buffers in the runtime.
    AtStop,
}

/// The most read from a parked stream at one step of the timer grid: past it, the stream is
/// read again as soon as other tasks had their turn.
const GRID_READ_BURST: usize = 1024 * 1024;

/// Runs a session as [`run`] does, its stream read as `reading` says.
pub async fn run_reading<W: AsyncWrite + Unpin>(
    client: &DiagnosticsClient,
    config: CollectTracing,
    out: &mut W,
    stop: impl Future<Output = ()>,
    stop_timeout: Duration,
    progress: impl FnMut(SessionProgress),
    reading: Reading,
) -> Result<SessionSummary, SessionError> {
    let started = Instant::now();
    let (session, version) = start(client, config).await?;
    let session = Started {
        session,
        version,
        started,
    };
    read_started(client, session, out, stop, stop_timeout, progress, reading).await
}

/// A session the runtime has enabled, not read yet.
pub struct Started {
    session: crate::client::EventPipeSession,
    version: CollectTracingVersion,
    /// When it was asked for.
    started: Instant,
}

/// Stops the session `running` and starts one for `config` back to back
/// ([`DiagnosticsClient::stop_then_start_tracing`]): what the old one's stop turns off (a logging
/// provider's loggers) the new one's start turns on again at once. `running`'s stream must be
/// read meanwhile; it ends once the runtime stopped it. A runtime that does not know `config`'s
/// command version is asked again as [`start`] does.
pub async fn stop_then_start(
    client: &DiagnosticsClient,
    running: u64,
    stop_timeout: Duration,
    config: CollectTracing,
) -> (Result<(), SessionError>, Result<Started, SessionError>) {
    let started = Instant::now();
    let mut config = config.with_lowest_version();
    if client.collect_tracing_unknown(config.version) {
        config = fallback(config);
    }
    let version = config.version;
    let (stopped, session) = client
        .stop_then_start_tracing(running, stop_timeout, config.clone())
        .await;
    let stopped = stopped.map_err(SessionError::Stop);
    let session = match session {
        Ok(session) => Ok((session, version)),
        Err(e) if e.is_unknown_command() && version > CollectTracingVersion::V2 => {
            start(client, config).await
        }
        Err(e) => Err(SessionError::Start(e)),
    };
    let session = session.map(|(session, version)| Started {
        session,
        version,
        started,
    });
    (stopped, session)
}

/// Reads a session [`stop_then_start`] started, as [`run_reading`] reads the one it starts.
pub async fn read_started<W: AsyncWrite + Unpin>(
    client: &DiagnosticsClient,
    session: Started,
    out: &mut W,
    stop: impl Future<Output = ()>,
    stop_timeout: Duration,
    progress: impl FnMut(SessionProgress),
    reading: Reading,
) -> Result<SessionSummary, SessionError> {
    let Started {
        session,
        version,
        started,
    } = session;
    let session_id = session.id;
    let mut stream = session.stream;
    let mut copier = Copier {
        out,
        buf: ReadBuffer::new(),
        bytes: 0,
        session_id,
        version,
        started,
        progress,
    };
    tokio::pin!(stop);
    // Enabled: the runtime records the session's events from now on (a runtime suspended at
    // startup writes its stream only once resumed).
    copier.report(false);

    let until = match reading {
        Reading::AtStop => {
            let parked = copier.out_of_reactor(stream)?;
            (&mut stop).await;
            stream = copier.back_in_reactor(parked)?;
            Until::Stopped
        }
        Reading::OnTimerGrid => {
            let parked = copier.out_of_reactor(stream)?;
            match timer_grid::park(&parked) {
                Ok(parking) => {
                    let until = copier
                        .read_on_grid(&parked, &parking, stop.as_mut())
                        .await?;
                    drop(parking);
                    stream = copier.back_in_reactor(parked)?;
                    until
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot park a session's stream on the timer grid; it is read as it arrives");
                    stream = copier.back_in_reactor(parked)?;
                    copier.read_as_it_comes(&mut stream, stop.as_mut()).await?
                }
            }
        }
        Reading::AsItComes => copier.read_as_it_comes(&mut stream, stop.as_mut()).await?,
    };
    if until == Until::Ended {
        return copier.finish(version, SessionEnd::EndedByRuntime).await;
    }

    // The runtime writes the rundown into the stream before it answers StopTracing, so the
    // stream must be drained while the stop command waits for its reply, as long as the stop
    // may take: listing a big process's code on a loaded machine takes longer than a command.
    let stop_command = async {
        client
            .stop_tracing(session_id, stop_timeout)
            .await
            .map_err(SessionError::Stop)
    };
    let stopped = async { tokio::try_join!(stop_command, copier.drain(&mut stream)) };
    tokio::time::timeout(stop_timeout, stopped)
        .await
        .map_err(|_| SessionError::DrainTimeout(stop_timeout))??;
    copier.finish(version, SessionEnd::Stopped).await
}

/// How reading a session's stream until its stop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Until {
    /// `stop` resolved: the session is to be stopped.
    Stopped,
    /// The runtime ended the stream.
    Ended,
}

/// Why a read of a parked stream stopped.
enum ParkedRead {
    /// Nothing more to read now.
    WouldBlock,
    /// [`GRID_READ_BURST`] read: more may be waiting.
    Burst,
    /// The runtime ended the stream.
    Ended,
}

/// Copies one session's stream into `out`, counting its bytes and reporting its progress.
struct Copier<'a, W, P> {
    out: &'a mut W,
    buf: ReadBuffer,
    /// Bytes copied so far.
    bytes: u64,
    session_id: u64,
    version: CollectTracingVersion,
    started: Instant,
    progress: P,
}

impl<W: AsyncWrite + Unpin, P: FnMut(SessionProgress)> Copier<'_, W, P> {
    fn report(&mut self, stopping: bool) {
        (self.progress)(SessionProgress {
            session_id: self.session_id,
            version: self.version,
            bytes: self.bytes,
            elapsed: self.started.elapsed(),
            stopping,
        });
    }

    /// Copies the `n` bytes a read just brought into the buffer.
    async fn take(&mut self, n: usize, stopping: bool) -> Result<(), SessionError> {
        write(self.out, self.buf.filled(n), &mut self.bytes).await?;
        self.report(stopping);
        Ok(())
    }

    fn read_error(&self, source: std::io::Error) -> SessionError {
        SessionError::Read {
            bytes: self.bytes,
            source,
        }
    }

    /// Takes the stream out of tokio's reactor: nothing wakes the agent for it meanwhile.
    fn out_of_reactor(
        &self,
        stream: tokio::net::UnixStream,
    ) -> Result<std::os::unix::net::UnixStream, SessionError> {
        stream.into_std().map_err(|source| self.read_error(source))
    }

    fn back_in_reactor(
        &self,
        parked: std::os::unix::net::UnixStream,
    ) -> Result<tokio::net::UnixStream, SessionError> {
        tokio::net::UnixStream::from_std(parked).map_err(|source| self.read_error(source))
    }

    /// Reads as the stream arrives until `stop` resolves or the stream ends. Only the read races
    /// the stop signal: a read is cancel-safe, a half-done write is not.
    async fn read_as_it_comes(
        &mut self,
        stream: &mut tokio::net::UnixStream,
        mut stop: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Until, SessionError> {
        loop {
            let n = tokio::select! {
                biased;
                () = &mut stop => return Ok(Until::Stopped),
                read = stream.read(self.buf.space()) => read.map_err(|source| self.read_error(source))?,
            };
            if n == 0 {
                return Ok(Until::Ended);
            }
            self.take(n, false).await?;
        }
    }

    /// Reads the `parked` stream whenever the timer grid's thread says it is readable, until
    /// `stop` resolves or the stream ends.
    async fn read_on_grid(
        &mut self,
        parked: &std::os::unix::net::UnixStream,
        parking: &timer_grid::Parked,
        mut stop: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Until, SessionError> {
        let mut burst = false;
        loop {
            tokio::select! {
                biased;
                () = &mut stop => return Ok(Until::Stopped),
                () = async {
                    if burst {
                        tokio::task::yield_now().await;
                    } else {
                        parking.readable().await;
                    }
                } => {}
            }
            burst = match self.read_parked(parked).await? {
                ParkedRead::WouldBlock => false,
                ParkedRead::Burst => true,
                ParkedRead::Ended => return Ok(Until::Ended),
            };
        }
    }

    /// Reads a parked stream until the socket would block (readiness is reported again only
    /// once more arrives, and the stream's end may come with its last chunk), the stream ends,
    /// or a burst's worth was read.
    async fn read_parked(
        &mut self,
        parked: &std::os::unix::net::UnixStream,
    ) -> Result<ParkedRead, SessionError> {
        let mut taken = 0;
        while taken < GRID_READ_BURST {
            let n = match std::io::Read::read(&mut &*parked, self.buf.space()) {
                Ok(0) => return Ok(ParkedRead::Ended),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    return Ok(ParkedRead::WouldBlock)
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(source) => return Err(self.read_error(source)),
            };
            self.take(n, false).await?;
            taken += n;
        }
        Ok(ParkedRead::Burst)
    }

    /// Reads the stream of a stopping session to its end.
    async fn drain(&mut self, stream: &mut tokio::net::UnixStream) -> Result<(), SessionError> {
        loop {
            let n = stream
                .read(self.buf.space())
                .await
                .map_err(|source| self.read_error(source))?;
            if n == 0 {
                return Ok(());
            }
            self.take(n, true).await?;
        }
    }

    async fn finish(
        self,
        version: CollectTracingVersion,
        end: SessionEnd,
    ) -> Result<SessionSummary, SessionError> {
        let bytes = self.bytes;
        self.out
            .flush()
            .await
            .map_err(|source| SessionError::Write { bytes, source })?;
        Ok(SessionSummary {
            session_id: self.session_id,
            version,
            bytes,
            elapsed: self.started.elapsed(),
            end,
        })
    }
}

/// The buffer a stream is read into: [`FIRST_CHUNK`] while reads bring little (a long-lived
/// session of a quiet process gets a few events at a time, and a node agent holds one buffer
/// per session), doubled up to [`CHUNK`] whenever a read fills it, and halved again after
/// [`SHRINK_AFTER`] reads in a row used a quarter of it at most (a burst at startup or a
/// rundown is over).
struct ReadBuffer {
    bytes: Vec<u8>,
    small_reads: u32,
}

/// Reads in a row that used at most a quarter of the buffer before it is halved.
const SHRINK_AFTER: u32 = 16;

impl ReadBuffer {
    fn new() -> ReadBuffer {
        ReadBuffer {
            bytes: vec![0; FIRST_CHUNK],
            small_reads: 0,
        }
    }

    /// Where the next read goes.
    fn space(&mut self) -> &mut [u8] {
        &mut self.bytes
    }

    /// The `n` bytes a read just brought; the buffer is resized for the next read when they
    /// filled it, or after a run of small reads.
    fn filled(&mut self, n: usize) -> &[u8] {
        let size = self.bytes.len();
        let resize = if n == size && n < CHUNK {
            Some((2 * n).min(CHUNK))
        } else if n <= size / 4 && size > FIRST_CHUNK {
            self.small_reads += 1;
            (self.small_reads >= SHRINK_AFTER).then_some(size / 2)
        } else {
            self.small_reads = 0;
            None
        };
        if let Some(size) = resize {
            let read = std::mem::replace(&mut self.bytes, vec![0; size]);
            self.bytes[..n].copy_from_slice(&read[..n]);
            self.small_reads = 0;
        }
        &self.bytes[..n]
    }
}

async fn write<W: AsyncWrite + Unpin>(
    out: &mut W,
    chunk: &[u8],
    bytes: &mut u64,
) -> Result<(), SessionError> {
    out.write_all(chunk)
        .await
        .map_err(|source| write_error(*bytes, source))?;
    *bytes += chunk.len() as u64;
    Ok(())
}

/// A failed write as the session reports it: the parse error a [`ParsingWriter`] ended the
/// stream with, or the writer's own failure.
fn write_error(bytes: u64, source: std::io::Error) -> SessionError {
    if !source
        .get_ref()
        .is_some_and(|inner| inner.is::<NettraceError>())
    {
        return SessionError::Write { bytes, source };
    }
    let kind = source.kind();
    match source
        .into_inner()
        .map(|inner| inner.downcast::<NettraceError>())
    {
        Some(Ok(parse)) => SessionError::OverLimit {
            bytes,
            source: *parse,
        },
        Some(Err(other)) => SessionError::Write {
            bytes,
            source: std::io::Error::new(kind, other),
        },
        None => SessionError::Write {
            bytes,
            source: kind.into(),
        },
    }
}

/// Runs a rundown-only session of process `pid` into `observer`, parsed within `parser`'s
/// limits: the runtime lists every method and module it has loaded (ReadyToRun methods once
/// their entry point is bound).
pub async fn rundown(
    client: &DiagnosticsClient,
    pid: u32,
    observer: impl EventObserver + Unpin,
    parser: &ParserOptions,
) -> Result<(), RundownError> {
    // A session needs a provider; the runtime's with no keywords adds nothing but the rundown.
    let rundown_only =
        CollectTracing::v2(vec![ProviderConfig::new(RUNTIME, 0, level::INFORMATIONAL)])
            .with_rundown(true);
    let mut sink = ParsingWriter::with_options(tokio::io::sink(), observer, parser.clone());
    run(
        client,
        rundown_only,
        &mut sink,
        std::future::ready(()),
        RUNDOWN_TIMEOUT,
        |_| {},
    )
    .await
    .map_err(|source| RundownError::Session { pid, source })?;
    match sink.error() {
        Some(error) => Err(RundownError::Parse {
            pid,
            reason: error.to_string(),
        }),
        None => Ok(()),
    }
}

/// Receives each event of a stream as it is parsed.
pub trait EventObserver {
    fn on_event(&mut self, event: &Event<'_>);

    /// The runtime dropped `count` events (its buffers were full) before the event last handed
    /// to [`on_event`](EventObserver::on_event), or before a sequence point: what the stream's
    /// sequence numbers reveal.
    fn on_dropped(&mut self, _count: u64) {}
}

impl<O: EventObserver + ?Sized> EventObserver for &mut O {
    fn on_event(&mut self, event: &Event<'_>) {
        (**self).on_event(event);
    }

    fn on_dropped(&mut self, count: u64) {
        (**self).on_dropped(count);
    }
}

/// Passes a session's stream through to `inner` unchanged and parses it on the way, handing each
/// event to an observer. A stream that stops parsing still reaches `inner` byte for byte; the
/// first parse error is kept for the caller to report. A stream that goes past the parser's
/// limits ([`NettraceError::is_over_limit`]) is hostile or broken: the next write fails with that
/// error, so [`run`] ends the session with [`SessionError::OverLimit`]; so does any parse error
/// with [`ParsingWriter::ending_on_error`].
pub struct ParsingWriter<W, O> {
    inner: W,
    parser: Parser,
    observer: O,
    error: Option<NettraceError>,
    end_on_error: bool,
    /// Dropped events already reported to the observer.
    dropped: u64,
}

impl<W, O: EventObserver> ParsingWriter<W, O> {
    /// A writer whose parser has the default limits.
    pub fn new(inner: W, observer: O) -> Self {
        Self::with_options(inner, observer, ParserOptions::default())
    }

    /// A writer whose parser has the given limits.
    pub fn with_options(inner: W, observer: O, options: ParserOptions) -> Self {
        ParsingWriter {
            inner,
            parser: Parser::with_options(options),
            observer,
            error: None,
            end_on_error: false,
            dropped: 0,
        }
    }

    /// Ends the session at the first parse error of any kind (the next write fails with it), for
    /// a consumer that would rather start a new session than go on without the events.
    pub fn ending_on_error(mut self) -> Self {
        self.end_on_error = true;
        self
    }

    pub fn parser(&self) -> &Parser {
        &self.parser
    }

    /// The first error that stopped parsing, if any.
    pub fn error(&self) -> Option<&NettraceError> {
        self.error.as_ref()
    }

    pub fn into_parts(self) -> (W, O) {
        (self.inner, self.observer)
    }

    fn observe(&mut self, bytes: &[u8]) {
        if self.error.is_some() {
            return;
        }
        if let Err(e) = self.parser.feed(bytes) {
            self.error = Some(e);
            return;
        }
        loop {
            match self.parser.next_event() {
                Ok(Some(event)) => self.observer.on_event(&event),
                Ok(None) => break,
                Err(e) => {
                    self.error = Some(e);
                    break;
                }
            }
            self.report_drops();
        }
        self.report_drops();
    }

    fn report_drops(&mut self) {
        let dropped = self.parser.dropped_events();
        if dropped > self.dropped {
            self.observer.on_dropped(dropped - self.dropped);
            self.dropped = dropped;
        }
    }
}

impl<W: AsyncWrite + Unpin, O: EventObserver + Unpin> AsyncWrite for ParsingWriter<W, O> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let end_on_error = self.end_on_error;
        if let Some(e) = self.error.take_if(|e| end_on_error || e.is_over_limit()) {
            // Handed to the session, which ends with it (`write_error`).
            let e = std::io::Error::new(std::io::ErrorKind::InvalidData, e);
            return Poll::Ready(Err(e));
        }
        let written = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            self.observe(&buf[..n]);
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_buffer_grows_when_reads_fill_it_and_shrinks_after_a_burst() {
        let mut buf = ReadBuffer::new();
        assert_eq!(buf.space().len(), FIRST_CHUNK);
        buf.space()[..3].copy_from_slice(b"abc");
        assert_eq!(buf.filled(3), b"abc");
        assert_eq!(buf.space().len(), FIRST_CHUNK);
        let mut size = FIRST_CHUNK;
        while size < CHUNK {
            buf.space().fill(7);
            // What was read stays readable while the buffer grows.
            assert!(buf.filled(size).iter().all(|&b| b == 7));
            assert_eq!(buf.filled(size).len(), size);
            size *= 2;
            assert_eq!(buf.space().len(), size);
        }
        buf.filled(CHUNK);
        assert_eq!(buf.space().len(), CHUNK);
        // Small reads after the burst: the buffer halves after enough of them in a row, keeping
        // what the last read brought.
        for _ in 0..SHRINK_AFTER - 1 {
            buf.filled(100);
        }
        buf.filled(CHUNK / 2);
        for _ in 0..SHRINK_AFTER - 1 {
            buf.filled(100);
        }
        assert_eq!(
            buf.space().len(),
            CHUNK,
            "a larger read in between starts the count again"
        );
        buf.space()[..3].copy_from_slice(b"xyz");
        assert_eq!(buf.filled(3), b"xyz");
        assert_eq!(buf.space().len(), CHUNK / 2);
        for _ in 0..10 * SHRINK_AFTER {
            buf.filled(1);
        }
        assert_eq!(buf.space().len(), FIRST_CHUNK, "never below the first size");
    }

    /// What a session's consumer hears of the stream's sequence-number gaps.
    #[tokio::test]
    async fn a_parsing_writer_reports_the_drops_it_reads() {
        use tokio::io::AsyncWriteExt;

        #[derive(Default)]
        struct Drops {
            events: usize,
            dropped: u64,
        }
        impl crate::session::EventObserver for Drops {
            fn on_event(&mut self, _: &Event<'_>) {
                self.events += 1;
            }
            fn on_dropped(&mut self, count: u64) {
                self.dropped += count;
            }
        }
        let data = nettrace::testutil::builder_stream(true);
        let mut writer = crate::session::ParsingWriter::new(tokio::io::sink(), Drops::default());
        // In small chunks, as a socket delivers it.
        for chunk in data.chunks(7) {
            writer.write_all(chunk).await.unwrap();
        }
        assert!(writer.error().is_none(), "{:?}", writer.error());
        let (_, drops) = writer.into_parts();
        assert_eq!((drops.events, drops.dropped), (6, 5));
    }
}
