//! What the store benchmarks share: a deterministic random source, store options that never
//! delete, scratch directories, queries and the sizes of blocks on disk.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use arrow::array::{Array, UInt32Array};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use profile::ProfileType;
use store::tsdb::{BlockInfo, Level, Query, QueryControl, SampleLabels, Store, StoreOptions};

pub const SECOND: i64 = 1_000_000_000;
/// 2025-11-30 12:00 UTC: any fixed time works, a realistic one keeps block names realistic.
pub const T0: i64 = 1_764_504_000 * SECOND;

/// xorshift64: fast, and the same numbers on every machine so runs compare.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Skewed towards 0 (P(k) ~ 1/(k+1)), as hot stacks are.
    pub fn zipf(&mut self, n: usize) -> usize {
        let u = (self.next() % 1_000_000) as f64 / 1_000_000.0;
        ((n as f64).powf(u) - 1.0) as usize
    }
}

/// Default options, except that nothing is deleted by age or bytes: the data is in the past.
pub fn options() -> StoreOptions {
    let mut levels = Level::defaults();
    for level in &mut levels {
        level.retention_age = Duration::MAX;
    }
    StoreOptions {
        retention_age: Duration::from_secs(1 << 40),
        full_detail_age: Duration::from_secs(1 << 40),
        levels,
        retention_bytes: u64::MAX,
        ..StoreOptions::default()
    }
}

/// An empty directory under the system's temp directory, unique to this process.
pub fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("clrscope-bench-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    dir
}

/// One profile type of one service over `[from, until)`.
pub fn query(service: &str, profile_type: &str, from: i64, until: i64) -> Query {
    Query {
        from,
        until,
        profile_type: ProfileType::known(profile_type).expect("a known profile type"),
        matchers: vec![("service_name".into(), service.into())],
        sample_matchers: Vec::new(),
        sample_labels: SampleLabels::All,
        control: QueryControl::default(),
    }
}

fn file_bytes(dir: &Path, name: &str) -> u64 {
    fs::metadata(dir.join(name)).map_or(0, |m| m.len())
}

/// Distinct stack ids in a block's samples table: its unique stacks, as a block interns each
/// stack once.
fn unique_stacks(dir: &Path) -> u64 {
    let file = fs::File::open(dir.join("samples.parquet")).expect("samples.parquet opens");
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .and_then(|b| b.build())
        .expect("samples.parquet reads");
    let mut ids = HashSet::new();
    for batch in reader {
        let batch = batch.expect("samples.parquet decodes");
        let stacks = batch
            .column_by_name("stack")
            .and_then(|c| c.as_any().downcast_ref::<UInt32Array>())
            .expect("a uint32 stack column");
        ids.extend(stacks.values().iter().copied());
    }
    ids.len() as u64
}

/// Bytes on disk of the compacted (closed, one-per-partition) blocks of full detail, per
/// sample and per unique stack, as they stay on disk; then those of each downsampled level.
pub fn print_sizes(store: &Store) {
    let compacted: Vec<_> = store
        .blocks()
        .iter()
        .filter(|b| !b.meta.compacted_from.is_empty() && b.meta.resolution == 0)
        .collect();
    println!("-- full detail, compacted --");
    print_block_sizes(&compacted);
    let mut resolutions: Vec<i64> = store.blocks().iter().map(|b| b.meta.resolution).collect();
    resolutions.sort_unstable();
    resolutions.dedup();
    for r in resolutions.into_iter().filter(|&r| r > 0) {
        let level: Vec<_> = store
            .blocks()
            .iter()
            .filter(|b| b.meta.resolution == r)
            .collect();
        println!(
            "-- level of {} s (samples: those appended in its spans) --",
            r / SECOND
        );
        print_block_sizes(&level);
    }
}

/// What [`print_sizes`] prints of a set of blocks.
fn print_block_sizes(blocks: &[&BlockInfo]) {
    let sum = |f: &dyn Fn(&BlockInfo) -> u64| blocks.iter().map(|b| f(b)).sum::<u64>();
    let appended = sum(&|b| b.meta.samples_appended);
    let rows = sum(&|b| b.meta.rows.samples);
    let total = sum(&|b| b.bytes);
    let file = |name: &'static str| sum(&move |b| file_bytes(&b.path, name));
    let unique = sum(&|b| unique_stacks(&b.path));
    let nodes = sum(&|b| b.meta.rows.stacks);
    let per_block = |n: u64| n / blocks.len().max(1) as u64;
    println!("blocks: {}", blocks.len());
    println!("samples appended: {appended}, rows stored: {rows}");
    println!(
        "bytes on disk: {total} = {:.2} B/sample",
        total as f64 / appended as f64
    );
    println!(
        "samples.parquet: {} = {:.2} B/sample",
        file("samples.parquet"),
        file("samples.parquet") as f64 / appended as f64
    );
    println!(
        "stacks.parquet: {} for {} unique stacks per block ({} nodes per block) = {:.2} B/unique stack",
        file("stacks.parquet"),
        per_block(unique),
        per_block(nodes),
        file("stacks.parquet") as f64 / unique as f64
    );
    println!(
        "functions.parquet: {} = {:.2} B/sample, labels.parquet: {} = {:.2} B/sample, meta.json: the rest",
        file("functions.parquet"),
        file("functions.parquet") as f64 / appended as f64,
        file("labels.parquet"),
        file("labels.parquet") as f64 / appended as f64
    );
}
