//! Reply decoders against hand-written payloads.

use super::samples::*;
use crate::*;

fn expected_info() -> ProcessInfo {
    ProcessInfo {
        pid: 42,
        runtime_cookie: RuntimeCookie(COOKIE),
        command_line: "/a b".into(),
        os: "Linux".into(),
        arch: "x64".into(),
        managed_entrypoint_assembly_name: None,
        clr_product_version: None,
        runtime_identifier: None,
    }
}

#[test]
fn process_info_v1() {
    assert_eq!(
        ProcessInfo::decode_v1(PROCESS_INFO_V1).unwrap(),
        expected_info()
    );
}

#[test]
fn process_info_v2() {
    let info = ProcessInfo::decode_v2(PROCESS_INFO_V2).unwrap();
    assert_eq!(
        info,
        ProcessInfo {
            managed_entrypoint_assembly_name: Some("app".into()),
            clr_product_version: Some("8.0.1".into()),
            ..expected_info()
        }
    );
    assert_eq!(
        info.runtime_cookie.to_string(),
        "123e4567-e89b-12d3-a456-426614174000"
    );
}

#[test]
fn process_info_v3() {
    assert_eq!(
        ProcessInfo::decode_v3(PROCESS_INFO_V3).unwrap(),
        ProcessInfo {
            managed_entrypoint_assembly_name: Some("app".into()),
            clr_product_version: Some("8.0.1".into()),
            runtime_identifier: Some("linux-x64".into()),
            ..expected_info()
        }
    );
}

#[test]
fn process_info_v3_payload_version_0_has_no_rid() {
    // Version 0 is ProcessInfo2's fields after the version; a newer version may append fields
    // after the rid, which are ignored.
    let mut v0 = vec![0, 0, 0, 0]; // u32 payload version = 0
    v0.extend_from_slice(PROCESS_INFO_V2);
    let info = ProcessInfo::decode_v3(&v0).unwrap();
    assert_eq!(info.runtime_identifier, None);
    assert_eq!(info.clr_product_version.as_deref(), Some("8.0.1"));

    let mut v2 = PROCESS_INFO_V3.to_vec();
    v2[0] = 2; // payload version 2 ...
    v2.extend_from_slice(&[1, 0, 0, 0, 0, 0]); // ... with a field we do not know: ""
    assert_eq!(
        ProcessInfo::decode_v3(&v2)
            .unwrap()
            .runtime_identifier
            .as_deref(),
        Some("linux-x64")
    );
}

#[test]
fn process_info_null_strings_read_as_empty() {
    let payload = [
        7, 0, 0, 0, 0, 0, 0, 0, // pid 7
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // cookie 0
        0, 0, 0, 0, // command line: count 0
        0, 0, 0, 0, // OS: count 0
        1, 0, 0, 0, 0, 0, // arch: count 1, just the NUL
    ];
    let info = ProcessInfo::decode_v1(&payload).unwrap();
    assert_eq!(
        (info.pid, info.command_line.as_str(), info.arch.as_str()),
        (7, "", "")
    );
}

/// ipc-protocol.md, StopTracing/CollectTracing "Returns": `{ Magic; 28; 0xFF00; 0x0000 }` and a
/// u64 session id.
#[test]
fn session_id_reply_from_the_doc() {
    let mut reply = MAGIC.to_vec();
    reply.extend_from_slice(&[
        0x1C, 0x00, // size = 28
        0xFF, 0x00, // Server / OK
        0x00, 0x00, // reserved
    ]);
    reply.extend_from_slice(SESSION_ID);
    let h = Header::decode(&reply).unwrap();
    assert_eq!(h.reply_kind().unwrap(), ReplyKind::Ok);
    assert_eq!(h.payload_len(), 8);
    let payload = reply.get(HEADER_LEN..HEADER_LEN + h.payload_len()).unwrap();
    assert_eq!(decode_session_id(payload).unwrap(), 0x7F12_3456_7890);
}

