//! The nettrace parser never amplifies: crafted streams whose items grow when decoded (label
//! lists, metadata floods, deep stacks, sizes and counts far beyond the bytes present) end with a
//! clear error while the parser's live heap stays within a bound proportional to its memory
//! budget. Measured with a counting global allocator, which is why these tests have a binary of
//! their own and run one at a time.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use nettrace::{NettraceError, NettraceReader, ParserOptions};

/// What `testutil` names through `crate`.
use nettrace::EventHeader;

#[path = "../src/testutil.rs"]
#[allow(dead_code)]
mod testutil;

use testutil::{MetadataRecord, StreamBuilder, V6Builder};

/// Counts live heap bytes and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to `System` unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // Counted as the new block arriving before the old one leaves, as a move does.
            grew(new_size);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// One test at a time, stream building included: the counters are process-wide.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

const BUDGET: usize = 4 << 20;

/// What the parser may hold: the budget, up to half of it again while a container moves to a
/// larger allocation, and the input buffer (one block of at most `max_block_size`, 1 MiB by
/// default, plus one 256 KiB read chunk, with the buffer's growth).
const BOUND: usize = 2 * BUDGET + (2 << 20);

/// Parses `stream` with a `BUDGET` parser until it fails; the error and the peak of live heap
/// bytes the parse added.
fn parse_measured(stream: &[u8]) -> (NettraceError, usize) {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let mut reader =
        NettraceReader::with_options(stream, ParserOptions::with_memory_budget(BUDGET));
    let error = loop {
        match reader.next_event() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the crafted stream parsed to its end without an error"),
            Err(e) => break e,
        }
    };
    let peak = PEAK.load(Ordering::Relaxed) - base;
    println!(
        "{} bytes in: peak {peak} bytes held, error: {error}",
        stream.len()
    );
    (error, peak)
}

fn assert_over_budget(error: &NettraceError, what: &str, peak: usize) {
    match error {
        NettraceError::OverBudget { what: w, limit, .. } => {
            assert_eq!(*w, what, "{error}");
            assert_eq!(*limit, BUDGET as u64);
        }
        other => panic!("expected the memory budget to stop {what}, got: {other}"),
    }
    let text = error.to_string();
    assert!(
        text.contains("memory budget of 4194304 bytes") && text.contains("--nettrace-budget"),
        "{text}"
    );
    assert!(peak < BOUND, "peak {peak} bytes above the bound of {BOUND}");
}

/// Appends LabelList blocks of `per_block` two-byte lists (a level override that ends its list)
/// until the stream is `total` bytes: each list decodes into a few hundred bytes.
#[test]
fn label_list_bomb() {
    let _serial = one_at_a_time();
    let mut b = V6Builder::new(8, &[]);
    let per_block = 250_000u32;
    let mut first = 1u32;
    while b.buf.len() < 8 << 20 {
        let mut body = first.to_le_bytes().to_vec();
        body.extend(per_block.to_le_bytes());
        for _ in 0..per_block {
            body.extend([0x80 | 9, 4]);
        }
        b.block(8, &body);
        first += per_block;
    }
    let (error, peak) = parse_measured(&b.finish());
    assert_over_budget(&error, "label lists", peak);
}

/// Distinct metadata records of a thousand one-letter fields each: 8 input bytes per field,
/// about ten times that decoded.
#[test]
fn metadata_flood() {
    let _serial = one_at_a_time();
    let mut fields = 1000i32.to_le_bytes().to_vec();
    for _ in 0..1000 {
        fields.extend(9i32.to_le_bytes());
        fields.extend(testutil::utf16z("a"));
    }
    let mut b = StreamBuilder::new(8);
    let mut id = 1u32;
    while b.buf.len() < 8 << 20 {
        let records: Vec<Vec<u8>> = (0..64)
            .map(|i| {
                MetadataRecord::new(id + i, "Hostile-Provider", 1, "E")
                    .raw_fields(fields.clone())
                    .encode()
            })
            .collect();
        b.metadata_block(&records, true);
        id += 64;
    }
    let (error, peak) = parse_measured(&b.finish());
    assert_over_budget(&error, "metadata", peak);
}

/// StackBlocks of deep stacks with no sequence point to release them.
#[test]
fn deep_stacks() {
    let _serial = one_at_a_time();
    let deep: Vec<u64> = (0..1000).collect();
    let stacks: Vec<&[u64]> = vec![&deep; 100];
    let mut b = StreamBuilder::new(8);
    let mut first = 1u32;
    while b.buf.len() < 16 << 20 {
        b.stack_block(first, &stacks);
        first += stacks.len() as u32;
    }
    let (error, peak) = parse_measured(&b.finish());
    assert_over_budget(&error, "stacks", peak);
}

/// Sizes and counts far beyond the bytes that follow them.
#[test]
fn huge_declared_sizes_and_counts() {
    let _serial = one_at_a_time();
    // A 15 MiB block, all of it present: refused from its header, never buffered.
    let mut b = StreamBuilder::new(8);
    b.block("StackBlock", &vec![0; 15 << 20]);
    let (error, peak) = parse_measured(&b.finish());
    assert!(
        matches!(error, NettraceError::BlockTooLarge { size, limit: 1_048_576, .. } if size == 15 << 20),
        "{error}"
    );
    assert!(peak < BOUND, "peak {peak} bytes above the bound of {BOUND}");

    // Counts of u32::MAX stacks, label lists and threads, i32::MAX trace properties and fields,
    // each with a few bytes behind it.
    let mut stacks = StreamBuilder::new(8);
    let mut body = 1u32.to_le_bytes().to_vec();
    body.extend(u32::MAX.to_le_bytes());
    body.extend([0; 64]);
    stacks.block("StackBlock", &body);
    let mut labels = V6Builder::new(8, &[]);
    let mut body = 1u32.to_le_bytes().to_vec();
    body.extend(u32::MAX.to_le_bytes());
    body.extend([0x80 | 9, 4].repeat(32));
    labels.block(8, &body);
    let mut fields = StreamBuilder::new(8);
    fields.metadata_block(
        &[MetadataRecord::new(1, "P", 1, "E")
            .raw_fields(i32::MAX.to_le_bytes().to_vec())
            .encode()],
        true,
    );
    let mut properties = V6Builder::new(8, &[]).finish();
    // The Trace block's property count is its body's last i32 (no properties follow it).
    let count_at = 8 + 12 + 4 + 16 + 8 + 8 + 4;
    properties[count_at..count_at + 4].copy_from_slice(&i32::MAX.to_le_bytes());
    for stream in [
        stacks.finish(),
        labels.finish(),
        fields.finish(),
        properties,
    ] {
        let (error, peak) = parse_measured(&stream);
        assert!(
            matches!(error, NettraceError::Malformed { .. }),
            "expected the stream to be refused as malformed, got: {error}"
        );
        assert!(peak < BOUND, "peak {peak} bytes above the bound of {BOUND}");
    }
}
