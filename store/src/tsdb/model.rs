//! What goes in (batches) and what comes out (queries), independent of how it is stored.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::incidents::IncidentWindow;

use super::error::{Result, StoreError};
use profile::{LabelValue, ProfileType};

/// One time series: a profile type of one labelled source (service, process, host, ...).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Series {
    pub profile_type: ProfileType,
    /// Sorted by key, keys unique.
    pub labels: Vec<(String, String)>,
}

impl Series {
    pub(crate) fn matches(
        &self,
        profile_type: &ProfileType,
        matchers: &[(String, String)],
    ) -> bool {
        &self.profile_type == profile_type
            && matchers
                .iter()
                .all(|(k, v)| self.labels.iter().any(|(sk, sv)| sk == k && sv == v))
    }
}

/// A question for [`super::Store::profile`] or [`super::Store::series`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// Inclusive, Unix nanoseconds.
    pub from: i64,
    /// Exclusive, Unix nanoseconds.
    pub until: i64,
    pub profile_type: ProfileType,
    /// Series label equalities, all of which must hold; see [`parse_selector`].
    pub matchers: Vec<(String, String)>,
    /// Sample label equalities (e.g. `span_id`), all of which must hold.
    pub sample_matchers: Vec<(String, LabelValue)>,
    /// Which sample labels [`super::Store::profile`] keeps.
    pub sample_labels: SampleLabels,
    /// Lets whoever asked stop the query, and counts what it read.
    pub control: QueryControl,
}

/// Shared by a query and whoever asked it (a clone is the same control): the asker can cancel
/// the query, which then stops before its next block with [`StoreError::Cancelled`]; the query
/// counts the blocks it read, so the asker can tell how much work it did.
///
/// A control is not part of the question: any two compare equal.
#[derive(Debug, Clone, Default)]
pub struct QueryControl(Arc<ControlState>);

#[derive(Debug, Default)]
struct ControlState {
    cancelled: AtomicBool,
    blocks_read: AtomicU64,
}

impl QueryControl {
    /// Asks the query to stop: it returns [`StoreError::Cancelled`] before reading another
    /// block. A query that has read its blocks finishes.
    pub fn cancel(&self) {
        self.0.cancelled.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.cancelled.load(Ordering::Relaxed)
    }

    /// Blocks the queries of this control have read so far.
    pub fn blocks_read(&self) -> u64 {
        self.0.blocks_read.load(Ordering::Relaxed)
    }

    /// Before each block: stops a cancelled query.
    pub(crate) fn check(&self) -> Result<()> {
        if self.is_cancelled() {
            return Err(StoreError::Cancelled);
        }
        Ok(())
    }

    pub(crate) fn block_read(&self) {
        self.0.blocks_read.fetch_add(1, Ordering::Relaxed);
    }
}

impl PartialEq for QueryControl {
    fn eq(&self, _: &QueryControl) -> bool {
        true
    }
}

impl Eq for QueryControl {}

/// Which per-sample labels a merged profile keeps. Samples that differ only in labels it drops
/// merge into one, so dropping the per-thread ones shrinks the answer (and its cost) by up to
/// the number of threads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SampleLabels {
    /// All of them (`thread_id`, `thread_name`, `trace_id`, ...): what a pprof file carries.
    #[default]
    All,
    /// Only those with these keys; none when empty, which is all a flame graph needs.
    Only(Vec<String>),
}

impl SampleLabels {
    /// The labels of a set (sorted) that are kept, in the same order.
    pub(crate) fn keep<'a>(
        &self,
        labels: &'a [(String, LabelValue)],
    ) -> Cow<'a, [(String, LabelValue)]> {
        match self {
            SampleLabels::All => Cow::Borrowed(labels),
            SampleLabels::Only(keys) => labels
                .iter()
                .filter(|(key, _)| keys.contains(key))
                .cloned()
                .collect(),
        }
    }
}

impl Query {
    pub(crate) fn check(&self) -> Result<()> {
        if self.from >= self.until {
            return Err(StoreError::InvalidQuery(format!(
                "empty time range: from {} is not before until {}",
                self.from, self.until
            )));
        }
        Ok(())
    }

    pub(crate) fn sample_labels_match(&self, labels: &[(String, LabelValue)]) -> bool {
        self.sample_matchers
            .iter()
            .all(|m| labels.iter().any(|l| l == m))
    }
}

/// Tuning of [`super::Store`]; [`Default`] suits one node agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// The longest the head stays in memory unflushed: what a SIGKILL can lose. At most 10 s.
    pub flush_interval: Duration,
    /// Time span of a partition; a block never straddles two, and compaction merges the
    /// blocks of one partition into one.
    pub partition: Duration,
    /// Blocks whose newest sample is older than this are deleted, at every level.
    pub retention_age: Duration,
    /// Blocks of full detail (one partition each, sample times as appended) whose newest sample
    /// is older than this are deleted; the levels of [`StoreOptions::levels`] keep their time.
    pub full_detail_age: Duration,
    /// Coarser copies of the data, finest first (see [`Level`]); empty: none.
    pub levels: Vec<Level>,
    /// While the blocks take more bytes than this, blocks are deleted: first those a coarser
    /// block covers, oldest first, then the oldest of the rest; never the newest block.
    pub retention_bytes: u64,
    /// The head is flushed early once its estimated size passes this many bytes.
    pub head_bytes: usize,
    /// Estimated bytes of block dictionaries kept for queries (see `cache.rs`): past it, the
    /// next query starts an empty cache. An hour of the busy service of `BENCHMARKS.md` takes
    /// about 17 MiB; 0 keeps nothing between queries.
    pub query_cache_bytes: usize,
    /// Most sample rows making a level's block reads at once (a few series per pass): its
    /// memory is ~80 bytes per row of this, whatever the span holds. Fewer means more reads.
    pub level_pass_rows: u64,
    /// How far incidents reach around their causes ([`crate::incidents`]).
    pub incident_window: IncidentWindow,
}

