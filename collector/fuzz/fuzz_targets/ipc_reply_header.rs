//! A whole reply as a transport sees it: the header, then its payload fed to every decoder that
//! could apply to its kind. Never panics; a decoded header re-encodes to the same bytes (bar the
//! reserved field).
#![no_main]

use ipc::{
    decode_error, decode_session_id, decode_status, EnvironmentHeader, Header, ProcessInfo,
    ReplyKind, HEADER_LEN,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(header) = Header::decode(data) else {
        return;
    };
    assert_eq!(header.encode()[..HEADER_LEN - 2], data[..HEADER_LEN - 2]);
    // Like a transport: the payload is what the header announces, or what arrived before EOF.
    let rest = data.get(HEADER_LEN..).unwrap_or_default();
    let payload = rest.get(..header.payload_len()).unwrap_or(rest);
    match header.reply_kind() {
        Ok(ReplyKind::Error) => {
            if let Ok(e) = decode_error(payload) {
                let _ = e.to_string();
            }
        }
        Ok(ReplyKind::Ok) => {
            let _ = decode_session_id(payload);
            if let Ok(h) = decode_status(payload) {
                let _ = h.to_string();
            }
            let _ = EnvironmentHeader::decode(payload);
            let _ = ProcessInfo::decode_v1(payload);
            let _ = ProcessInfo::decode_v2(payload);
            let _ = ProcessInfo::decode_v3(payload);
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
