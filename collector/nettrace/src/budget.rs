//! The parser's memory budget: every decoded item the parser keeps (metadata records, stacks,
//! V6 threads and label lists, trace properties, per-thread sequence numbers) is charged before
//! it is stored, and every decoder spends from the budget's remainder while it builds an item, so
//! no stream can make the parser hold more than the budget whatever its lengths and counts say.
//!
//! Costs are heap bytes as the containers hold them: string and vector capacities, plus each
//! map or vector slot at twice its size (containers grow by doubling).

use super::cursor::{Cursor, ReadFault, ReadResult};
use super::error::NettraceError;
use profile::budget::SharedBudget;
pub(crate) use profile::budget::{slot, string_pairs};
use std::fmt::Write as _;

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

/// Bytes held by the parser, by kind, against a limit, and against the budget it shares with
/// other parsers, if any.
#[derive(Debug)]
pub(crate) struct MemoryBudget {
    limit: usize,
    held: [usize; Held::ALL.len()],
    peak: usize,
    shared: Option<SharedBudget>,
    /// The input buffer's capacity, charged to the shared budget only (the parser's own budget
    /// counts decoded state: its input is one block plus one fed chunk).
    input: usize,
}

impl MemoryBudget {
    pub fn new(limit: usize) -> Self {
        MemoryBudget {
            limit,
            held: [0; Held::ALL.len()],
            peak: 0,
            shared: None,
            input: 0,
        }
    }

    /// Also charges everything to `shared`.
    pub fn sharing(mut self, shared: Option<SharedBudget>) -> Self {
        self.shared = shared;
        self
    }

    pub fn total(&self) -> usize {
        self.held.iter().sum()
    }

    /// Takes `bytes` for an item of `kind` about to be stored (read at stream `offset`).
    pub fn charge(&mut self, kind: Held, bytes: usize, offset: u64) -> Result<(), NettraceError> {
        if bytes > self.limit - self.total() {
            return Err(self.exceeded(kind, offset));
        }
        if let Some(shared) = &self.shared {
            if !shared.take(bytes) {
                return Err(self.shared_exceeded(kind.name(), offset));
            }
        }
        self.held[kind as usize] += bytes;
        self.peak = self.peak.max(self.total());
        Ok(())
    }

    /// The input buffer now has `capacity` bytes (it is about to take input at `offset`).
    pub fn set_input(&mut self, capacity: usize, offset: u64) -> Result<(), NettraceError> {
        let Some(shared) = &self.shared else {
            return Ok(());
        };
        if capacity > self.input {
            if !shared.take(capacity - self.input) {
                return Err(self.shared_exceeded("input", offset));
            }
        } else {
            shared.give_back(self.input - capacity);
        }
        self.input = capacity;
        Ok(())
    }

    /// The most that was held at once.
    pub fn peak(&self) -> usize {
        self.peak
    }

    /// Gives back the cost of an item of `kind` that was dropped.
    pub fn release(&mut self, kind: Held, bytes: usize) {
        let held = &mut self.held[kind as usize];
        let given = bytes.min(*held);
        *held -= given;
        if let Some(shared) = &self.shared {
            shared.give_back(given);
        }
    }

    /// Everything of `kind` was dropped.
    pub fn release_all(&mut self, kind: Held) {
        let given = std::mem::take(&mut self.held[kind as usize]);
        if let Some(shared) = &self.shared {
            shared.give_back(given);
        }
    }

    /// An allowance for decoding one item: what the budget (and the shared one) has left.
    pub fn meter(&self) -> Meter {
        let own = self.limit - self.total();
        let shared = self.shared.as_ref().map_or(usize::MAX, SharedBudget::left);
        Meter {
            left: own.min(shared),
            over: false,
            shared_bound: shared < own,
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
        if meter.over && meter.shared_bound {
            self.shared_exceeded(kind.name(), offset)
        } else if meter.over {
            self.exceeded(kind, offset)
        } else {
            malformed(fault)
        }
    }

    /// The error that stops this parser's stream, counted as one refusal of the shared budget.
    fn shared_exceeded(&self, what: &'static str, offset: u64) -> NettraceError {
        let (limit, held_all) = self.shared.as_ref().map_or((0, 0), |s| {
            s.refuse();
            (s.limit(), s.held())
        });
        NettraceError::OverSharedBudget {
            what,
            offset,
            limit: limit as u64,
            held_all: held_all as u64,
            held_here: (self.total() + self.input) as u64,
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

/// A parser gives back all it held to the budget it shares.
impl Drop for MemoryBudget {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            shared.give_back(self.total() + self.input);
        }
    }
}

/// What one item may allocate while it is decoded.
#[derive(Debug)]
pub(crate) struct Meter {
    left: usize,
    over: bool,
    /// The shared budget, not the parser's own, set `left`.
    shared_bound: bool,
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
    fn parsers_sharing_a_budget_hold_no_more_than_it_together_and_give_back_when_dropped() {
        let shared = SharedBudget::new(100);
        let mut a = MemoryBudget::new(80).sharing(Some(shared.clone()));
        let mut b = MemoryBudget::new(80).sharing(Some(shared.clone()));
        a.charge(Held::Stacks, 60, 0).unwrap();
        b.set_input(30, 0).unwrap();
        assert_eq!(shared.held(), 90);
        // Within b's own budget, over the shared one: b is refused, a keeps what it holds.
        let e = b.charge(Held::Metadata, 20, 7).unwrap_err();
        assert_eq!(
            e.to_string(),
            "metadata at offset 7 do not fit in the memory budget the agent's parsers share, 100 \
             bytes (all hold 90, this stream 30); this stream stops, the others go on: raise it if \
             many streams need it (ParserOptions::shared_budget; clrscope agent: \
             --nettrace-agent-budget)"
        );
        assert_eq!(shared.refusals(), 1);
        // A decoder's allowance is the smaller of the two remainders, and says whose it is.
        let mut m = b.meter();
        let c = Cursor::new(&[], 3);
        let f = m.spend(&c, 11).unwrap_err();
        let e = b.decode_error(&m, Held::Threads, 3, f, |_| unreachable!());
        assert!(matches!(e, NettraceError::OverSharedBudget { .. }), "{e}");
        // Over its own budget first: the parser's own limit is named.
        let e = a.charge(Held::Stacks, 21, 9).unwrap_err();
        assert!(matches!(e, NettraceError::OverBudget { .. }), "{e}");
        a.release(Held::Stacks, 100);
        assert_eq!(shared.held(), 30);
        b.set_input(10, 0).unwrap();
        assert_eq!(shared.held(), 10);
        drop(b);
        assert_eq!(shared.held(), 0);
        drop(a);
        assert_eq!(shared.held(), 0);
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
