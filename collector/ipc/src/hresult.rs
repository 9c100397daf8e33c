//! HRESULTs the diagnostic server sends back, with names and explanations a person can act on.

use std::fmt;

/// An HRESULT as sent on the wire (an i32, kept as its u32 bit pattern to print it as usual).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hresult(pub u32);

impl Hresult {
    pub const S_OK: Hresult = Hresult(0);
    pub const BAD_ENCODING: Hresult = Hresult(0x8013_1384);
    pub const UNKNOWN_COMMAND: Hresult = Hresult(0x8013_1385);
    pub const UNKNOWN_MAGIC: Hresult = Hresult(0x8013_1386);
    pub const NOTSUPPORTED: Hresult = Hresult(0x8013_1515);
    pub const FAIL: Hresult = Hresult(0x8000_4005);
    pub const NOT_YET_AVAILABLE: Hresult = Hresult(0x8013_135B);
    pub const RUNTIME_UNINITIALIZED: Hresult = Hresult(0x8013_1371);
    pub const INVALIDARG: Hresult = Hresult(0x8007_0057);
    pub const INSUFFICIENT_BUFFER: Hresult = Hresult(0x8007_007A);
    pub const ENVVAR_NOT_FOUND: Hresult = Hresult(0x8000_00CB);
    /// Named by the official client only (CORPROF_E_PROFILER_ALREADY_ACTIVE).
    pub const PROFILER_ALREADY_ACTIVE: Hresult = Hresult(0x8013_136A);

    /// True for S_OK and other success codes (sign bit clear).
    pub fn is_success(self) -> bool {
        self.0 & 0x8000_0000 == 0
    }

    /// The runtime's name for the code (`DS_IPC_E_*` without the prefix), if it is one we know.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Hresult::S_OK => "S_OK",
            Hresult::BAD_ENCODING => "BAD_ENCODING",
            Hresult::UNKNOWN_COMMAND => "UNKNOWN_COMMAND",
            Hresult::UNKNOWN_MAGIC => "UNKNOWN_MAGIC",
            Hresult::NOTSUPPORTED => "NOTSUPPORTED",
            Hresult::FAIL => "FAIL",
            Hresult::NOT_YET_AVAILABLE => "NOT_YET_AVAILABLE",
            Hresult::RUNTIME_UNINITIALIZED => "RUNTIME_UNINITIALIZED",
            Hresult::INVALIDARG => "INVALIDARG",
            Hresult::INSUFFICIENT_BUFFER => "INSUFFICIENT_BUFFER",
            Hresult::ENVVAR_NOT_FOUND => "ENVVAR_NOT_FOUND",
            Hresult::PROFILER_ALREADY_ACTIVE => "PROFILER_ALREADY_ACTIVE",
            _ => return None,
        })
    }

    /// What the code means for the person running clrscope, and what to try.
    pub fn explain(self) -> String {
        match self {
            Hresult::S_OK => "success".into(),
            Hresult::BAD_ENCODING => "the runtime could not parse the request: its payload is \
                malformed, or it holds a value this runtime rejects (a zero buffer size, a level \
                above 5, an empty provider name, no providers, or an option newer than the \
                runtime)"
                .into(),
            Hresult::UNKNOWN_COMMAND => "the runtime does not know this command (it is older \
                than the command: ProcessInfo2 and SetEnvironmentVariable need .NET 6, \
                ProcessInfo3, EnablePerfMap, DisablePerfMap and ApplyStartupHook need .NET 8, \
                CollectTracing3 and 4 need .NET 9, CollectTracing5 needs .NET 10, \
                CollectTracing6 needs .NET 11); retry with an older form of the command"
                .into(),
            Hresult::UNKNOWN_MAGIC => "the runtime did not recognize the message header magic; \
                this tool and the runtime speak different IPC protocol versions"
                .into(),
            Hresult::NOTSUPPORTED => "the runtime does not support this operation on this \
                platform or in this build (for example NativeAOT, or a runtime built without \
                the feature)"
                .into(),
            Hresult::FAIL => "the runtime tried and failed (for a dump: createdump failed or \
                the path is not writable from inside the target's container; for a trace: the \
                session could not start, e.g. too many sessions are already running)"
                .into(),
            Hresult::NOT_YET_AVAILABLE => "the runtime is not far enough into startup for this \
                command yet; if it is suspended at startup, send ResumeRuntime first"
                .into(),
            Hresult::RUNTIME_UNINITIALIZED => "the runtime has not finished initializing the \
                subsystem this command needs; retry once the process is running"
                .into(),
            Hresult::INVALIDARG => "the runtime rejected an argument of the request; for \
                startup-only commands this usually means the runtime is no longer suspended at \
                startup"
                .into(),
            Hresult::INSUFFICIENT_BUFFER => {
                "a buffer in the runtime was too small for the reply".into()
            }
            Hresult::ENVVAR_NOT_FOUND => {
                "the environment variable does not exist in the target".into()
            }
            Hresult::PROFILER_ALREADY_ACTIVE => "a profiler is already loaded in the target".into(),
            _ if self.is_success() => "a success code this tool does not know".into(),
            _ => {
                "an error code this tool does not know; the runtime's own logs may say more".into()
            }
        }
    }
}

impl fmt::Display for Hresult {
    /// `0x80131385 (UNKNOWN_COMMAND): the runtime does not know this command ...`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "0x{:08X} ({name}): {}", self.0, self.explain()),
            None => write!(f, "0x{:08X}: {}", self.0, self.explain()),
        }
    }
}

/// The payload of an error reply: the HRESULT, plus the text GenerateCoreDump3 may add.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    pub hresult: Hresult,
    /// The runtime's own words (only GenerateCoreDump3 sends them); `None` when absent or empty.
    pub message: Option<String>,
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the runtime returned {}", self.hresult)?;
        if let Some(m) = &self.message {
            write!(f, "; runtime says: {m}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ServerError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_and_explains() {
        let s = Hresult::UNKNOWN_COMMAND.to_string();
        assert!(
            s.starts_with("0x80131385 (UNKNOWN_COMMAND): the runtime does not know"),
            "{s}"
        );
        assert!(s.contains("CollectTracing3 and 4 need .NET 9"), "{s}");
        assert_eq!(Hresult(0x8013_136A).name(), Some("PROFILER_ALREADY_ACTIVE"));
        let unknown = Hresult(0x8123_4567).to_string();
        assert!(
            unknown.starts_with("0x81234567: an error code"),
            "{unknown}"
        );
        assert!(!Hresult::FAIL.is_success());
        assert!(Hresult::S_OK.is_success());
    }

    #[test]
    fn server_error_display() {
        let e = ServerError {
            hresult: Hresult::FAIL,
            message: Some("Problem launching createdump".into()),
        };
        let s = e.to_string();
        assert!(
            s.starts_with("the runtime returned 0x80004005 (FAIL): "),
            "{s}"
        );
        assert!(
            s.ends_with("; runtime says: Problem launching createdump"),
            "{s}"
        );
    }
}
