//! Pyroscope: pprof profiles labelled the way Pyroscope and Grafana look for them, for
//! `push.v1.PusherService/Push` (Connect) and the legacy `POST /ingest`.
//!
//! [`profiles`] groups the agent's batches per process and Pyroscope profile, each a pprof
//! profile with the sample types Pyroscope's .NET support knows (the types Grafana lists):
//!
//! | store types | `__name__` | pprof sample types | period type |
//! |---|---|---|---|
//! | `cpu` | `process_cpu` | `samples/count`, `cpu/nanoseconds` | `cpu/nanoseconds` |
//! | `wall` | `wall` | `samples/count`, `wall/nanoseconds` | `wall/nanoseconds` |
//! | `alloc_samples`, `alloc_size` | `alloc` | `alloc_samples/count`, `alloc_size/bytes` | `cpu/nanoseconds` |
//! | `exception` | `exception` | `exception/count` | `cpu/nanoseconds` |
//! | `lock_count`, `lock_time` | `lock` | `lock_count/count`, `lock_time/nanoseconds` | `cpu/nanoseconds` |
//!
//! so Pyroscope names them `process_cpu:cpu:nanoseconds:cpu:nanoseconds`,
//! `alloc:alloc_size:bytes:cpu:nanoseconds` and so on. Sampled profiles carry the sample count
//! (`samples/count`) next to the time, and the sampler's measured period. Series labels pass
//! through (`service_name`, `process_id`, `host_name`); sample labels stay pprof labels
//! (`thread_id`, `trace_id`, `span_id`, `span_name`), which Pyroscope reads for span profiles.

use std::collections::HashMap;

use profile::labels;
use profile::ProfileType;
use profile::{Function, FunctionIndex, Profile, ProfileBuilder, ValueType};

use crate::otlp::ExportBatch;

/// The messages of Pyroscope's `push.v1` API the agent sends, generated from `tests/otlp/push.proto`
/// (Pyroscope's names and field numbers; `tests/suite/wire_types.rs` regenerates them).
pub mod proto {
    include!("wire/push.v1.rs");
}

/// The label Pyroscope takes the profile name from.
pub const NAME_LABEL: &str = "__name__";

/// One Pyroscope profile and the store types that fill its sample types.
struct Group {
    name: &'static str,
    sample_types: &'static [(&'static str, &'static str)],
    period_type: (&'static str, &'static str),
}

const PROCESS_CPU: Group = Group {
    name: "process_cpu",
    sample_types: &[("samples", "count"), ("cpu", "nanoseconds")],
    period_type: ("cpu", "nanoseconds"),
};
const WALL: Group = Group {
    name: "wall",
    sample_types: &[("samples", "count"), ("wall", "nanoseconds")],
    period_type: ("wall", "nanoseconds"),
};
const ALLOC: Group = Group {
    name: "alloc",
    sample_types: &[("alloc_samples", "count"), ("alloc_size", "bytes")],
    period_type: ("cpu", "nanoseconds"),
};
const EXCEPTION: Group = Group {
    name: "exception",
    sample_types: &[("exception", "count")],
    period_type: ("cpu", "nanoseconds"),
};
const LOCK: Group = Group {
    name: "lock",
    sample_types: &[("lock_count", "count"), ("lock_time", "nanoseconds")],
    period_type: ("cpu", "nanoseconds"),
};

/// Where a store type's values go: its group and, per sample type of the group, whether the
/// slot gets the sample count (sampled types) or the value.
enum Slot {
    /// `[count, value]`.
    Sampled,
    /// The value at this index, 0 elsewhere.
    At(usize),
}

/// The profile name (`__name__`) and period type Pyroscope files a store profile type under,
/// as the pushes send it: `process_cpu` with `cpu`/`nanoseconds` for `cpu`, `alloc` for
/// `alloc_samples` and `alloc_size`, … (the querier API answers with the same names).
pub fn pyroscope_name(
    profile_type: &ProfileType,
) -> Option<(&'static str, (&'static str, &'static str))> {
    group_of(profile_type).map(|(group, _)| (group.name, group.period_type))
}

