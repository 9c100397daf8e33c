//! An incident's portable bundle: one self-contained HTML file, for a retrospective to attach.
//!
//! One HTML file rather than an archive: it opens with a double click in any browser, offline
//! and without the agent, and a ticket or chat takes it as one attachment. The page shows the
//! incident (causes, processes, window) and, per process, the CPU flame-graph diff ranked by
//! growth of share, without scripts; the data it shows is in the same file as `data:` links to
//! download: pprof of before and during, the diff as JSON, the profile totals as CSV, and the
//! process's kept logs (Warning and above) and exceptions of the window as JSON (when the agent
//! holds them: the API's bundle of an attached process). A Content-Security-Policy of
//! `default-src 'none'` keeps the page from reaching any network.
//!
//! Size: at most [`MAX_PROCESSES`] processes; each pprof is at most [`MAX_PPROF_BYTES`] (a
//! larger one is cut to the [`CUT_NODES`] largest call-tree nodes, the rest shown as `other`);
//! at most [`MAX_RECORDS`] log records and as many exceptions per process; the CSV has one row
//! per profile type and [`CSV_STEP`]. Base64 adds a third.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use collector::attached::AttachedProcesses;
use collector::signals::exceptions::exception_json;
use collector::signals::logs::record_json;
use exporter::Format;
use profile::log::LogLevel;
use profile::{CallTree, Profile};
use serde_json::Value;
use store::incidents::{DiffProfiles, Incident, IncidentDiff};
use store::tsdb::{QueryControl, SampleLabels, Store};

use crate::error::ApiError;
use crate::incidents::{diff_of, DEFAULT_DIFF_FUNCTIONS};

/// Processes of an incident a bundle covers (the first, by pid).
pub const MAX_PROCESSES: usize = 8;
/// Largest pprof (gzipped) a bundle embeds before it is cut to [`CUT_NODES`].
pub const MAX_PPROF_BYTES: usize = 2 << 20;
/// Call-tree nodes a pprof over [`MAX_PPROF_BYTES`] is cut to.
pub const CUT_NODES: usize = 8192;
/// Log records and exceptions per process, newest kept.
pub const MAX_RECORDS: usize = 2000;
/// The step of the profile totals' CSV.
pub const CSV_STEP: Duration = Duration::from_secs(10);
/// The profile type of the diff.
const DIFF_TYPE: &str = "cpu";
const MILLISECOND: i64 = 1_000_000;

/// What the store holds for a bundle, per process.
pub struct BundleParts {
    processes: Vec<ProcessPart>,
}

struct ProcessPart {
    pid: u64,
    service_name: String,
    diff: IncidentDiff,
    before_pprof: Vec<u8>,
    during_pprof: Vec<u8>,
    /// `time_unix_ms,profile_type,unit,total` rows.
    csv: String,
}

/// The kept logs and exceptions of each process, by pid: JSON arrays.
pub type Signals = BTreeMap<u64, (Vec<Value>, Vec<Value>)>;

impl BundleParts {
    /// Runs the queries of a bundle: every one through [`diff_of`] and the store's series.
    pub fn collect(
        store: &Store,
        incident: &Incident,
        control: &QueryControl,
    ) -> Result<BundleParts, ApiError> {
        let mut processes = Vec::new();
        for process in incident.processes.iter().take(MAX_PROCESSES) {
            let (diff, profiles) = diff_of(
                store,
                incident,
                process.pid,
                DIFF_TYPE,
                DEFAULT_DIFF_FUNCTIONS,
                control,
            )?;
            let DiffProfiles { before, during } = profiles;
            processes.push(ProcessPart {
                pid: process.pid,
                service_name: process.service_name.clone(),
                before_pprof: pprof(&before)?,
                during_pprof: pprof(&during)?,
                csv: totals_csv(store, incident, process.pid, control)?,
                diff,
            });
        }
        Ok(BundleParts { processes })
    }
}

