//! The parser's memory budget: every decoded item the parser keeps (metadata records, stacks,
//! V6 threads and label lists, trace properties, per-thread sequence numbers) is charged before
//! it is stored, and every decoder spends from the budget's remainder while it builds an item, so
//! no stream can make the parser hold more than the budget whatever its lengths and counts say.
//!
//! Costs are heap bytes as the containers hold them: string and vector capacities, plus each
//! map or vector slot at twice its size (containers grow by doubling).

use super::cursor::{Cursor, ReadFault, ReadResult};
use super::error::NettraceError;
use std::fmt::Write as _;
use std::mem::size_of;

/// What the parser holds, for the budget's breakdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    Metadata,
    Stacks,
    Threads,
    LabelLists,
    TraceProperties,
    /// The last sequence number of every capture thread, for dropped-event counts.
    SequenceNumbers,
}

impl Held {
    const ALL: [Held; 6] = [
        Held::Metadata,
        Held::Stacks,
        Held::Threads,
        Held::LabelLists,
        Held::TraceProperties,
        Held::SequenceNumbers,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Held::Metadata => "metadata",
            Held::Stacks => "stacks",
            Held::Threads => "threads",
            Held::LabelLists => "label lists",
            Held::TraceProperties => "trace properties",
            Held::SequenceNumbers => "sequence numbers",
        }
    }
}

/// The heap cost of one slot of a vector or map holding `T`.
pub(crate) const fn slot<T>() -> usize {
    2 * size_of::<T>()
}

/// The heap cost of `(key, value)` string pairs.
pub(crate) fn string_pairs(pairs: &Vec<(String, String)>) -> usize {
    pairs.capacity() * size_of::<(String, String)>()
        + pairs
            .iter()
            .map(|(k, v)| k.capacity() + v.capacity())
            .sum::<usize>()
}

/// Bytes held by the parser, by kind, against a limit.
#[derive(Debug)]
pub(crate) struct MemoryBudget {
    limit: usize,
    held: [usize; Held::ALL.len()],
    peak: usize,
}

impl MemoryBudget {
    pub fn new(limit: usize) -> Self {
        MemoryBudget {
            limit,
            held: [0; Held::ALL.len()],
            peak: 0,
        }
    }

    pub fn total(&self) -> usize {
        self.held.iter().sum()
    }

    /// Takes `bytes` for an item of `kind` about to be stored (read at stream `offset`).
    pub fn charge(&mut self, kind: Held, bytes: usize, offset: u64) -> Result<(), NettraceError> {
        if bytes > self.limit - self.total() {
            return Err(self.exceeded(kind, offset));
        }
        self.held[kind as usize] += bytes;
        self.peak = self.peak.max(self.total());
        Ok(())
    }

    /// The most that was held at once.
    pub fn peak(&self) -> usize {
        self.peak
    }

    /// Gives back the cost of an item of `kind` that was dropped.
    pub fn release(&mut self, kind: Held, bytes: usize) {
        let held = &mut self.held[kind as usize];
        *held = held.saturating_sub(bytes);
    }

    /// Everything of `kind` was dropped.
    pub fn release_all(&mut self, kind: Held) {
        self.held[kind as usize] = 0;
    }

    /// An allowance for decoding one item: what the budget has left.
    pub fn meter(&self) -> Meter {
        Meter {
            left: self.limit - self.total(),
            over: false,
        }
    }

    /// Maps a decoder's failure: over its allowance means over the budget, anything else is
    /// the stream's fault as `malformed` describes it.
    pub fn decode_error(
        &self,
        meter: &Meter,
        kind: Held,
        offset: u64,
        fault: ReadFault,
        malformed: impl FnOnce(ReadFault) -> NettraceError,
    ) -> NettraceError {
        if meter.over {
            self.exceeded(kind, offset)
        } else {
            malformed(fault)
        }
    }

    fn exceeded(&self, kind: Held, offset: u64) -> NettraceError {
        let mut held = String::new();
        for k in Held::ALL {
            let bytes = self.held[k as usize];
            if bytes > 0 {
                let sep = if held.is_empty() { "" } else { ", " };
                let _ = write!(held, "{sep}{} {bytes}", k.name());
            }
        }
        if held.is_empty() {
            held.push_str("nothing");
        }
        NettraceError::OverBudget {
            what: kind.name(),
            offset,
            limit: self.limit as u64,
            held,
        }
    }
}

/// What one item may allocate while it is decoded.
#[derive(Debug)]
pub(crate) struct Meter {
    left: usize,
    over: bool,
}

impl Meter {
    /// Takes `bytes` the decoder is about to allocate; a fault at `c` when they do not fit.
    pub fn spend(&mut self, c: &Cursor<'_>, bytes: usize) -> ReadResult<()> {
        match self.left.checked_sub(bytes) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => {
                self.over = true;
                Err(c.fault("over the parser's memory budget"))
            }
        }
    }

    /// A string read with [`Cursor::utf8`], paid for before it is allocated (invalid UTF-8
    /// grows by up to three times when replaced).
    pub fn utf8(&mut self, c: &mut Cursor<'_>) -> ReadResult<String> {
        let mut peek = *c;
        let len = peek.var_u32()? as usize;
        self.spend(c, len.saturating_mul(3))?;
        let s = c.utf8()?;
        self.left += len.saturating_mul(3) - s.capacity().min(len.saturating_mul(3));
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_until_the_limit_and_names_what_is_held() {
        let mut b = MemoryBudget::new(100);
        b.charge(Held::Stacks, 60, 0).unwrap();
        b.charge(Held::Metadata, 40, 5).unwrap();
        let e = b.charge(Held::LabelLists, 1, 9).unwrap_err();
        assert_eq!(
            e.to_string(),
            "label lists at offset 9 do not fit in the parser's memory budget of 100 bytes \
             (holding metadata 40, stacks 60); the stream is hostile or damaged, or a genuine \
             one needs a higher budget (ParserOptions::memory_budget; clrscope: --nettrace-budget)"
        );
        b.release(Held::Stacks, 60);
        b.charge(Held::LabelLists, 60, 9).unwrap();
        b.release_all(Held::LabelLists);
        assert_eq!(b.total(), 40);
    }

    #[test]
    fn meter_faults_when_the_remainder_is_spent() {
        let mut b = MemoryBudget::new(10);
        b.charge(Held::Threads, 4, 0).unwrap();
        let mut m = b.meter();
        let c = Cursor::new(&[], 7);
        m.spend(&c, 6).unwrap();
        let f = m.spend(&c, 1).unwrap_err();
        let e = b.decode_error(&m, Held::Threads, 3, f, |_| unreachable!());
        assert!(
            matches!(e, NettraceError::OverBudget { offset: 3, .. }),
            "{e}"
        );
        // A string is paid for at three times its length before it is read.
        let mut m = MemoryBudget::new(8).meter();
        let bytes = [3, b'a', b'b', b'c'];
        assert!(m.utf8(&mut Cursor::new(&bytes, 0)).is_err());
        let mut m = MemoryBudget::new(9).meter();
        assert_eq!(m.utf8(&mut Cursor::new(&bytes, 0)).unwrap(), "abc");
    }
}
