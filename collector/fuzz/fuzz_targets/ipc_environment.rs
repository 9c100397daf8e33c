//! ProcessEnvironment reply: the 6-byte payload, then the continuation it announces. Never
//! panics, and never allocates more than the input holds.
#![no_main]

use ipc::{decode_environment, EnvironmentHeader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (head, continuation) = data.split_at(data.len().min(6));
    if let Ok(h) = EnvironmentHeader::decode(head) {
        let n = continuation.len().min(h.continuation_len as usize);
        let _ = decode_environment(&continuation[..n]);
    }
    let _ = decode_environment(data);
});
