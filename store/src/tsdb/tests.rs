use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::*;
use profile::labels::OTHER_FRAME;
use profile::{diff, BatchSample, Function, LabelValue};

const MINUTE: i64 = 60_000_000_000;
const HOUR: i64 = 60 * MINUTE;

/// A fresh directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("clrscope-tsdb-{}-{name}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        TempDir(dir.join("data"))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Some(parent) = self.0.parent() {
            let _ = fs::remove_dir_all(parent);
        }
    }
}

/// Options that never delete by age or bytes, unless a test says so.
fn keep_all() -> StoreOptions {
    StoreOptions {
        retention_age: Duration::from_secs(1 << 40),
        retention_bytes: u64::MAX,
        partition: Duration::from_secs(3600),
        levels: Vec::new(),
        ..StoreOptions::default()
    }
}

fn function(name: &str) -> Function {
    Function {
        name: name.to_string(),
        module: "App.dll".to_string(),
    }
}

/// Stack as function names (leaf first), value, sample labels.
type TestSample<'a> = (&'a [&'a str], i64, &'a [(&'a str, LabelValue)]);

/// A batch whose stacks are given as function names, leaf first.
fn batch(service: &str, pt: &str, time: i64, samples: &[TestSample]) -> Batch {
    let mut functions: Vec<Function> = Vec::new();
    let mut out = Vec::new();
    for (stack, value, labels) in samples {
        let stack = stack
            .iter()
            .map(|name| {
                let f = function(name);
                match functions.iter().position(|g| *g == f) {
                    Some(i) => i as u32,
                    None => {
                        functions.push(f);
                        functions.len() as u32 - 1
                    }
                }
            })
            .collect();
        out.push(BatchSample {
            stack,
            value: *value,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        });
    }
    Batch {
        series: vec![
            ("service_name".into(), service.into()),
            ("process_id".into(), "42".into()),
            ("host_name".into(), "node-1".into()),
        ],
        profile_type: ProfileType::known(pt).expect("known type"),
        timestamp_unix_nanos: time,
        functions,
        samples: out,
    }
}

/// Stack names and sorted labels: what makes a sample.
type FlatKey = (Vec<String>, Vec<(String, LabelValue)>);
type Flat = BTreeMap<FlatKey, i64>;

/// A profile as stack names and labels to value, independent of function order.
fn flat(p: &Profile) -> Flat {
    let mut out = Flat::new();
    for s in &p.samples {
        let names = s
            .stack
            .iter()
            .map(|&f| p.functions[f as usize].name.clone())
            .collect();
        *out.entry((names, s.labels.to_vec())).or_insert(0) += s.values[0];
    }
    out
}

fn query(service: Option<&str>, pt: &str, from: i64, until: i64) -> Query {
    Query {
        from,
        until,
        profile_type: ProfileType::known(pt).unwrap(),
        matchers: service
            .map(|s| vec![("service_name".to_string(), s.to_string())])
            .unwrap_or_default(),
        sample_matchers: Vec::new(),
        sample_labels: SampleLabels::All,
        control: QueryControl::default(),
    }
}

fn tid(n: i64) -> (&'static str, LabelValue) {
    ("thread_id", LabelValue::Num(n))
}

fn entry(stack: &[&str], labels: &[(&str, LabelValue)], value: i64) -> (FlatKey, i64) {
    let mut labels: Vec<(String, LabelValue)> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    labels.sort();
    (
        (stack.iter().map(|s| s.to_string()).collect(), labels),
        value,
    )
}

#[test]
fn round_trip_through_head_blocks_and_reopen() {
    let dir = TempDir::new("roundtrip");
    let t0 = 10 * HOUR;
    let span = ("span_id", LabelValue::Str("00f067aa0ba902b7".into()));
    let mut store = Store::open(&dir.0, keep_all()).unwrap();
    store
        .append(&batch(
            "api",
            "cpu",
            t0,
            &[
                (&["Hot", "Main"], 10, &[tid(1)]),
                (&["Hot", "Main"], 5, &[tid(1)]),
                (&["Cold", "Main"], 1, &[tid(2), span.clone()]),
                (&[], 3, &[]),
            ],
        ))
        .unwrap();
    store
        .append(&batch(
            "api",
            "cpu",
            t0 + 1_000,
            &[(&["Hot", "Main"], 7, &[tid(1)])],
        ))
        .unwrap();
    store
        .append(&batch("api", "wall", t0, &[(&["Sleep", "Main"], 99, &[])]))
        .unwrap();
    store
        .append(&batch("worker", "cpu", t0, &[(&["Other"], 4, &[])]))
        .unwrap();
    let expected: Flat = [
        entry(&["Hot", "Main"], &[tid(1)], 22),
        entry(&["Cold", "Main"], &[tid(2), span.clone()], 1),
        entry(&[], &[], 3),
    ]
    .into_iter()
    .collect();
    let q = query(Some("api"), "cpu", t0, t0 + MINUTE);
    let from_head = store.profile(&q).unwrap();
    assert_eq!(flat(&from_head), expected);
    assert_eq!(
        from_head.sample_types[0],
        ValueType::new("cpu", "nanoseconds")
    );
    assert_eq!(
        (from_head.start_unix_nanos, from_head.duration_nanos),
        (t0, MINUTE)
    );
    assert!(store.blocks().is_empty());

    store.flush().unwrap();
    assert_eq!(store.blocks().len(), 1);
    assert_eq!(flat(&store.profile(&q).unwrap()), expected);
    assert_eq!(store.blocks()[0].meta.samples_appended, 7);
    assert_eq!(store.blocks()[0].meta.rows.samples, 6);
    drop(store);

    let store = Store::open(&dir.0, keep_all()).unwrap();
    assert!(store.problems().is_empty());
    assert_eq!(flat(&store.profile(&q).unwrap()), expected);
    let wall = store.profile(&query(None, "wall", t0, t0 + 1)).unwrap();
    assert_eq!(
        flat(&wall),
        [entry(&["Sleep", "Main"], &[], 99)].into_iter().collect()
    );
    let mut by_span = q.clone();
    by_span.sample_matchers = vec![("span_id".to_string(), span.1.clone())];
    assert_eq!(
        flat(&store.profile(&by_span).unwrap()),
        [entry(&["Cold", "Main"], &[tid(2), span], 1)]
            .into_iter()
            .collect()
    );
    assert_eq!(
        store
            .profile(&query(None, "cpu", t0, t0 + MINUTE))
            .unwrap()
            .total(0),
        30
    );
}

#[test]
fn repeated_stacks_are_stored_once() {
    let dir = TempDir::new("dedup");
    let mut store = Store::open(&dir.0, keep_all()).unwrap();
    let deep: Vec<String> = (0..30).map(|i| format!("Frame{i}")).collect();
    let deep: Vec<&str> = deep.iter().map(String::as_str).collect();
    let mut other = deep.clone();
    other[0] = "OtherLeaf";
    for i in 0..1000 {
        store
            .append(&batch(
                "api",
                "cpu",
                HOUR + i,
                &[(&deep, 1, &[]), (&other, 2, &[])],
            ))
            .unwrap();
    }
    store.flush().unwrap();
    let meta = &store.blocks()[0].meta;
    assert_eq!(meta.rows.samples, 2000);
    // 30 nodes for the first stack, one more for the other leaf.
    assert_eq!(meta.rows.stacks, 31);
    assert_eq!(meta.rows.functions, 31);
    let p = store.profile(&query(None, "cpu", 0, 2 * HOUR)).unwrap();
    assert_eq!(p.samples.len(), 2);
    assert_eq!(p.total(0), 3000);
}

#[test]
fn time_range_and_labels_prune_blocks() {
    let dir = TempDir::new("prune");
    let options = StoreOptions {
        partition: Duration::from_secs(60),
        ..keep_all()
    };
    let mut store = Store::open(&dir.0, options).unwrap();
    store
        .append(&batch("a", "cpu", HOUR, &[(&["A1"], 1, &[])]))
        .unwrap();
    store.flush().unwrap();
    store
        .append(&batch("b", "cpu", HOUR + 2 * MINUTE, &[(&["B1"], 2, &[])]))
        .unwrap();
    store.flush().unwrap();
    store
        .append(&batch("a", "cpu", 3 * HOUR, &[(&["A3"], 4, &[])]))
        .unwrap();
    store.flush().unwrap();
    assert_eq!(store.blocks().len(), 3);
    let total = |q: &Query| store.profile(q).unwrap().total(0);
    assert_eq!(total(&query(None, "cpu", HOUR, HOUR + 1)), 1);
    assert_eq!(total(&query(None, "cpu", HOUR, HOUR + 3 * MINUTE)), 3);
    assert_eq!(total(&query(None, "cpu", 2 * HOUR, 4 * HOUR)), 4);
    assert_eq!(total(&query(Some("a"), "cpu", 0, 4 * HOUR)), 5);
    assert_eq!(total(&query(None, "wall", 0, 4 * HOUR)), 0);

    // Damage service b's block: queries that prune it never notice.
    let b_block = store.blocks()[1].path.clone();
    fs::write(b_block.join(block::SAMPLES), b"garbage").unwrap();
    assert_eq!(total(&query(Some("a"), "cpu", 0, 4 * HOUR)), 5);
    assert_eq!(total(&query(None, "cpu", 2 * HOUR, 4 * HOUR)), 4);
    assert!(store.problems().is_empty());
    // A query that needs it reports it and answers from the rest.
    assert_eq!(total(&query(None, "cpu", 0, 4 * HOUR)), 5);
    let problems = store.problems();
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].path, b_block);
    assert!(
        problems[0].message.contains("damaged"),
        "{}",
        problems[0].message
    );
}

#[test]
fn a_cancelled_query_reads_no_more_blocks() {
    let dir = TempDir::new("cancel");
    three_hours(&dir);
    let store = Store::open(&dir.0, keep_all()).unwrap();
    let q = query(None, "cpu", 0, 4 * HOUR);
    assert_eq!(store.profile(&q).unwrap().total(0), 3);
    assert_eq!(
        q.control.blocks_read(),
        3,
        "a control counts the blocks read"
    );
    let cancelled = query(None, "cpu", 0, 4 * HOUR);
    cancelled.control.cancel();
    for result in [
        store.profile(&cancelled).map(drop),
        store.call_tree(&cancelled, 16).map(drop),
        store.series(&cancelled, Duration::from_secs(60)).map(drop),
    ] {
        assert!(matches!(result, Err(StoreError::Cancelled)), "{result:?}");
    }
    assert_eq!(cancelled.control.blocks_read(), 0);
}

/// Three blocks, one per hour, each with one sample of value 1.
fn three_hours(dir: &TempDir) -> Vec<u64> {
    let mut store = Store::open(&dir.0, keep_all()).unwrap();
    for h in 1..=3 {
        store
            .append(&batch("api", "cpu", h * HOUR, &[(&["F"], 1, &[])]))
            .unwrap();
        store.flush().unwrap();
    }
    store.blocks().iter().map(|b| b.bytes).collect()
}

#[test]
fn retention_by_age_deletes_only_old_blocks() {
    let dir = TempDir::new("age");
    three_hours(&dir);
    let options = StoreOptions {
        retention_age: Duration::from_secs(90 * 60),
        ..keep_all()
    };
    let mut store = Store::open(&dir.0, options).unwrap();
    let names: Vec<String> = store.blocks().iter().map(|b| b.name.clone()).collect();
    let deleted = store.apply_retention(3 * HOUR + 10 * MINUTE).unwrap();
    assert_eq!(deleted, vec![names[0].clone()]);
    assert!(!store.dir.join(&names[0]).exists());
    drop(store);
    let store = Store::open(&dir.0, keep_all()).unwrap();
    let left: Vec<String> = store.blocks().iter().map(|b| b.name.clone()).collect();
    assert_eq!(left, names[1..]);
    assert_eq!(
        store
            .profile(&query(None, "cpu", 0, 4 * HOUR))
            .unwrap()
            .total(0),
        2
    );
}

#[test]
fn blocks_listing_one_series_share_it_until_none_lists_it() {
    let dir = TempDir::new("shared-series");
    let shared = |store: &Store, service: &str| {
        let of_service: Vec<&Arc<Series>> = store
            .blocks()
            .iter()
            .flat_map(|b| &b.meta.series)
            .filter(|s| s.labels.contains(&("service_name".into(), service.into())))
            .collect();
        assert!(of_service.len() > 1, "fewer than two blocks list {service}");
        of_service.iter().all(|s| Arc::ptr_eq(s, of_service[0]))
    };
    let mut store = Store::open(&dir.0, keep_all()).unwrap();
    store
        .append(&batch("web", "cpu", 0, &[(&["G"], 1, &[])]))
        .unwrap();
    store.flush().unwrap();
    for h in 1..=2 {
        store
            .append(&batch("api", "cpu", h * HOUR, &[(&["F"], 1, &[])]))
            .unwrap();
        store.flush().unwrap();
    }
    assert_eq!(store.blocks().len(), 3);
    assert!(
        shared(&store, "api"),
        "a written block shares a known series"
    );
    assert_eq!(store.series.len(), 2);
    drop(store);

    let options = StoreOptions {
        retention_age: Duration::from_secs(90 * 60),
        ..keep_all()
    };
    let mut store = Store::open(&dir.0, options).unwrap();
    assert!(shared(&store, "api"), "blocks read on open share a series");
    assert_eq!(store.series.len(), 2);
    // The hour-0 block, the only one listing "web", ages out: "web" is forgotten.
    store.apply_retention(2 * HOUR + 30 * MINUTE).unwrap();
    assert_eq!(store.blocks().len(), 2);
    assert_eq!(store.series.len(), 1);
    assert!(store
        .series
        .iter()
        .all(|s| Arc::ptr_eq(s, &store.blocks()[0].meta.series[0])));
}

#[test]
fn retention_by_bytes_deletes_oldest_but_never_the_newest() {
    let dir = TempDir::new("bytes");
    let sizes = three_hours(&dir);
    let options = StoreOptions {
        retention_bytes: sizes[1] + sizes[2],
        ..keep_all()
    };
    let mut store = Store::open(&dir.0, options).unwrap();
    let names: Vec<String> = store.blocks().iter().map(|b| b.name.clone()).collect();
    assert_eq!(store.apply_retention(0).unwrap(), vec![names[0].clone()]);
    assert_eq!(store.apply_retention(0).unwrap(), Vec::<String>::new());
    drop(store);
    let options = StoreOptions {
        retention_bytes: 0,
        ..keep_all()
    };
    let mut store = Store::open(&dir.0, options).unwrap();
    assert_eq!(store.apply_retention(0).unwrap(), vec![names[1].clone()]);
    assert_eq!(store.blocks().len(), 1);
    assert_eq!(store.blocks()[0].name, names[2]);
    assert_eq!(
        store
            .profile(&query(None, "cpu", 0, 4 * HOUR))
            .unwrap()
            .total(0),
        1
    );
}

#[test]
fn damaged_blocks_are_reported_and_skipped_on_open() {
    let dir = TempDir::new("damaged");
    three_hours(&dir);
    let names: Vec<PathBuf> = fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    // Truncated Parquet file, garbage meta.json, and a block from a future format.
    let samples = names[0].join(block::SAMPLES);
    let len = fs::metadata(&samples).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&samples)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    fs::write(names[1].join(block::META), b"\x00\xffnot json").unwrap();
    let meta = names[2].join(block::META);
    let text = fs::read_to_string(&meta).unwrap();
    fs::write(
        &meta,
        text.replace("\"format_major\": 1", "\"format_major\": 3"),
    )
    .unwrap();

    let store = Store::open(&dir.0, keep_all()).unwrap();
    assert!(store.blocks().is_empty());
    let problems = store.problems();
    assert_eq!(problems.len(), 3);
    let message = |p: &PathBuf| &problems.iter().find(|q| &q.path == p).unwrap().message;
    assert!(
        message(&names[0]).contains("damaged"),
        "{}",
        message(&names[0])
    );
    assert!(
        message(&names[1]).contains("meta.json"),
        "{}",
        message(&names[1])
    );
    assert!(
        message(&names[2]).contains(&format!("format version 3.{FORMAT_MINOR}")),
        "{}",
        message(&names[2])
    );
    assert_eq!(
        store
            .profile(&query(None, "cpu", 0, 4 * HOUR))
            .unwrap()
            .total(0),
        0
    );
}

