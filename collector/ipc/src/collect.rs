//! The CollectTracing family of commands: the EventPipe session configuration and its six wire
//! versions.

use super::wire::{check_string, Writer};
use super::ProtocolError;

/// The rundown keyword the runtime uses when a request only says "rundown: yes"
/// (GC, Loader, Jit, NGen, an unused bit, JittedMethodILToNativeMap, ThreadTransfer).
pub const DEFAULT_RUNDOWN_KEYWORD: u64 = 0x8002_0139;

/// The runtime rejects a request with more providers than this.
pub const MAX_PROVIDERS: usize = 1000;

/// Highest EventPipe level (Verbose); the runtime rejects anything above it.
pub const MAX_LEVEL: u32 = 5;

/// Which CollectTracing command to send. Newer versions carry more options but older runtimes
/// answer them with UNKNOWN_COMMAND, so send the lowest one the options need
/// ([`CollectTracing::lowest_version`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CollectTracingVersion {
    /// .NET Core 3.0+. Rundown always on, stacks always on.
    V1,
    /// .NET Core 3.0+. Adds `request_rundown`.
    V2,
    /// .NET 9+. Adds `request_stackwalk`.
    V3,
    /// .NET 9+. Replaces `request_rundown` with `rundown_keyword`.
    V4,
    /// .NET 10+. Adds a session type (we send 0, streaming) and per-provider event-id filters.
    V5,
    /// .NET 11+. Adds `buffer_mode`.
    V6,
}

impl CollectTracingVersion {
    /// Command id in the EventPipe command set.
    pub fn command_id(self) -> u8 {
        match self {
            CollectTracingVersion::V1 => 0x02,
            CollectTracingVersion::V2 => 0x03,
            CollectTracingVersion::V3 => 0x04,
            CollectTracingVersion::V4 => 0x05,
            CollectTracingVersion::V5 => 0x06,
            CollectTracingVersion::V6 => 0x07,
        }
    }

    /// The command's name as the protocol documents it.
    pub fn name(self) -> &'static str {
        match self {
            CollectTracingVersion::V1 => "CollectTracing",
            CollectTracingVersion::V2 => "CollectTracing2",
            CollectTracingVersion::V3 => "CollectTracing3",
            CollectTracingVersion::V4 => "CollectTracing4",
            CollectTracingVersion::V5 => "CollectTracing5",
            CollectTracingVersion::V6 => "CollectTracing6",
        }
    }
}

/// Serialization of the event stream that follows the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TraceFormat {
    /// The legacy format of .NET Core 2.x tools.
    NetPerf = 0,
    /// NetTrace (V4+ "nettrace"): what every current reader expects.
    #[default]
    NetTrace = 1,
}

/// What the runtime does when the session's buffer is full (CollectTracing6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BufferMode {
    /// Drop new events (lossy); the only behavior before .NET 11.
    #[default]
    Drop = 0,
    /// Block the threads that write events until the reader catches up (lossless, but it slows
    /// the target down: only for captures that must be complete).
    Block = 1,
}

/// Per-provider event-id filter, applied after keywords and level (CollectTracing5+).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventFilter {
    /// `true`: only `event_ids` are enabled. `false`: all but `event_ids` are enabled.
    pub enable: bool,
    pub event_ids: Vec<u32>,
}

impl EventFilter {
    /// Enable only these events.
    pub fn only(event_ids: Vec<u32>) -> Self {
        EventFilter {
            enable: true,
            event_ids,
        }
    }

    /// Enable every event but these.
    pub fn except(event_ids: Vec<u32>) -> Self {
        EventFilter {
            enable: false,
            event_ids,
        }
    }
}

/// One provider of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    pub name: String,
    pub keywords: u64,
    /// 0 (LogAlways) to 5 (Verbose).
    pub level: u32,
    /// `key=value;key=value` arguments. `None` is sent as the protocol's null string (count 0);
    /// `Some("")` as an empty string (count 1), which is what the official client sends.
    pub arguments: Option<String>,
    /// Sent by CollectTracing5+ only; `None` means all events.
    pub event_filter: Option<EventFilter>,
}

