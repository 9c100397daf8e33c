//! The pre-trigger ring buffer: a process's recent raw nettrace blocks, bounded in bytes and
//! seconds, from which a trace that starts *before* its trigger is cut.
//!
//! # Which session feeds it
//!
//! A dedicated session carrying the CollectTrace action's own providers, started when the rule
//! is applied and kept running until the action fires. Not the agent's existing sessions,
//! because a nettrace file is one session's stream: its metadata ids, stack ids (reset at every
//! sequence point), per-thread sequence numbers and the Trace object's clock all belong to that
//! session, so blocks of two sessions cannot be spliced into one valid file without decoding and
//! re-encoding every event; and the agent's sampler sessions are stopped every duty cycle and
//! carry only the sampler's and the light session's providers, not the ones the action asks for.
//! The cost is that session's: with the `Cpu` profile the runtime's sampler runs without pause
//! while a rule with `PreTriggerSeconds` is armed (the duty cycle cannot apply to a stream that
//! must cover the seconds before any moment); the blocks themselves are only framed, not parsed.
//!
//! # What it keeps
//!
//! The Trace object and every metadata block (events refer to metadata by id for the whole
//! session), and the stream's other blocks in order, grouped by sequence point: a group's stack
//! blocks stay as long as any of its event blocks does, since stack ids are only valid within
//! their group. Event blocks leave oldest first when the ring holds more than `max_bytes` or
//! when they are older than `max_age` behind the newest. Everything it holds is charged to the
//! process's share of the signal budget: when the share has no room, the oldest event blocks
//! leave too, counted as dropped ([`SignalKind::Rings`]). If metadata and the current group's
//! stacks alone outgrow `max_bytes` or the share, [`TraceRing::push`] says so and the owner
//! restarts the session.
//!
//! # The artifact
//!
//! [`TraceRing::write_since`] writes a valid stream: header, Trace object, all metadata, then
//! every kept group from the one holding the cut time, minus its event blocks that ended before
//! it. The capture then goes on with the live session's blocks and ends with its rundown, so the
//! file opens in any nettrace reader and its frames can be named.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::time::Duration;

use crate::signals::{SignalKind, SignalShare};
use nettrace::splice::{ObjectKind, ObjectWriter, RawObject};
use nettrace::Clock;
use profile::budget::Hold;

/// Bounds of a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingLimits {
    pub max_bytes: usize,
    /// Event blocks further than this behind the newest leave.
    pub max_age: Duration,
}

/// Why a ring cannot take more.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RingError {
    #[error(
        "the session's metadata and stacks alone take {bytes} bytes, more than the ring's \
         {limit}: the session must restart to start a fresh dictionary"
    )]
    DictionaryFull { bytes: usize, limit: usize },
    #[error(
        "the session's metadata and stacks alone take {bytes} bytes, more than the process's \
         share of the signal budget has room for (--signal-process-budget, --signal-budget): \
         the session must restart to start a fresh dictionary"
    )]
    OverBudget { bytes: usize },
    #[error("the stream has a {0:?} before its Trace object")]
    NoTrace(ObjectKind),
}

#[derive(Debug)]
struct Item {
    object: RawObject,
    /// Unix nanoseconds covered by an event block.
    range: Option<(i64, i64)>,
}

/// The blocks between two sequence points (and the one that closes them).
#[derive(Debug, Default)]
struct Group {
    items: VecDeque<Item>,
    closed: bool,
    event_blocks: usize,
}

/// A bounded copy of one session's recent blocks.
#[derive(Debug)]
pub struct TraceRing {
    limits: RingLimits,
    trace: Option<(RawObject, Clock)>,
    metadata: Vec<RawObject>,
    groups: VecDeque<Group>,
    bytes: usize,
    newest: i64,
    /// `bytes`, held of the process's share.
    held: Hold,
    share: SignalShare,
}

