//! NetTrace: the stream format EventPipe writes (format V4 with the V5 metadata tags; V6 as newer
//! tools write it is read too), parsed incrementally, with decoders for the events clrscope uses.
//!
//! - [`Parser`]: push bytes in any chunking with [`Parser::feed`], pull events with
//!   [`Parser::next_event`]; [`Parser::finish`] tells whether the stream was complete.
//! - [`NettraceReader`] / [`AsyncNettraceReader`]: the same over `std::io::Read` or a tokio
//!   `AsyncRead` (the diagnostic socket of a live session).
//! - [`Event`]: header, metadata, payload, stack, UTC time; [`Event::decode`] for any
//!   self-describing payload, [`Event::known`] for the typed decoders in [`events`].
//!
//! A crate of its own beside `collector` (which runs the sessions that produce the streams): it
//! depends on no workspace crate but the model leaf `profile`, whose ids, log levels and memory
//! budget its decoders fill and charge.
//!
//! ```no_run
//! use nettrace::{events::KnownEvent, NettraceReader};
//! let mut r = NettraceReader::new(std::fs::File::open("app.nettrace")?);
//! while let Some(ev) = r.next_event()? {
//!     if let Some(KnownEvent::ThreadSample(s)) = ev.known()? {
//!         let frames = ev.stack().map_or(0, |s| s.len());
//!         println!("{} tid={} {:?} {frames} frames", ev.unix_nanos(), ev.header.thread_id, s.kind);
//!     }
//! }
//! println!("dropped: {}", r.parser().dropped_events());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod block;
mod budget;
mod cursor;
mod error;
mod event;
pub mod events;
mod header;
mod io;
mod metadata;
mod payload;
mod reader;
mod sequence;
pub mod splice;
mod time;
mod v6;

#[cfg(test)]
mod tests;
#[cfg(any(test, feature = "testutil"))]
pub mod testutil;

pub use block::{EventHeader, StackIdentity};
pub use error::NettraceError;
pub use event::{Event, Stack};
pub use header::TraceInfo;
pub use io::{AsyncNettraceReader, NettraceReader};
pub use metadata::{EventMetadata, Field, FieldType};
pub use payload::{decode_payload, find, NamedValue, Value};
pub use reader::{Parser, ParserOptions, ParserStats};
pub use time::{dotnet_ticks_to_unix_nanos, filetime_to_unix_nanos, Clock, SystemTime};
pub use v6::{LabelList, ThreadInfo};