impl ProviderConfig {
    pub fn new(name: impl Into<String>, keywords: u64, level: u32) -> Self {
        ProviderConfig {
            name: name.into(),
            keywords,
            level,
            arguments: None,
            event_filter: None,
        }
    }

    pub fn with_arguments(mut self, arguments: impl Into<String>) -> Self {
        self.arguments = Some(arguments.into());
        self
    }

    pub fn with_event_filter(mut self, filter: EventFilter) -> Self {
        self.event_filter = Some(filter);
        self
    }
}

/// Options of an EventPipe streaming session.
///
/// `request_rundown` is what V2/V3 send and `rundown_keyword` what V4+ send; they must agree
/// (`request_rundown == (rundown_keyword != 0)`), which [`with_rundown`](Self::with_rundown) and
/// [`with_rundown_keyword`](Self::with_rundown_keyword) maintain. Encoding rejects options the
/// chosen version cannot carry rather than dropping them silently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectTracing {
    pub version: CollectTracingVersion,
    pub circular_buffer_mb: u32,
    pub format: TraceFormat,
    /// V2, V3 (V1 always runs rundown).
    pub request_rundown: bool,
    /// V4+.
    pub rundown_keyword: u64,
    /// V3+ (V1, V2 always walk stacks).
    pub request_stackwalk: bool,
    pub providers: Vec<ProviderConfig>,
    /// V6 only.
    pub buffer_mode: BufferMode,
}

impl CollectTracing {
    /// The official client's default buffer size.
    pub const DEFAULT_BUFFER_MB: u32 = 256;

    /// A CollectTracing2 session with the official client's defaults: 256 MB buffer, NetTrace,
    /// default rundown at the end, stacks on. Every runtime since .NET Core 3.0 accepts it.
    pub fn v2(providers: Vec<ProviderConfig>) -> Self {
        CollectTracing {
            version: CollectTracingVersion::V2,
            circular_buffer_mb: Self::DEFAULT_BUFFER_MB,
            format: TraceFormat::NetTrace,
            request_rundown: true,
            rundown_keyword: DEFAULT_RUNDOWN_KEYWORD,
            request_stackwalk: true,
            providers,
            buffer_mode: BufferMode::Drop,
        }
    }

    /// Rundown with the default keyword, or none. Does not change `version`.
    pub fn with_rundown(mut self, on: bool) -> Self {
        self.request_rundown = on;
        self.rundown_keyword = if on { DEFAULT_RUNDOWN_KEYWORD } else { 0 };
        self
    }

    /// Rundown with these keywords (0 = none). Does not change `version`.
    pub fn with_rundown_keyword(mut self, keyword: u64) -> Self {
        self.request_rundown = keyword != 0;
        self.rundown_keyword = keyword;
        self
    }

    /// Does not change `version`.
    pub fn with_stackwalk(mut self, on: bool) -> Self {
        self.request_stackwalk = on;
        self
    }

    /// Does not change `version`.
    pub fn with_buffer_mode(mut self, mode: BufferMode) -> Self {
        self.buffer_mode = mode;
        self
    }

    pub fn with_circular_buffer_mb(mut self, mb: u32) -> Self {
        self.circular_buffer_mb = mb;
        self
    }

    /// The lowest version that carries these options, chosen as the official client does
    /// (`EventPipeSession.CreateStartMessage`): never V1, V2 unless an option needs more.
    pub fn lowest_version(&self) -> CollectTracingVersion {
        if self.buffer_mode != BufferMode::Drop {
            CollectTracingVersion::V6
        } else if self.providers.iter().any(|p| p.event_filter.is_some()) {
            CollectTracingVersion::V5
        } else if self.rundown_keyword != 0 && self.rundown_keyword != DEFAULT_RUNDOWN_KEYWORD {
            CollectTracingVersion::V4
        } else if !self.request_stackwalk {
            CollectTracingVersion::V3
        } else {
            CollectTracingVersion::V2
        }
    }

    /// Sets `version` to [`lowest_version`](Self::lowest_version).
    pub fn with_lowest_version(mut self) -> Self {
        self.version = self.lowest_version();
        self
    }