fn group_of(profile_type: &ProfileType) -> Option<(&'static Group, Slot)> {
    Some(match profile_type.name.as_str() {
        "cpu" => (&PROCESS_CPU, Slot::Sampled),
        "wall" => (&WALL, Slot::Sampled),
        "alloc_samples" => (&ALLOC, Slot::At(0)),
        "alloc_size" => (&ALLOC, Slot::At(1)),
        "exception" => (&EXCEPTION, Slot::At(0)),
        "lock_count" => (&LOCK, Slot::At(0)),
        "lock_time" => (&LOCK, Slot::At(1)),
        _ => return None,
    })
}

/// One Pyroscope profile of one process.
#[derive(Debug, Clone)]
pub struct SeriesProfile {
    /// `__name__`, then the series labels (`service_name`, ...), sorted by name after it.
    pub labels: Vec<(String, String)>,
    pub profile: Profile,
    /// Unix nanoseconds of the first and last batch in it.
    pub from: i64,
    pub until: i64,
}

impl SeriesProfile {
    /// The labels as `push.v1` carries them.
    pub fn label_pairs(&self) -> Vec<proto::LabelPair> {
        self.labels
            .iter()
            .map(|(name, value)| proto::LabelPair {
                name: name.clone(),
                value: value.clone(),
            })
            .collect()
    }