#[test]
fn leftovers_of_a_crash_are_ignored_and_cleaned() {
    let dir = TempDir::new("crash");
    three_hours(&dir);
    // A block being written when the process died, and an interrupted compaction.
    let tmp = dir
        .0
        .join(format!("{:020}-000099{}", 4 * HOUR, block::TEMP_SUFFIX));
    fs::create_dir(&tmp).unwrap();
    fs::write(tmp.join(block::SAMPLES), b"PAR1 half").unwrap();
    let mut store = Store::open(&dir.0, keep_all()).unwrap();
    assert!(!tmp.exists());
    assert!(store.problems().is_empty());
    assert_eq!(store.blocks().len(), 3);
    let copy = dir.0.join("copy-of-first");
    let first = store.blocks()[0].path.clone();
    fs::create_dir(&copy).unwrap();
    for f in fs::read_dir(&first).unwrap() {
        let f = f.unwrap();
        fs::copy(f.path(), copy.join(f.file_name())).unwrap();
    }
    let meta = copy.join(block::META);
    let mut m: BlockMeta = serde_json::from_slice(&fs::read(&meta).unwrap()).unwrap();
    m.compacted_from = vec![store.blocks()[0].name.clone()];
    fs::write(&meta, serde_json::to_vec(&m).unwrap()).unwrap();
    drop(store);
    store = Store::open(&dir.0, keep_all()).unwrap();
    assert!(!first.exists());
    assert_eq!(store.blocks().len(), 3);
    assert_eq!(
        store
            .profile(&query(None, "cpu", 0, 4 * HOUR))
            .unwrap()
            .total(0),
        3
    );
}

#[test]
fn files_are_private() {
    let dir = TempDir::new("perms");
    three_hours(&dir);
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir.0), 0o700);
    let store = Store::open(&dir.0, keep_all()).unwrap();
    for b in store.blocks() {
        assert_eq!(mode(&b.path), 0o700);
        for f in fs::read_dir(&b.path).unwrap() {
            assert_eq!(mode(&f.unwrap().path()), 0o600);
        }
    }
}

#[test]
fn closed_partitions_are_compacted() {
    let dir = TempDir::new("compact");
    let options = StoreOptions {
        partition: Duration::from_secs(60),
        ..keep_all()
    };
    let mut store = Store::open(&dir.0, options).unwrap();
    for i in 0..3 {
        store
            .append(&batch(
                "api",
                "cpu",
                MINUTE + i,
                &[(&["F", "Main"], 1, &[tid(i)])],
            ))
            .unwrap();
        store.flush().unwrap();
    }
    assert_eq!(store.blocks().len(), 3);
    // A batch in the next minute closes the first one, which the flush compacts.
    store
        .append(&batch(
            "api",
            "cpu",
            2 * MINUTE,
            &[(&["G", "Main"], 5, &[])],
        ))
        .unwrap();
    store.flush().unwrap();
    assert_eq!(store.blocks().len(), 2);
    let merged = &store.blocks()[0].meta;
    assert_eq!(merged.compacted_from.len(), 3);
    assert_eq!((merged.min_time, merged.max_time), (MINUTE, MINUTE + 2));
    assert_eq!(merged.samples_appended, 3);
    assert_eq!(merged.rows.stacks, 2);
    assert_eq!(store.compact().unwrap(), 0);
    drop(store);
    let store = Store::open(&dir.0, keep_all()).unwrap();
    assert_eq!(store.blocks().len(), 2);
    let p = store.profile(&query(None, "cpu", 0, 3 * MINUTE)).unwrap();
    assert_eq!(p.total(0), 8);
    assert_eq!(p.samples.len(), 4);
}

#[test]
fn a_head_spanning_partitions_gives_each_block_only_what_its_rows_use() {
    let dir = TempDir::new("split-head");
    let options = StoreOptions {
        partition: Duration::from_secs(60),
        ..keep_all()
    };
    let mut store = Store::open(&dir.0, options).unwrap();
    let web = [(&["F", "Main"][..], 3, &[tid(1)][..])];
    let api = [(&["G", "Run", "Main"][..], 5, &[][..])];
    store
        .append(&batch("web", "cpu", MINUTE - 1, &web))
        .unwrap();
    store.append(&batch("api", "cpu", MINUTE, &api)).unwrap();
    store.flush().unwrap();
    assert_eq!(store.blocks().len(), 2, "one block per partition");
    let services = |meta: &BlockMeta| -> Vec<String> {
        meta.series
            .iter()
            .flat_map(|s| &s.labels)
            .filter(|(k, _)| k == "service_name")
            .map(|(_, v)| v.clone())
            .collect()
    };
    let (first, second) = (&store.blocks()[0].meta, &store.blocks()[1].meta);
    assert_eq!(services(first), ["web"]);
    assert_eq!(services(second), ["api"]);
    assert_eq!((first.rows.functions, first.rows.label_sets), (2, 1));
    assert_eq!((second.rows.functions, second.rows.label_sets), (3, 1));
    for (service, from, expected) in [
        ("web", 0, vec![entry(&["F", "Main"], &[tid(1)], 3)]),
        ("api", MINUTE, vec![entry(&["G", "Run", "Main"], &[], 5)]),
    ] {
        let q = query(Some(service), "cpu", from, from + MINUTE);
        assert_eq!(
            flat(&store.profile(&q).unwrap()),
            expected.into_iter().collect()
        );
    }
}

