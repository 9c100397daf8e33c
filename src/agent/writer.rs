//! The one writer of the store: a thread fed by a bounded channel of batches, which also
//! flushes on time, applies retention and compacts. The same batches go to the exporters.

use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use exporter::otlp::ExportBatch;
use profile::Batch;
use store::tsdb::Store;

use super::export::ExportTaps;
use super::health::StoreHealth;

/// Batches waiting for the writer. At one batch per profile type per process per period this is
/// minutes of slack for dozens of processes; past it batches are dropped and counted.
pub const QUEUE_BATCHES: usize = 4096;

/// How often the writer checks whether the head is due for a flush.
const TICK: Duration = Duration::from_secs(1);

/// How often retention and compaction run.
const MAINTENANCE_EVERY: Duration = Duration::from_secs(60);

/// Where the per-process tasks put their batches. Cloning shares the queue.
#[derive(Debug, Clone)]
pub struct BatchSink {
    queue: SyncSender<Arc<Batch>>,
    health: StoreHealth,
    exporters: ExportTaps,
}

impl BatchSink {
    /// Queues a batch for the store and the exporters without waiting; a full queue drops it
    /// (counted, logged). `period_nanos`: the sampler period of a cpu or wall batch, 0 for
    /// event profiles.
    pub fn send(&self, batch: Batch, period_nanos: i64) {
        let batch = Arc::new(batch);
        if !self.exporters.is_empty() {
            self.exporters.offer(&ExportBatch {
                batch: batch.clone(),
                period_nanos,
            });
        }
        match self.queue.try_send(batch) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.health.dropped_batches.inc();
                let dropped = self.health.dropped_batches.get();
                if dropped.is_power_of_two() {
                    tracing::warn!(
                        dropped,
                        "the store cannot keep up (slow disk?); profile batches are being dropped"
                    );
                }
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Batches dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.health.dropped_batches.get()
    }
}

/// Starts the writer thread. It ends, after a last flush, once every [`BatchSink`] is dropped.
pub fn spawn(
    store: Arc<RwLock<Store>>,
    health: StoreHealth,
    exporters: ExportTaps,
) -> std::io::Result<(BatchSink, JoinHandle<()>)> {
    let (queue, batches) = sync_channel(QUEUE_BATCHES);
    let sink = BatchSink {
        queue,
        health: health.clone(),
        exporters,
    };
    let handle = std::thread::Builder::new()
        .name("store-writer".into())
        .spawn(move || write_loop(&store, &batches, &health))?;
    Ok((sink, handle))
}

fn write_loop(store: &RwLock<Store>, batches: &Receiver<Arc<Batch>>, health: &StoreHealth) {
    let write = || store.write().unwrap_or_else(|p| p.into_inner());
    let mut last_maintenance = Instant::now();
    report_size(&write(), health);
    loop {
        let next = batches.recv_timeout(TICK);
        let result = {
            let mut store = write();
            let blocks = store.blocks().len();
            let result = match next {
                Ok(batch) => store.append(&batch),
                Err(RecvTimeoutError::Timeout) => store.flush_if_due(),
                Err(RecvTimeoutError::Disconnected) => break,
            };
            // A flush adds a block (only maintenance removes any).
            if store.blocks().len() != blocks {
                health.flushes.inc();
                report_size(&store, health);
            }
            result
        };
        if let Err(error) = result {
            health.write_errors.inc();
            tracing::error!(%error, "writing profiles to the store failed");
        }
        if last_maintenance.elapsed() >= MAINTENANCE_EVERY {
            last_maintenance = Instant::now();
            let mut store = write();
            maintain(&mut store, health);
            report_size(&store, health);
        }
    }
    if let Err(error) = write().flush() {
        tracing::error!(%error, "the last flush of the store failed; the newest profiles are lost");
    }
}

/// The store's blocks and their bytes on disk, as gauges.
fn report_size(store: &Store, health: &StoreHealth) {
    let blocks = store.blocks();
    health.blocks.set(blocks.len() as f64);
    health
        .bytes
        .set(blocks.iter().map(|b| b.bytes).sum::<u64>() as f64);
}

/// Deletes what retention says is too old or too much, then merges small blocks and makes the
/// coarser levels of closed spans.
fn maintain(store: &mut Store, health: &StoreHealth) {
    match store.apply_retention(profile::clock::unix_nanos()) {
        Ok(deleted) if !deleted.is_empty() => {
            tracing::info!(blocks = deleted.len(), "retention deleted old blocks")
        }
        Ok(_) => {}
        Err(error) => {
            health.write_errors.inc();
            tracing::error!(%error, "applying retention failed");
        }
    }
    if let Err(error) = store.compact().and_then(|_| store.downsample()) {
        health.write_errors.inc();
        tracing::error!(%error, "compacting or downsampling blocks failed");
    }
}
