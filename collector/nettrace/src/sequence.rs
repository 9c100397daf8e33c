//! Dropped-event accounting from sequence numbers.
//!
//! Every capture thread numbers its events 1, 2, 3, … whether or not they reach the stream, so
//! a gap between consecutive events of one capture thread is a count of events the runtime
//! dropped (buffers full). A sequence point carries each thread's latest number, which also
//! reveals drops on threads whose events were *all* dropped. A number going back, or a previous
//! number of 0, means the OS reused a thread id: counted as a restart, not as drops.

use super::budget::slot;
use std::collections::{HashMap, HashSet};

#[derive(Debug, Clone, Copy)]
struct ThreadSeq {
    thread_id: u64,
    last: u32,
    dropped: u64,
}

#[derive(Debug, Default)]
pub(crate) struct DropTracker {
    threads: Vec<ThreadSeq>,
    index: HashMap<u64, usize>,
    /// Index of the thread of the previous event: runs of events share a capture thread.
    cached: Option<usize>,
    total: u64,
}

/// Events missing between `last` and `seq`, where `seq` should be `last + 1`.
#[inline]
fn gap(last: u32, seq: u32, expected_step: u32) -> u64 {
    if last == 0 {
        return 0;
    }
    let diff = seq.wrapping_sub(last);
    if diff > expected_step && diff < 0x8000_0000 {
        u64::from(diff - expected_step)
    } else {
        0
    }
}

impl DropTracker {
    /// Budget cost of one capture thread: its entry and its index entry.
    pub const THREAD_COST: usize = slot::<ThreadSeq>() + slot::<(u64, usize)>();

    /// Capture threads tracked.
    #[inline]
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Forgets the threads a sequence point does not list: the runtime lists every thread that
    /// still has a buffer, so the others have exited (their drops stay in the total).
    pub fn keep_only(&mut self, listed: &[(u64, u32)]) {
        let listed: HashSet<u64> = listed.iter().map(|&(thread, _)| thread).collect();
        self.threads.retain(|t| listed.contains(&t.thread_id));
        self.index = self
            .threads
            .iter()
            .enumerate()
            .map(|(i, t)| (t.thread_id, i))
            .collect();
        self.cached = None;
    }

    #[inline]
    fn slot(&mut self, thread_id: u64, seq_if_new: u32) -> (usize, bool) {
        if let Some(i) = self.cached {
            if self.threads[i].thread_id == thread_id {
                return (i, false);
            }
        }
        let (i, new) = match self.index.get(&thread_id) {
            Some(&i) => (i, false),
            None => {
                self.threads.push(ThreadSeq {
                    thread_id,
                    last: seq_if_new,
                    dropped: 0,
                });
                let i = self.threads.len() - 1;
                self.index.insert(thread_id, i);
                (i, true)
            }
        };
        self.cached = Some(i);
        (i, new)
    }

    /// Records an event; returns how many events were dropped just before it on its thread.
    #[inline]
    pub fn on_event(&mut self, capture_thread_id: u64, seq: u32) -> u64 {
        let (i, new) = self.slot(capture_thread_id, seq);
        if new {
            return 0;
        }
        let t = &mut self.threads[i];
        let lost = gap(t.last, seq, 1);
        t.last = seq;
        t.dropped += lost;
        self.total += lost;
        lost
    }

    /// Records a sequence point's view of one thread.
    pub fn on_sequence_point(&mut self, capture_thread_id: u64, seq: u32) {
        let (i, new) = self.slot(capture_thread_id, seq);
        if new {
            return;
        }
        let t = &mut self.threads[i];
        let lost = gap(t.last, seq, 0);
        t.last = seq;
        t.dropped += lost;
        self.total += lost;
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    /// `(capture thread id, dropped)` for threads that dropped anything.
    pub fn by_thread(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.threads
            .iter()
            .filter(|t| t.dropped > 0)
            .map(|t| (t.thread_id, t.dropped))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_per_thread() {
        let mut d = DropTracker::default();
        assert_eq!(d.on_event(1, 1), 0);
        assert_eq!(d.on_event(1, 2), 0);
        assert_eq!(
            d.on_event(2, 7),
            0,
            "first sight of a thread is never a drop"
        );
        assert_eq!(d.on_event(1, 5), 2);
        assert_eq!(d.on_event(2, 8), 0);
        assert_eq!(d.total(), 2);
        // Sequence point: thread 2 logged up to 11 but we saw 8 → 3 dropped.
        d.on_sequence_point(2, 11);
        d.on_sequence_point(1, 5);
        assert_eq!(d.total(), 5);
        assert_eq!(d.on_event(2, 12), 0);
        // Thread id reuse: numbering restarts at 1.
        assert_eq!(d.on_event(1, 1), 0);
        assert_eq!(d.on_event(1, 2), 0);
        let mut by: Vec<_> = d.by_thread().collect();
        by.sort();
        assert_eq!(by, vec![(1, 2), (2, 3)]);
    }

    #[test]
    fn wraparound() {
        let mut d = DropTracker::default();
        d.on_event(9, u32::MAX - 1);
        assert_eq!(d.on_event(9, u32::MAX), 0);
        assert_eq!(d.on_event(9, 1), 1, "0 was skipped across the wrap");
    }
}
