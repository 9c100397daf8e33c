//! Memory budgets the agent's parts share: a limit in bytes, what is held against it now, and
//! shares of it that hold at most a limit of their own. Two budgets of this one kind exist in an
//! agent: the parsers' (`--nettrace-agent-budget`: a parser refused memory stops its stream) and
//! the signals' (`--signal-budget`, with a share per process, `--signal-process-budget`: a record
//! refused room is dropped, counted). They are kept apart because their refusals differ: a flood
//! of log records must cost records, never the sessions that name code and take samples.
//!
//! Costs are heap bytes as the containers hold them: string and vector capacities, plus each map
//! or vector slot at twice its size (containers grow by doubling).

use std::fmt;
use std::mem::size_of;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// A memory budget several holders share: what they hold together stays under its limit. A share
/// ([`SharedBudget::share`]) holds at most its own limit, and what it holds counts against the
/// budget it was cut from too. Cloning shares.
#[derive(Clone)]
pub struct SharedBudget(Arc<SharedState>);

struct SharedState {
    limit: usize,
    held: AtomicUsize,
    /// Holders stopped because they did not fit.
    refusals: AtomicU64,
    /// The budget this is a share of.
    parent: Option<SharedBudget>,
}

impl fmt::Debug for SharedBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBudget")
            .field("limit", &self.limit())
            .field("held", &self.held())
            .field("parent", &self.0.parent)
            .finish()
    }
}

impl SharedBudget {
    pub fn new(limit: usize) -> Self {
        SharedBudget(Arc::new(SharedState {
            limit,
            held: AtomicUsize::new(0),
            refusals: AtomicU64::new(0),
            parent: None,
        }))
    }

    /// A budget without a limit (a command-line tool's, a test's).
    pub fn unlimited() -> Self {
        SharedBudget::new(usize::MAX)
    }

    /// A share of this budget: it holds at most `limit`, and only while this one has room.
    pub fn share(&self, limit: usize) -> SharedBudget {
        SharedBudget(Arc::new(SharedState {
            limit,
            held: AtomicUsize::new(0),
            refusals: AtomicU64::new(0),
            parent: Some(self.clone()),
        }))
    }

    /// The limit in bytes.
    pub fn limit(&self) -> usize {
        self.0.limit
    }

    /// Bytes held now (by this share and the shares cut from it).
    pub fn held(&self) -> usize {
        self.0.held.load(Ordering::Relaxed)
    }

    /// How many holders were refused memory.
    pub fn refusals(&self) -> u64 {
        self.0.refusals.load(Ordering::Relaxed)
    }

    /// Counts one refusal.
    pub fn refuse(&self) {
        self.0.refusals.fetch_add(1, Ordering::Relaxed);
    }

    /// What may still be taken: the least any budget up the chain has left.
    pub fn left(&self) -> usize {
        let own = self.0.limit.saturating_sub(self.held());
        self.0.parent.as_ref().map_or(own, |p| own.min(p.left()))
    }

    /// Takes `bytes` from this budget and every one up the chain, or from none.
    pub fn take(&self, bytes: usize) -> bool {
        let own = self
            .0
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                held.checked_add(bytes)
                    .filter(|&total| total <= self.0.limit)
            })
            .is_ok();
        if !own {
            return false;
        }
        if let Some(parent) = &self.0.parent {
            if !parent.take(bytes) {
                self.give_back_own(bytes);
                return false;
            }
        }
        true
    }

    /// Gives back `bytes` taken with [`SharedBudget::take`].
    pub fn give_back(&self, bytes: usize) {
        self.give_back_own(bytes);
        if let Some(parent) = &self.0.parent {
            parent.give_back(bytes);
        }
    }

    fn give_back_own(&self, bytes: usize) {
        // Never below zero, whatever the order of concurrent updates.
        let _ = self
            .0
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                Some(held.saturating_sub(bytes))
            });
    }

    /// Holds `bytes` until the hold is dropped; `None` when they do not fit.
    pub fn hold(&self, bytes: usize) -> Option<Hold> {
        self.take(bytes).then(|| Hold {
            budget: self.clone(),
            bytes,
        })
    }

    /// A hold of nothing, to grow later ([`Hold::resize`]).
    pub fn hold_nothing(&self) -> Hold {
        Hold {
            budget: self.clone(),
            bytes: 0,
        }
    }
}

/// Two budgets are equal when they are the same budget.
impl PartialEq for SharedBudget {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedBudget {}

/// Bytes held of a budget, given back when dropped.
#[derive(Debug)]
pub struct Hold {
    budget: SharedBudget,
    bytes: usize,
}

impl Hold {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds `bytes` instead; false (holding what it held) when more do not fit.
    pub fn resize(&mut self, bytes: usize) -> bool {
        if bytes > self.bytes {
            if !self.budget.take(bytes - self.bytes) {
                return false;
            }
        } else {
            self.budget.give_back(self.bytes - bytes);
        }
        self.bytes = bytes;
        true
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

/// A value and the bytes it holds of a budget, given back when the last of it is dropped (kept in
/// an `Arc`, once whoever holds a clone lets go: a history, a live reader's queue, an answer).
pub struct Charged<T> {
    value: T,
    hold: Hold,
}

impl<T> Charged<T> {
    /// `value`, holding `hold`.
    pub fn new(value: T, hold: Hold) -> Self {
        Charged { value, hold }
    }

    /// The bytes it holds.
    pub fn held_bytes(&self) -> usize {
        self.hold.bytes()
    }

    /// The value, its bytes given back.
    pub fn into_inner(self) -> T {
        self.value
    }
}

impl<T> Deref for Charged<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> DerefMut for Charged<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

impl<T: fmt::Debug> fmt::Debug for Charged<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value.fmt(f)
    }
}

/// Values compare; what they hold does not.
impl<T: PartialEq> PartialEq for Charged<T> {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

/// The heap cost of one slot of a vector or map holding `T`.
pub const fn slot<T>() -> usize {
    2 * size_of::<T>()
}

/// The heap cost of `(key, value)` string pairs.
pub fn string_pairs(pairs: &Vec<(String, String)>) -> usize {
    pairs.capacity() * size_of::<(String, String)>()
        + pairs
            .iter()
            .map(|(k, v)| k.capacity() + v.capacity())
            .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_holds_its_own_limit_and_counts_against_its_budget() {
        let agent = SharedBudget::new(100);
        let a = agent.share(60);
        let b = agent.share(60);
        let first = a.hold(50).unwrap();
        // Within a's share but not b's room in the agent's budget.
        assert!(a.hold(20).is_none());
        assert!(b.hold(60).is_none());
        let second = b.hold(50).unwrap();
        assert_eq!((agent.held(), a.held(), b.held()), (100, 50, 50));
        assert_eq!(b.left(), 0);
        drop(first);
        assert_eq!((agent.held(), a.held()), (50, 0));
        // A hold grows only while both budgets have room, and gives back when it shrinks.
        let mut growing = a.hold_nothing();
        assert!(growing.resize(50));
        assert!(!growing.resize(51));
        assert_eq!(growing.bytes(), 50);
        assert!(growing.resize(10));
        assert_eq!(agent.held(), 60);
        let charged = Charged::new("value", growing);
        assert_eq!((*charged, charged.held_bytes()), ("value", 10));
        drop(charged);
        drop(second);
        assert_eq!((agent.held(), a.held(), b.held()), (0, 0, 0));
    }
}