/// A stored sample row: (series, stack, labels, time, value).
type Row = (u32, u32, u32, i64, i64);

/// The rows of a block's `samples.parquet`, and its row groups' sizes.
fn stored_rows(block: &BlockInfo) -> (Vec<Row>, Vec<i64>) {
    let file = fs::File::open(block.path.join(block::SAMPLES)).unwrap();
    let builder =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
    let groups = builder
        .metadata()
        .row_groups()
        .iter()
        .map(|g| g.num_rows())
        .collect();
    let mut rows = Vec::new();
    for batch in builder.build().unwrap() {
        let batch = batch.unwrap();
        let c = SampleColumns::of(&batch).unwrap();
        for i in 0..batch.num_rows() {
            rows.push((
                c.series.value(i),
                c.stack.value(i),
                c.labels.value(i),
                c.time.value(i),
                c.value.value(i),
            ));
        }
    }
    (rows, groups)
}

#[test]
fn compacted_blocks_are_sorted_with_small_series_sharing_a_row_group() {
    let dir = TempDir::new("sorted");
    let options = StoreOptions {
        partition: Duration::from_secs(60),
        ..keep_all()
    };
    let mut store = Store::open(&dir.0, options).unwrap();
    // Stacks and series in a different order in each flush, so concatenating the inputs would
    // not be sorted.
    let stacks: [&[&str]; 3] = [&["C", "Main"], &["B", "Main"], &["A", "Main"]];
    for i in 0..3 {
        for (service, pt) in [("api", "cpu"), ("api", "wall"), ("worker", "cpu")] {
            let samples: Vec<TestSample> = (0..3)
                .map(|k| (stacks[(i + k) % 3], 1 + k as i64, &[][..]))
                .collect();
            store
                .append(&batch(service, pt, MINUTE + i as i64, &samples))
                .unwrap();
        }
        store.flush().unwrap();
    }
    store
        .append(&batch("api", "cpu", 2 * MINUTE, &[(&["A"], 1, &[])]))
        .unwrap();
    store.flush().unwrap();
    let compacted = &store.blocks()[0];
    assert_eq!(compacted.meta.compacted_from.len(), 3);
    let (rows, groups) = stored_rows(compacted);
    assert_eq!(rows.len(), 27);
    assert!(
        rows.is_sorted_by_key(|&(series, stack, labels, time, _)| (series, time, stack, labels)),
        "{rows:?}"
    );
    assert_eq!(groups, vec![27], "small series share a row group");
    assert_eq!(block::rows_per_series(compacted).unwrap(), [9, 9, 9]);
    // Functions by name, though the first flush saw C first.
    let names: Vec<String> = block::read_dicts(compacted)
        .unwrap()
        .functions
        .into_iter()
        .map(|f| f.name)
        .collect();
    assert_eq!(names, ["A", "B", "C", "Main"]);
    // Each series answers alone, though read with its neighbours.
    let total = |service, pt| {
        store
            .profile(&query(Some(service), pt, MINUTE, 2 * MINUTE))
            .unwrap()
            .total(0)
    };
    assert_eq!(total("api", "cpu"), 18);
    assert_eq!(total("api", "wall"), 18);
    assert_eq!(total("worker", "cpu"), 18);
    assert_eq!(total("worker", "wall"), 0);
}

#[test]
fn format_1_0_blocks_with_one_row_group_for_all_series_are_read() {
    let dir = TempDir::new("v1_0");
    let mut store = Store::open(&dir.0, keep_all()).unwrap();
    store
        .append(&batch("api", "cpu", HOUR, &[(&["A"], 1, &[tid(1)])]))
        .unwrap();
    store
        .append(&batch("worker", "cpu", HOUR, &[(&["B"], 2, &[])]))
        .unwrap();
    store
        .append(&batch("api", "cpu", HOUR + 1, &[(&["A"], 4, &[tid(1)])]))
        .unwrap();
    store.flush().unwrap();
    let block = store.blocks()[0].clone();
    drop(store);
    // Rewrite the samples as 1.0 could have written them: one row group, unsorted.
    let (rows, groups) = stored_rows(&block);
    assert_eq!(groups.len(), 1, "small series share a row group");
    let mut h = head::Head::new();
    for &(series, stack, labels, time, value) in rows.iter().rev() {
        h.push_row(series, time, stack, labels, value);
    }
    let path = block.path.join(block::SAMPLES);
    fs::remove_file(&path).unwrap();
    let samples = h.record_batch();
    let mut writer = parquet::arrow::ArrowWriter::try_new(
        fs::File::create(&path).unwrap(),
        samples.schema(),
        None,
    )
    .unwrap();
    writer.write(&samples).unwrap();
    writer.close().unwrap();
    let meta = block.path.join(block::META);
    let text = fs::read_to_string(&meta).unwrap();
    fs::write(
        &meta,
        text.replace("\"format_minor\": 1", "\"format_minor\": 0"),
    )
    .unwrap();

    let store = Store::open(&dir.0, keep_all()).unwrap();
    assert!(store.problems().is_empty(), "{:?}", store.problems());
    assert_eq!(store.blocks()[0].meta.format_minor, 0);
    assert_eq!(stored_rows(&store.blocks()[0]).1.len(), 1);
    let total = |service| {
        store
            .profile(&query(Some(service), "cpu", 0, 2 * HOUR))
            .unwrap()
            .total(0)
    };
    assert_eq!((total("api"), total("worker")), (5, 2));
}

#[test]
fn breadth_first_numbering_keeps_every_stack() {
    let mut h = head::Head::new();
    let names: Vec<Function> = ["Main", "A", "B", "C", "D"].map(function).to_vec();
    let ids: Vec<u32> = names
        .iter()
        .map(|f| h.interner.intern_function(f).unwrap())
        .collect();
    // Leaf first; interned deepest branch first so first-seen order is not breadth first.
    let stacks: Vec<Vec<u32>> = vec![
        vec![ids[4], ids[3], ids[2], ids[0]],
        vec![ids[1], ids[0]],
        vec![ids[3], ids[1], ids[0]],
        vec![ids[2], ids[0]],
        vec![ids[0]],
    ];
    let leaves: Vec<u32> = stacks
        .iter()
        .map(|s| h.interner.intern_stack(s).unwrap())
        .collect();
    let mut dicts = h.interner.dicts.clone();
    let new_ids = dicts.breadth_first();
    let mut out = Vec::new();
    for (stack, leaf) in stacks.iter().zip(leaves) {
        dicts.resolve(new_ids[leaf as usize], &mut out);
        assert_eq!(&out, stack);
    }
    let parents: Vec<u32> = dicts.stacks.iter().map(|n| n.parent).collect();
    let roots = parents.iter().filter(|&&p| p == head::NO_PARENT).count();
    assert_eq!(roots, 1);
    assert!(parents[roots..].is_sorted(), "{parents:?}");
    assert!(parents[roots..]
        .iter()
        .enumerate()
        .all(|(i, &p)| (p as usize) < i + roots));
}

#[test]
fn profiles_merge_equal_samples_across_many_blocks() {
    let dir = TempDir::new("many");
    let options = StoreOptions {
        partition: Duration::from_secs(60),
        ..keep_all()
    };
    let mut store = Store::open(&dir.0, options).unwrap();
    let mut expected = Flat::new();
    for minute in 0..9 {
        // Each block interns its stacks in a different order, so ids differ between blocks.
        let mut samples: Vec<TestSample> = vec![
            (&["Hot", "Main"], 1, &[]),
            (&["Cold", "Main"], 10, &[]),
            (&["Hot", "Main"], 100, &[]),
        ];
        samples.rotate_left(minute % 3);
        let labels = [tid(1)];
        samples[2].2 = &labels;
        for (stack, value, labels) in &samples {
            *expected.entry(entry(stack, labels, 0).0).or_insert(0) += value;
        }
        store
            .append(&batch("api", "cpu", (minute as i64 + 1) * MINUTE, &samples))
            .unwrap();
        store.flush().unwrap();
    }
    assert!(store.blocks().len() >= 8);
    let q = query(None, "cpu", 0, HOUR);
    assert_eq!(flat(&store.profile(&q).unwrap()), expected);
    // Without sample labels, samples that differed only in them are one.
    let no_labels = Query {
        sample_labels: SampleLabels::Only(Vec::new()),
        ..q.clone()
    };
    let p = store.profile(&no_labels).unwrap();
    assert_eq!(p.samples.len(), 2);
    assert!(p.samples.iter().all(|s| s.labels.is_empty()));
    assert_eq!(p.total(0), 9 * 111);
}

/// An answer large enough to be spelled out on several threads has every sample once, and
/// exactly the functions its samples use.
#[test]
fn a_large_profile_spelled_out_on_several_threads_has_every_sample_once() {
    let dir = TempDir::new("large");
    let mut store = Store::open(&dir.0, keep_all()).unwrap();
    // A function no sample of the answer uses, interned first.
    store
        .append(&batch("other", "cpu", MINUTE, &[(&["Unused"], 1, &[])]))
        .unwrap();
    let names: Vec<[String; 3]> = (0..300)
        .map(|j| {
            [
                format!("Leaf{j}"),
                format!("Mid{}", j % 7),
                "Main".to_string(),
            ]
        })
        .collect();
    let stacks: Vec<Vec<&str>> = names
        .iter()
        .map(|n| n.iter().map(String::as_str).collect())
        .collect();
    let labels: Vec<[(&str, LabelValue); 1]> = (0..400).map(|t| [tid(t)]).collect();
    let mut expected = Flat::new();
    for minute in 1..3 {
        let mut samples: Vec<TestSample> = Vec::new();
        for (j, stack) in stacks.iter().enumerate() {
            for (t, labels) in labels.iter().enumerate() {
                let value = 1 + ((j * 31 + t * 7 + minute) % 13) as i64;
                samples.push((stack, value, labels));
                *expected.entry(entry(stack, labels, 0).0).or_insert(0) += value;
            }
        }
        store
            .append(&batch("api", "cpu", minute as i64 * MINUTE, &samples))
            .unwrap();
    }
    store.flush().unwrap();
    let p = store.profile(&query(Some("api"), "cpu", 0, HOUR)).unwrap();
    assert_eq!(p.samples.len(), 120_000);
    assert_eq!(flat(&p), expected);
    let mut used: Vec<&str> = p.functions.iter().map(|f| f.name.as_str()).collect();
    used.sort_unstable();
    used.dedup();
    assert_eq!(
        (used.len(), p.functions.len()),
        (308, 308),
        "each used function once"
    );
    assert!(!used.contains(&"Unused"));
}

