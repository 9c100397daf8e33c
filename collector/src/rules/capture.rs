//! The task behind `PreTriggerSeconds`: runs the ring's session (see [`super::ring`] for why a
//! session of its own), keeps its blocks in a [`TraceRing`], and on request writes a trace that
//! starts in the past, goes on live for the action's duration, and ends with the session's
//! rundown. After a capture (or when the ring's dictionary outgrows it) the session restarts,
//! with an empty ring.

use std::future::Future;
use std::io;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::ring::{RingError, RingLimits, TraceRing};
use crate::client::{DiagnosticsClient, EventPipeSession};
use crate::session::{self, SessionError};
use crate::signals::SignalShare;
use ipc::CollectTracing;
use nettrace::splice::{ObjectSplitter, ObjectWriter};
use nettrace::NettraceError;

/// Largest block accepted from the runtime (it writes ~100 KB blocks).
const MAX_BLOCK: usize = 16 << 20;
const CHUNK: usize = 64 * 1024;
/// How long the runtime may take to end a stopped session (the rundown of a large app).
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// A request to cut a trace from the ring.
pub struct CaptureRequest {
    /// The trace starts here (Unix nanoseconds): the trigger time minus `PreTriggerSeconds`.
    pub from_unix_nanos: i64,
    /// How long it goes on live after the request.
    pub duration: Duration,
    /// The file's bytes, in order; the channel closes when the file is complete (bounded: a
    /// slow receiver holds the session back, not memory).
    pub out: mpsc::Sender<Vec<u8>>,
    pub reply: oneshot::Sender<Result<CaptureSummary, CaptureError>>,
}

/// What a capture wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureSummary {
    pub bytes: u64,
    /// The start of its first event block: how far back it really reaches.
    pub first_event_unix_nanos: Option<i64>,
}

