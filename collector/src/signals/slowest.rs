//! The slowest finished spans of a process, per minute of their end: what an incident lists as
//! its slowest spans. In memory, bounded: [`SLOWEST_PER_MINUTE`] spans a minute for
//! [`SLOWEST_MINUTES`] minutes, however many spans the process finishes.

use std::collections::BTreeMap;
use std::sync::Arc;

use profile::span::SpanRecord;

/// Spans kept per minute: the slowest.
pub const SLOWEST_PER_MINUTE: usize = 32;
/// Minutes kept, the newest: an hour, four default incident windows (a few MB at most: the
/// spans are not charged to the signal budget, their count bounds them).
pub const SLOWEST_MINUTES: usize = 60;
const MINUTE_NANOS: i64 = 60_000_000_000;

#[derive(Debug, Default)]
struct Minute {
    /// Slowest first.
    spans: Vec<Arc<SpanRecord>>,
    /// Spans that ended in the minute, kept or not.
    seen: u64,
}

/// See the module's documentation.
#[derive(Debug, Default)]
pub struct SlowestSpans {
    minutes: BTreeMap<i64, Minute>,
}

/// The slowest spans that ended within a range.
#[derive(Debug, Clone, Default)]
pub struct Slowest {
    /// Slowest first.
    pub spans: Vec<Arc<SpanRecord>>,
    /// Spans that ended in the minutes the range touches, kept or not.
    pub seen: u64,
}

impl SlowestSpans {
    /// Keeps `span` if it is among its minute's slowest.
    pub fn offer(&mut self, span: &Arc<SpanRecord>) {
        let minute = span.end_unix_nanos().div_euclid(MINUTE_NANOS);
        if self.minutes.len() >= SLOWEST_MINUTES
            && self
                .minutes
                .first_key_value()
                .is_some_and(|(&m, _)| minute < m)
        {
            return; // older than anything kept
        }
        let entry = self.minutes.entry(minute).or_default();
        entry.seen += 1;
        let at = entry
            .spans
            .partition_point(|s| s.duration_nanos >= span.duration_nanos);
        if at < SLOWEST_PER_MINUTE {
            entry.spans.insert(at, span.clone());
            entry.spans.truncate(SLOWEST_PER_MINUTE);
        }
        while self.minutes.len() > SLOWEST_MINUTES {
            self.minutes.pop_first();
        }
    }

    /// The kept spans that ended in `[from, until)` (Unix nanoseconds), slowest first, at most
    /// `limit`. Near the range's edges a minute's kept spans may have ended outside it, so a
    /// slow span of an edge minute can be missing when slower ones outside took its place.
    pub fn slowest(&self, from: i64, until: i64, limit: usize) -> Slowest {
        let first = from.div_euclid(MINUTE_NANOS);
        let last = until.saturating_sub(1).div_euclid(MINUTE_NANOS);
        let mut out = Slowest::default();
        for minute in self.minutes.range(first..=last).map(|(_, m)| m) {
            out.seen += minute.seen;
            let ended = |s: &&Arc<SpanRecord>| (from..until).contains(&s.end_unix_nanos());
            out.spans.extend(minute.spans.iter().filter(ended).cloned());
        }
        out.spans
            .sort_by_key(|s| std::cmp::Reverse(s.duration_nanos));
        out.spans.truncate(limit);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profile::span::{Span, SpanId, SpanKind, SpanStatus, TraceId};

    fn ms(ms: i64) -> i64 {
        ms * 1_000_000
    }

    fn span(end_ms: i64, duration_ms: i64) -> Arc<SpanRecord> {
        Arc::new(SpanRecord {
            span: Span {
                trace_id: TraceId([1; 16]),
                span_id: SpanId([2; 8]),
                name: Arc::from("op"),
            },
            parent_span_id: None,
            display_name: format!("{end_ms}/{duration_ms}"),
            kind: SpanKind::Internal,
            start_unix_nanos: (end_ms - duration_ms) * 1_000_000,
            duration_nanos: duration_ms * 1_000_000,
            status: SpanStatus::Unset,
            status_description: String::new(),
            trace_state: String::new(),
            source_name: Arc::from("s"),
            source_version: String::new(),
            tags: Vec::new(),
            dropped_tags: 0,
        })
    }

    #[test]
    fn each_minute_keeps_its_slowest_and_old_minutes_go() {
        let mut kept = SlowestSpans::default();
        // Minute 0: 100 spans of 1..=100 ms; minute 1: one of 5 ms.
        for d in 1..=100 {
            kept.offer(&span(1_000 + d, d));
        }
        kept.offer(&span(61_000, 5));
        let all = kept.slowest(0, ms(120_000), 1000);
        assert_eq!(all.seen, 101);
        assert_eq!(all.spans.len(), SLOWEST_PER_MINUTE + 1);
        assert_eq!(all.spans[0].duration_nanos, 100_000_000);
        assert_eq!(all.spans.last().unwrap().duration_nanos, 5_000_000);
        // The range cuts by end time, and the limit keeps the slowest.
        let cut = kept.slowest(ms(1_090), ms(60_000), 3);
        let durations: Vec<i64> = cut
            .spans
            .iter()
            .map(|s| s.duration_nanos / 1_000_000)
            .collect();
        assert_eq!(durations, [100, 99, 98]);
        assert_eq!(kept.slowest(ms(1_090), ms(1_095), 10).spans.len(), 5);
        for minute in 2..(2 + SLOWEST_MINUTES as i64) {
            kept.offer(&span(minute * 60_000, 1));
        }
        assert_eq!(kept.minutes.len(), SLOWEST_MINUTES);
        assert_eq!(kept.slowest(0, ms(120_000), 10).seen, 0);
        kept.offer(&span(1_000, 1_000));
        assert_eq!(
            kept.slowest(0, ms(60_000), 10).seen,
            0,
            "older than all kept"
        );
    }
}