#[test]
fn only_the_sample_labels_asked_for_are_kept() {
    let dir = TempDir::new("keep");
    let mut store = Store::open(&dir.0, keep_all()).unwrap();
    let name = |n: &str| ("thread_name", LabelValue::Str(n.into()));
    store
        .append(&batch(
            "api",
            "cpu",
            HOUR,
            &[
                (&["F"], 1, &[tid(1), name("worker")]),
                (&["F"], 2, &[tid(2), name("worker")]),
                (&["F"], 4, &[tid(3), name("main")]),
            ],
        ))
        .unwrap();
    let q = Query {
        sample_labels: SampleLabels::Only(vec!["thread_name".into()]),
        ..query(None, "cpu", HOUR, HOUR + 1)
    };
    let expected: Flat = [
        entry(&["F"], &[name("worker")], 3),
        entry(&["F"], &[name("main")], 4),
    ]
    .into_iter()
    .collect();
    assert_eq!(flat(&store.profile(&q).unwrap()), expected);
    store.flush().unwrap();
    assert_eq!(flat(&store.profile(&q).unwrap()), expected);
}

/// Three one-minute blocks of service "api", 1, 2 and 4 in value.
fn three_minutes(options: StoreOptions) -> (TempDir, Store) {
    let dir = TempDir::new("cache");
    let mut store = Store::open(&dir.0, options).unwrap();
    for (minute, value) in [(1, 1), (2, 2), (3, 4)] {
        let samples: [TestSample; 2] = [(&["Hot", "Main"], value, &[]), (&["Main"], 0, &[])];
        store
            .append(&batch("api", "cpu", minute * MINUTE, &samples))
            .unwrap();
        store.flush().unwrap();
    }
    (dir, store)
}

fn minute_options(query_cache_bytes: usize) -> StoreOptions {
    StoreOptions {
        partition: Duration::from_secs(60),
        query_cache_bytes,
        ..keep_all()
    }
}

#[test]
fn queries_reuse_the_dictionaries_of_blocks_they_read() {
    let (_dir, store) = three_minutes(minute_options(1 << 20));
    let everything = query(None, "cpu", 0, HOUR);
    // A timeline without sample matchers reads no dictionary at all.
    let points = store.series(&everything, Duration::from_secs(60)).unwrap();
    assert_eq!(points.iter().map(|(_, v)| v).sum::<i64>(), 7);
    assert_eq!(store.cache.usage().0, 0);
    assert_eq!(store.profile(&everything).unwrap().total(0), 7);
    let (blocks, bytes) = store.cache.usage();
    assert_eq!(blocks, 3);
    // Asked again (and for a part): answered from the cache, which does not grow.
    assert_eq!(store.profile(&everything).unwrap().total(0), 7);
    let second = query(None, "cpu", 2 * MINUTE, 3 * MINUTE);
    assert_eq!(store.profile(&second).unwrap().total(0), 2);
    assert_eq!(store.cache.usage(), (blocks, bytes));
}

#[test]
fn past_its_budget_the_cache_starts_afresh() {
    let (_dir, store) = three_minutes(minute_options(1));
    for (minute, total) in [(1, 1), (2, 2), (3, 4), (1, 1)] {
        let q = query(None, "cpu", minute * MINUTE, (minute + 1) * MINUTE);
        assert_eq!(store.profile(&q).unwrap().total(0), total);
        // Each query finds the previous one's epoch over budget and starts a new one.
        assert_eq!(store.cache.usage().0, 1, "minute {minute}");
    }
    let everything = query(None, "cpu", 0, HOUR);
    assert_eq!(store.profile(&everything).unwrap().total(0), 7);
    assert_eq!(store.cache.usage().0, 3);
}

#[test]
fn blocks_deleted_by_retention_or_compaction_leave_the_cache() {
    let (_dir, mut store) = three_minutes(minute_options(1 << 20));
    let everything = query(None, "cpu", 0, HOUR);
    assert_eq!(store.profile(&everything).unwrap().total(0), 7);
    assert_eq!(store.cache.usage().0, 3);
    // Retention deletes the first minute: its ids go, and it is not answered from the cache.
    store.options.retention_age = Duration::from_secs(60);
    let deleted = store.apply_retention(2 * MINUTE + MINUTE / 2).unwrap();
    assert_eq!(deleted.len(), 1);
    assert_eq!(store.cache.usage().0, 2);
    assert_eq!(store.profile(&everything).unwrap().total(0), 6);
    // Compaction replaces two blocks of one minute by one: the inputs' ids go.
    store.options.retention_age = keep_all().retention_age;
    store
        .append(&batch(
            "api",
            "cpu",
            3 * MINUTE + 1,
            &[(&["Hot", "Main"], 8, &[])],
        ))
        .unwrap();
    store.flush().unwrap();
    assert_eq!(store.profile(&everything).unwrap().total(0), 14);
    store
        .append(&batch("api", "cpu", 4 * MINUTE, &[(&["Main"], 16, &[])]))
        .unwrap();
    store.flush().unwrap();
    let compacted = store
        .blocks()
        .iter()
        .find(|b| !b.meta.compacted_from.is_empty())
        .expect("minute 3 compacted")
        .clone();
    assert_eq!(compacted.meta.compacted_from.len(), 2);
    let cached = store.cache.usage().0;
    assert_eq!(cached, 1, "only minute 2 is left of what was read");
    assert_eq!(store.profile(&everything).unwrap().total(0), 30);
    assert_eq!(store.cache.usage().0, 3);
}

#[test]
fn concurrent_queries_agree_while_the_cache_turns_over() {
    let (_dir, store) = three_minutes(minute_options(1));
    let expected = flat(&store.profile(&query(None, "cpu", 0, HOUR)).unwrap());
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for minute in 0..20 {
                    let q = query(None, "cpu", 0, HOUR - minute);
                    assert_eq!(flat(&store.profile(&q).unwrap()), expected);
                }
            });
        }
    });
}

#[test]
fn a_head_spanning_partitions_flushes_one_block_each() {
    let dir = TempDir::new("split");
    let options = StoreOptions {
        partition: Duration::from_secs(60),
        ..keep_all()
    };
    let mut store = Store::open(&dir.0, options).unwrap();
    store
        .append(&batch(
            "api",
            "cpu",
            MINUTE,
            &[(&["F"], 1, &[]), (&["G"], 1, &[])],
        ))
        .unwrap();
    store
        .append(&batch("api", "cpu", 2 * MINUTE + 1, &[(&["F"], 2, &[])]))
        .unwrap();
    store.flush().unwrap();
    let metas: Vec<_> = store.blocks().iter().map(|b| b.meta.clone()).collect();
    assert_eq!(metas.len(), 2);
    assert_eq!((metas[0].min_time, metas[0].samples_appended), (MINUTE, 2));
    assert_eq!(
        (metas[1].min_time, metas[1].samples_appended),
        (2 * MINUTE + 1, 1)
    );
}

#[test]
fn timeline_sums_per_step() {
    let dir = TempDir::new("timeline");
    let mut store = Store::open(&dir.0, keep_all()).unwrap();
    for (t, v) in [(0, 1), (10, 2), (15, 4), (25, 8), (30, 16)] {
        store
            .append(&batch("api", "cpu", HOUR + t, &[(&["F"], v, &[])]))
            .unwrap();
    }
    store.flush().unwrap();
    store
        .append(&batch("api", "cpu", HOUR + 29, &[(&["F"], 32, &[])]))
        .unwrap();
    let q = query(Some("api"), "cpu", HOUR, HOUR + 30);
    let points = store.series(&q, Duration::from_nanos(10)).unwrap();
    assert_eq!(points, vec![(HOUR, 1), (HOUR + 10, 6), (HOUR + 20, 40)]);
    assert!(matches!(
        store.series(&q, Duration::ZERO),
        Err(StoreError::InvalidQuery(_))
    ));
    let wide = query(None, "cpu", 0, i64::MAX);
    assert!(store
        .series(&wide, Duration::from_nanos(1))
        .unwrap_err()
        .to_string()
        .contains("larger step"));
}

#[test]
fn labels_and_profile_types_are_listed() {
    let dir = TempDir::new("labels");
    let mut store = Store::open(&dir.0, keep_all()).unwrap();
    store
        .append(&batch("api", "cpu", HOUR, &[(&["F"], 1, &[])]))
        .unwrap();
    store.flush().unwrap();
    store
        .append(&batch("worker", "alloc_size", HOUR, &[(&["F"], 1, &[])]))
        .unwrap();
    assert_eq!(
        store.label_names(),
        vec!["host_name", "process_id", "service_name"]
    );
    assert_eq!(store.label_values("service_name"), vec!["api", "worker"]);
    assert_eq!(store.label_values("nope"), Vec::<String>::new());
    let types: Vec<String> = store.profile_types().into_iter().map(|t| t.name).collect();
    assert_eq!(types, vec!["alloc_size", "cpu"]);
}

#[test]
fn known_profile_types_have_units() {
    let unit = |n| ProfileType::known(n).map(|t| t.unit);
    assert_eq!(unit("cpu").as_deref(), Some("nanoseconds"));
    assert_eq!(unit("wall").as_deref(), Some("nanoseconds"));
    assert_eq!(unit("lock_time").as_deref(), Some("nanoseconds"));
    assert_eq!(unit("alloc_samples").as_deref(), Some("count"));
    assert_eq!(unit("exception").as_deref(), Some("count"));
    assert_eq!(unit("lock_count").as_deref(), Some("count"));
    assert_eq!(unit("alloc_size").as_deref(), Some("bytes"));
    assert_eq!(unit("heap"), None);
    for name in ProfileType::KNOWN_NAMES {
        assert!(unit(name).is_some(), "{name}");
    }
}