/// Why a capture failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    #[error("writing the trace: {0}")]
    Write(#[from] io::Error),
    #[error("the ring's session: {0}")]
    Session(#[from] SessionError),
    #[error("the ring's stream did not split into blocks: {0}")]
    Stream(#[from] NettraceError),
    #[error("the process ended before the capture")]
    ProcessEnded,
}

/// How long a ring waits before it starts again when the signal budget had no room for its
/// session's dictionary.
const OVER_BUDGET_PAUSE: Duration = Duration::from_secs(10);

/// Runs ring sessions with `config` until `stop` resolves, the requests channel closes, or the
/// process ends, serving capture requests one at a time; the rings are charged to `share`.
pub async fn run_ring(
    client: &DiagnosticsClient,
    config: CollectTracing,
    limits: RingLimits,
    share: &SignalShare,
    requests: &mut mpsc::Receiver<CaptureRequest>,
    stop: impl Future<Output = ()>,
) -> Result<(), CaptureError> {
    tokio::pin!(stop);
    let mut pause = None;
    loop {
        if let Some(pause) = pause.take() {
            tokio::select! {
                () = &mut stop => return Ok(()),
                () = tokio::time::sleep(pause) => {}
            }
        }
        let (session, _) = session::start(client, config.clone()).await?;
        let id = session.id;
        let mut reader = Reader::new(session);
        let mut ring = TraceRing::new(limits, share);
        loop {
            tokio::select! {
                biased;
                () = &mut stop => {
                    reader.stop(client, id, &mut |_| Ok(())).await?;
                    return Ok(());
                }
                request = requests.recv() => {
                    let Some(request) = request else {
                        reader.stop(client, id, &mut |_| Ok(())).await?;
                        return Ok(());
                    };
                    let result = capture(client, id, &mut reader, &ring, request.from_unix_nanos,
                        request.duration, request.out).await;
                    let ended = matches!(result, Err(CaptureError::ProcessEnded));
                    let _ = request.reply.send(result);
                    if ended {
                        return Ok(());
                    }
                    break;
                }
                more = reader.read() => {
                    if !more? {
                        return Ok(());
                    }
                    let mut full = false;
                    while let Some(object) = reader.splitter.next_object()? {
                        match ring.push(object) {
                            Ok(()) => {}
                            Err(e @ RingError::DictionaryFull { .. }) => {
                                tracing::info!(%e, "restarting the pre-trigger session");
                                full = true;
                                break;
                            }
                            Err(e @ RingError::OverBudget { .. }) => {
                                tracing::warn!(%e, pause_s = OVER_BUDGET_PAUSE.as_secs(), "restarting the pre-trigger session after a pause");
                                pause = Some(OVER_BUDGET_PAUSE);
                                full = true;
                                break;
                            }
                            Err(e) => return Err(CaptureError::Stream(NettraceError::malformed("ring", 0, e.to_string()))),
                        }
                    }
                    if full {
                        reader.stop(client, id, &mut |_| Ok(())).await?;
                        break;
                    }
                }
            }
        }
    }
}

/// A session's stream, split into objects as it arrives.
struct Reader {
    session: EventPipeSession,
    splitter: ObjectSplitter,
    buf: Vec<u8>,
}

impl Reader {
    fn new(session: EventPipeSession) -> Self {
        Reader {
            session,
            splitter: ObjectSplitter::new(MAX_BLOCK),
            buf: vec![0; CHUNK],
        }
    }

    /// Reads a chunk into the splitter; false at the end of the stream.
    async fn read(&mut self) -> Result<bool, CaptureError> {
        let n = self
            .session
            .stream
            .read(&mut self.buf)
            .await
            .map_err(|source| SessionError::Read { bytes: 0, source })?;
        self.splitter.feed(&self.buf[..n]);
        Ok(n > 0)
    }

    /// Stops the session and hands every remaining object (the rundown) to `each`.
    async fn stop(
        &mut self,
        client: &DiagnosticsClient,
        id: u64,
        each: &mut (dyn FnMut(nettrace::splice::RawObject) -> io::Result<()> + Send),
    ) -> Result<(), CaptureError> {
        let stop_command = async {
            client
                .stop_tracing(id, STOP_TIMEOUT)
                .await
                .map_err(SessionError::Stop)
        };
        let drain = async {
            while self.read().await? {
                while let Some(object) = self.splitter.next_object()? {
                    each(object)?;
                }
            }
            Ok::<_, CaptureError>(())
        };
        let both = async {
            let (stopped, drained) = tokio::join!(stop_command, drain);
            drained?;
            // The process may have ended meanwhile: a stop that finds no session is fine then.
            if let Err(e) = stopped {
                tracing::debug!(%e, "stopping the pre-trigger session");
            }
            Ok::<_, CaptureError>(())
        };
        tokio::time::timeout(STOP_TIMEOUT, both)
            .await
            .map_err(|_| SessionError::DrainTimeout(STOP_TIMEOUT))?
    }
}

/// Moves what the writer framed so far to `out`.
async fn flush(writer: &mut ObjectWriter<Vec<u8>>, out: &mpsc::Sender<Vec<u8>>) -> io::Result<()> {
    let bytes = std::mem::take(writer.get_mut());
    if bytes.is_empty() {
        return Ok(());
    }
    out.send(bytes)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the capture's receiver is gone"))
}

async fn capture(
    client: &DiagnosticsClient,
    id: u64,
    reader: &mut Reader,
    ring: &TraceRing,
    from: i64,
    duration: Duration,
    out: mpsc::Sender<Vec<u8>>,
) -> Result<CaptureSummary, CaptureError> {
    // Objects are framed into a buffer, which goes out after each read: at most the ring's
    // bytes (once) or one read's worth of blocks are held.
    let mut writer = ObjectWriter::new(Vec::new())?;
    let first_event_unix_nanos = ring.write_since(from, &mut writer)?;
    flush(&mut writer, &out).await?;
    let deadline = Instant::now() + duration;
    let mut ended = false;
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => break,
            more = reader.read() => {
                let more = more?;
                while let Some(object) = reader.splitter.next_object()? {
                    writer.write(&object)?;
                }
                flush(&mut writer, &out).await?;
                if !more {
                    ended = true;
                    break;
                }
            }
        }
    }
    if !ended {
        // The rundown is small next to the trace (a few MB for a large app): framed in memory.
        reader
            .stop(client, id, &mut |object| writer.write(&object))
            .await?;
    }
    let bytes = writer.bytes() + 1;
    let tail = writer.finish()?;
    if out.send(tail).await.is_err() {
        return Err(
            io::Error::new(io::ErrorKind::BrokenPipe, "the capture's receiver is gone").into(),
        );
    }
    if ended && first_event_unix_nanos.is_none() {
        return Err(CaptureError::ProcessEnded);
    }
    Ok(CaptureSummary {
        bytes,
        first_event_unix_nanos,
    })
}