/// The runtime answers ResumeRuntime with a 24-byte OK carrying S_OK (`ds_ipc_message_send_success`),
/// though the doc says it has no payload; both decode to S_OK.
#[test]
fn status_replies() {
    let mut reply = MAGIC.to_vec();
    reply.extend_from_slice(&[0x18, 0x00, 0xFF, 0x00, 0x00, 0x00]); // size 24, Server/OK
    reply.extend_from_slice(STATUS_OK);
    let h = Header::decode(&reply).unwrap();
    assert!(h.is_ok());
    assert_eq!(
        decode_status(reply.get(HEADER_LEN..).unwrap()).unwrap(),
        Hresult::S_OK
    );
    assert_eq!(decode_status(&[]).unwrap(), Hresult::S_OK);
    assert!(matches!(
        decode_status(&[0, 0, 0]),
        Err(ProtocolError::Truncated { .. })
    ));
}

/// ipc-protocol.md, "Errors": the BAD_ENCODING reply. The doc's table shows size 28 and an
/// 8-byte code; the runtime writes an i32 (`ds_ipc_message_send_error`), size 24.
#[test]
fn error_reply_bad_encoding() {
    let mut reply = MAGIC.to_vec();
    reply.extend_from_slice(&[0x18, 0x00, 0xFF, 0xFF, 0x00, 0x00]); // size 24, Server/Error
    reply.extend_from_slice(ERROR_BAD_ENCODING);
    let h = Header::decode(&reply).unwrap();
    assert_eq!(h.reply_kind().unwrap(), ReplyKind::Error);
    let e = decode_error(reply.get(HEADER_LEN..).unwrap()).unwrap();
    assert_eq!(
        e,
        ServerError {
            hresult: Hresult::BAD_ENCODING,
            message: None
        }
    );
    assert_eq!(e.hresult.name(), Some("BAD_ENCODING"));
}

#[test]
fn error_reply_with_dump3_message() {
    let e = decode_error(ERROR_DUMP3).unwrap();
    assert_eq!(e.hresult, Hresult::FAIL);
    assert_eq!(e.message.as_deref(), Some("no space"));
    // An empty message (count 1, just the NUL) is what the runtime sends when createdump said
    // nothing.
    let empty = [0x05, 0x40, 0x00, 0x80, 1, 0, 0, 0, 0, 0];
    assert_eq!(decode_error(&empty).unwrap().message, None);
}

#[test]
fn environment() {
    let h = EnvironmentHeader::decode(ENV_HEADER).unwrap();
    assert_eq!(
        h,
        EnvironmentHeader {
            continuation_len: 26,
            future: 0
        }
    );
    assert_eq!(h.continuation_len as usize, ENV_BLOCK.len());
    assert_eq!(
        decode_environment(ENV_BLOCK).unwrap(),
        vec![("A".into(), "1".into()), ("B".into(), String::new())]
    );
    // "It is valid for nIncomingBytes to be 4 and the continuation to simply contain 0."
    assert_eq!(decode_environment(&[0, 0, 0, 0]).unwrap(), vec![]);
}

#[test]
fn environment_entry_without_equals_and_with_several() {
    let block = [
        2, 0, 0, 0, // 2 entries
        2, 0, 0, 0, b'X', 0, 0, 0, // "X"
        4, 0, 0, 0, b'K', 0, b'=', 0, b'=', 0, 0, 0, // "K=="
    ];
    assert_eq!(
        decode_environment(&block).unwrap(),
        vec![("X".into(), String::new()), ("K".into(), "=".into())]
    );
}

#[test]
fn environment_header_caps_the_length() {
    let huge = [0xFF, 0xFF, 0xFF, 0xFF, 0, 0];
    assert!(matches!(
        EnvironmentHeader::decode(&huge),
        Err(ProtocolError::EnvironmentTooLarge { .. })
    ));
}

#[test]
fn environment_count_beyond_input_fails_fast() {
    // Claims 4 billion entries in 4 bytes: must fail, not try to reserve them.
    assert!(matches!(
        decode_environment(&[0xFF, 0xFF, 0xFF, 0xFF]),
        Err(ProtocolError::Truncated { .. })
    ));
}