#[test]
fn selectors_parse() {
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(
        parse_selector(r#"{service_name="x", process_id="1"}"#).unwrap(),
        pairs(&[("service_name", "x"), ("process_id", "1")])
    );
    assert_eq!(
        parse_selector(r#"a="q\"\\""#).unwrap(),
        pairs(&[("a", "q\"\\")])
    );
    assert_eq!(parse_selector("{}").unwrap(), pairs(&[]));
    for bad in [
        r#"{a="x""#,
        r#"a!="x""#,
        "a=x",
        r#"a="x" b="y""#,
        r#"="x""#,
        r#"a="x"#,
        r#"a="\n""#,
    ] {
        let err = parse_selector(bad).unwrap_err();
        assert!(
            matches!(err, StoreError::InvalidSelector { .. }),
            "{bad}: {err}"
        );
    }
}

#[test]
fn bad_input_is_refused_with_a_reason() {
    let dir = TempDir::new("bad");
    let too_slow = StoreOptions {
        flush_interval: Duration::from_secs(11),
        ..keep_all()
    };
    assert!(matches!(
        Store::open(&dir.0, too_slow),
        Err(StoreError::InvalidOptions(_))
    ));
    let no_partition = StoreOptions {
        partition: Duration::ZERO,
        ..keep_all()
    };
    assert!(matches!(
        Store::open(&dir.0, no_partition),
        Err(StoreError::InvalidOptions(_))
    ));
    let no_head = StoreOptions {
        head_bytes: 0,
        ..keep_all()
    };
    assert!(matches!(
        Store::open(&dir.0, no_head),
        Err(StoreError::InvalidOptions(_))
    ));
    let mut store = Store::open(&dir.0, keep_all()).unwrap();
    let mut b = batch("api", "cpu", HOUR, &[(&["F"], 1, &[])]);
    b.samples[0].stack = vec![7];
    assert!(store
        .append(&b)
        .unwrap_err()
        .to_string()
        .contains("function 7"));
    let mut b = batch("api", "cpu", HOUR, &[(&["F"], 1, &[])]);
    b.series.push(("service_name".into(), "again".into()));
    assert!(matches!(store.append(&b), Err(StoreError::InvalidBatch(_))));
    assert!(matches!(
        store.profile(&query(None, "cpu", HOUR, HOUR)),
        Err(StoreError::InvalidQuery(_))
    ));
    let file = dir.0.join("file");
    fs::write(&file, b"").unwrap();
    assert!(matches!(
        Store::open(file.join("sub"), keep_all()),
        Err(StoreError::Io { .. })
    ));
}

#[test]
fn a_second_store_on_one_directory_is_refused_until_the_first_closes() {
    let dir = TempDir::new("lock");
    let first = Store::open(&dir.0, keep_all()).unwrap();
    let err = Store::open(&dir.0, keep_all()).unwrap_err();
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains(&dir.0.display().to_string())
            && message.contains("another clrscope agent"),
        "{message}"
    );
    let mode = fs::metadata(dir.0.join(LOCK_FILE))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    drop(first);
    let store = Store::open(&dir.0, keep_all()).unwrap();
    assert!(store.problems().is_empty(), "the lock file is not a block");
}

#[test]
fn head_flushes_when_due_or_full() {
    let dir = TempDir::new("due");
    let options = StoreOptions {
        flush_interval: Duration::from_secs(10),
        ..keep_all()
    };
    let mut store = Store::open(&dir.0, options).unwrap();
    store
        .append(&batch("api", "cpu", HOUR, &[(&["F"], 1, &[])]))
        .unwrap();
    store.flush_if_due().unwrap();
    assert!(store.blocks().is_empty());
    store.options.flush_interval = Duration::ZERO;
    store.flush_if_due().unwrap();
    assert_eq!(store.blocks().len(), 1);
    store.options.flush_interval = Duration::from_secs(10);
    store.options.head_bytes = 1;
    store
        .append(&batch("api", "cpu", HOUR + 1, &[(&["F"], 1, &[])]))
        .unwrap();
    assert_eq!(store.blocks().len(), 2);
}

/// Writes a block through the real writer with hand-made (inconsistent) dictionaries.
fn crafted_block(dir: &Path, name: &str, dicts: &head::Dicts, stack: u32) {
    let mut h = head::Head::new();
    h.push_row(0, HOUR, stack, 0, 1);
    let meta = BlockMeta {
        format: FORMAT_NAME.into(),
        format_major: FORMAT_MAJOR,
        format_minor: FORMAT_MINOR,
        min_time: HOUR,
        max_time: HOUR,
        samples_appended: 1,
        rows: BlockRows {
            samples: 1,
            stacks: dicts.stacks.len() as u64,
            functions: dicts.functions.len() as u64,
            label_sets: dicts.label_sets.len() as u64,
        },
        series: dicts.series.clone(),
        compacted_from: Vec::new(),
        resolution: 0,
        dropped_labels: Vec::new(),
    };
    block::write(dir, name, dicts, h.record_batch(), &meta).unwrap();
}

#[test]
fn references_past_a_dictionary_are_reported_not_followed() {
    let dir = TempDir::new("refs");
    fs::create_dir_all(&dir.0).unwrap();
    let series = Series {
        profile_type: ProfileType::known("cpu").unwrap(),
        labels: Vec::new(),
    };
    let node = |parent, function| head::StackNode { parent, function };
    let dicts = head::Dicts {
        functions: vec![function("F")],
        stacks: vec![node(head::NO_PARENT, 0)],
        label_sets: vec![Vec::new()],
        series: vec![Arc::new(series)],
    };
    crafted_block(&dir.0, "00000000003600000000000-000001", &dicts, 7);
    // A parent pointing forward would make a cycle.
    let cyclic = head::Dicts {
        stacks: vec![node(1, 0), node(0, 0)],
        ..dicts.clone()
    };
    crafted_block(&dir.0, "00000000003600000000000-000002", &cyclic, 0);
    crafted_block(&dir.0, "00000000003600000000000-000003", &dicts, 0);
    let store = Store::open(&dir.0, keep_all()).unwrap();
    assert_eq!(store.blocks().len(), 3);
    let p = store.profile(&query(None, "cpu", 0, 2 * HOUR)).unwrap();
    assert_eq!(flat(&p), [entry(&["F"], &[], 1)].into_iter().collect());
    let problems = store.problems();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems
        .iter()
        .any(|p| p.message.contains("refers past a dictionary")));
    assert!(problems
        .iter()
        .any(|p| p.message.contains("stack node 0 refers past")));
}

#[test]
fn diff_lines_up_two_profiles() {
    let dir = TempDir::new("diff");
    let mut store = Store::open(&dir.0, keep_all()).unwrap();
    store
        .append(&batch(
            "api",
            "cpu",
            HOUR,
            &[(&["A", "Main"], 3, &[]), (&["B", "Main"], 1, &[])],
        ))
        .unwrap();
    store
        .append(&batch(
            "api",
            "cpu",
            2 * HOUR,
            &[(&["B", "Main"], 5, &[]), (&["C"], 2, &[])],
        ))
        .unwrap();
    let a = store.profile(&query(None, "cpu", HOUR, HOUR + 1)).unwrap();
    let b = store
        .profile(&query(None, "cpu", 2 * HOUR, 2 * HOUR + 1))
        .unwrap();
    let d = diff(&a, &b, 0);
    assert_eq!(d.sample_types[1], ValueType::new("new", "nanoseconds"));
    assert_eq!((d.start_unix_nanos, d.duration_nanos), (HOUR, HOUR + 1));
    let mut rows: Vec<(Vec<String>, Vec<i64>)> = d
        .samples
        .iter()
        .map(|s| {
            let names = s
                .stack
                .iter()
                .map(|&f| d.functions[f as usize].name.clone())
                .collect();
            (names, s.values.clone())
        })
        .collect();
    rows.sort();
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        rows,
        vec![
            (names(&["A", "Main"]), vec![3, 0]),
            (names(&["B", "Main"]), vec![1, 5]),
            (names(&["C"]), vec![0, 2]),
        ]
    );
    let everything = store
        .profile(&query(None, "cpu", i64::MIN, i64::MAX))
        .unwrap();
    let d = diff(&a, &everything, 0);
    assert_eq!((d.start_unix_nanos, d.duration_nanos), (i64::MIN, i64::MAX));
    assert_eq!(d.total(1), 11);
}

/// Samples of `p` by stack names only (labels dropped), as a flame graph merges them.
fn by_stack(p: &Profile) -> BTreeMap<Vec<String>, i64> {
    let mut out = BTreeMap::new();
    for ((stack, _), value) in flat(p) {
        *out.entry(stack).or_insert(0) += value;
    }
    out
}

#[test]
fn flame_profile_with_room_for_every_node_equals_the_profile() {
    let dir = TempDir::new("flame-all");
    let mut store = Store::open(&dir.0, keep_all()).unwrap();
    let span = [("span_id", LabelValue::Str("s1".into()))];
    let samples: &[TestSample] = &[
        (&["Leaf", "Mid", "Main"], 5, &[]),
        (&["Mid", "Main"], 2, &span),
        (&["Other", "Main"], 3, &[]),
        (&[], 4, &[]),
    ];
    store.append(&batch("app", "cpu", MINUTE, samples)).unwrap();
    store.flush().unwrap(); // one block ...
    store
        .append(&batch("app", "cpu", 2 * MINUTE, samples))
        .unwrap(); // ... and the head
    let mut q = query(Some("app"), "cpu", 0, HOUR);
    let whole = by_stack(&store.profile(&q).unwrap());
    assert_eq!(
        by_stack(&store.call_tree(&q, 100).unwrap().to_profile()),
        whole
    );
    assert_eq!(
        whole[&vec!["Leaf".to_string(), "Mid".into(), "Main".into()]],
        10
    );
    assert_eq!(whole[&Vec::<String>::new()], 8);

    q.sample_matchers = vec![("span_id".into(), LabelValue::Str("s1".into()))];
    let spans = store.call_tree(&q, 100).unwrap().to_profile();
    assert_eq!(
        by_stack(&spans),
        BTreeMap::from([(vec!["Mid".to_string(), "Main".into()], 4)])
    );
    assert!(store.call_tree(&q, 0).is_err());
}

#[test]
fn call_tree_cuts_to_max_nodes_and_keeps_the_cut_under_other() {
    let dir = TempDir::new("flame-cut");
    let mut store = Store::open(&dir.0, keep_all()).unwrap();
    // Main → Hot (1,000) and Main → 200 distinct cold leaves of 1 each, in two blocks.
    let names: Vec<String> = (0..200).map(|i| format!("Cold{i}")).collect();
    for (minute, half) in names.chunks(100).enumerate() {
        let mut samples: Vec<TestSample> = vec![(&["Hot", "Main"], 500, &[])];
        let stacks: Vec<[&str; 2]> = half.iter().map(|n| [n.as_str(), "Main"]).collect();
        samples.extend(stacks.iter().map(|s| (&s[..], 1, &[][..])));
        let time = (minute as i64 + 1) * MINUTE;
        store.append(&batch("app", "cpu", time, &samples)).unwrap();
        store.flush().unwrap();
    }
    let q = query(Some("app"), "cpu", 0, HOUR);
    let cut = by_stack(&store.call_tree(&q, 3).unwrap().to_profile());
    let s = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    assert_eq!(
        cut,
        BTreeMap::from([
            (s(&["Hot", "Main"]), 1000),
            (s(&[OTHER_FRAME, "Main"]), 200),
        ]),
        "Main, Hot and the cut below Main"
    );
    assert_eq!(cut.values().sum::<i64>(), 1200, "nothing is lost");
    // The largest nodes are the same whatever the order blocks are read in.
    assert_eq!(by_stack(&store.call_tree(&q, 2).unwrap().to_profile()), cut);
}

