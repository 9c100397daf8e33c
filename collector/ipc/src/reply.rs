//! Decoders of reply payloads (the bytes after the reply header) and of the ProcessEnvironment
//! continuation.
//!
//! Bytes after the last field a decoder knows are ignored, as the official client does, so a
//! newer runtime that appends fields still decodes.

use super::advertise::RuntimeCookie;
use super::hresult::{Hresult, ServerError};
use super::wire::Reader;
use super::ProtocolError;

/// The reply to ProcessInfo, ProcessInfo2 or ProcessInfo3.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    /// The pid in the target's own pid namespace.
    pub pid: u64,
    pub runtime_cookie: RuntimeCookie,
    /// On Linux: the full path of argv\[0\], then the other arguments, joined by spaces.
    pub command_line: String,
    /// `Linux`, `macOS`, `Windows` or `Unknown`.
    pub os: String,
    /// `x86`, `x64`, `arm32`, `arm64` or `Unknown`.
    pub arch: String,
    /// ProcessInfo2+: the entry assembly's simple name, a better process name than argv\[0\]
    /// (which is `dotnet` for framework-dependent apps).
    pub managed_entrypoint_assembly_name: Option<String>,
    /// ProcessInfo2+: e.g. `8.0.11`, with a prerelease label on previews.
    pub clr_product_version: Option<String>,
    /// ProcessInfo3 with payload version 1+: e.g. `linux-x64`, `linux-musl-arm64`.
    pub runtime_identifier: Option<String>,
}

impl ProcessInfo {
    /// Decodes a ProcessInfo (0x0400) reply payload.
    pub fn decode_v1(payload: &[u8]) -> Result<Self, ProtocolError> {
        decode_common(&mut Reader::new(payload))
    }

    /// Decodes a ProcessInfo2 (0x0404) reply payload.
    pub fn decode_v2(payload: &[u8]) -> Result<Self, ProtocolError> {
        let mut r = Reader::new(payload);
        let mut info = decode_common(&mut r)?;
        decode_v2_fields(&mut r, &mut info)?;
        Ok(info)
    }

    /// Decodes a ProcessInfo3 (0x0408) reply payload: a u32 payload version, the ProcessInfo2
    /// fields, then the runtime identifier when the version is 1 or more.
    pub fn decode_v3(payload: &[u8]) -> Result<Self, ProtocolError> {
        let mut r = Reader::new(payload);
        let version = r.u32("ProcessInfo3 payload version")?;
        let mut info = decode_common(&mut r)?;
        decode_v2_fields(&mut r, &mut info)?;
        if version >= 1 {
            info.runtime_identifier = Some(r.string("ProcessInfo3 runtime identifier")?);
        }
        Ok(info)
    }
}

fn decode_common(r: &mut Reader<'_>) -> Result<ProcessInfo, ProtocolError> {
    Ok(ProcessInfo {
        pid: r.u64("ProcessInfo pid")?,
        runtime_cookie: RuntimeCookie(r.array("ProcessInfo runtime cookie")?),
        command_line: r.string("ProcessInfo command line")?,
        os: r.string("ProcessInfo OS")?,
        arch: r.string("ProcessInfo architecture")?,
        managed_entrypoint_assembly_name: None,
        clr_product_version: None,
        runtime_identifier: None,
    })
}

fn decode_v2_fields(r: &mut Reader<'_>, info: &mut ProcessInfo) -> Result<(), ProtocolError> {
    info.managed_entrypoint_assembly_name = Some(r.string("ProcessInfo entrypoint assembly name")?);
    info.clr_product_version = Some(r.string("ProcessInfo CLR product version")?);
    Ok(())
}

/// The u64 session id of a CollectTracing* OK reply (the StopTracing reply echoes it).
pub fn decode_session_id(payload: &[u8]) -> Result<u64, ProtocolError> {
    Reader::new(payload).u64("session id")
}

/// The i32 HRESULT of an OK reply to ResumeRuntime, SetEnvironmentVariable, EnablePerfMap,
/// DisablePerfMap, ApplyStartupHook and GenerateCoreDump*.
///
/// The runtime sends S_OK there (`ds_ipc_message_send_success`); an empty payload, which the
/// protocol doc describes for ResumeRuntime, is read as S_OK too.
pub fn decode_status(payload: &[u8]) -> Result<Hresult, ProtocolError> {
    if payload.is_empty() {
        return Ok(Hresult::S_OK);
    }
    Reader::new(payload).u32("status HRESULT").map(Hresult)
}

/// The payload of an error reply (0xFF/0xFF): an HRESULT, then, from GenerateCoreDump3 only, the
/// runtime's message as a protocol string.
pub fn decode_error(payload: &[u8]) -> Result<ServerError, ProtocolError> {
    let mut r = Reader::new(payload);
    let hresult = Hresult(r.u32("error HRESULT")?);
    let message = if r.remaining() > 0 {
        Some(r.string("error message")?).filter(|m| !m.is_empty())
    } else {
        None
    };
    Ok(ServerError { hresult, message })
}

/// Largest environment block we agree to read (the length is the target's to choose; Linux
/// itself caps argv + environment at a quarter of the stack limit, a few MiB).
pub const MAX_ENVIRONMENT_LEN: u32 = 16 << 20;

/// The OK reply payload of ProcessEnvironment: how many continuation bytes follow the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvironmentHeader {
    pub continuation_len: u32,
    /// Reserved, 0.
    pub future: u16,
}

impl EnvironmentHeader {
    /// Fails on a length over [`MAX_ENVIRONMENT_LEN`], so a transport can allocate what it says.
    pub fn decode(payload: &[u8]) -> Result<Self, ProtocolError> {
        let mut r = Reader::new(payload);
        let continuation_len = r.u32("ProcessEnvironment continuation length")?;
        let future = r.u16("ProcessEnvironment reserved field")?;
        if continuation_len > MAX_ENVIRONMENT_LEN {
            return Err(ProtocolError::EnvironmentTooLarge {
                len: continuation_len,
                max: MAX_ENVIRONMENT_LEN,
            });
        }
        Ok(EnvironmentHeader {
            continuation_len,
            future,
        })
    }
}

/// Decodes the ProcessEnvironment continuation, `array<array<WCHAR>>` of `NAME=value`, into
/// `(NAME, value)` pairs in the runtime's order. An entry without `=` becomes `(entry, "")`.
pub fn decode_environment(continuation: &[u8]) -> Result<Vec<(String, String)>, ProtocolError> {
    let mut r = Reader::new(continuation);
    let count = r.u32("environment entry count")?;
    // Each entry takes at least its 4-byte count: never reserve more than could be present.
    let mut out = Vec::with_capacity((count as usize).min(r.remaining() / 4));
    for _ in 0..count {
        let entry = r.string("environment entry")?;
        out.push(match entry.split_once('=') {
            Some((name, value)) => (name.to_string(), value.to_string()),
            None => (entry, String::new()),
        });
    }
    Ok(out)
}