/// `profile` as gzipped pprof, cut to [`CUT_NODES`] if it would be over [`MAX_PPROF_BYTES`].
fn pprof(profile: &Profile) -> Result<Vec<u8>, ApiError> {
    let mut out = Vec::new();
    exporter::write(profile, Format::Pprof, &mut out)?;
    if out.len() <= MAX_PPROF_BYTES {
        return Ok(out);
    }
    let cut = CallTree::from_profile(profile, 0, None)
        .cut(CUT_NODES)
        .to_profile();
    out.clear();
    exporter::write(&cut, Format::Pprof, &mut out)?;
    Ok(out)
}

/// Each stored profile type's totals over the incident's window, per [`CSV_STEP`].
fn totals_csv(
    store: &Store,
    incident: &Incident,
    pid: u64,
    control: &QueryControl,
) -> Result<String, ApiError> {
    let mut csv = String::from("time_unix_ms,profile_type,unit,total\n");
    let (before, during) = incident.ranges(profile::clock::unix_millis());
    for profile_type in store.profile_types() {
        let query = store::tsdb::Query {
            from: before.0 * MILLISECOND,
            until: during.1 * MILLISECOND,
            profile_type: profile_type.clone(),
            matchers: vec![("process_id".to_string(), pid.to_string())],
            sample_matchers: Vec::new(),
            sample_labels: SampleLabels::Only(Vec::new()),
            control: control.clone(),
        };
        for (at, total) in store.series(&query, CSV_STEP)? {
            let _ = writeln!(
                csv,
                "{},{},{},{total}",
                at / MILLISECOND,
                profile_type.name,
                profile_type.unit
            );
        }
    }
    Ok(csv)
}

/// The logs (Warning and above) and exceptions the agent keeps of the incident's processes
/// that are attached, within its window.
pub fn signals(processes: &AttachedProcesses, incident: &Incident) -> Signals {
    let from = incident.from_unix_ms * MILLISECOND;
    let until = incident.until_unix_ms * MILLISECOND;
    let within = |t: i64| (from..until).contains(&t);
    let mut out = Signals::new();
    for process in incident.processes.iter().take(MAX_PROCESSES) {
        let Some(attached) = processes.by_pid(process.pid) else {
            continue;
        };
        let signals = &attached.signals;
        let logs: Vec<Value> = signals
            .logs_since(from)
            .iter()
            .filter(|r| within(r.unix_nanos) && r.message.level >= LogLevel::Warning)
            .map(|r| record_json(r))
            .collect();
        let exceptions: Vec<Value> = signals
            .exceptions()
            .iter()
            .filter(|e| within(e.unix_nanos))
            .map(|e| exception_json(e))
            .collect();
        let newest = |mut v: Vec<Value>| v.split_off(v.len().saturating_sub(MAX_RECORDS));
        out.insert(process.pid, (newest(logs), newest(exceptions)));
    }
    out
}

/// The bundle's file name.
pub fn file_name(incident: &Incident) -> String {
    format!("clrscope-incident-{}.html", incident.id)
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn time(unix_ms: i64) -> String {
    profile::utc::format(
        unix_ms.saturating_mul(MILLISECOND),
        profile::utc::Form::Auto,
    )
}

fn download(out: &mut String, name: &str, mime: &str, bytes: &[u8]) {
    let _ = write!(
        out,
        "<a class=\"file\" download=\"{name}\" href=\"data:{mime};base64,{}\">{name}</a> ({} bytes) ",
        STANDARD.encode(bytes),
        bytes.len()
    );
}

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:2em;color:#222}\
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;\
text-align:left}td.n{text-align:right;font-variant-numeric:tabular-nums}th{background:#f3f3f3}\
a.file{margin-right:.3em}code{font-size:13px}";

/// The page: the incident, then each process's diff and its data files.
pub fn write(incident: &Incident, parts: &BundleParts, signals: &Signals) -> Vec<u8> {
    let mut out = String::new();
    let title = format!("clrscope incident {}", incident.id);
    let _ = write!(
        out,
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\
         <title>{title}</title><style>{STYLE}</style></head><body><h1>{title}</h1>\
         <p>Window <span id=\"window\">{} – {}</span>; first cause {}, last {}.</p>",
        time(incident.from_unix_ms),
        time(incident.until_unix_ms),
        time(incident.first_cause_unix_ms),
        time(incident.last_cause_unix_ms),
    );
    write_causes(&mut out, incident);
    download(
        &mut out,
        &format!("incident-{}.json", incident.id),
        "application/json",
        &serde_json::to_vec_pretty(incident).expect("an incident serializes"),
    );
    for part in &parts.processes {
        write_process(&mut out, incident, part, signals.get(&part.pid));
    }
    out.push_str("</body></html>\n");
    out.into_bytes()
}

fn write_causes(out: &mut String, incident: &Incident) {
    out.push_str("<h2>Causes</h2><table id=\"causes\"><tr><th>time</th><th>kind</th><th>rule or note</th><th>processes</th></tr>");
    for cause in &incident.causes {
        let kind = serde_json::to_value(cause.kind).unwrap_or_default();
        let what = cause
            .rule
            .as_deref()
            .or(cause.note.as_deref())
            .unwrap_or("");
        let processes: Vec<String> = cause
            .processes
            .iter()
            .map(|p| format!("{} ({})", p.service_name, p.pid))
            .collect();
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            time(cause.unix_ms),
            escape(kind.as_str().unwrap_or_default()),
            escape(what),
            escape(&processes.join(", "))
        );
    }
    out.push_str("</table>");
    if incident.causes_dropped > 0 {
        let _ = write!(
            out,
            "<p>{} later causes are counted, not listed.</p>",
            incident.causes_dropped
        );
    }
}

