//! ADVR_V1 decoding: never panics, and what decodes re-encodes to the same bytes (bar the
//! reserved field, which is ignored).
#![no_main]

use ipc::{Advertise, ADVERTISE_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(adv) = Advertise::decode(data) {
        let bytes = adv.encode();
        assert_eq!(bytes[..ADVERTISE_LEN - 2], data[..ADVERTISE_LEN - 2]);
        assert_eq!(Advertise::decode(&bytes).ok(), Some(adv));
    }
});