    pub fn service_name(&self) -> &str {
        self.label(labels::SERVICE_NAME)
            .unwrap_or("unknown_service")
    }

    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

type SeriesGroup<'a> = (&'a [(String, String)], &'static str);

struct Filling {
    builder: ProfileBuilder,
    series: Vec<(String, String)>,
    group: &'static Group,
    from: i64,
    until: i64,
    period_weighted: i128,
    period_samples: i128,
}

/// The batches as Pyroscope profiles, one per process and group (see the module
/// documentation), in the order their first batch came. Types Pyroscope has no name for are
/// left out.
pub fn profiles(batches: &[ExportBatch]) -> Vec<SeriesProfile> {
    let mut fillings: Vec<Filling> = Vec::new();
    // (series labels, group name) → filling.
    let mut index: HashMap<SeriesGroup<'_>, usize> = HashMap::new();
    for export in batches {
        let batch = &*export.batch;
        let Some((group, slot)) = group_of(&batch.profile_type) else {
            continue;
        };
        let at = *index
            .entry((batch.series.as_slice(), group.name))
            .or_insert_with(|| {
                let sample_types = group
                    .sample_types
                    .iter()
                    .map(|(kind, unit)| ValueType::new(*kind, *unit))
                    .collect();
                let (kind, unit) = group.period_type;
                let builder = ProfileBuilder::new(sample_types, ValueType::new(kind, unit), 0);
                fillings.push(Filling {
                    builder,
                    series: batch.series.clone(),
                    group,
                    from: batch.timestamp_unix_nanos,
                    until: batch.timestamp_unix_nanos,
                    period_weighted: 0,
                    period_samples: 0,
                });
                fillings.len() - 1
            });
        let filling = &mut fillings[at];
        filling.from = filling.from.min(batch.timestamp_unix_nanos);
        filling.until = filling.until.max(batch.timestamp_unix_nanos);
        let mut functions: Vec<Option<FunctionIndex>> = vec![None; batch.functions.len()];
        let mut values = vec![0i64; group.sample_types.len()];
        for sample in &batch.samples {
            let stack = sample
                .stack
                .iter()
                .filter_map(|&f| {
                    let slot = functions.get_mut(f as usize)?;
                    Some(*slot.get_or_insert_with(|| {
                        filling
                            .builder
                            .function(Function::clone(&batch.functions[f as usize]))
                    }))
                })
                .collect();
            values.fill(0);
            match slot {
                Slot::Sampled => {
                    let count = export.sample_count(sample.value).unwrap_or(0);
                    values[0] = count;
                    values[1] = sample.value;
                    filling.period_weighted += i128::from(export.period_nanos) * i128::from(count);
                    filling.period_samples += i128::from(count);
                }
                Slot::At(i) => values[i] = sample.value,
            }
            filling.builder.add(stack, sample.labels.clone(), &values);
        }
    }
    fillings
        .into_iter()
        .map(|mut f| {
            if f.period_samples > 0 {
                f.builder
                    .set_period(i64::try_from(f.period_weighted / f.period_samples).unwrap_or(0));
            }
            f.builder.set_time_range(f.from, f.until - f.from);
            // The time is the profile's; count or time is what viewers show first.
            f.builder
                .set_default_sample_type(f.group.sample_types.len() - 1);
            let mut labels = vec![(NAME_LABEL.to_string(), f.group.name.to_string())];
            let mut series = f.series;
            series.sort();
            labels.extend(series);
            SeriesProfile {
                labels,
                profile: f.builder.build(),
                from: f.from,
                until: f.until,
            }
        })
        .collect()
}

/// `service{host_name="box",process_id="42"}`: the `name` of a legacy `/ingest`, the service
/// name followed by the other labels (`__name__` left out: Pyroscope derives it from the pprof
/// sample types there).
pub fn ingest_name(profile: &SeriesProfile) -> String {
    let others: Vec<String> = profile
        .labels
        .iter()
        .filter(|(name, _)| name != NAME_LABEL && name != labels::SERVICE_NAME)
        .map(|(name, value)| {
            // Pyroscope's label values end at `,` and `}`.
            let value: String = value
                .chars()
                .map(|c| {
                    if matches!(c, ',' | '}' | '{' | '=') {
                        '_'
                    } else {
                        c
                    }
                })
                .collect();
            format!("{name}={value}")
        })
        .collect();
    format!("{}{{{}}}", profile.service_name(), others.join(","))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use profile::LabelValue;
    use profile::{Batch, BatchSample};

    fn export(profile_type: &str, time: i64, values: &[i64], period_nanos: i64) -> ExportBatch {
        ExportBatch {
            batch: Arc::new(Batch {
                series: vec![
                    ("service_name".into(), "shop".into()),
                    ("process_id".into(), "42".into()),
                ],
                profile_type: ProfileType::known(profile_type).unwrap(),
                timestamp_unix_nanos: time,
                functions: vec![
                    Function {
                        name: "Hot()".into(),
                        module: "Shop.dll".into(),
                    },
                    Function {
                        name: "Cold()".into(),
                        module: "Shop.dll".into(),
                    },
                ],
                samples: values
                    .iter()
                    .enumerate()
                    .map(|(i, &value)| BatchSample {
                        stack: vec![i as u32],
                        value,
                        labels: vec![("thread_id".into(), LabelValue::Num(1))],
                    })
                    .collect(),
            }),
            period_nanos,
        }
    }

    #[test]
    fn cpu_carries_counts_and_time_and_allocations_share_a_profile() {
        let profiles = profiles(&[
            export("cpu", 10, &[3_000, 1_000], 1_000),
            export("cpu", 20, &[2_200], 1_100),
            export("alloc_samples", 15, &[2], 0),
            export("alloc_size", 15, &[4096], 0),
            export("exception", 15, &[1], 0),
        ]);
        assert_eq!(profiles.len(), 3);
        let cpu = &profiles[0];
        assert_eq!(
            cpu.labels,
            [
                ("__name__".to_string(), "process_cpu".to_string()),
                ("process_id".to_string(), "42".to_string()),
                ("service_name".to_string(), "shop".to_string()),
            ]
        );
        assert_eq!((cpu.from, cpu.until), (10, 20));
        let p = &cpu.profile;
        assert_eq!(p.sample_types[0], ValueType::new("samples", "count"));
        assert_eq!(p.period_type, ValueType::new("cpu", "nanoseconds"));
        // 3 + 1 samples at 1000 ns, 2 at 1100 ns.
        assert_eq!(p.total(0), 6);
        assert_eq!(p.total(1), 6_200);
        assert_eq!(p.period, 6_200 / 6);
        assert_eq!(p.samples[0].values, [5, 5_200]);

        let alloc = &profiles[1];
        assert_eq!(alloc.label(NAME_LABEL), Some("alloc"));
        assert_eq!(alloc.profile.samples.len(), 1);
        assert_eq!(alloc.profile.samples[0].values, [2, 4096]);
        assert_eq!(profiles[2].label(NAME_LABEL), Some("exception"));
        assert_eq!(ingest_name(alloc), "shop{process_id=42}");
    }
}
