//! Arbitrary bytes as a nettrace stream, fed in chunks whose sizes the input also picks: the
//! parser, every decoder and the span tracker must return errors, never panic, and never allocate
//! beyond limits.

#![no_main]

use collector::activity::SpanTracker;
use collector::nettrace::Parser;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&chunk_seed, stream)) = data.split_first() else {
        return;
    };
    let chunk = 1 + usize::from(chunk_seed) * 97;
    let mut parser = Parser::new();
    let mut tracker = SpanTracker::default();
    for piece in stream.chunks(chunk) {
        if parser.feed(piece).is_err() {
            return;
        }
        loop {
            match parser.next_event() {
                Ok(Some(event)) => {
                    let _ = event.known();
                    let _ = event.decode();
                    if let Some(stack) = event.stack() {
                        let _ = stack.ips().count();
                    }
                    let _ = event.unix_nanos();
                    let _ = tracker.observe(&event);
                    let _ = tracker.span_at(event.header.thread_id, event.header.timestamp);
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
    let _ = parser.finish();
    let _ = parser.dropped_events();
});
