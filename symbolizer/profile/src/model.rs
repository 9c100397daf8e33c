//! The canonical profile: what every exporter reads and the store keeps.
//!
//! Shaped after pprof, which every peer understands: sample types with units, a function table,
//! samples holding a stack of function indices (leaf first) and one value per sample type, plus
//! labels. Samples with equal stacks and labels are merged as they are added.

use std::collections::HashMap;
use std::sync::Arc;

/// A value's meaning and unit, e.g. `cpu`/`nanoseconds` or `samples`/`count`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ValueType {
    pub kind: String,
    pub unit: String,
}

impl ValueType {
    pub fn new(kind: impl Into<String>, unit: impl Into<String>) -> Self {
        ValueType {
            kind: kind.into(),
            unit: unit.into(),
        }
    }
}

/// A function as frames name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Function {
    /// The name people read: `Namespace.Type.Method(args)`.
    pub name: String,
    /// The file of its module (`System.Linq.dll`); empty when unknown.
    pub module: String,
}

/// Index into [`Profile::functions`].
pub type FunctionIndex = u32;

/// A label's value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LabelValue {
    Str(String),
    Num(i64),
}

/// A sample's labels, sorted by key. Shared: the samples of a large profile carry a few
/// distinct label sets (one per thread, say) hundreds of thousands of times, and a copy each
/// would cost allocations and memory for nothing.
pub type Labels = Arc<[(String, LabelValue)]>;

/// One aggregated sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// Function indices, leaf first.
    pub stack: Vec<FunctionIndex>,
    /// One value per [`Profile::sample_types`] entry.
    pub values: Vec<i64>,
    pub labels: Labels,
}

/// A profile over a time range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    pub sample_types: Vec<ValueType>,
    /// Which sample type viewers show first.
    pub default_sample_type: usize,
    pub period_type: ValueType,
    /// Sampling period in `period_type` units.
    pub period: i64,
    pub functions: Vec<Function>,
    pub samples: Vec<Sample>,
    /// Start of the profiled range, Unix nanoseconds.
    pub start_unix_nanos: i64,
    pub duration_nanos: i64,
}

/// One function's share of a profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FunctionTotals {
    pub function: FunctionIndex,
    /// Value of samples whose leaf is the function.
    pub self_value: i64,
    /// Value of samples with the function anywhere on the stack (recursion counted once).
    pub total_value: i64,
}

impl Profile {
    /// A profile of values that are already totals in `value_type`'s unit, as a query over a
    /// range answers: one sample type, and `period` 0 ("unknown"), since each stored sample was
    /// worth the sampler period measured in its own window (which varies from window to window
    /// and process to process), so nothing needs scaling and no single period is true of the
    /// whole.
    pub fn of_totals(
        value_type: ValueType,
        functions: Vec<Function>,
        samples: Vec<Sample>,
        start_unix_nanos: i64,
        duration_nanos: i64,
    ) -> Profile {
        Profile {
            sample_types: vec![value_type.clone()],
            default_sample_type: 0,
            period_type: value_type,
            period: 0,
            functions,
            samples,
            start_unix_nanos,
            duration_nanos,
        }
    }

    /// Total of one sample type over all samples.
    pub fn total(&self, sample_type: usize) -> i64 {
        self.samples.iter().map(|s| s.values[sample_type]).sum()
    }

    /// Self and total value per function for one sample type, largest self first (ties by
    /// total, then name), functions with no value left out.
    pub fn function_totals(&self, sample_type: usize) -> Vec<FunctionTotals> {
        let mut totals: Vec<FunctionTotals> = (0..self.functions.len())
            .map(|i| FunctionTotals {
                function: i as FunctionIndex,
                self_value: 0,
                total_value: 0,
            })
            .collect();
        let mut seen = Vec::new();
        for sample in &self.samples {
            let value = sample.values[sample_type];
            if let Some(&leaf) = sample.stack.first() {
                totals[leaf as usize].self_value += value;
            }
            seen.clear();
            for &function in &sample.stack {
                if !seen.contains(&function) {
                    seen.push(function);
                    totals[function as usize].total_value += value;
                }
            }
        }
        totals.retain(|t| t.total_value != 0);
        totals.sort_by(|a, b| {
            (b.self_value, b.total_value)
                .cmp(&(a.self_value, a.total_value))
                .then_with(|| {
                    self.functions[a.function as usize]
                        .name
                        .cmp(&self.functions[b.function as usize].name)
                })
        });
        totals
    }
}

