//! A heap snapshot as a `.gcdump` file, written into any async writer.

use std::io::Write;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::ArtifactError;
use crate::client::DiagnosticsClient;
use crate::gcdump::{self, DumpInfo, HeapGraph, SnapshotOptions, SnapshotProgress};

/// How much of the file crosses from the encoding thread to the writer at a time, and how many
/// such pieces may wait: the encoder blocks beyond that, so a slow writer bounds the memory.
const PIECE: usize = 256 * 1024;
const PIECES_IN_FLIGHT: usize = 4;

/// A process's heap and the facts the `.gcdump` header records.
#[derive(Debug)]
pub struct HeapSnapshot {
    pub graph: HeapGraph,
    pub info: DumpInfo,
}

/// Induces a full blocking GC in the runtime behind `client` (the process is paused meanwhile)
/// and returns its heap; `pid` is the process as the caller knows it, recorded in the file.
pub async fn collect_gcdump(
    client: &DiagnosticsClient,
    pid: u32,
    options: SnapshotOptions,
    progress: impl FnMut(SnapshotProgress),
) -> Result<HeapSnapshot, ArtifactError> {
    let process = client
        .process_info()
        .await
        .map_err(ArtifactError::ProcessInfo)?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let graph = gcdump::snapshot(client, options, progress).await?;
    let info = DumpInfo {
        process_id: pid,
        process_name: process
            .managed_entrypoint_assembly_name
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| program_name(&process.command_line)),
        machine_name: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default(),
        collected_unix_nanos: i64::try_from(now.as_nanos()).unwrap_or(i64::MAX),
        creation_tool: format!("clrscope {}", env!("CARGO_PKG_VERSION")),
    };
    Ok(HeapSnapshot { graph, info })
}

/// The program's file name from a ProcessInfo command line (argv[0] first).
fn program_name(command_line: &str) -> String {
    let argv0 = command_line.split(' ').next().unwrap_or_default();
    argv0.rsplit('/').next().unwrap_or(argv0).to_string()
}

/// Writes `snapshot` as a `.gcdump` file into `out` (encoded on the blocking pool, streamed in
/// bounded pieces); returns the bytes written.
pub async fn write_gcdump_async<W: AsyncWrite + Unpin>(
    snapshot: Arc<HeapSnapshot>,
    out: &mut W,
) -> Result<u64, ArtifactError> {
    let (pieces, mut received) = mpsc::channel::<Vec<u8>>(PIECES_IN_FLIGHT);
    let encoder = tokio::task::spawn_blocking(move || {
        let mut sink = PieceWriter {
            pieces,
            piece: Vec::with_capacity(PIECE),
        };
        gcdump::write_gcdump(&snapshot.graph, &snapshot.info, &mut sink)?;
        sink.flush()
    });
    let mut bytes = 0u64;
    let mut write_error = None;
    while let Some(piece) = received.recv().await {
        if let Err(source) = out.write_all(&piece).await {
            write_error = Some(ArtifactError::Write { bytes, source });
            // Dropping the receiver makes the encoder fail at its next piece and end.
            break;
        }
        bytes += piece.len() as u64;
    }
    drop(received);
    let encoded = encoder.await;
    if let Some(error) = write_error {
        return Err(error);
    }
    match encoded {
        Ok(Ok(())) => {}
        Ok(Err(source)) => return Err(ArtifactError::Write { bytes, source }),
        Err(join) => std::panic::resume_unwind(join.into_panic()),
    }
    out.flush()
        .await
        .map_err(|source| ArtifactError::Write { bytes, source })?;
    Ok(bytes)
}

/// A blocking writer that hands full pieces to the async side.
struct PieceWriter {
    pieces: mpsc::Sender<Vec<u8>>,
    piece: Vec<u8>,
}

impl PieceWriter {
    fn send(&mut self) -> std::io::Result<()> {
        if self.piece.is_empty() {
            return Ok(());
        }
        let piece = std::mem::replace(&mut self.piece, Vec::with_capacity(PIECE));
        self.pieces.blocking_send(piece).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the artifact's writer has gone",
            )
        })
    }
}

impl Write for PieceWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len().min(PIECE - self.piece.len());
        self.piece.extend_from_slice(&buf[..n]);
        if self.piece.len() == PIECE {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}