#[test]
fn a_data_directory_others_may_write_or_own_is_refused_one_they_may_read_is_made_private() {
    let dir = TempDir::new("unsafe-dir");
    fs::create_dir_all(&dir.0).unwrap();
    fs::set_permissions(&dir.0, fs::Permissions::from_mode(0o777)).unwrap();
    let err = Store::open(&dir.0, keep_all()).unwrap_err();
    assert!(matches!(err, StoreError::UnsafeDataDir { .. }), "{err}");
    assert!(err.to_string().contains("mode 0777"), "{err}");

    fs::set_permissions(&dir.0, fs::Permissions::from_mode(0o755)).unwrap();
    drop(Store::open(&dir.0, keep_all()).unwrap());
    let mode = fs::metadata(&dir.0).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700);

    // Another user's directory (needs root to make one).
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::chown(&dir.0, Some(65534), None).unwrap();
        let err = Store::open(&dir.0, keep_all()).unwrap_err();
        assert!(err.to_string().contains("owned by uid 65534"), "{err}");
    }
}

const SECOND: i64 = 1_000_000_000;

/// Minute blocks, then the default levels (10 minutes without span ids, 1 hour without thread
/// ids either), nothing deleted unless a test says so.
fn level_options() -> StoreOptions {
    let mut levels = Level::defaults();
    for level in &mut levels {
        level.retention_age = Duration::MAX;
    }
    StoreOptions {
        partition: Duration::from_secs(60),
        levels,
        full_detail_age: Duration::from_secs(1 << 40),
        ..keep_all()
    }
}

/// Three hours of two cpu batches a minute (at :07 and :37), three stacks on two threads each,
/// values that differ every batch, a `span_id` on some samples; then one batch at 3h+5s that
/// closes the last hour.
fn three_hours_of_batches() -> Vec<Batch> {
    let mut out = Vec::new();
    for m in 0..180 {
        for k in 0..2 {
            let time = m * MINUTE + k * 30 * SECOND + 7 * SECOND;
            let mut samples = Vec::new();
            for j in 0..3i64 {
                for thread in 0..2i64 {
                    let value = 1 + (m * 7 + k * 3 + j * 5 + thread) % 11;
                    let mut labels = vec![
                        tid(100 + thread),
                        ("thread_name", LabelValue::Str(format!("worker-{thread}"))),
                    ];
                    if (m + j) % 4 == 0 {
                        labels.push(("span_id", LabelValue::Str(format!("{m:016x}"))));
                    }
                    samples.push((j, value, labels));
                }
            }
            let names = [
                ["Leaf0", "Mid0", "Main"],
                ["Leaf1", "Mid1", "Main"],
                ["Leaf2", "Mid0", "Main"],
            ];
            let samples: Vec<TestSample> = samples
                .iter()
                .map(|(j, value, labels)| (&names[*j as usize][..], *value, &labels[..]))
                .collect();
            out.push(batch("api", "cpu", time, &samples));
        }
    }
    out.push(batch(
        "api",
        "cpu",
        3 * HOUR + 5 * SECOND,
        &[(&["Main"], 1, &[])],
    ));
    out
}

/// The sum of the values of the batches' samples in `[from, until)`: the ground truth.
fn appended_total(batches: &[Batch], from: i64, until: i64) -> i64 {
    batches
        .iter()
        .filter(|b| (from..until).contains(&b.timestamp_unix_nanos))
        .flat_map(|b| b.samples.iter().map(|s| s.value))
        .sum()
}

/// A store with `options` holding `batches`, flushed every ten minutes of data.
fn store_of(name: &str, options: StoreOptions, batches: &[Batch]) -> (TempDir, Store) {
    let dir = TempDir::new(name);
    let mut store = Store::open(&dir.0, options).unwrap();
    for (i, b) in batches.iter().enumerate() {
        store.append(b).unwrap();
        if i % 20 == 19 {
            store.flush().unwrap();
        }
    }
    store.flush().unwrap();
    (dir, store)
}

/// The same store without levels: the fine data levels are judged against.
fn fine_store_of(name: &str, batches: &[Batch]) -> (TempDir, Store) {
    let options = StoreOptions {
        levels: Vec::new(),
        ..level_options()
    };
    store_of(name, options, batches)
}

fn resolutions(blocks: &[&BlockInfo]) -> Vec<i64> {
    blocks.iter().map(|b| b.meta.resolution).collect()
}

fn count(v: &[i64], r: i64) -> usize {
    v.iter().filter(|&&x| x == r).count()
}

fn thread_names_only(q: &Query) -> Query {
    Query {
        sample_labels: SampleLabels::Only(vec!["thread_name".into()]),
        ..q.clone()
    }
}

#[test]
fn levels_answer_with_the_totals_of_the_fine_data_over_any_range() {
    let batches = three_hours_of_batches();
    let (_dir, store) = store_of("levels", level_options(), &batches);
    let (_fine_dir, fine) = fine_store_of("fine", &batches);
    let all: Vec<&BlockInfo> = store.blocks().iter().collect();
    let r = resolutions(&all);
    assert_eq!(count(&r, 600 * SECOND), 18, "18 ten-minute blocks");
    assert_eq!(count(&r, HOUR), 3, "3 hour blocks");
    for b in store.blocks().iter().filter(|b| b.meta.resolution > 0) {
        assert_eq!(b.meta.format_major, FORMAT_MAJOR_DOWNSAMPLED);
        assert_eq!(
            (b.meta.min_time, b.meta.max_time),
            (b.meta.min_time, b.meta.min_time)
        );
    }
    let hour_block = store
        .blocks()
        .iter()
        .find(|b| b.meta.resolution == HOUR)
        .unwrap();
    assert_eq!(
        hour_block.meta.dropped_labels,
        vec!["span_id", "thread_id", "trace_id"]
    );
    let ranges = [
        (0, 3 * HOUR),
        (HOUR, 2 * HOUR),
        (10 * MINUTE, 50 * MINUTE),
        (7 * MINUTE + 30 * SECOND, 2 * HOUR + 13 * MINUTE),
        (59 * MINUTE, 61 * MINUTE + 20 * SECOND),
        (5 * SECOND, 3 * HOUR - 5 * SECOND),
        (HOUR + 37 * SECOND, HOUR + 38 * SECOND),
    ];
    for (from, until) in ranges {
        let q = query(Some("api"), "cpu", from, until);
        let truth = appended_total(&batches, from, until);
        let what = format!("[{from}, {until})");
        assert_eq!(store.profile(&q).unwrap().total(0), truth, "profile {what}");
        assert_eq!(
            store.call_tree(&q, 1000).unwrap().total(),
            truth,
            "call tree {what}"
        );
        for step in [10 * SECOND, 10 * 60 * SECOND, HOUR] {
            let points = store.series(&q, Duration::from_nanos(step as u64)).unwrap();
            let fine_points = fine.series(&q, Duration::from_nanos(step as u64)).unwrap();
            assert_eq!(points, fine_points, "series {what} step {step}");
        }
        // Stack by stack, grouped by the labels every level keeps.
        let q = thread_names_only(&q);
        assert_eq!(
            flat(&store.profile(&q).unwrap()),
            flat(&fine.profile(&q).unwrap()),
            "profile by thread name {what}"
        );
    }
}

/// Level blocks made one series per pass (the smallest budget) answer as those made in one
/// pass, and with the fine data's totals: no series lost, merged twice or mixed with another.
#[test]
fn level_blocks_made_a_series_at_a_time_answer_as_those_made_at_once() {
    let mut batches = Vec::new();
    for b in three_hours_of_batches() {
        let mut web = b.clone();
        web.series[0].1 = "web".into();
        let mut wall = b.clone();
        wall.profile_type = ProfileType::known("wall").unwrap();
        batches.extend([b, web, wall]);
    }
    let per_series = StoreOptions {
        level_pass_rows: 1,
        ..level_options()
    };
    let (_dir, store) = store_of("passes", per_series, &batches);
    let (_once_dir, once) = store_of("one-pass", level_options(), &batches);
    let levels = |s: &Store| {
        let mut v: Vec<(i64, i64, u64)> = s
            .blocks()
            .iter()
            .filter(|b| b.meta.resolution > 0)
            .map(|b| (b.meta.resolution, b.meta.min_time, b.meta.rows.samples))
            .collect();
        v.sort();
        v
    };
    assert_eq!(levels(&store), levels(&once));
    assert_eq!(
        count(
            &resolutions(&store.blocks().iter().collect::<Vec<_>>()),
            HOUR
        ),
        3
    );
    for (service, pt) in [("api", "cpu"), ("web", "cpu"), ("api", "wall")] {
        // Whole hours (hour blocks) and whole ten minutes (ten-minute blocks, thread ids kept).
        for (from, until) in [(0, 3 * HOUR), (10 * MINUTE, 50 * MINUTE)] {
            let q = query(Some(service), pt, from, until);
            let what = format!("{service} {pt} [{from}, {until})");
            let truth: i64 = batches
                .iter()
                .filter(|b| b.series[0].1 == service && b.profile_type.name == pt)
                .filter(|b| (from..until).contains(&b.timestamp_unix_nanos))
                .flat_map(|b| b.samples.iter().map(|s| s.value))
                .sum();
            let profile = store.profile(&q).unwrap();
            assert_eq!(profile.total(0), truth, "{what}");
            assert_eq!(flat(&profile), flat(&once.profile(&q).unwrap()), "{what}");
        }
    }
}

#[test]
fn queries_read_the_coarsest_level_the_range_and_step_allow() {
    let batches = three_hours_of_batches();
    let (_dir, store) = store_of("choice", level_options(), &batches);
    let plan = |from, until, step: Option<i64>, thread: bool| {
        let mut q = query(Some("api"), "cpu", from, until);
        if thread {
            q.sample_matchers = vec![("thread_id".into(), LabelValue::Num(100))];
        }
        resolutions(&store.plan(&q, step).blocks)
    };
    let ten = 600 * SECOND;
    // Three whole hours: the hour blocks, nothing else.
    assert_eq!(plan(0, 3 * HOUR, None, false), vec![HOUR; 3]);
    assert_eq!(plan(0, 3 * HOUR, Some(HOUR), false), vec![HOUR; 3]);
    // Steps of ten minutes: ten-minute blocks; of 10 s: minute blocks.
    assert_eq!(plan(0, 3 * HOUR, Some(ten), false), vec![ten; 18]);
    assert_eq!(plan(0, 3 * HOUR, Some(10 * SECOND), false), vec![0; 180]);
    // Unaligned edges: minutes at the edges, ten-minute blocks, the hour in the middle.
    let r = plan(55 * MINUTE, 2 * HOUR + 12 * MINUTE, None, false);
    assert_eq!((count(&r, HOUR), count(&r, ten), count(&r, 0)), (1, 1, 7));
    // One minute: its minute block.
    assert_eq!(plan(HOUR, HOUR + MINUTE, None, false), vec![0]);
    // A thread id to match: not the hour level, which dropped it.
    assert_eq!(plan(0, 3 * HOUR, None, true), vec![ten; 18]);
    let mut q = query(Some("api"), "cpu", 0, 3 * HOUR);
    q.sample_matchers = vec![("thread_id".into(), LabelValue::Num(100))];
    let truth: i64 = batches
        .iter()
        .filter(|b| b.timestamp_unix_nanos < 3 * HOUR)
        .flat_map(|b| &b.samples)
        .filter(|s| {
            s.labels
                .contains(&("thread_id".to_string(), LabelValue::Num(100)))
        })
        .map(|s| s.value)
        .sum();
    assert_eq!(store.profile(&q).unwrap().total(0), truth);
    // An answer that reads the hour level has the labels it keeps, from every source alike.
    let p = store
        .profile(&query(Some("api"), "cpu", 30 * MINUTE, 3 * HOUR))
        .unwrap();
    let keys: BTreeSet<String> = p
        .samples
        .iter()
        .flat_map(|s| s.labels.iter().map(|(k, _)| k.clone()))
        .collect();
    assert_eq!(keys, BTreeSet::from(["thread_name".to_string()]));
}