/// What makes samples equal: the stack and the sorted labels.
type SampleKey = (Vec<FunctionIndex>, Vec<(String, LabelValue)>);

/// Builds a [`Profile`], interning functions and merging equal samples.
#[derive(Debug)]
pub struct ProfileBuilder {
    profile: Profile,
    function_index: HashMap<Function, FunctionIndex>,
    sample_index: HashMap<SampleKey, usize>,
}

impl ProfileBuilder {
    pub fn new(sample_types: Vec<ValueType>, period_type: ValueType, period: i64) -> Self {
        ProfileBuilder {
            profile: Profile {
                sample_types,
                default_sample_type: 0,
                period_type,
                period,
                functions: Vec::new(),
                samples: Vec::new(),
                start_unix_nanos: 0,
                duration_nanos: 0,
            },
            function_index: HashMap::new(),
            sample_index: HashMap::new(),
        }
    }

    pub fn set_default_sample_type(&mut self, index: usize) {
        self.profile.default_sample_type = index;
    }

    pub fn set_period(&mut self, period: i64) {
        self.profile.period = period;
    }

    pub fn set_time_range(&mut self, start_unix_nanos: i64, duration_nanos: i64) {
        self.profile.start_unix_nanos = start_unix_nanos;
        self.profile.duration_nanos = duration_nanos;
    }

    /// The index of a function, added on first use.
    pub fn function(&mut self, function: Function) -> FunctionIndex {
        if let Some(&index) = self.function_index.get(&function) {
            return index;
        }
        let index = FunctionIndex::try_from(self.profile.functions.len())
            .expect("fewer than 2^32 distinct functions");
        self.profile.functions.push(function.clone());
        self.function_index.insert(function, index);
        index
    }

    /// Adds values to the sample with this stack and labels (labels in any order).
    pub fn add(
        &mut self,
        stack: Vec<FunctionIndex>,
        mut labels: Vec<(String, LabelValue)>,
        values: &[i64],
    ) {
        debug_assert_eq!(values.len(), self.profile.sample_types.len());
        labels.sort();
        let key = (stack, labels);
        match self.sample_index.get(&key) {
            Some(&i) => {
                for (total, v) in self.profile.samples[i].values.iter_mut().zip(values) {
                    *total += v;
                }
            }
            None => {
                self.sample_index
                    .insert(key.clone(), self.profile.samples.len());
                self.profile.samples.push(Sample {
                    stack: key.0,
                    values: values.to_vec(),
                    labels: key.1.into(),
                });
            }
        }
    }

    pub fn build(self) -> Profile {
        self.profile
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_samples_merge_and_functions_intern() {
        let mut b = ProfileBuilder::new(
            vec![
                ValueType::new("samples", "count"),
                ValueType::new("cpu", "nanoseconds"),
            ],
            ValueType::new("cpu", "nanoseconds"),
            1_000_000,
        );
        let f = |name: &str| Function {
            name: name.into(),
            module: "App.dll".into(),
        };
        let leaf = b.function(f("App.Hot()"));
        let main = b.function(f("App.Main()"));
        assert_eq!(b.function(f("App.Hot()")), leaf);
        let labels = |tid: i64| vec![("thread_id".to_string(), LabelValue::Num(tid))];
        b.add(vec![leaf, main], labels(1), &[1, 1_000_000]);
        b.add(vec![leaf, main], labels(1), &[1, 1_000_000]);
        b.add(vec![leaf, main], labels(2), &[1, 1_000_000]);
        b.add(vec![main], labels(1), &[1, 1_000_000]);
        let p = b.build();
        assert_eq!(p.functions.len(), 2);
        assert_eq!(p.samples.len(), 3);
        assert_eq!(p.samples[0].values, vec![2, 2_000_000]);
        assert_eq!(p.total(1), 4_000_000);
        let totals = p.function_totals(1);
        assert_eq!(totals[0].function, leaf);
        assert_eq!(
            (totals[0].self_value, totals[0].total_value),
            (3_000_000, 3_000_000)
        );
        assert_eq!(
            (totals[1].self_value, totals[1].total_value),
            (1_000_000, 4_000_000)
        );
    }
}