impl TraceRing {
    pub fn new(limits: RingLimits, share: &SignalShare) -> Self {
        TraceRing {
            limits,
            trace: None,
            metadata: Vec::new(),
            groups: VecDeque::new(),
            bytes: 0,
            newest: i64::MIN,
            held: share.budget().hold_nothing(),
            share: share.clone(),
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The start of the oldest event block held, Unix nanoseconds.
    pub fn oldest_event(&self) -> Option<i64> {
        self.groups
            .iter()
            .flat_map(|g| g.items.iter())
            .filter_map(|i| i.range.map(|r| r.0))
            .min()
    }

    /// The Unix-nanosecond clock of the stream, once its Trace object arrived.
    pub fn clock(&self) -> Option<Clock> {
        self.trace.as_ref().map(|(_, c)| *c)
    }

    /// Adds the stream's next object, dropping the oldest event blocks beyond the limits.
    pub fn push(&mut self, object: RawObject) -> Result<(), RingError> {
        let size = object.size();
        match object.kind {
            ObjectKind::Trace => {
                let clock = object
                    .trace_info()
                    .map(|t| t.clock())
                    .ok_or(RingError::NoTrace(ObjectKind::Trace))?;
                self.bytes += size;
                self.trace = Some((object, clock));
                if !self.held.resize(self.bytes) {
                    return Err(RingError::OverBudget { bytes: self.bytes });
                }
                return Ok(());
            }
            ObjectKind::MetadataBlock => {
                self.metadata.push(object);
                self.bytes += size;
            }
            kind => {
                let clock = self.clock().ok_or(RingError::NoTrace(kind))?;
                let range = (kind == ObjectKind::EventBlock)
                    .then(|| object.time_range())
                    .flatten()
                    .map(|(a, b)| (clock.unix_nanos(a), clock.unix_nanos(b)));
                if let Some((_, end)) = range {
                    self.newest = self.newest.max(end);
                }
                if self.groups.back().is_none_or(|g| g.closed) {
                    self.groups.push_back(Group::default());
                }
                let group = self.groups.back_mut().expect("a group was just ensured");
                group.closed = kind == ObjectKind::SequencePointBlock;
                group.event_blocks += usize::from(range.is_some());
                group.items.push_back(Item { object, range });
                self.bytes += size;
            }
        }
        self.evict();
        if self.bytes > self.limits.max_bytes {
            return Err(RingError::DictionaryFull {
                bytes: self.bytes,
                limit: self.limits.max_bytes,
            });
        }
        if !self.held.resize(self.bytes) {
            return Err(RingError::OverBudget { bytes: self.bytes });
        }
        Ok(())
    }

    fn evict(&mut self) {
        let max_age = i64::try_from(self.limits.max_age.as_nanos()).unwrap_or(i64::MAX);
        let oldest_allowed = self.newest.saturating_sub(max_age);
        loop {
            let over = self.bytes > self.limits.max_bytes;
            let Some(front) = self.groups.front_mut() else {
                return;
            };
            let first_event = front.items.iter().position(|i| i.range.is_some());
            let old = first_event
                .and_then(|i| front.items[i].range)
                .is_some_and(|(_, end)| end < oldest_allowed);
            // Asked last: a block that leaves for its age or the ring's size was not dropped.
            let unpaid = first_event.is_some() && !over && !old && !self.held.resize(self.bytes);
            match first_event {
                Some(i) if over || old || unpaid => {
                    let item = front.items.remove(i).expect("position is in range");
                    front.event_blocks -= 1;
                    self.bytes -= item.object.size();
                    if unpaid {
                        self.share.count_dropped(SignalKind::Rings, 1);
                    }
                }
                // A closed group without events left holds stacks nobody refers to.
                None if front.closed => {
                    let group = self.groups.pop_front().expect("front exists");
                    self.bytes -= group.items.iter().map(|i| i.object.size()).sum::<usize>();
                }
                _ => return,
            }
        }
    }

    /// Writes a valid stream holding the kept events that end at or after `from` (Unix
    /// nanoseconds): header, Trace object, metadata, then the groups from the cut on. The caller
    /// may go on writing the live session's objects, then [`ObjectWriter::finish`]. Returns the
    /// start of the first event block written.
    pub fn write_since<W: Write>(
        &self,
        from: i64,
        out: &mut ObjectWriter<W>,
    ) -> io::Result<Option<i64>> {
        let Some((trace, _)) = &self.trace else {
            return Ok(None);
        };
        out.write(trace)?;
        for m in &self.metadata {
            out.write(m)?;
        }
        let mut first = None::<i64>;
        for (n, group) in self.groups.iter().enumerate() {
            let last = n + 1 == self.groups.len();
            let keeps_events = group
                .items
                .iter()
                .any(|i| i.range.is_some_and(|(_, end)| end >= from));
            if !keeps_events && !last {
                continue;
            }
            for item in &group.items {
                match item.range {
                    Some((_, end)) if end < from => {}
                    Some((start, _)) => {
                        first = Some(first.map_or(start, |f| f.min(start)));
                        out.write(&item.object)?;
                    }
                    None => out.write(&item.object)?,
                }
            }
        }
        Ok(first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nettrace::splice::ObjectSplitter;
    use nettrace::testutil::{EventSpec, MetadataRecord, StreamBuilder};
    use nettrace::Parser;

    /// Events each second (QPC in ns from 1000), a sequence point every 3 s, stacks per group.
    fn long_stream(seconds: i64) -> Vec<RawObject> {
        let s = 1_000_000_000i64;
        let mut b = StreamBuilder::new(8);
        b.metadata_block(&[MetadataRecord::new(1, "P", 1, "E").encode()], true);
        for t in 0..seconds {
            if t % 3 == 0 {
                b.stack_block(1, &[&[0x100 + t as u64]]);
            }
            b.event_block(
                &[EventSpec::new(1, t as u32 + 1, 7, 1000 + t * s, vec![t as u8]).stack(1)],
                true,
            );
            if t % 3 == 2 {
                b.sequence_point(1000 + t * s + 1, &[(7, t as u32 + 1)]);
            }
        }
        let stream = b.finish();
        let mut splitter = ObjectSplitter::new(1 << 20);
        splitter.feed(&stream);
        let mut out = Vec::new();
        while let Some(o) = splitter.next_object().unwrap() {
            out.push(o);
        }
        out
    }

    fn parse(stream: &[u8]) -> Vec<(u8, u64)> {
        let mut p = Parser::new();
        p.feed(stream).unwrap();
        let mut out = Vec::new();
        while let Some(e) = p.next_event().unwrap() {
            out.push((e.payload[0], e.stack().unwrap().ips().next().unwrap()));
        }
        p.finish().unwrap();
        assert_eq!(p.dropped_events(), 0);
        out
    }

    #[test]
    fn a_cut_keeps_its_groups_stacks_and_reads_back() {
        let mut ring = TraceRing::new(
            RingLimits {
                max_bytes: 1 << 20,
                max_age: Duration::from_secs(5),
            },
            &SignalShare::unlimited(),
        );
        for o in long_stream(20) {
            ring.push(o).unwrap();
        }
        let clock = ring.clock().unwrap();
        // Events older than 5 s behind the newest (t = 19) left.
        let oldest = ring.oldest_event().unwrap();
        assert_eq!(oldest, clock.unix_nanos(1000 + 14 * 1_000_000_000));
        // Cut at t = 16 (mid-group 15..17): its stack block (written at t = 15) comes along.
        let mut w = ObjectWriter::new(Vec::new()).unwrap();
        let from = clock.unix_nanos(1000 + 16 * 1_000_000_000);
        let first = ring.write_since(from, &mut w).unwrap();
        assert_eq!(first, Some(from));
        let file = w.finish().unwrap();
        assert_eq!(
            parse(&file),
            [(16, 0x10f), (17, 0x10f), (18, 0x112), (19, 0x112)]
        );
    }

    #[test]
    fn bytes_bound_the_ring() {
        let objects = long_stream(30);
        let mut ring = TraceRing::new(
            RingLimits {
                max_bytes: 2000,
                max_age: Duration::from_secs(3600),
            },
            &SignalShare::unlimited(),
        );
        for o in objects {
            ring.push(o).unwrap();
            assert!(ring.bytes() <= 2000, "{}", ring.bytes());
        }
        let mut w = ObjectWriter::new(Vec::new()).unwrap();
        ring.write_since(i64::MIN, &mut w).unwrap();
        let events = parse(&w.finish().unwrap());
        assert!(!events.is_empty() && events.len() < 30, "{events:?}");
        assert_eq!(events.last().unwrap().0, 29);

        let mut tiny = TraceRing::new(
            RingLimits {
                max_bytes: 50,
                max_age: Duration::from_secs(1),
            },
            &SignalShare::unlimited(),
        );
        let mut objects = long_stream(3).into_iter();
        tiny.push(objects.next().unwrap()).unwrap();
        assert!(matches!(
            objects.try_for_each(|o| tiny.push(o)),
            Err(RingError::DictionaryFull { .. })
        ));
    }

    #[test]
    fn the_signal_budget_bounds_the_ring_and_counts_what_it_dropped() {
        let objects = long_stream(30);
        let agent = profile::budget::SharedBudget::new(3000);
        let share = SignalShare::new(agent.share(2000));
        let limits = RingLimits {
            max_bytes: 1 << 20,
            max_age: Duration::from_secs(3600),
        };
        let mut ring = TraceRing::new(limits, &share);
        for o in objects {
            ring.push(o).unwrap();
            assert!(ring.bytes() <= 2000, "{}", ring.bytes());
            assert_eq!(agent.held(), ring.bytes());
        }
        let dropped = share.dropped(SignalKind::Rings);
        assert!(dropped > 0);
        let mut w = ObjectWriter::new(Vec::new()).unwrap();
        ring.write_since(i64::MIN, &mut w).unwrap();
        let events = parse(&w.finish().unwrap());
        assert_eq!(events.len() as u64, 30 - dropped, "{events:?}");
        assert_eq!(events.last().unwrap().0, 29);
        drop(ring);
        assert_eq!(agent.held(), 0);

        // Another holder took the room: the dictionary alone does not fit.
        let taken = agent.hold(2990).unwrap();
        let mut starved = TraceRing::new(limits, &share);
        let refused = long_stream(3).into_iter().try_for_each(|o| starved.push(o));
        assert!(
            matches!(refused, Err(RingError::OverBudget { .. })),
            "{refused:?}"
        );
        drop(taken);
    }
}