/// Two days and two hours of one batch every 20 minutes (at :07, :27, :47), two stacks on two
/// threads with values that differ every batch; then one batch at 50 h + 5 s.
fn two_days_of_sparse_batches() -> Vec<Batch> {
    let mut out = Vec::new();
    for i in 0..150i64 {
        let time = i * 20 * MINUTE + 7 * MINUTE;
        let labels = |thread: i64| {
            vec![
                tid(100 + thread),
                ("thread_name", LabelValue::Str(format!("worker-{thread}"))),
            ]
        };
        let (a, b) = (labels(0), labels(1));
        let samples: Vec<TestSample> = vec![
            (&["Leaf0", "Main"][..], 1 + i % 13, &a[..]),
            (&["Leaf1", "Main"][..], 2 + i % 5, &b[..]),
            (&["Leaf0", "Main"][..], 3 + i % 7, &b[..]),
        ];
        out.push(batch("api", "cpu", time, &samples));
    }
    out.push(batch(
        "api",
        "cpu",
        50 * HOUR + 5 * SECOND,
        &[(&["Main"], 1, &[])],
    ));
    out
}

#[test]
fn a_day_level_answers_ranges_of_days_with_the_same_totals() {
    const DAY: i64 = 24 * HOUR;
    let batches = two_days_of_sparse_batches();
    let (_dir, store) = store_of("days", level_options(), &batches);
    let (_fine_dir, fine) = fine_store_of("days-fine", &batches);
    let all: Vec<&BlockInfo> = store.blocks().iter().collect();
    let r = resolutions(&all);
    assert_eq!(count(&r, HOUR), 50, "50 hour blocks");
    assert_eq!(count(&r, DAY), 2, "the two closed days, not the open third");
    let plan = |from, until, step: Option<i64>| {
        resolutions(
            &store
                .plan(&query(Some("api"), "cpu", from, until), step)
                .blocks,
        )
    };
    assert_eq!(plan(0, 2 * DAY, None), vec![DAY; 2]);
    // A day's timeline in hours reads hours; in days, days.
    assert_eq!(plan(0, 2 * DAY, Some(HOUR)), vec![HOUR; 48]);
    assert_eq!(plan(0, 2 * DAY, Some(DAY)), vec![DAY; 2]);
    // Unaligned: the whole day inside, hours around it, then finer levels at the edges.
    let r = plan(3 * HOUR + 7 * MINUTE, DAY + 30 * HOUR, None);
    assert_eq!((count(&r, DAY), count(&r, HOUR)), (1, 20 + 2));
    for (from, until) in [
        (0, 2 * DAY),
        (0, 50 * HOUR + MINUTE),
        (3 * HOUR + 7 * MINUTE, DAY + 30 * HOUR),
        (DAY - 20 * MINUTE, DAY + 20 * MINUTE),
    ] {
        let q = query(Some("api"), "cpu", from, until);
        let truth = appended_total(&batches, from, until);
        let what = format!("[{from}, {until})");
        assert_eq!(store.profile(&q).unwrap().total(0), truth, "profile {what}");
        assert_eq!(
            store.call_tree(&q, 100).unwrap().total(),
            truth,
            "tree {what}"
        );
        for step in [HOUR, DAY] {
            let step = Duration::from_nanos(step as u64);
            assert_eq!(
                store.series(&q, step).unwrap(),
                fine.series(&q, step).unwrap(),
                "series {what} step {step:?}"
            );
        }
        let q = thread_names_only(&q);
        assert_eq!(
            flat(&store.profile(&q).unwrap()),
            flat(&fine.profile(&q).unwrap()),
            "profile by thread name {what}"
        );
    }
}

#[test]
fn retention_keeps_totals_across_levels_and_deletes_covered_detail_first() {
    let batches = three_hours_of_batches();
    let (dir, store) = store_of("retention", level_options(), &batches);
    drop(store);
    // Full detail for an hour, ten minutes for two, hours for ever.
    let mut levels = level_options().levels;
    levels[0].retention_age = Duration::from_secs(2 * 3600);
    let options = StoreOptions {
        full_detail_age: Duration::from_secs(3600),
        levels,
        ..level_options()
    };
    let mut store = Store::open(&dir.0, options.clone()).unwrap();
    let now = 3 * HOUR + 10 * SECOND;
    store.apply_retention(now).unwrap();
    for b in store.blocks() {
        let end = b.meta.span().1;
        match b.meta.resolution {
            // The minute of the closing batch is covered by no level: it stays.
            0 => assert!(end > 2 * HOUR || b.meta.min_time >= 3 * HOUR, "{}", b.name),
            r if r == 600 * SECOND => assert!(end > HOUR, "{}", b.name),
            _ => {}
        }
    }
    for (from, until) in [(0, 3 * HOUR), (HOUR, 2 * HOUR + 17 * MINUTE + 3 * SECOND)] {
        let q = query(Some("api"), "cpu", from, until);
        let truth = appended_total(&batches, from, until);
        assert_eq!(
            store.profile(&q).unwrap().total(0),
            truth,
            "[{from}, {until})"
        );
        assert_eq!(store.call_tree(&q, 100).unwrap().total(), truth);
    }
    // Past what finer levels keep, a range's edge counts whole coarse spans that start in it.
    let q = query(Some("api"), "cpu", 25 * MINUTE, 3 * HOUR);
    assert_eq!(
        store.profile(&q).unwrap().total(0),
        appended_total(&batches, HOUR, 3 * HOUR)
    );
    let q = query(Some("api"), "cpu", 0, 90 * MINUTE + 7 * SECOND);
    assert_eq!(
        store.profile(&q).unwrap().total(0),
        appended_total(&batches, 0, 100 * MINUTE)
    );
    // The byte budget takes the blocks a coarser one covers first, the oldest first.
    let hours: u64 = store
        .blocks()
        .iter()
        .filter(|b| b.meta.resolution == HOUR || b.meta.min_time >= 3 * HOUR)
        .map(|b| b.bytes)
        .sum();
    drop(store);
    let mut store = Store::open(
        &dir.0,
        StoreOptions {
            retention_bytes: hours,
            ..options
        },
    )
    .unwrap();
    let before: Vec<BlockInfo> = store.blocks().to_vec();
    let deleted = store.apply_retention(now).unwrap();
    let gone: Vec<&BlockInfo> = before
        .iter()
        .filter(|b| deleted.contains(&b.name))
        .collect();
    assert!(
        gone.iter().all(|b| b.meta.resolution < HOUR),
        "only covered detail went"
    );
    assert_eq!(
        resolutions(&store.blocks().iter().collect::<Vec<_>>()),
        vec![HOUR, HOUR, HOUR, 0]
    );
    let q = query(Some("api"), "cpu", 0, 3 * HOUR);
    assert_eq!(
        store.profile(&q).unwrap().total(0),
        appended_total(&batches, 0, 3 * HOUR)
    );
    // Age at the horizon takes every level.
    store.options.retention_age = Duration::from_secs(3600);
    let deleted = store.apply_retention(now + 2 * HOUR).unwrap();
    assert_eq!(deleted.len(), 4);
}

#[test]
fn late_data_remakes_the_levels_it_falls_in() {
    let mut batches = three_hours_of_batches();
    let (dir, mut store) = store_of("late", level_options(), &batches);
    let late = batch(
        "api",
        "cpu",
        70 * MINUTE + 3 * SECOND,
        &[(&["Late"], 1000, &[])],
    );
    store.append(&late).unwrap();
    store.flush().unwrap();
    batches.push(late);
    let downsampled = store
        .blocks()
        .iter()
        .filter(|b| b.meta.resolution > 0)
        .count();
    assert_eq!(downsampled, 21, "remade, not added");
    drop(store);
    let store = Store::open(&dir.0, level_options()).unwrap();
    for (from, until) in [(0, 3 * HOUR), (HOUR, 2 * HOUR), (70 * MINUTE, 80 * MINUTE)] {
        let q = query(Some("api"), "cpu", from, until);
        assert_eq!(
            store.profile(&q).unwrap().total(0),
            appended_total(&batches, from, until)
        );
    }
}

#[test]
fn a_downsampled_block_that_says_it_is_of_full_detail_is_refused() {
    let batches = three_hours_of_batches();
    let (dir, store) = store_of("format2", level_options(), &batches);
    let b = store
        .blocks()
        .iter()
        .find(|b| b.meta.resolution > 0)
        .unwrap()
        .clone();
    drop(store);
    let path = b.path.join(block::META);
    let text = fs::read_to_string(&path).unwrap();
    fs::write(
        &path,
        text.replace("\"format_major\": 2", "\"format_major\": 1"),
    )
    .unwrap();
    let store = Store::open(&dir.0, level_options()).unwrap();
    let problems = store.problems();
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].path, b.path);
    assert!(
        problems[0].message.contains("resolution"),
        "{}",
        problems[0].message
    );
}

mod incidents {
    use super::*;
    use crate::incidents::{
        incident_exceptions, share_changes, CauseKind, IncidentCause, IncidentFilter,
        IncidentProcess, IncidentWindow,
    };
    use std::os::unix::fs::MetadataExt;

    const MIN_MS: i64 = 60_000;

    fn window() -> StoreOptions {
        StoreOptions {
            incident_window: IncidentWindow {
                before: Duration::from_secs(600),
                after: Duration::from_secs(300),
            },
            ..keep_all()
        }
    }

    fn firing(unix_ms: i64, pid: u64, rule: &str) -> IncidentCause {
        IncidentCause {
            unix_ms,
            kind: CauseKind::RuleTriggered,
            rule: Some(rule.to_string()),
            note: None,
            trigger: None,
            trigger_from_unix_ms: None,
            processes: vec![IncidentProcess {
                pid,
                service_name: format!("svc{pid}"),
            }],
        }
    }

