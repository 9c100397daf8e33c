//! Comparing two profiles of one type, e.g. "this minute" against "the same minute yesterday".

use crate::model::{Function, Profile, ProfileBuilder, ValueType};

/// A profile over the union of both inputs' samples (matched by function names and labels) with
/// two sample types, `base` and `new`, each holding that input's value of `sample_type` (0 where
/// a stack is absent), which is what differential flame graphs draw.
pub fn diff(base: &Profile, new: &Profile, sample_type: usize) -> Profile {
    let unit = |p: &Profile| {
        p.sample_types
            .get(sample_type)
            .map_or_else(String::new, |t| t.unit.clone())
    };
    let mut builder = ProfileBuilder::new(
        vec![
            ValueType::new("base", unit(base)),
            ValueType::new("new", unit(new)),
        ],
        ValueType::new("base", unit(base)),
        0,
    );
    // Saturating: the widest ranges a query can name span more than i64 nanoseconds.
    let end = |p: &Profile| p.start_unix_nanos.saturating_add(p.duration_nanos);
    let start = base.start_unix_nanos.min(new.start_unix_nanos);
    builder.set_time_range(start, end(base).max(end(new)).saturating_sub(start));
    for (side, profile) in [base, new].into_iter().enumerate() {
        for sample in &profile.samples {
            let stack = sample
                .stack
                .iter()
                .filter_map(|&f| profile.functions.get(f as usize))
                .map(|f: &Function| builder.function(f.clone()))
                .collect();
            let mut values = [0, 0];
            values[side] = sample.values.get(sample_type).copied().unwrap_or(0);
            builder.add(stack, sample.labels.to_vec(), &values);
        }
    }
    builder.build()
}
