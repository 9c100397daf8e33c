//! Arbitrary bytes as a nettrace stream, fed in chunks whose sizes the input also picks: the
//! parser, every decoder (counter values included), the span tracker, and the raw-block splitter
//! with the pre-trigger ring must return errors, never panic, and never allocate beyond limits.
//! The parser gets a small memory budget, so that memory the fuzzer's `-rss_limit_mb` sees beyond
//! it is amplification the budget missed.

#![no_main]

use std::time::Duration;

use collector::activity::SpanTracker;
use collector::counters::{CounterDecoder, CounterSessionConfig};
use collector::rules::ring::{RingLimits, TraceRing};
use collector::signals::SignalShare;
use libfuzzer_sys::fuzz_target;
use nettrace::splice::{ObjectSplitter, ObjectWriter};
use nettrace::{Parser, ParserOptions};

fuzz_target!(|data: &[u8]| {
    let Some((&chunk_seed, stream)) = data.split_first() else {
        return;
    };
    let chunk = 1 + usize::from(chunk_seed) * 97;
    let mut parser = Parser::with_options(ParserOptions::with_memory_budget(8 << 20));
    let mut tracker = SpanTracker::default();
    let counters = CounterDecoder::new(&CounterSessionConfig::new(5));
    let mut splitter = ObjectSplitter::new(1 << 20);
    // The ring's own byte cap bounds it here; the signal budget's share is not what is fuzzed.
    let mut ring = TraceRing::new(
        RingLimits {
            max_bytes: 1 << 20,
            max_age: Duration::from_secs(10),
        },
        &SignalShare::unlimited(),
    );
    let mut split_ok = true;
    for piece in stream.chunks(chunk) {
        if split_ok {
            splitter.feed(piece);
            loop {
                match splitter.next_object() {
                    Ok(Some(object)) => {
                        let _ = object.time_range();
                        if ring.push(object).is_err() {
                            split_ok = false;
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(_) => {
                        split_ok = false;
                        break;
                    }
                }
            }
        }
        if parser.feed(piece).is_err() {
            break;
        }
        loop {
            match parser.next_event() {
                Ok(Some(event)) => {
                    let _ = event.known();
                    let _ = event.decode();
                    let _ = counters.decode(&event);
                    if let Some(stack) = event.stack() {
                        let _ = stack.ips().count();
                    }
                    let _ = event.unix_nanos();
                    let _ = tracker.observe(&event);
                    let _ = tracker.span_at(event.header.thread_id, event.header.timestamp);
                }
                Ok(None) => break,
                Err(_) => break,
            }
        }
    }
    let _ = parser.finish();
    let _ = parser.dropped_events();
    if let Ok(mut out) = ObjectWriter::new(Vec::new()) {
        let _ = ring.write_since(i64::MIN, &mut out);
    }
});
