//! Valid reply payloads, written out by hand field by field. Shared by the byte-exact decoder
//! tests and the truncation/mutation tests.

/// `"DOTNET_IPC_V1\0"`, the first 14 bytes of every message.
pub const MAGIC: [u8; 14] = *b"DOTNET_IPC_V1\0";

/// The runtime cookie of the doc's advertise example, 123e4567-e89b-12d3-a456-426614174000, as
/// the 16 bytes of a GUID in memory.
pub const COOKIE: [u8; 16] = [
    0x67, 0x45, 0x3E, 0x12, // Data1 0x123e4567 LE
    0x9B, 0xE8, // Data2 0xe89b LE
    0xD3, 0x12, // Data3 0x12d3 LE
    0xA4, 0x56, 0x42, 0x66, 0x14, 0x17, 0x40, 0x00, // Data4
];

/// ProcessInfo (0x0400) reply payload: pid 42, COOKIE, "/a b", "Linux", "x64".
pub const PROCESS_INFO_V1: &[u8] = &[
    0x2A, 0, 0, 0, 0, 0, 0, 0, // u64 pid = 42
    0x67, 0x45, 0x3E, 0x12, 0x9B, 0xE8, 0xD3, 0x12, // runtime cookie ...
    0xA4, 0x56, 0x42, 0x66, 0x14, 0x17, 0x40, 0x00, // ... (COOKIE)
    5, 0, 0, 0, // command line: 5 UTF-16 units incl. NUL
    b'/', 0, b'a', 0, b' ', 0, b'b', 0, 0, 0, // "/a b\0"
    6, 0, 0, 0, // OS: 6 units
    b'L', 0, b'i', 0, b'n', 0, b'u', 0, b'x', 0, 0, 0, // "Linux\0"
    4, 0, 0, 0, // arch: 4 units
    b'x', 0, b'6', 0, b'4', 0, 0, 0, // "x64\0"
];

/// ProcessInfo2 (0x0404) reply payload: PROCESS_INFO_V1's fields, then "app", "8.0.1".
pub const PROCESS_INFO_V2: &[u8] = &[
    0x2A, 0, 0, 0, 0, 0, 0, 0, // u64 pid = 42
    0x67, 0x45, 0x3E, 0x12, 0x9B, 0xE8, 0xD3, 0x12, // runtime cookie ...
    0xA4, 0x56, 0x42, 0x66, 0x14, 0x17, 0x40, 0x00, // ... (COOKIE)
    5, 0, 0, 0, b'/', 0, b'a', 0, b' ', 0, b'b', 0, 0, 0, // command line "/a b"
    6, 0, 0, 0, b'L', 0, b'i', 0, b'n', 0, b'u', 0, b'x', 0, 0, 0, // OS "Linux"
    4, 0, 0, 0, b'x', 0, b'6', 0, b'4', 0, 0, 0, // arch "x64"
    4, 0, 0, 0, b'a', 0, b'p', 0, b'p', 0, 0, 0, // entrypoint assembly "app"
    6, 0, 0, 0, b'8', 0, b'.', 0, b'0', 0, b'.', 0, b'1', 0, 0, 0, // CLR version "8.0.1"
];

/// ProcessInfo3 (0x0408) reply payload, payload version 1: PROCESS_INFO_V2's fields after the
/// version, then the runtime identifier "linux-x64".
pub const PROCESS_INFO_V3: &[u8] = &[
    1, 0, 0, 0, // u32 payload version = 1
    0x2A, 0, 0, 0, 0, 0, 0, 0, // u64 pid = 42
    0x67, 0x45, 0x3E, 0x12, 0x9B, 0xE8, 0xD3, 0x12, // runtime cookie ...
    0xA4, 0x56, 0x42, 0x66, 0x14, 0x17, 0x40, 0x00, // ... (COOKIE)
    5, 0, 0, 0, b'/', 0, b'a', 0, b' ', 0, b'b', 0, 0, 0, // command line "/a b"
    6, 0, 0, 0, b'L', 0, b'i', 0, b'n', 0, b'u', 0, b'x', 0, 0, 0, // OS "Linux"
    4, 0, 0, 0, b'x', 0, b'6', 0, b'4', 0, 0, 0, // arch "x64"
    4, 0, 0, 0, b'a', 0, b'p', 0, b'p', 0, 0, 0, // entrypoint assembly "app"
    6, 0, 0, 0, b'8', 0, b'.', 0, b'0', 0, b'.', 0, b'1', 0, 0, 0, // CLR version "8.0.1"
    10, 0, 0, 0, // runtime identifier: 10 units
    b'l', 0, b'i', 0, b'n', 0, b'u', 0, b'x', 0, b'-', 0, b'x', 0, b'6', 0, b'4', 0, 0, 0,
];

/// CollectTracing*/StopTracing OK reply payload: u64 session id 0x0000_7F12_3456_7890.
pub const SESSION_ID: &[u8] = &[0x90, 0x78, 0x56, 0x34, 0x12, 0x7F, 0x00, 0x00];

/// OK reply payload of ResumeRuntime, SetEnvironmentVariable, EnablePerfMap, ...: i32 S_OK, as
/// `ds_ipc_message_send_success` writes it.
pub const STATUS_OK: &[u8] = &[0x00, 0x00, 0x00, 0x00];

/// Error reply payload: BAD_ENCODING 0x80131384 as an i32.
pub const ERROR_BAD_ENCODING: &[u8] = &[0x84, 0x13, 0x13, 0x80];

/// GenerateCoreDump3 error reply payload: FAIL 0x80004005, then the message "no space".
pub const ERROR_DUMP3: &[u8] = &[
    0x05, 0x40, 0x00, 0x80, // i32 HRESULT = E_FAIL
    9, 0, 0, 0, // message: 9 units incl. NUL
    b'n', 0, b'o', 0, b' ', 0, b's', 0, b'p', 0, b'a', 0, b'c', 0, b'e', 0, 0,
    0, // "no space\0"
];

/// ProcessEnvironment OK reply payload: 26 continuation bytes follow.
pub const ENV_HEADER: &[u8] = &[
    26, 0, 0, 0, // u32 continuation length
    0, 0, // u16 future
];

/// ProcessEnvironment continuation of 26 bytes: two entries, "A=1" and "B=".
pub const ENV_BLOCK: &[u8] = &[
    2, 0, 0, 0, // u32 entry count
    4, 0, 0, 0, b'A', 0, b'=', 0, b'1', 0, 0, 0, // "A=1\0"
    3, 0, 0, 0, b'B', 0, b'=', 0, 0, 0, // "B=\0"
];
