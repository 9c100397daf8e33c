//! The file names dotnet-monitor gives artifacts (`Utilities.GetFileNameTimeStampUtcNow` and each
//! operation's `GenerateFileName`), so scripts that pick files up keep working.

use std::time::SystemTime;

use crate::utc;

/// A kind of artifact; its [`name`](ArtifactKind::name) is dotnet-monitor's artifact type (the
/// key of its per-kind request limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArtifactKind {
    /// A core dump: `core_<ts>` (dotnet-monitor on Linux; `dump_<ts>.dmp` only on Windows).
    Dump,
    /// `<ts>_<pid>.gcdump`.
    GcDump,
    /// `<ts>_<pid>.nettrace`.
    Trace,
    /// `<ts>_<pid>.stacks.txt` as plain text, `<ts>_<pid>.stacks.json` as JSON or speedscope.
    Stacks { plain_text: bool },
    /// `<ts>_<pid>.txt` as plain text, `<ts>_<pid>.json` as NDJSON or JSON sequence
    /// (dotnet-monitor's log file names).
    Logs { plain_text: bool },
    /// `<ts>_<pid>.metrics.json`: live metrics, a JSON text sequence.
    LiveMetrics,
    /// `<ts>_<pid>.exceptions.txt` as plain text, `<ts>_<pid>.exceptions.json` as NDJSON or JSON
    /// sequence (dotnet-monitor's exceptions file names).
    Exceptions { plain_text: bool },
}

impl ArtifactKind {
    pub fn name(self) -> &'static str {
        match self {
            ArtifactKind::Dump => "dump",
            ArtifactKind::GcDump => "gcdump",
            ArtifactKind::Trace => "trace",
            ArtifactKind::Stacks { .. } => "stacks",
            ArtifactKind::Logs { .. } => "logs",
            ArtifactKind::LiveMetrics => "livemetrics",
            ArtifactKind::Exceptions { .. } => "exceptions",
        }
    }

    /// The artifact's file name for process `pid`, taken at `at`.
    pub fn file_name(self, pid: u64, at: SystemTime) -> String {
        let ts = utc::format(utc::unix_nanos(at), utc::Form::FileName);
        match self {
            ArtifactKind::Dump => format!("core_{ts}"),
            ArtifactKind::GcDump => format!("{ts}_{pid}.gcdump"),
            ArtifactKind::Trace => format!("{ts}_{pid}.nettrace"),
            ArtifactKind::Stacks { plain_text: true } => format!("{ts}_{pid}.stacks.txt"),
            ArtifactKind::Stacks { plain_text: false } => format!("{ts}_{pid}.stacks.json"),
            ArtifactKind::Logs { plain_text: true } => format!("{ts}_{pid}.txt"),
            ArtifactKind::Logs { plain_text: false } => format!("{ts}_{pid}.json"),
            ArtifactKind::LiveMetrics => format!("{ts}_{pid}.metrics.json"),
            ArtifactKind::Exceptions { plain_text: true } => format!("{ts}_{pid}.exceptions.txt"),
            ArtifactKind::Exceptions { plain_text: false } => {
                format!("{ts}_{pid}.exceptions.json")
            }
        }
    }

    /// Whether `file_name` is one [`file_name`](ArtifactKind::file_name) gives some artifact,
    /// so that clean-up never touches other files in a shared folder.
    pub fn is_artifact_file_name(file_name: &str) -> bool {
        let is_ts = |s: &str| {
            let b = s.as_bytes();
            b.len() == 19
                && b.iter().enumerate().all(|(i, &c)| match i {
                    8 | 15 => c == b'_',
                    _ => c.is_ascii_digit(),
                })
        };
        if let Some(ts) = file_name.strip_prefix("core_") {
            return is_ts(ts);
        }
        let Some((ts, rest)) = file_name.split_at_checked(19) else {
            return false;
        };
        let Some(rest) = rest.strip_prefix('_') else {
            return false;
        };
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        is_ts(ts)
            && digits > 0
            && matches!(
                &rest[digits..],
                ".gcdump"
                    | ".nettrace"
                    | ".stacks.txt"
                    | ".stacks.json"
                    | ".txt"
                    | ".json"
                    | ".metrics.json"
                    | ".exceptions.txt"
                    | ".exceptions.json"
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use std::time::UNIX_EPOCH;

    #[test]
    fn names_follow_dotnet_monitor() {
        // 2024-02-29 13:05:09.042 UTC
        let at = UNIX_EPOCH + Duration::from_millis(1_709_211_909_042);
        assert_eq!(
            ArtifactKind::Trace.file_name(42, at),
            "20240229_130509_042_42.nettrace"
        );
        assert_eq!(
            ArtifactKind::Dump.file_name(42, at),
            "core_20240229_130509_042"
        );
        assert_eq!(
            ArtifactKind::Stacks { plain_text: true }.file_name(7, at),
            "20240229_130509_042_7.stacks.txt"
        );
    }

    #[test]
    fn only_artifact_names_are_recognised() {
        let at = UNIX_EPOCH + Duration::from_millis(1_709_211_909_042);
        for kind in [
            ArtifactKind::Dump,
            ArtifactKind::GcDump,
            ArtifactKind::Trace,
            ArtifactKind::Stacks { plain_text: true },
            ArtifactKind::Stacks { plain_text: false },
            ArtifactKind::Logs { plain_text: true },
            ArtifactKind::Logs { plain_text: false },
            ArtifactKind::LiveMetrics,
            ArtifactKind::Exceptions { plain_text: true },
            ArtifactKind::Exceptions { plain_text: false },
        ] {
            assert!(ArtifactKind::is_artifact_file_name(
                &kind.file_name(1234, at)
            ));
        }
        for other in [
            "",
            "core_",
            "core_2024",
            "notes.txt",
            "20240229_130509_042_.nettrace",
            "20240229_130509_042_12.nettrace.tmp",
            "2024022a_130509_042_12.gcdump",
            "core_20240229_130509_042.dmp",
        ] {
            assert!(!ArtifactKind::is_artifact_file_name(other), "{other:?}");
        }
    }
}
