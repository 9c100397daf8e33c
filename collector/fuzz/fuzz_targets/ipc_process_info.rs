//! ProcessInfo, ProcessInfo2 and ProcessInfo3 reply payloads: never panic. The first byte picks
//! the version so one corpus covers all three.
#![no_main]

use ipc::ProcessInfo;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, payload)) = data.split_first() else {
        return;
    };
    let decoded = match selector % 3 {
        0 => ProcessInfo::decode_v1(payload),
        1 => ProcessInfo::decode_v2(payload),
        _ => ProcessInfo::decode_v3(payload),
    };
    if let Ok(info) = decoded {
        let _ = info.runtime_cookie.to_string();
    }
});
