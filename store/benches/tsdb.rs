//! Ingest and query speed of `store::tsdb`, and bytes on disk, on a synthetic but realistic
//! workload: two processes of one service, a batch of 5,000 cpu samples per process every 10 s,
//! drawn (Zipf-like) from 2,000 stacks grown as a call tree (15-frame request pipelines, each new
//! stack a hot one cut and extended by 1–4 frames) over 3,000 functions, 16 threads, a span id on
//! one sample in ten.
//!
//! `cargo bench -p store --bench tsdb` (prints the sizes first).

mod common;

use std::fs;
use std::time::Duration;

use common::{fresh_dir, options, Rng, SECOND, T0};
use criterion::{criterion_group, BatchSize, Criterion, Throughput};
use profile::{Batch, BatchSample, ProfileType};
use profile::{Function, LabelValue};
use store::tsdb::{Query, Store};

const SAMPLES_PER_BATCH: usize = 5_000;

struct Workload {
    functions: Vec<Function>,
    stacks: Vec<Vec<u32>>,
}

impl Workload {
    fn new() -> Workload {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let functions = (0..3000)
            .map(|i| Function {
                name: format!(
                    "Contoso.Orders.Component{}.Service{}.Method{}(System.String, System.Int32)",
                    i % 17,
                    i % 101,
                    i
                ),
                module: format!("Contoso.Orders.Component{}.dll", i % 17),
            })
            .collect();
        // Stacks grow as a call tree does: a new stack is a hot existing one cut at some depth
        // and extended by a few frames, under a few request pipelines of 15 frames.
        let mut stacks: Vec<Vec<u32>> = (0..4)
            .map(|p| (0..15).map(|d| (p * 15 + d) as u32).collect())
            .collect();
        while stacks.len() < 2000 {
            let base = &stacks[rng.zipf(stacks.len())];
            let keep = base.len() / 2 + rng.below(base.len() / 2 + 1);
            let mut root_first = base[..keep].to_vec();
            for _ in 0..1 + rng.below(4) {
                root_first.push(60 + rng.below(2940) as u32);
            }
            stacks.push(root_first);
        }
        for s in &mut stacks {
            s.reverse();
        }
        Workload { functions, stacks }
    }

    fn batch(&self, rng: &mut Rng, pid: u32, time: i64) -> Batch {
        let samples = (0..SAMPLES_PER_BATCH)
            .map(|_| {
                let mut labels = vec![(
                    "thread_id".to_string(),
                    LabelValue::Num(100 + rng.below(16) as i64),
                )];
                if rng.below(10) == 0 {
                    labels.push((
                        "span_id".to_string(),
                        LabelValue::Str(format!("{:016x}", rng.below(20) as u64 + time as u64)),
                    ));
                }
                BatchSample {
                    stack: self.stacks[rng.zipf(self.stacks.len())].clone(),
                    value: 1_000_000,
                    labels,
                }
            })
            .collect();
        Batch {
            series: vec![
                ("host_name".into(), "node-1".into()),
                ("process_id".into(), pid.to_string()),
                ("service_name".into(), "orders".into()),
            ],
            profile_type: ProfileType::known("cpu").unwrap(),
            timestamp_unix_nanos: time,
            functions: self.functions.clone(),
            samples,
        }
    }

    /// Two processes, one batch each per 10 s, for `minutes` minutes.
    fn batches(&self, minutes: i64) -> Vec<Batch> {
        let mut rng = Rng(42);
        let mut out = Vec::new();
        for tick in 0..minutes * 6 {
            for pid in [4242, 4343] {
                out.push(self.batch(&mut rng, pid, T0 + tick * 10 * SECOND));
            }
        }
        out
    }
}

fn query(from: i64, until: i64) -> Query {
    common::query("orders", "cpu", from, until)
}

/// Ten minutes of data, flushed as the agent would (one block per minute after compaction).
fn print_sizes(workload: &Workload) {
    let dir = fresh_dir("sizes");
    let mut store = Store::open(&dir, options()).unwrap();
    let batches = workload.batches(10);
    for (i, b) in batches.iter().enumerate() {
        store.append(b).unwrap();
        if i % 2 == 1 {
            store.flush().unwrap(); // every 10 s of data
        }
    }
    store.flush().unwrap();
    common::print_sizes(&store);
    let _ = fs::remove_dir_all(&dir);
}

fn ingest(c: &mut Criterion) {
    let workload = Workload::new();
    let minute = workload.batches(1);
    let mut group = c.benchmark_group("ingest");
    group.sample_size(10);
    group.throughput(Throughput::Elements(
        (minute.len() * SAMPLES_PER_BATCH) as u64,
    ));
    let dir = fresh_dir("ingest");
    group.bench_function("append_and_flush_one_minute", |b| {
        b.iter_batched(
            || {
                let _ = fs::remove_dir_all(&dir);
                Store::open(&dir, options()).unwrap()
            },
            |mut store| {
                for (i, batch) in minute.iter().enumerate() {
                    store.append(batch).unwrap();
                    if i % 2 == 1 {
                        store.flush().unwrap();
                    }
                }
                store
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
    let _ = fs::remove_dir_all(&dir);
}

fn query_bench(c: &mut Criterion) {
    let workload = Workload::new();
    let dir = fresh_dir("query");
    let mut store = Store::open(&dir, options()).unwrap();
    for b in workload.batches(10) {
        store.append(&b).unwrap();
    }
    store.flush().unwrap();
    let mut group = c.benchmark_group("query");
    group.sample_size(10);
    let one_minute = query(T0 + 5 * 60 * SECOND, T0 + 6 * 60 * SECOND);
    group.bench_function("profile_one_minute", |b| {
        b.iter(|| store.profile(&one_minute).unwrap())
    });
    let ten_minutes = query(T0, T0 + 10 * 60 * SECOND);
    group.bench_function("profile_ten_minutes", |b| {
        b.iter(|| store.profile(&ten_minutes).unwrap())
    });
    group.bench_function("series_ten_minutes_10s_step", |b| {
        b.iter(|| store.series(&ten_minutes, Duration::from_secs(10)).unwrap())
    });
    group.finish();
    let _ = fs::remove_dir_all(&dir);
}

criterion_group!(benches, ingest, query_bench);

fn main() {
    print_sizes(&Workload::new());
    benches();
    Criterion::default().configure_from_args().final_summary();
}
