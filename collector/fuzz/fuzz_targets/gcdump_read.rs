//! Arbitrary bytes as a `.gcdump` file: the reader must return an error, never panic, and never
//! allocate more than the input can describe.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(file) = collector::gcdump::read_gcdump(data) {
        let _ = file.graph.histogram();
    }
});
