//! Lookup throughput on a map the size of a large service: 50 000 methods, a quarter of them also
//! tiered up (62 500 code versions), laid out in code heaps like the JIT's, plus R2R images.
//!
//! `cargo bench -p symbolizer --bench symbolize`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use symbolizer::{CodeMap, Frame, ImageRange, LoadSource, MethodFlags, MethodLoad, ModuleLoad};

const METHODS: u64 = 50_000;
const HEAPS: u64 = 8;
const HEAP_BASE: u64 = 0x7f00_0000_0000;
const HEAP_STRIDE: u64 = 0x1000_0000;
const IMAGE_BASE: u64 = 0x7e00_0000_0000;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The load events of the synthetic process, and the ranges they cover.
fn events() -> (Vec<MethodLoad>, Vec<(u64, u64)>) {
    let mut rng = Rng(42);
    let mut cursors: Vec<u64> = (0..HEAPS).map(|h| HEAP_BASE + h * HEAP_STRIDE).collect();
    let mut events = Vec::new();
    let mut ranges = Vec::new();
    let mut place = |rng: &mut Rng, size: u32| {
        let heap = rng.below(HEAPS) as usize;
        let start = cursors[heap];
        // Code is 16-byte aligned, with the odd gap where a stub or data sits.
        let gap = if rng.below(16) == 0 { 64 } else { 0 };
        cursors[heap] = (start + u64::from(size) + gap + 15) & !15;
        start
    };
    for m in 0..METHODS {
        let size = 32 + rng.below(1_000) as u32;
        let namespace = format!("MyCompany.Service{}.Handler`1[System.Int32]", m % 700);
        let name = format!("Handle{m}");
        let signature =
            "instance class System.Threading.Tasks.Task`1<!0>  (class System.String,int32)";
        let module_id = 0x7f10_0000_0000 + (m % 200) * 0x1000;
        let tier0 = place(&mut rng, size);
        ranges.push((tier0, tier0 + u64::from(size)));
        events.push(MethodLoad {
            method_id: 0x7f20_0000_0000 + m * 0x40,
            module_id,
            start_address: tier0,
            size,
            method_token: 0x0600_0000 + m as u32,
            flags: MethodFlags::JITTED | 0x180,
            namespace: namespace.clone(),
            name: name.clone(),
            signature: signature.to_string(),
            rejit_id: 0,
            timestamp: m,
            source: LoadSource::Live,
        });
        if m % 4 == 0 {
            let tier1 = place(&mut rng, size / 2 + 16);
            ranges.push((tier1, tier1 + u64::from(size / 2 + 16)));
            events.push(MethodLoad {
                start_address: tier1,
                size: size / 2 + 16,
                flags: MethodFlags::JITTED | 0x200,
                rejit_id: 1,
                timestamp: METHODS + m,
                ..events.last().cloned().unwrap_or_default()
            });
        }
    }
    (events, ranges)
}

fn build(events: &[MethodLoad]) -> CodeMap {
    let mut map = CodeMap::new();
    for m in 0..200u64 {
        map.load_module(&ModuleLoad {
            module_id: 0x7f10_0000_0000 + m * 0x1000,
            assembly_id: m,
            flags: 0x8 | 0x20,
            il_path: format!("/app/Lib{m}.dll"),
            native_path: String::new(),
            managed_pdb: None,
        });
    }
    map.set_images((0..200u64).map(|m| ImageRange {
        start: IMAGE_BASE + m * 0x100_0000,
        end: IMAGE_BASE + m * 0x100_0000 + 0x80_0000,
        path: format!("/app/Lib{m}.dll"),
        ..Default::default()
    }));
    for event in events {
        map.load_method(event).expect("valid synthetic event");
    }
    map
}

/// A flat sorted `Vec` with binary search, to compare the `BTreeMap` the crate uses against.
fn flat_lookup(index: &[(u64, u64, u32)], ip: u64) -> Option<u32> {
    let after = index.partition_point(|&(start, _, _)| start <= ip);
    let &(_, end, code) = index.get(after.checked_sub(1)?)?;
    (ip < end).then_some(code)
}

