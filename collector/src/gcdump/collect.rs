//! Taking a heap snapshot of a live process over EventPipe, the way dotnet-gcdump does: a session
//! whose GCHeapCollect keyword makes the runtime induce a blocking gen-2 GC and walk the heap
//! during it; the session is stopped once that GC has ended, and the stream drained.

use std::time::{Duration, Instant};

use crate::client::{DiagnosticsClient, DEFAULT_TIMEOUT};
use crate::providers::{self, level};
use crate::session;
use ipc::{CollectTracing, ProviderConfig};
use nettrace::AsyncNettraceReader;

use super::events::{self, HeapEvent};
use super::graph::{GraphBuilder, HeapGraph};
use super::GcDumpError;

/// GC | Type | GCHeapDump | GCHeapCollect | GCHeapAndTypeNames: induce the GC, walk the heap,
/// name the types.
pub const HEAP_SNAPSHOT_KEYWORDS: u64 = 0x198_0001;

/// The runtime's buffer for the session: the heap walk is one burst of events; dotnet-gcdump
/// asks for as much.
const BUFFER_MB: u32 = 1024;

/// How a snapshot is taken.
#[derive(Debug, Clone, Copy)]
pub struct SnapshotOptions {
    /// From the start of the session until the induced GC has ended and the stream is drained.
    pub timeout: Duration,
}

impl Default for SnapshotOptions {
    fn default() -> Self {
        SnapshotOptions {
            timeout: Duration::from_secs(30),
        }
    }
}

/// Where a snapshot stands, for progress displays.
#[derive(Debug, Clone, Copy)]
pub struct SnapshotProgress {
    /// Objects reported so far.
    pub objects: usize,
    pub elapsed: Duration,
    /// The induced GC has ended; the rest of the stream is being drained.
    pub draining: bool,
}

/// Induces a full blocking GC in the process behind `client` and returns its heap.
///
/// The runtime names each type once, in the first heap walk that meets it, and forgets what it
/// named only when a change of the runtime provider's sessions leaves no session asking for type
/// events (see [`forget_named_types`], which every walk is preceded and followed by). A walk
/// still running when its session stopped (a snapshot that timed out or was cancelled, ours or
/// another tool's) names types for nobody: then the snapshot is taken once more.
pub async fn snapshot(
    client: &DiagnosticsClient,
    options: SnapshotOptions,
    mut progress: impl FnMut(SnapshotProgress),
) -> Result<HeapGraph, GcDumpError> {
    let started = Instant::now();
    let (mut builder, mut pointer_size) =
        walk_heap(client, options, started, &mut progress).await?;
    // A session that stopped before its walk was done (a snapshot that timed out) leaves two
    // traps for the next: its induced GC may start as the next session is enabled, which then
    // takes that GC for its own and sees it walk nothing (the runtime induces no second GC); and
    // types its walk named are not named again. Either way a fresh session walks again.
    for _ in 0..2 {
        let unnamed = builder.unnamed_types();
        if builder.node_count() == 0 {
            tracing::info!(
                "the induced GC walked no object for this session (it was induced for one that \
                 had stopped): taking the snapshot again"
            );
        } else if unnamed > 0 {
            tracing::info!(
                unnamed,
                "type names missing (an earlier heap walk named them for a session that had \
                 stopped): taking the snapshot again"
            );
        } else {
            break;
        }
        (builder, pointer_size) = walk_heap(client, options, started, &mut progress).await?;
    }
    if builder.node_count() == 0 {
        return Err(GcDumpError::Incomplete(
            "the runtime's heap walks held no object".into(),
        ));
    }
    builder.finish(pointer_size)
}

/// GC ends remembered while the induced GC's start has not been read (a few GCs at most can end
/// between a session's start and its induced GC's).
const MAX_ENDED_EARLY: usize = 16;

/// Leaves the runtime without our session when a snapshot gives up: it must not outlive the
/// snapshot. The stream (`reader`) is closed first: the runtime flushes into it before it
/// answers StopTracing, and nobody reads it now.
async fn abandon<R>(client: &DiagnosticsClient, session_id: u64, reader: R) {
    drop(reader);
    let _ = client.stop_tracing(session_id, DEFAULT_TIMEOUT).await;
}

/// Makes the runtime forget which types it has named, so that the next heap walk names every
/// type it meets: a session of the runtime provider without keywords, started and stopped.
///
/// The runtime forgets when a session of its provider starts or stops and the keywords of all
/// sessions then lack Type (0x80000). But EventPipe reckons the keywords of a stopping session
/// with that session still counted, so when another session has the runtime provider enabled
/// (the agent's own code-map session, another tool's) a snapshot's stop leaves the runtime
/// believing Type is still on: it keeps its memory of named types, and the next walk names
/// none (measured beside the agent: 4 of 6 snapshots with every type unnamed, each retry too).
/// This session's start is reckoned after the snapshot's session is gone.
async fn forget_named_types(client: &DiagnosticsClient) {
    let keywordless = CollectTracing::v2(vec![ProviderConfig::new(
        providers::RUNTIME,
        0,
        level::INFORMATIONAL,
    )])
    .with_rundown(false);
    let ended = std::future::ready(());
    let sink = &mut tokio::io::sink();
    // Not the snapshot's own failure: a walk without names is taken again (see `snapshot`).
    if let Err(error) =
        session::run(client, keywordless, sink, ended, DEFAULT_TIMEOUT, |_| {}).await
    {
        tracing::warn!(%error, "the session that makes the runtime name types again failed");
    }
}

