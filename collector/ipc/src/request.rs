//! Requests the client sends: each encodes to one whole message, header included.

use super::collect::CollectTracing;
use super::header::{command_set, Header, HEADER_LEN};
use super::wire::{check_string, Writer};
use super::ProtocolError;

/// What the runtime should write for perf (EnablePerfMap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PerfMapType {
    Disabled = 0,
    /// Both jitdump and perf map files.
    All = 1,
    JitDump = 2,
    PerfMap = 3,
}

/// Kind of core dump. `Normal` is what dotnet-dump calls "Mini".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DumpType {
    Normal = 1,
    WithHeap = 2,
    Triage = 3,
    Full = 4,
}

/// A GenerateCoreDump request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreDump {
    /// 1, 2 or 3: GenerateCoreDump, GenerateCoreDump2, GenerateCoreDump3. Same payload; version 1
    /// reads `flags` as a logging on/off switch, version 3 errors carry a message.
    pub version: u8,
    /// Where the runtime's createdump writes the dump, as seen from inside the target.
    pub path: String,
    pub dump_type: DumpType,
    /// Version 1: 0 or 1 (log the dump's progress). Versions 2, 3: the `CoreDump::*` flags.
    pub flags: u32,
}

impl CoreDump {
    pub const LOGGING_ENABLED: u32 = 0x01;
    pub const VERBOSE_LOGGING_ENABLED: u32 = 0x02;
    pub const CRASH_REPORT_ENABLED: u32 = 0x04;

    /// A GenerateCoreDump3 request without flags. On UNKNOWN_COMMAND retry with version 2, then 1
    /// (as the official client does).
    pub fn new(path: impl Into<String>, dump_type: DumpType) -> Self {
        CoreDump {
            version: 3,
            path: path.into(),
            dump_type,
            flags: 0,
        }
    }
}

/// A command for the diagnostic server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    ProcessInfo,
    ProcessInfo2,
    ProcessInfo3,
    /// Lets a runtime suspended at startup (a `suspend` diagnostic port) continue.
    ResumeRuntime,
    ProcessEnvironment,
    SetEnvironmentVariable {
        name: String,
        value: String,
    },
    EnablePerfMap(PerfMapType),
    DisablePerfMap,
    CollectTracing(CollectTracing),
    /// Sent on a new connection; the session's own connection carries its event stream.
    StopTracing {
        session_id: u64,
    },
    GenerateCoreDump(CoreDump),
    /// Meant for a runtime suspended at startup: the hook runs when it resumes.
    ApplyStartupHook {
        path: String,
    },
}

impl Request {
    /// The command's name as the protocol documents it, for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Request::ProcessInfo => "ProcessInfo",
            Request::ProcessInfo2 => "ProcessInfo2",
            Request::ProcessInfo3 => "ProcessInfo3",
            Request::ResumeRuntime => "ResumeRuntime",
            Request::ProcessEnvironment => "ProcessEnvironment",
            Request::SetEnvironmentVariable { .. } => "SetEnvironmentVariable",
            Request::EnablePerfMap(_) => "EnablePerfMap",
            Request::DisablePerfMap => "DisablePerfMap",
            Request::CollectTracing(c) => c.version.name(),
            Request::StopTracing { .. } => "StopTracing",
            Request::GenerateCoreDump(d) => match d.version {
                1 => "GenerateCoreDump",
                2 => "GenerateCoreDump2",
                3 => "GenerateCoreDump3",
                _ => "GenerateCoreDump (invalid version)",
            },
            Request::ApplyStartupHook { .. } => "ApplyStartupHook",
        }
    }

    /// `(command_set, command_id)`. For a dump, the id is `version` even when out of range
    /// (encoding rejects that).
    pub fn command(&self) -> (u8, u8) {
        use command_set::{DUMP, EVENTPIPE, PROCESS};
        match self {
            Request::ProcessInfo => (PROCESS, 0x00),
            Request::ResumeRuntime => (PROCESS, 0x01),
            Request::ProcessEnvironment => (PROCESS, 0x02),
            Request::SetEnvironmentVariable { .. } => (PROCESS, 0x03),
            Request::ProcessInfo2 => (PROCESS, 0x04),
            Request::EnablePerfMap(_) => (PROCESS, 0x05),
            Request::DisablePerfMap => (PROCESS, 0x06),
            Request::ApplyStartupHook { .. } => (PROCESS, 0x07),
            Request::ProcessInfo3 => (PROCESS, 0x08),
            Request::StopTracing { .. } => (EVENTPIPE, 0x01),
            Request::CollectTracing(c) => (EVENTPIPE, c.version.command_id()),
            Request::GenerateCoreDump(d) => (DUMP, d.version),
        }
    }

    /// The whole message, header and payload. Fails on options the runtime would reject and on
    /// messages over 65535 bytes.
    pub fn encode(&self) -> Result<Vec<u8>, ProtocolError> {
        let name = self.name();
        let invalid = |reason: &str| ProtocolError::InvalidRequest {
            request: name,
            reason: reason.to_string(),
        };
        let mut w = Writer::default();
        match self {
            Request::ProcessInfo
            | Request::ProcessInfo2
            | Request::ProcessInfo3
            | Request::ResumeRuntime
            | Request::ProcessEnvironment
            | Request::DisablePerfMap => {}
            Request::SetEnvironmentVariable { name: var, value } => {
                if var.is_empty() {
                    return Err(invalid("the variable name is empty"));
                }
                check_string(name, "the variable name", var)?;
                check_string(name, "the value", value)?;
                w.string(var);
                w.string(value);
            }
            Request::EnablePerfMap(t) => w.u32(*t as u32),
            Request::CollectTracing(c) => w.bytes(&c.encode_payload()?),
            Request::StopTracing { session_id } => w.u64(*session_id),
            Request::GenerateCoreDump(d) => {
                if !(1..=3).contains(&d.version) {
                    return Err(invalid("version must be 1, 2 or 3"));
                }
                if d.version == 1 && d.flags > CoreDump::LOGGING_ENABLED {
                    return Err(invalid(
                        "version 1 only takes the logging flag (1); verbose logging and crash \
                         reports need version 2 or 3",
                    ));
                }
                if d.path.is_empty() {
                    return Err(invalid("the dump path is empty"));
                }
                check_string(name, "the dump path", &d.path)?;
                w.string(&d.path);
                w.u32(d.dump_type as u32);
                w.u32(d.flags);
            }
            Request::ApplyStartupHook { path } => {
                if path.is_empty() {
                    return Err(invalid("the startup hook path is empty"));
                }
                check_string(name, "the startup hook path", path)?;
                w.string(path);
            }
        }
        let payload = w.into_inner();
        let header = Header::for_payload(name, self.command(), payload.len())?;
        let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
        out.extend_from_slice(&header.encode());
        out.extend_from_slice(&payload);
        Ok(out)
    }
}