fn benches(c: &mut Criterion) {
    let (events, ranges) = events();
    let map = build(&events);
    let stats = map.stats();
    eprintln!(
        "map: {} functions, {} code versions, {} segments, {} images",
        stats.functions, stats.code_versions, stats.segments, stats.images
    );

    let mut rng = Rng(7);
    let random_hits: Vec<u64> = (0..4096)
        .map(|_| {
            let (start, end) = ranges[rng.below(ranges.len() as u64) as usize];
            start + rng.below(end - start)
        })
        .collect();
    // Profiles are skewed: stacks come from a few hundred hot methods.
    let hot: Vec<u64> = (0..300)
        .map(|_| {
            let (start, end) = ranges[rng.below(ranges.len() as u64) as usize];
            start + rng.below(end - start)
        })
        .collect();
    let stacks: Vec<Vec<u64>> = (0..128)
        .map(|_| {
            (0..32)
                .map(|_| hot[rng.below(hot.len() as u64) as usize])
                .collect()
        })
        .collect();
    let misses: Vec<u64> = (0..4096)
        .map(|_| IMAGE_BASE + rng.below(200) * 0x100_0000 + rng.below(0x80_0000))
        .collect();

    let mut group = c.benchmark_group("symbolize");
    group.throughput(Throughput::Elements(random_hits.len() as u64));
    group.bench_function("random_hits", |b| {
        b.iter(|| {
            for &ip in &random_hits {
                black_box(map.symbolize(black_box(ip)));
            }
        })
    });
    group.throughput(Throughput::Elements(misses.len() as u64));
    group.bench_function("image_misses", |b| {
        b.iter(|| {
            for &ip in &misses {
                black_box(map.symbolize(black_box(ip)));
            }
        })
    });
    group.throughput(Throughput::Elements((stacks.len() * 32) as u64));
    group.bench_function("hot_stacks_32_frames", |b| {
        let mut out: Vec<Frame> = Vec::with_capacity(32);
        b.iter(|| {
            for stack in &stacks {
                map.symbolize_stack_into(black_box(stack), &mut out);
                black_box(&out);
            }
        })
    });
    group.finish();

    // Live JIT events between samples: each load invalidates the flat index, and 4096 lookups are
    // too few to pay for a rebuild (n/8 + 64 = 7876), so they walk the tree: compare with
    // symbolize/random_hits, same addresses through the flat index.
    let mut group = c.benchmark_group("interleaved");
    group.throughput(Throughput::Elements(random_hits.len() as u64));
    group.bench_function("one_load_then_4096_lookups", |b| {
        let mut map = build(&events);
        let mut next = 0u64;
        let template = events[0].clone();
        b.iter(|| {
            next += 1;
            map.load_method(&MethodLoad {
                method_id: 0x7f30_0000_0000 + next * 0x40,
                start_address: 0x7f50_0000_0000 + next * 0x100,
                size: 0x80,
                timestamp: 1_000_000 + next,
                ..template.clone()
            })
            .expect("valid synthetic event");
            for &ip in &random_hits {
                black_box(map.symbolize(black_box(ip)));
            }
        })
    });
    group.finish();

    let mut flat: Vec<(u64, u64, u32)> = ranges
        .iter()
        .enumerate()
        .map(|(i, &(start, end))| (start, end, i as u32))
        .collect();
    flat.sort_unstable();
    let mut group = c.benchmark_group("flat_vec_baseline");
    group.throughput(Throughput::Elements(random_hits.len() as u64));
    group.bench_function("random_hits", |b| {
        b.iter(|| {
            for &ip in &random_hits {
                black_box(flat_lookup(&flat, black_box(ip)));
            }
        })
    });
    group.finish();

    let mut group = c.benchmark_group("load");
    group.sample_size(10);
    group.throughput(Throughput::Elements(events.len() as u64));
    group.bench_function("all_code_versions", |b| {
        b.iter_batched(
            || (),
            |_| black_box(build(&events)),
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(symbolize, benches);
criterion_main!(symbolize);
