//! One copy of each logging event that the process's twin logs sessions both deliver.
//!
//! The logs session is a pair of sessions with the same provider (the agent's `run_logs_twin`):
//! any session's end turns the process's loggers off until a session is enabled anew, and the
//! runtime drops what is written while a session is being stopped, so each twin is started again
//! only while the other one runs. While both run, EventPipe writes every event into each, with
//! a timestamp of each session's own: the events carry no id of their own
//! (`LoggingEventSource`'s payload is level, factory, logger, event id and name, arguments and
//! activity ids). So a copy is known by its writing thread, event id and payload bytes, within
//! [`SAME_WRITE`] of the other copy's time; copies are matched one to one, so that a message
//! logged twice is kept twice.

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::nettrace::Event;

/// Two sessions' copies of one write are this close in time at most (Unix ns): EventPipe
/// stamps each session's copy as it writes it, one after the other on the logging thread, which
/// a loaded machine may preempt in between (50 ms let 2 of 45,464 messages through twice at a
/// load of 17 on 2 cores).
pub const SAME_WRITE: i64 = 2_000_000_000;
/// How long a copy waits for its twin after it arrived: the twins' streams are read on the
/// same grid, a step or two apart under load.
pub const TWIN_WAIT: Duration = Duration::from_secs(10);
/// At most this many copies wait; the oldest go first (a twin copy arriving after its copy
/// went is kept twice).
pub const MAX_WAITING_COPIES: usize = 131_072;

/// Copies of logging events seen lately, by session.
#[derive(Debug, Default)]
pub struct TwinCopies(Mutex<CopiesState>);

#[derive(Debug, Default)]
struct CopiesState {
    /// Every copy waiting for its twin, in arrival order: `(serial, key, arrived)`.
    arrivals: VecDeque<(u64, u64, Instant)>,
    next_serial: u64,
    /// The waiting copies by key, by session.
    by_key: HashMap<u64, Vec<Waiting>>,
    /// Second copies dropped.
    dropped: u64,
}

/// One session's copies of one key, oldest first: `(unix_nanos, serial)`. A thread writes its
/// events into every session in the same order, so the oldest is the next one's twin.
#[derive(Debug)]
struct Waiting {
    session: u64,
    copies: VecDeque<(i64, u64)>,
}

impl TwinCopies {
    fn lock(&self) -> MutexGuard<'_, CopiesState> {
        // Each call leaves the state whole: a panic elsewhere cannot leave half of one.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `event`, delivered by `session`, is the first copy of its write: false when
    /// another session delivered the same write.
    pub fn first_copy(&self, session: u64, event: &Event<'_>) -> bool {
        let mut hasher = DefaultHasher::new();
        event.header.thread_id.hash(&mut hasher);
        event.metadata.event_id.hash(&mut hasher);
        event.payload.hash(&mut hasher);
        self.first_copy_of(session, hasher.finish(), event.unix_nanos(), Instant::now())
    }

    fn first_copy_of(&self, session: u64, key: u64, unix_nanos: i64, now: Instant) -> bool {
        let mut state = self.lock();
        state.forget(now);
        let state = &mut *state;
        let queues = state.by_key.entry(key).or_default();
        let mut twin = false;
        for waiting in queues.iter_mut().filter(|w| w.session != session) {
            // Older than any twin of this copy: their twins never came (that session started
            // after them).
            while waiting
                .copies
                .front()
                .is_some_and(|&(at, _)| at < unix_nanos - SAME_WRITE)
            {
                waiting.copies.pop_front();
            }
            if waiting
                .copies
                .front()
                .is_some_and(|&(at, _)| at <= unix_nanos + SAME_WRITE)
            {
                waiting.copies.pop_front();
                twin = true;
                break;
            }
        }
        queues.retain(|w| !w.copies.is_empty());
        if twin {
            if queues.is_empty() {
                state.by_key.remove(&key);
            }
            state.dropped += 1;
            return false;
        }
        let serial = state.next_serial;
        state.next_serial += 1;
        state.arrivals.push_back((serial, key, now));
        match queues.iter_mut().find(|w| w.session == session) {
            Some(waiting) => waiting.copies.push_back((unix_nanos, serial)),
            None => queues.push(Waiting {
                session,
                copies: VecDeque::from([(unix_nanos, serial)]),
            }),
        }
        true
    }

    /// Second copies dropped so far.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }
}

impl CopiesState {
    /// Forgets the copies that waited [`TWIN_WAIT`], and the oldest beyond
    /// [`MAX_WAITING_COPIES`].
    fn forget(&mut self, now: Instant) {
        while let Some(&(serial, key, arrived)) = self.arrivals.front() {
            let old = now.saturating_duration_since(arrived) >= TWIN_WAIT;
            if !old && self.arrivals.len() < MAX_WAITING_COPIES {
                break;
            }
            self.arrivals.pop_front();
            if let Some(queues) = self.by_key.get_mut(&key) {
                // A copy is its session's oldest of its key while it waits; gone when matched.
                for waiting in queues.iter_mut() {
                    if waiting.copies.front().is_some_and(|&(_, s)| s == serial) {
                        waiting.copies.pop_front();
                    }
                }
                queues.retain(|w| !w.copies.is_empty());
                if queues.is_empty() {
                    self.by_key.remove(&key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_copy_per_write_each_write_kept() {
        let copies = TwinCopies::default();
        let now = Instant::now();
        // Session 1 alone: every event is a first copy, the same write twice too.
        assert!(copies.first_copy_of(1, 7, 1_000, now));
        assert!(copies.first_copy_of(1, 7, 2_000, now));
        // Session 2's copies of both: dropped, one each.
        assert!(!copies.first_copy_of(2, 7, 1_500, now));
        assert!(!copies.first_copy_of(2, 7, 2_500, now));
        // A third write of the same message, in session 2 first.
        assert!(copies.first_copy_of(2, 7, 3_000, now));
        assert!(!copies.first_copy_of(1, 7, 3_100, now));
        // Another key, or the same key far apart in time: not a copy.
        assert!(copies.first_copy_of(2, 8, 3_000, now));
        assert!(copies.first_copy_of(1, 9, 3_000 + 2 * SAME_WRITE, now));
        assert!(copies.first_copy_of(2, 9, 3_000, now));
        assert_eq!(copies.dropped(), 3);
    }

    #[test]
    fn copies_wait_a_bounded_while() {
        let copies = TwinCopies::default();
        let now = Instant::now();
        assert!(copies.first_copy_of(1, 7, 1_000, now));
        // Its twin arrives too late: kept (twice).
        assert!(copies.first_copy_of(2, 7, 1_000, now + TWIN_WAIT));
        for i in 0..MAX_WAITING_COPIES as u64 + 10 {
            copies.first_copy_of(1, 100 + i, 0, now + TWIN_WAIT);
        }
        let state = copies.lock();
        assert_eq!(state.arrivals.len(), MAX_WAITING_COPIES);
        assert_eq!(state.by_key.len(), MAX_WAITING_COPIES);
    }
}
