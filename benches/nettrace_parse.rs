//! NetTrace parsing throughput (MB/s and events/s) on a sample-heavy trace from a real .NET 8
//! runtime. Default input: `collector/tests/fixtures/app.nettrace` (small: it stays in cache);
//! point `CLRSCOPE_BENCH_NETTRACE` at a larger recording for figures closer to production.
//!
//! `cargo bench --bench nettrace_parse`

use collector::samples::SampleAggregator;
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use nettrace::events::{EventKind, KnownEvent};
use nettrace::{NettraceReader, Parser};

fn input() -> (String, Vec<u8>) {
    let path = std::env::var("CLRSCOPE_BENCH_NETTRACE").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/collector/tests/fixtures/app.nettrace"
        )
        .to_owned()
    });
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    (path, data)
}

/// Header decode, metadata lookup and drop accounting for every event.
fn parse_events(data: &[u8]) -> u64 {
    let mut p = Parser::new();
    p.feed(data).expect("feed");
    let mut n = 0u64;
    while let Some(ev) = p.next_event().expect("valid trace") {
        n += u64::from(ev.header.payload_size) + 1;
    }
    p.finish().expect("complete trace");
    n
}

/// What a CPU profile build does: typed ThreadSample decode plus the stack's IPs.
fn parse_samples_with_stacks(data: &[u8]) -> u64 {
    let mut r = NettraceReader::new(data);
    let mut acc = 0u64;
    while let Some(ev) = r.next_event().expect("valid trace") {
        if ev.metadata.kind != EventKind::ThreadSample {
            continue;
        }
        if let Ok(Some(KnownEvent::ThreadSample(_))) = ev.known() {
            if let Some(s) = ev.stack() {
                acc = s.ips().fold(acc, u64::wrapping_add);
            }
        }
    }
    acc
}

/// What a sampler window of the agent does with each event: the ThreadSample ones counted by
/// thread and stack ([`SampleAggregator`]).
fn aggregate_window(data: &[u8]) -> u64 {
    let mut p = Parser::new();
    p.feed(data).expect("feed");
    let mut samples = SampleAggregator::new(0);
    while let Some(ev) = p.next_event().expect("valid trace") {
        if let Ok(Some(sample)) = ev.thread_sample() {
            samples.add(&ev, &sample);
        }
    }
    samples.samples()
}

fn bench(c: &mut Criterion) {
    let (path, data) = input();
    let events = {
        let mut p = Parser::new();
        p.feed(&data).expect("feed");
        while p.next_event().expect("valid trace").is_some() {}
        p.stats().events
    };
    eprintln!("input {path}: {} bytes, {events} events", data.len());

    let mut g = c.benchmark_group("nettrace_bytes");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.bench_function("events", |b| b.iter(|| parse_events(black_box(&data))));
    g.bench_function("samples_with_stacks", |b| {
        b.iter(|| parse_samples_with_stacks(black_box(&data)))
    });
    g.finish();

    let mut g = c.benchmark_group("nettrace_events");
    g.throughput(Throughput::Elements(events));
    g.bench_function("events", |b| b.iter(|| parse_events(black_box(&data))));
    g.bench_function("window_aggregate", |b| {
        b.iter(|| aggregate_window(black_box(&data)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