    #[test]
    fn firings_within_a_window_make_one_incident_and_later_ones_another() {
        let dir = TempDir::new("incidents-merge");
        let store = Store::open(&dir.0, window()).unwrap();
        let t0 = 1_800_000_000_000;
        let first = store.incidents().record(firing(t0, 7, "cpu")).unwrap();
        assert_eq!(
            (first.from_unix_ms, first.until_unix_ms),
            (t0 - 10 * MIN_MS, t0 + 5 * MIN_MS)
        );
        // 4 minutes later: within the window, which now ends 5 minutes after it.
        let same = store
            .incidents()
            .record(firing(t0 + 4 * MIN_MS, 7, "gc"))
            .unwrap();
        assert_eq!(same.id, first.id);
        assert_eq!(same.until_unix_ms, t0 + 9 * MIN_MS);
        assert_eq!(same.rules, ["cpu", "gc"]);
        // Another process at the same time: an incident of its own.
        let other = store.incidents().record(firing(t0, 8, "cpu")).unwrap();
        assert_ne!(other.id, first.id);
        // Past the window's end: a new incident.
        let later = store
            .incidents()
            .record(firing(t0 + 9 * MIN_MS + 1, 7, "cpu"))
            .unwrap();
        assert_ne!(later.id, first.id);
        // A mark on both processes within all three windows joins them into one.
        let mark = IncidentCause {
            unix_ms: t0 + 5 * MIN_MS,
            kind: CauseKind::Mark,
            rule: None,
            note: Some("deploy".into()),
            trigger: None,
            trigger_from_unix_ms: None,
            processes: vec![first.processes[0].clone(), other.processes[0].clone()],
        };
        let merged = store.incidents().record(mark).unwrap();
        assert_eq!(merged.id, first.id);
        assert_eq!(merged.causes.len(), 5);
        assert_eq!(store.incidents().list(&IncidentFilter::default()).len(), 1);
        let by_rule = IncidentFilter {
            rule: Some("gc".into()),
            ..IncidentFilter::default()
        };
        assert_eq!(store.incidents().list(&by_rule).len(), 1);
        let by_time = IncidentFilter {
            from_unix_ms: Some(merged.until_unix_ms),
            ..IncidentFilter::default()
        };
        assert!(store.incidents().list(&by_time).is_empty());
    }

    #[test]
    fn before_ends_where_the_trigger_window_starts() {
        let dir = TempDir::new("incidents-onset");
        let store = Store::open(&dir.0, window()).unwrap();
        let t0 = 1_800_000_000_000;
        let plain = store.incidents().record(firing(t0, 7, "cpu")).unwrap();
        assert_eq!(plain.onset_unix_ms, t0);
        let judged = IncidentCause {
            trigger: Some("CPUUsage > 12 over 5 s".into()),
            trigger_from_unix_ms: Some(t0 + HOUR / 1_000_000 - 5_000),
            ..firing(t0 + HOUR / 1_000_000, 8, "cpu")
        };
        let incident = store.incidents().record(judged).unwrap();
        let onset = t0 + HOUR / 1_000_000 - 5_000;
        assert_eq!(incident.onset_unix_ms, onset);
        assert_eq!(incident.from_unix_ms, onset - 10 * MIN_MS);
        let ((_, before_end), (during_start, _)) = incident.ranges(onset + 60_000);
        assert_eq!((before_end, during_start), (onset, onset));
        // A file written before the onset was kept gets it from its causes.
        let file = dir
            .0
            .join(crate::incidents::INCIDENTS_DIR)
            .join(format!("incident-{:010}.json", incident.id));
        let mut json: serde_json::Value =
            serde_json::from_slice(&fs::read(&file).unwrap()).unwrap();
        json.as_object_mut().unwrap().remove("onset_unix_ms");
        fs::write(&file, json.to_string()).unwrap();
        drop(store);
        let store = Store::open(&dir.0, window()).unwrap();
        assert_eq!(
            store.incidents().get(incident.id).unwrap().onset_unix_ms,
            onset
        );
        assert_eq!(store.incidents().get(plain.id).unwrap(), plain);
    }

    #[test]
    fn incidents_are_private_files_that_outlive_the_store() {
        let dir = TempDir::new("incidents-reopen");
        let t0 = 1_800_000_000_000;
        let recorded = {
            let store = Store::open(&dir.0, window()).unwrap();
            store.incidents().record(firing(t0, 7, "cpu")).unwrap()
        };
        let store = Store::open(&dir.0, window()).unwrap();
        assert!(store.problems().is_empty(), "{:?}", store.problems());
        assert_eq!(store.incidents().get(recorded.id), Some(recorded.clone()));
        let next = store
            .incidents()
            .record(firing(t0 + HOUR / 1_000_000, 7, "cpu"))
            .unwrap();
        assert_eq!(next.id, recorded.id + 1);
        let incidents = dir.0.join(crate::incidents::INCIDENTS_DIR);
        assert_eq!(fs::metadata(&incidents).unwrap().mode() & 0o777, 0o700);
        for entry in fs::read_dir(&incidents).unwrap() {
            let meta = entry.unwrap().metadata().unwrap();
            assert_eq!(meta.mode() & 0o777, 0o600);
        }
    }

    #[test]
    fn incidents_leave_with_the_retention_age_and_within_the_byte_budget() {
        let dir = TempDir::new("incidents-retention");
        let now = profile::clock::unix_nanos();
        let now_ms = now / 1_000_000;
        let mut store = Store::open(
            &dir.0,
            StoreOptions {
                retention_age: Duration::from_secs(3600),
                ..window()
            },
        )
        .unwrap();
        let old = store
            .incidents()
            .record(firing(now_ms - 2 * 3600 * 1000, 7, "cpu"))
            .unwrap();
        let recent = store.incidents().record(firing(now_ms, 7, "cpu")).unwrap();
        store.apply_retention(now).unwrap();
        assert_eq!(store.incidents().get(old.id), None);
        assert!(store.incidents().get(recent.id).is_some());
        // A budget smaller than what the incidents take: the oldest go first.
        let newer = store.incidents().record(firing(now_ms, 8, "cpu")).unwrap();
        store.options.retention_bytes = store.incidents().bytes() - 1;
        store.apply_retention(now).unwrap();
        assert_eq!(store.incidents().get(recent.id), None);
        assert!(store.incidents().get(newer.id).is_some());
        assert_eq!(
            fs::read_dir(dir.0.join(crate::incidents::INCIDENTS_DIR))
                .unwrap()
                .count(),
            1
        );
    }

    #[test]
    fn shares_rank_the_function_that_grew_first() {
        let before = batch(
            "api",
            "cpu",
            MINUTE,
            &[
                (&["Hash", "Main"], 60, &[]),
                (&["Evaluate", "Price", "Main"], 10, &[]),
                (&["Main"], 30, &[]),
            ],
        );
        let during = batch(
            "api",
            "cpu",
            3 * MINUTE,
            &[
                (&["Hash", "Main"], 30, &[]),
                (&["Clock", "Evaluate", "Price", "Main"], 40, &[]),
                (&["Evaluate", "Price", "Main"], 20, &[]),
                (&["Main"], 10, &[]),
            ],
        );
        let dir = TempDir::new("incidents-shares");
        let mut store = Store::open(&dir.0, keep_all()).unwrap();
        store.append(&before).unwrap();
        store.append(&during).unwrap();
        let before = store.profile(&query(None, "cpu", 0, 2 * MINUTE)).unwrap();
        let during = store
            .profile(&query(None, "cpu", 2 * MINUTE, 4 * MINUTE))
            .unwrap();
        let changes = share_changes(&before, &during, 10);
        // Ranked by inclusive growth: Evaluate (+50) before the clock it reads (+40, the larger
        // self growth); Price, whose growth is all in its call to Evaluate, is left out.
        let names: Vec<&str> = changes.iter().map(|c| c.function.as_str()).collect();
        assert_eq!(names, ["Evaluate", "Clock", "Main", "Hash"]);
        let evaluate = &changes[0];
        assert_eq!((evaluate.self_before, evaluate.self_during), (10.0, 20.0));
        assert_eq!((evaluate.total_before, evaluate.total_during), (10.0, 60.0));
        assert_eq!(
            (changes[1].self_during, changes[1].total_during),
            (40.0, 40.0)
        );
        assert_eq!(changes[2].total_during, 100.0);
        assert_eq!(share_changes(&before, &during, 1).len(), 1);
    }

    /// Exception types ranked by growth of their rate: one thrown only during first, one that
    /// doubled next, one that held steady left out; each counted whole on its side of the onset.
    #[test]
    fn exceptions_that_are_new_or_grew_come_first_with_their_counts() {
        let ty = |name: &str| ("type", LabelValue::Str(name.to_string()));
        let (timeout, coupon, io) = ([ty("Timeout")], [ty("Coupon")], [ty("IO")]);
        let dir = TempDir::new("incidents-exceptions");
        let mut store = Store::open(&dir.0, window()).unwrap();
        let onset_ms = 1_800_000_000_000;
        let at = |minutes_after_onset: i64| (onset_ms + minutes_after_onset * MIN_MS) * 1_000_000;
        // Before: 5 minutes with 10 timeouts and 50 IO errors; during: 5 minutes with 20
        // timeouts (one site), 50 IO errors and 300 coupon failures (two sites).
        store
            .append(&batch(
                "api",
                "exception",
                at(-3),
                &[(&["Send", "Main"], 10, &timeout), (&["Read"], 50, &io)],
            ))
            .unwrap();
        store
            .append(&batch(
                "api",
                "exception",
                at(2),
                &[
                    (&["Send", "Main"], 20, &timeout),
                    (&["Read"], 50, &io),
                    (&["Lookup", "Main"], 290, &coupon),
                    (&["Rethrow", "Main"], 10, &coupon),
                ],
            ))
            .unwrap();
        let mut cause = firing(onset_ms, 42, "storm");
        cause.trigger_from_unix_ms = Some(onset_ms);
        let mut incident = store.incidents().record(cause).unwrap();
        // 5 minutes either side, so IO's rate is the same on both.
        incident.from_unix_ms = onset_ms - 5 * MIN_MS;
        incident.until_unix_ms = onset_ms + 5 * MIN_MS;
        let control = QueryControl::default();
        let now = onset_ms + 60 * MIN_MS;
        let answer = incident_exceptions(&store, &incident, 42, now, 10, &control).unwrap();
        let rows: Vec<(&str, i64, i64, bool, &str, i64)> = answer
            .exceptions
            .iter()
            .map(|e| {
                let site = (e.thrown_at.as_str(), e.thrown_at_count);
                (
                    e.type_name.as_str(),
                    e.before,
                    e.during,
                    e.new,
                    site.0,
                    site.1,
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("Coupon", 0, 300, true, "Lookup", 290),
                ("Timeout", 10, 20, false, "Send", 20)
            ]
        );
        assert_eq!((answer.before_total, answer.during_total), (60, 370));
        assert_eq!(answer.types_left_out, 1);
        assert_eq!(answer.exceptions[0].during_per_minute, 60.0);
        let one = incident_exceptions(&store, &incident, 42, now, 1, &control).unwrap();
        assert_eq!((one.exceptions.len(), one.types_left_out), (1, 2));
    }
}