/// One session, between two [`forget_named_types`]: the induced GC's heap, not yet resolved,
/// and the target's pointer size.
async fn walk_heap(
    client: &DiagnosticsClient,
    options: SnapshotOptions,
    started: Instant,
    progress: &mut impl FnMut(SnapshotProgress),
) -> Result<(GraphBuilder, u8), GcDumpError> {
    forget_named_types(client).await;
    let walked = walk_heap_once(client, options, started, progress).await;
    // Leaves the runtime as a tool without neighbours would: the next snapshot, ours or
    // another tool's (dotnet-gcdump), gets every name.
    forget_named_types(client).await;
    walked
}

/// One heap snapshot session: see [`walk_heap`].
async fn walk_heap_once(
    client: &DiagnosticsClient,
    options: SnapshotOptions,
    started: Instant,
    progress: &mut impl FnMut(SnapshotProgress),
) -> Result<(GraphBuilder, u8), GcDumpError> {
    let config = CollectTracing::v2(vec![ProviderConfig::new(
        providers::RUNTIME,
        HEAP_SNAPSHOT_KEYWORDS,
        level::VERBOSE,
    )])
    .with_rundown(false)
    .with_circular_buffer_mb(BUFFER_MB);
    let (session, _) = session::start(client, config)
        .await
        .map_err(GcDumpError::Session)?;
    let session_id = session.id;
    let mut reader = AsyncNettraceReader::new(session.stream);
    let mut builder = GraphBuilder::default();
    let mut induced: Option<u32> = None;
    // GCs that ended before their start was read: the stream is in order per thread, not across
    // threads, and with server GC (ASP.NET Core's default) the thread that starts a GC is not
    // the one that ends it (on .NET 8, every snapshot of such a service read GCEnd first).
    let mut ended_early: Vec<u32> = Vec::new();
    let mut last_report = Instant::now();

    let walk = async {
        loop {
            let Some(event) = reader.next_event().await? else {
                return Err(GcDumpError::EndedEarly);
            };
            let Some(heap_event) = events::decode(&event)? else {
                continue;
            };
            match heap_event {
                HeapEvent::GcStart(start)
                    if induced.is_none() && start.is_induced_full_blocking() =>
                {
                    induced = Some(start.count);
                    // Heap events still buffered on other threads come in the drain below.
                    if ended_early.contains(&start.count) {
                        return Ok(());
                    }
                }
                HeapEvent::GcEnd(count) if induced == Some(count) => return Ok(()),
                HeapEvent::GcEnd(count) if induced.is_none() => {
                    if ended_early.len() == MAX_ENDED_EARLY {
                        ended_early.remove(0);
                    }
                    ended_early.push(count);
                }
                other => builder.add(other)?,
            }
            if last_report.elapsed() >= Duration::from_millis(100) {
                last_report = Instant::now();
                progress(SnapshotProgress {
                    objects: builder.node_count(),
                    elapsed: started.elapsed(),
                    draining: false,
                });
            }
        }
    };
    let in_time = |d: Duration| options.timeout.saturating_sub(d);
    let seen = |b: &GraphBuilder, induced: Option<u32>| {
        if induced.is_some() {
            format!(
                "the induced GC started and {} objects arrived",
                b.node_count()
            )
        } else {
            "the induced full GC had not started".to_string()
        }
    };
    let failure = match tokio::time::timeout(in_time(started.elapsed()), walk).await {
        Ok(Ok(())) => None,
        Ok(Err(error)) => Some(error),
        Err(_) => Some(GcDumpError::Timeout {
            timeout: options.timeout,
            seen: seen(&builder, induced),
        }),
    };
    if let Some(error) = failure {
        abandon(client, session_id, reader).await;
        return Err(error);
    }
    progress(SnapshotProgress {
        objects: builder.node_count(),
        elapsed: started.elapsed(),
        draining: true,
    });

    // The runtime flushes the session into the stream before it answers StopTracing: read the
    // stream while waiting for the reply. Heap events still buffered arrive here too. What is
    // left of the timeout bounds both below, so that running out of it is a timeout (with its
    // advice), never a StopTracing that had no time at all.
    let stop = async {
        client
            .stop_tracing(session_id, options.timeout)
            .await
            .map_err(GcDumpError::Stop)
    };
    // The stop itself induces one more GC, walked into this stream, when another session has
    // the runtime provider enabled (the stop is reckoned with this session's GCHeapCollect still
    // counted; see `forget_named_types`): the walk of this snapshot ends where a GC starts.
    let drain = async {
        let mut next_gc = false;
        while let Some(event) = reader.next_event().await? {
            match events::decode(&event)? {
                Some(HeapEvent::GcStart(_)) => next_gc = true,
                Some(heap_event) if !next_gc => builder.add(heap_event)?,
                _ => {}
            }
        }
        Ok::<_, GcDumpError>(())
    };
    let stopped = tokio::time::timeout(in_time(started.elapsed()), async {
        tokio::try_join!(stop, drain)
    })
    .await;
    match stopped {
        Ok(result) => result?,
        Err(_) => {
            abandon(client, session_id, reader).await;
            return Err(GcDumpError::Timeout {
                timeout: options.timeout,
                seen: "the induced GC ended but the runtime did not close the stream".into(),
            });
        }
    };
    let dropped = reader.parser().dropped_events();
    if dropped > 0 {
        return Err(GcDumpError::Incomplete(format!(
            "the runtime dropped {dropped} events (its session buffer was full)"
        )));
    }
    let pointer_size = reader.parser().trace().map_or(8, |t| t.pointer_size);
    Ok((builder, pointer_size))
}