fn write_process(
    out: &mut String,
    incident: &Incident,
    part: &ProcessPart,
    signals: Option<&(Vec<Value>, Vec<Value>)>,
) {
    let diff = &part.diff;
    let _ = write!(
        out,
        "<h2>{} (pid {})</h2><p>CPU before {} – {} ({} ms) against during {} – {} ({} ms); \
         functions ranked by growth of their share (inclusive: with what they call), a function \
         whose growth is all in one callee left out for it.</p>\
         <table class=\"diff\" data-pid=\"{}\"><tr><th>#</th><th>function</th>\
         <th>share before %</th><th>share during %</th><th>growth (points)</th>\
         <th>self before %</th><th>self during %</th></tr>",
        escape(&part.service_name),
        part.pid,
        time(diff.before_from_unix_ms),
        time(diff.before_until_unix_ms),
        diff.before_total / MILLISECOND,
        time(diff.during_from_unix_ms),
        time(diff.during_until_unix_ms),
        diff.during_total / MILLISECOND,
        part.pid,
    );
    for (rank, f) in diff.functions.iter().enumerate() {
        let _ = write!(
            out,
            "<tr><td class=\"n\">{}</td><td><code class=\"function\">{}</code></td>\
             <td class=\"n share-before\">{:.2}</td><td class=\"n share-during\">{:.2}</td>\
             <td class=\"n\">{:+.2}</td><td class=\"n\">{:.2}</td><td class=\"n\">{:.2}</td></tr>",
            rank + 1,
            escape(&f.function),
            f.total_before,
            f.total_during,
            f.growth(),
            f.self_before,
            f.self_during
        );
    }
    out.push_str("</table><p>Data: ");
    let prefix = format!("incident-{}-pid-{}", incident.id, part.pid);
    download(
        out,
        &format!("{prefix}-cpu-before.pb.gz"),
        "application/octet-stream",
        &part.before_pprof,
    );
    download(
        out,
        &format!("{prefix}-cpu-during.pb.gz"),
        "application/octet-stream",
        &part.during_pprof,
    );
    let diff_json = serde_json::to_vec_pretty(diff).expect("a diff serializes");
    download(
        out,
        &format!("{prefix}-diff.json"),
        "application/json",
        &diff_json,
    );
    download(
        out,
        &format!("{prefix}-profile-totals.csv"),
        "text/csv",
        part.csv.as_bytes(),
    );
    if let Some((logs, exceptions)) = signals {
        for (name, records) in [("logs", logs), ("exceptions", exceptions)] {
            let json = serde_json::to_vec(records).expect("records serialize");
            download(
                out,
                &format!("{prefix}-{name}.json"),
                "application/json",
                &json,
            );
        }
    }
    out.push_str("</p>");
}