/// A coarser copy of the data (a "level"): once a span of `resolution` is closed, the blocks
/// of the next finer level in it are merged into one block whose sample times are the span's
/// start, one row per series, stack and sample label set, with the labels of `drop_labels`
/// removed. Values are summed, so the total of any span equals the finer data's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Level {
    /// Span of one block and the time resolution of its samples: a multiple of the next finer
    /// level's (of [`StoreOptions::partition`] for the first level).
    pub resolution: Duration,
    /// Blocks of this level whose span ended longer ago than this are deleted.
    pub retention_age: Duration,
    /// Sample labels not kept at this level (nor at coarser ones): those of per-sample
    /// cardinality that would keep rows apart which a long range merges anyway.
    pub drop_labels: Vec<String>,
}

impl Level {
    /// The default levels: 10 minutes kept 3 days without trace and span ids (span names
    /// stay); 1 hour and 1 day (UTC) kept as long as the store keeps anything, without thread
    /// ids either (thread names stay). Days let a week's flame graph read ~30 blocks rather
    /// than 168 hours' dictionaries; hours stay for ranges and timeline steps within a day.
    pub fn defaults() -> Vec<Level> {
        use profile::labels::{SPAN_ID, THREAD_ID, TRACE_ID};
        let traces = [TRACE_ID, SPAN_ID].map(String::from).to_vec();
        let threads = [traces.clone(), vec![THREAD_ID.to_string()]].concat();
        vec![
            Level {
                resolution: Duration::from_secs(600),
                retention_age: Duration::from_secs(3 * 24 * 3600),
                drop_labels: traces,
            },
            Level {
                resolution: Duration::from_secs(3600),
                retention_age: Duration::MAX,
                drop_labels: threads.clone(),
            },
            Level {
                resolution: Duration::from_secs(24 * 3600),
                retention_age: Duration::MAX,
                drop_labels: threads,
            },
        ]
    }
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            flush_interval: Duration::from_secs(10),
            partition: Duration::from_secs(60),
            retention_age: Duration::from_secs(7 * 24 * 3600),
            full_detail_age: Duration::from_secs(24 * 3600),
            levels: Level::defaults(),
            retention_bytes: 1 << 30,
            head_bytes: 64 << 20,
            query_cache_bytes: 32 << 20,
            level_pass_rows: 1 << 18,
            incident_window: IncidentWindow::default(),
        }
    }
}

impl StoreOptions {
    pub(crate) fn check(&self) -> Result<()> {
        let fail = |m: &str| Err(StoreError::InvalidOptions(m.to_string()));
        if self.flush_interval > Duration::from_secs(10) {
            return fail("flush_interval must be at most 10 s: it bounds what a crash loses");
        }
        if self.partition.as_nanos() == 0 || self.partition.as_nanos() > i64::MAX as u128 {
            return fail("partition must be between 1 ns and 292 years (one minute is usual)");
        }
        let mut finer = self.partition;
        for level in &self.levels {
            let (coarse, fine) = (level.resolution.as_nanos(), finer.as_nanos());
            if coarse <= fine || coarse % fine != 0 || coarse > i64::MAX as u128 {
                return fail(
                    "each level's resolution must be a larger multiple of the next finer one's \
                     (the partition's for the first), e.g. 1 min, 10 min, 1 h",
                );
            }
            finer = level.resolution;
        }
        if self.head_bytes == 0 {
            return fail("head_bytes must be positive");
        }
        if self.level_pass_rows == 0 {
            return fail("level_pass_rows must be positive");
        }
        Ok(())
    }
}

/// Parses `{service_name="api",process_id="42"}` (braces optional, `\"` and `\\` escapes)
/// into label equalities, so callers can take Pyroscope-style selectors from users.
pub fn parse_selector(input: &str) -> Result<Vec<(String, String)>> {
    let fail = |reason: &str| StoreError::InvalidSelector {
        input: input.to_string(),
        reason: reason.to_string(),
    };
    let mut s = input.trim();
    if let Some(inner) = s.strip_prefix('{') {
        s = inner
            .strip_suffix('}')
            .ok_or_else(|| fail("missing closing '}'"))?;
    }
    let mut chars = s.chars().peekable();
    let mut out = Vec::new();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                key.push(c);
                chars.next();
            } else {
                break;
            }
        }
        if key.is_empty() {
            return Err(fail("expected a label name"));
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') {
            return Err(fail(&format!(
                "expected '=' after {key} (only equality is supported)"
            )));
        }
        if chars.peek() == Some(&'~') {
            return Err(fail(&format!(
                "{key}=~ is a regular expression match: only equality is supported"
            )));
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('"') {
            return Err(fail(&format!(
                "the value of {key} must be in double quotes"
            )));
        }
        let mut value = String::new();
        loop {
            match chars.next() {
                None => return Err(fail("unterminated string")),
                Some('"') => break,
                Some('\\') => match chars.next() {
                    Some(c @ ('"' | '\\')) => value.push(c),
                    _ => return Err(fail("only \\\" and \\\\ escapes are supported")),
                },
                Some(c) => value.push(c),
            }
        }
        out.push((key, value));
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        match chars.next() {
            None => break,
            Some(',') => {}
            Some(_) => return Err(fail("expected ',' between matchers")),
        }
    }
    Ok(out)
}