    fn invalid(&self, reason: String) -> ProtocolError {
        ProtocolError::InvalidRequest {
            request: self.version.name(),
            reason,
        }
    }

    /// Rejects what the runtime would answer with BAD_ENCODING, and options the chosen version
    /// would silently drop.
    fn validate(&self) -> Result<(), ProtocolError> {
        use CollectTracingVersion as V;
        let request = self.version.name();
        if self.circular_buffer_mb == 0 {
            return Err(
                self.invalid("circular_buffer_mb is 0; the runtime needs at least 1".into())
            );
        }
        if self.providers.is_empty() || self.providers.len() > MAX_PROVIDERS {
            return Err(self.invalid(format!(
                "{} providers; the runtime accepts 1 to {MAX_PROVIDERS}",
                self.providers.len()
            )));
        }
        for p in &self.providers {
            if p.name.is_empty() {
                return Err(self.invalid("a provider has an empty name".into()));
            }
            check_string(request, "a provider name", &p.name)?;
            if p.level > MAX_LEVEL {
                return Err(self.invalid(format!(
                    "provider {} has level {}; levels go from 0 (LogAlways) to 5 (Verbose)",
                    p.name, p.level
                )));
            }
            if let Some(a) = &p.arguments {
                check_string(request, "provider arguments", a)?;
            }
        }
        if self.request_rundown != (self.rundown_keyword != 0) {
            return Err(self.invalid(format!(
                "request_rundown ({}) and rundown_keyword (0x{:X}) disagree; set them together \
                 with with_rundown() or with_rundown_keyword()",
                self.request_rundown, self.rundown_keyword
            )));
        }
        let needs = |option: &str, min: V| -> Result<(), ProtocolError> {
            if self.version < min {
                return Err(self.invalid(format!(
                    "{option} needs {} or later; call with_lowest_version()",
                    min.name()
                )));
            }
            Ok(())
        };
        if self.version == V::V1 && !self.request_rundown {
            needs("turning rundown off", V::V2)?;
        }
        if !self.request_stackwalk {
            needs("request_stackwalk = false", V::V3)?;
        }
        if self.rundown_keyword != 0 && self.rundown_keyword != DEFAULT_RUNDOWN_KEYWORD {
            needs("a custom rundown_keyword", V::V4)?;
        }
        if self.providers.iter().any(|p| p.event_filter.is_some()) {
            needs("an event filter", V::V5)?;
        }
        if self.buffer_mode != BufferMode::Drop {
            needs("buffer_mode = Block", V::V6)?;
        }
        Ok(())
    }

    /// The payload of the chosen version (without the header).
    pub(crate) fn encode_payload(&self) -> Result<Vec<u8>, ProtocolError> {
        use CollectTracingVersion as V;
        self.validate()?;
        let mut w = Writer::default();
        if self.version >= V::V5 {
            w.u32(0); // session_type: 0 = streaming over this connection
        }
        w.u32(self.circular_buffer_mb);
        w.u32(self.format as u32);
        match self.version {
            V::V1 => {}
            V::V2 => w.bool(self.request_rundown),
            V::V3 => {
                w.bool(self.request_rundown);
                w.bool(self.request_stackwalk);
            }
            V::V4 | V::V5 | V::V6 => {
                w.u64(self.rundown_keyword);
                w.bool(self.request_stackwalk);
            }
        }
        // validate() capped the count at MAX_PROVIDERS.
        w.u32(self.providers.len() as u32);
        for p in &self.providers {
            w.u64(p.keywords);
            w.u32(p.level);
            w.string(&p.name);
            w.opt_string(p.arguments.as_deref());
            if self.version >= V::V5 {
                match &p.event_filter {
                    // The official client's "no filter": deny nothing.
                    None => {
                        w.bool(false);
                        w.u32(0);
                    }
                    Some(f) => {
                        w.bool(f.enable);
                        w.u32(u32::try_from(f.event_ids.len()).unwrap_or(u32::MAX));
                        for id in &f.event_ids {
                            w.u32(*id);
                        }
                    }
                }
            }
        }
        if self.version == V::V6 {
            w.u32(self.buffer_mode as u32);
        }
        Ok(w.into_inner())
    }
}
