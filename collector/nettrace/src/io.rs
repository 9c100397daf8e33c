//! Pull-style readers over a file or socket: the parser fed in fixed-size chunks, so memory
//! stays at one block plus one chunk.

use super::error::NettraceError;
use super::event::Event;
use super::reader::{Parser, ParserOptions};
use std::io::{ErrorKind, Read};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Bytes read from the source per call.
const CHUNK: usize = 256 << 10;

/// Reads a NetTrace stream from a blocking source (file, pipe).
#[derive(Debug)]
pub struct NettraceReader<R> {
    inner: R,
    parser: Parser,
    chunk: Vec<u8>,
    eof: bool,
}

impl<R: Read> NettraceReader<R> {
    /// Reader with default limits.
    pub fn new(inner: R) -> Self {
        Self::with_options(inner, ParserOptions::default())
    }

    /// Reader with the given limits.
    pub fn with_options(inner: R, opts: ParserOptions) -> Self {
        NettraceReader {
            inner,
            parser: Parser::with_options(opts),
            chunk: vec![0; CHUNK],
            eof: false,
        }
    }

    /// The next event; `Ok(None)` at a clean end of stream, an error if the stream is damaged
    /// or ends early.
    pub fn next_event(&mut self) -> Result<Option<Event<'_>>, NettraceError> {
        loop {
            if let Some(st) = self.parser.advance()? {
                return Ok(Some(self.parser.make_event(st)));
            }
            if self.eof || self.parser.is_finished() {
                self.parser.finish()?;
                return Ok(None);
            }
            let n = loop {
                match self.inner.read(&mut self.chunk) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(source) => {
                        return Err(NettraceError::Io {
                            offset: self.parser.bytes_fed(),
                            source,
                        })
                    }
                }
            };
            if n == 0 {
                self.eof = true;
            } else {
                self.parser.feed(&self.chunk[..n])?;
            }
        }
    }

    /// The parser, for the trace header, metadata, drop counts and statistics.
    pub fn parser(&self) -> &Parser {
        &self.parser
    }

    /// The source back.
    pub fn into_inner(self) -> R {
        self.inner
    }
}

/// Reads a NetTrace stream from an async source (the diagnostic socket of a live session).
#[derive(Debug)]
pub struct AsyncNettraceReader<R> {
    inner: R,
    parser: Parser,
    chunk: Vec<u8>,
    eof: bool,
}

impl<R: AsyncRead + Unpin> AsyncNettraceReader<R> {
    /// Reader with default limits.
    pub fn new(inner: R) -> Self {
        Self::with_options(inner, ParserOptions::default())
    }

    /// Reader with the given limits.
    pub fn with_options(inner: R, opts: ParserOptions) -> Self {
        AsyncNettraceReader {
            inner,
            parser: Parser::with_options(opts),
            chunk: vec![0; CHUNK],
            eof: false,
        }
    }

    /// The next event, waiting for the source as needed; `Ok(None)` at a clean end of stream.
    /// Events are delivered as soon as their block has arrived. Cancel-safe: a cancelled call
    /// loses no input.
    pub async fn next_event(&mut self) -> Result<Option<Event<'_>>, NettraceError> {
        loop {
            if let Some(st) = self.parser.advance()? {
                return Ok(Some(self.parser.make_event(st)));
            }
            if self.eof || self.parser.is_finished() {
                self.parser.finish()?;
                return Ok(None);
            }
            let n = match self.inner.read(&mut self.chunk).await {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(source) => {
                    return Err(NettraceError::Io {
                        offset: self.parser.bytes_fed(),
                        source,
                    })
                }
            };
            if n == 0 {
                self.eof = true;
            } else {
                self.parser.feed(&self.chunk[..n])?;
            }
        }
    }

    /// The parser, for the trace header, metadata, drop counts and statistics.
    pub fn parser(&self) -> &Parser {
        &self.parser
    }

    /// The source back.
    pub fn into_inner(self) -> R {
        self.inner
    }
}
