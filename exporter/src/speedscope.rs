//! speedscope's file format (<https://www.speedscope.app/file-format-schema.json>, defined in
//! jlfwong/speedscope `src/lib/file-format-spec.ts`).
//!
//! One `sampled` profile per sample type (or only `options.sample_type`), and, when
//! `options.thread_label` is set, per value of that label: speedscope shows one profile at a time
//! with a picker, so per-thread profiles give its time-order and left-heavy views one thread
//! each, which is how wall-time profiles are read. Threads are ordered by label value; samples
//! without the label come last. A profile's name adds the thread's `thread_name` label, if any,
//! so the picker reads `cpu (nanoseconds) · thread_id=101 (Main)`.
//!
//! Frames are the profile's functions (`file` = module), shared by all profiles. Each profile
//! holds its distinct stacks root first, sorted, weighted by their totals; stacks whose total is
//! not positive are left out, since speedscope rejects negative weights. `startValue` is 0 and
//! `endValue` the total weight. Units: `nanoseconds`, `microseconds`, `milliseconds`, `seconds`
//! and `bytes` are kept, anything else (counts) is `none`. The profile opened first is the
//! heaviest of the preferred sample type (`options.sample_type`, else the profile's default).

use std::collections::BTreeMap;
use std::io::Write;

use profile::labels::{THREAD_NAME, UNKNOWN_FRAME};
use profile::{LabelValue, Profile, Sample};
use serde::Serialize;

use crate::{
    check, describe_sample_type, resolve_sample_type, ExportError, ExportOptions, ThreadKey,
};

const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

#[derive(Serialize)]
struct File<'a> {
    #[serde(rename = "$schema")]
    schema: &'static str,
    shared: Shared<'a>,
    profiles: Vec<SampledProfile>,
    name: String,
    #[serde(rename = "activeProfileIndex")]
    active_profile_index: usize,
    exporter: String,
}

#[derive(Serialize)]
struct Shared<'a> {
    frames: Vec<Frame<'a>>,
}

#[derive(Serialize)]
struct Frame<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<&'a str>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SampledProfile {
    r#type: &'static str,
    name: String,
    unit: &'static str,
    start_value: i64,
    end_value: i64,
    samples: Vec<Vec<usize>>,
    weights: Vec<i64>,
}

/// Writes the profile as one speedscope JSON file (see the module documentation for its layout).
pub fn write_speedscope(
    profile: &Profile,
    options: &ExportOptions,
    mut out: impl Write,
) -> Result<(), ExportError> {
    check(profile)?;
    let preferred = resolve_sample_type(profile, options.sample_type)?;
    let sample_types = match options.sample_type {
        Some(index) => index..index + 1,
        None => 0..profile.sample_types.len(),
    };

    let mut frames: Vec<Frame> = profile
        .functions
        .iter()
        .map(|f| Frame {
            name: &f.name,
            file: (!f.module.is_empty()).then_some(f.module.as_str()),
        })
        .collect();
    // For samples with an empty stack: the profile's own `[unknown]` function if it has one,
    // else a frame added on first use.
    let mut unknown_frame = profile
        .functions
        .iter()
        .position(|f| f.name == UNKNOWN_FRAME && f.module.is_empty());

    let mut profiles = Vec::new();
    let mut active = (0, i64::MIN);
    for index in sample_types {
        // Thread (None when threads are merged) → its root-first stacks with their total
        // weights, and its name.
        let mut groups: BTreeMap<Option<ThreadKey>, Group> = BTreeMap::new();
        for sample in &profile.samples {
            let thread = options
                .thread_label
                .as_deref()
                .map(|label| ThreadKey::of(sample, label));
            let stack: Vec<usize> = if sample.stack.is_empty() {
                vec![*unknown_frame.get_or_insert_with(|| {
                    frames.push(Frame {
                        name: UNKNOWN_FRAME,
                        file: None,
                    });
                    frames.len() - 1
                })]
            } else {
                sample.stack.iter().rev().map(|&f| f as usize).collect()
            };
            let group = groups.entry(thread).or_default();
            group.name = group.name.or_else(|| thread_name(sample));
            let total = group.stacks.entry(stack).or_insert(0);
            *total = total.saturating_add(sample.values[index]);
        }
        if groups.is_empty() {
            // No samples: still one (empty) profile, so every sample type shows up.
            groups.insert(None, Group::default());
        }

        let sample_type = &profile.sample_types[index];
        for (thread, group) in groups {
            let (samples, weights): (Vec<Vec<usize>>, Vec<i64>) =
                group.stacks.into_iter().filter(|&(_, w)| w > 0).unzip();
            let end_value = weights.iter().fold(0i64, |a, &w| a.saturating_add(w));
            if index == preferred && end_value > active.1 {
                active = (profiles.len(), end_value);
            }
            let mut name = describe_sample_type(sample_type);
            if let (Some(thread), Some(label)) = (thread, &options.thread_label) {
                name.push_str(" · ");
                name.push_str(&thread.describe(label));
                if let Some(thread_name) = group.name.filter(|_| label != THREAD_NAME) {
                    name.push_str(&format!(" ({thread_name})"));
                }
            }
            profiles.push(SampledProfile {
                r#type: "sampled",
                name,
                unit: unit(&sample_type.unit),
                start_value: 0,
                end_value,
                samples,
                weights,
            });
        }
    }

    let file = File {
        schema: SCHEMA,
        shared: Shared { frames },
        profiles,
        name: options
            .title
            .clone()
            .unwrap_or_else(|| "clrscope profile".to_string()),
        active_profile_index: active.0,
        exporter: concat!("clrscope@", env!("CARGO_PKG_VERSION")).to_string(),
    };
    serde_json::to_writer(&mut out, &file).map_err(std::io::Error::from)?;
    out.flush()?;
    Ok(())
}

/// The samples of one thread (or of all, when threads are merged).
#[derive(Default)]
struct Group<'a> {
    /// Root-first frame indices → total weight; sorted, so equal profiles give equal files.
    stacks: BTreeMap<Vec<usize>, i64>,
    /// The `thread_name` label of the group's first sample that has one.
    name: Option<&'a str>,
}

fn thread_name(sample: &Sample) -> Option<&str> {
    sample.labels.iter().find_map(|(key, value)| match value {
        LabelValue::Str(name) if key == THREAD_NAME => Some(name.as_str()),
        _ => None,
    })
}

/// speedscope's name for a unit: one it knows, else `none`.
fn unit(unit: &str) -> &'static str {
    match unit {
        "nanoseconds" => "nanoseconds",
        "microseconds" => "microseconds",
        "milliseconds" => "milliseconds",
        "seconds" => "seconds",
        "bytes" => "bytes",
        _ => "none",
    }
}
