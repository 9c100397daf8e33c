//! Incidents: a collection rule firing, or a mark set through the API ("something happened at
//! 14:02 on these processes"), with a window of profiles around it for the retrospective.
//!
//! An incident's window runs from [`IncidentWindow::before`] before its first cause until
//! [`IncidentWindow::after`] after its last; a cause at or before an incident's window end on
//! one of its processes joins it (so firings that overlap make one incident), and incidents
//! that come to overlap are merged. Each incident is one JSON file in `incidents/` beside the
//! profile blocks, written atomically when a cause is recorded (a SIGKILL loses none), and
//! under the store's retention: see [`crate::tsdb::Store::apply_retention`].

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use profile::Profile;
use serde::{Deserialize, Serialize};

use crate::tsdb::{BlockProblem, Result, StoreError};

/// The directory of the data directory that holds the incidents.
pub const INCIDENTS_DIR: &str = "incidents";
/// How long before its first cause an incident's window starts, unless configured.
pub const DEFAULT_BEFORE: Duration = Duration::from_secs(10 * 60);
/// How long after its last cause an incident's window ends, unless configured.
pub const DEFAULT_AFTER: Duration = Duration::from_secs(5 * 60);
/// Causes one incident keeps; later ones are counted in [`Incident::causes_dropped`] (a rule
/// firing every second for hours stays one small file).
pub const MAX_CAUSES: usize = 1000;
/// Processes one incident names at most.
pub const MAX_PROCESSES: usize = 256;
/// The largest incident file read back: larger ones are damaged or not ours.
const MAX_FILE_BYTES: u64 = 4 << 20;
const SUFFIX: &str = ".json";
const TEMP_SUFFIX: &str = ".tmp";

/// How far an incident's window reaches around its causes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IncidentWindow {
    pub before: Duration,
    pub after: Duration,
}

impl Default for IncidentWindow {
    fn default() -> Self {
        IncidentWindow {
            before: DEFAULT_BEFORE,
            after: DEFAULT_AFTER,
        }
    }
}

/// A process an incident concerns.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct IncidentProcess {
    pub pid: u64,
    pub service_name: String,
}

/// What made an incident.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CauseKind {
    /// A collection rule's trigger was satisfied and its actions ran.
    RuleTriggered,
    /// A collection rule's trigger was satisfied but its limits held the actions back.
    RuleThrottled,
    /// Someone marked the time through the API.
    Mark,
}

/// One cause of an incident: a rule firing on a process, or a mark on some processes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncidentCause {
    pub unix_ms: i64,
    pub kind: CauseKind,
    /// The collection rule, for rule causes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// What the person who set a mark said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// For rule causes, the trigger that was satisfied, as configured (`CPUUsage > 12 over 5 s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    /// For triggers that judge a sliding window, its start: what satisfied the trigger began no
    /// later, so an incident's "before" ends there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger_from_unix_ms: Option<i64>,
    pub processes: Vec<IncidentProcess>,
}

impl IncidentCause {
    /// When what this cause reports began: its trigger's window start, or its own time.
    fn onset_unix_ms(&self) -> i64 {
        self.trigger_from_unix_ms
            .map_or(self.unix_ms, |from| from.min(self.unix_ms))
    }
}

/// An incident as stored and as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Incident {
    pub id: u64,
    /// The window: `[from_unix_ms, until_unix_ms)`.
    pub from_unix_ms: i64,
    pub until_unix_ms: i64,
    pub first_cause_unix_ms: i64,
    pub last_cause_unix_ms: i64,
    /// Where "during" starts: the earliest cause's trigger window start (or the first cause).
    /// Files written before it was kept get it from their causes when read.
    #[serde(default)]
    pub onset_unix_ms: i64,
    /// Sorted by pid.
    pub processes: Vec<IncidentProcess>,
    /// The rules among its causes, sorted.
    pub rules: Vec<String>,
    /// Oldest first, at most [`MAX_CAUSES`].
    pub causes: Vec<IncidentCause>,
    pub causes_dropped: u64,
}

impl Incident {
    fn new(id: u64, cause: IncidentCause, window: IncidentWindow) -> Incident {
        let mut incident = Incident {
            id,
            from_unix_ms: cause.unix_ms,
            until_unix_ms: cause.unix_ms,
            first_cause_unix_ms: cause.unix_ms,
            last_cause_unix_ms: cause.unix_ms,
            onset_unix_ms: cause.onset_unix_ms(),
            processes: Vec::new(),
            rules: Vec::new(),
            causes: Vec::new(),
            causes_dropped: 0,
        };
        incident.add(cause, window);
        incident
    }

    /// Whether `cause` belongs to this incident: on one of its processes, and within its
    /// window's end, or (a mark set for a past time) with its first cause within the `after`
    /// the cause's own window would reach.
    fn takes(&self, cause: &IncidentCause, window: IncidentWindow) -> bool {
        cause.unix_ms <= self.until_unix_ms
            && cause.unix_ms.saturating_add(millis(window.after)) >= self.first_cause_unix_ms
            && self.shares_a_process(&cause.processes)
    }

    fn shares_a_process(&self, processes: &[IncidentProcess]) -> bool {
        processes.iter().any(|p| self.processes.contains(p))
    }

    fn add(&mut self, cause: IncidentCause, window: IncidentWindow) {
        self.first_cause_unix_ms = self.first_cause_unix_ms.min(cause.unix_ms);
        self.last_cause_unix_ms = self.last_cause_unix_ms.max(cause.unix_ms);
        self.onset_unix_ms = self.onset_unix_ms.min(cause.onset_unix_ms());
        self.from_unix_ms = self.onset_unix_ms.saturating_sub(millis(window.before));
        self.until_unix_ms = self.last_cause_unix_ms.saturating_add(millis(window.after));
        for p in &cause.processes {
            if !self.processes.contains(p) && self.processes.len() < MAX_PROCESSES {
                self.processes.push(p.clone());
            }
        }
        self.processes.sort();
        if let Some(rule) = &cause.rule {
            if !self.rules.contains(rule) {
                self.rules.push(rule.clone());
                self.rules.sort();
            }
        }
        if self.causes.len() < MAX_CAUSES {
            let at = self.causes.partition_point(|c| c.unix_ms <= cause.unix_ms);
            self.causes.insert(at, cause);
        } else {
            self.causes_dropped += 1;
        }
    }

    fn absorb(&mut self, other: Incident, window: IncidentWindow) {
        self.causes_dropped += other.causes_dropped;
        for cause in other.causes {
            self.add(cause, window);
        }
    }

    /// Whether it matches every filter given.
    pub fn matches(&self, filter: &IncidentFilter) -> bool {
        filter
            .pid
            .is_none_or(|pid| self.processes.iter().any(|p| p.pid == pid))
            && filter
                .service_name
                .as_ref()
                .is_none_or(|s| self.processes.iter().any(|p| p.service_name == *s))
            && filter.rule.as_ref().is_none_or(|r| self.rules.contains(r))
            && filter.from_unix_ms.is_none_or(|t| self.until_unix_ms > t)
            && filter.until_unix_ms.is_none_or(|t| self.from_unix_ms < t)
    }
}

/// Which incidents a listing shows: those matching every field given; the time range keeps
/// the incidents whose window overlaps `[from_unix_ms, until_unix_ms)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IncidentFilter {
    pub pid: Option<u64>,
    pub service_name: Option<String>,
    pub rule: Option<String>,
    pub from_unix_ms: Option<i64>,
    pub until_unix_ms: Option<i64>,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[derive(Debug)]
struct Stored {
    incident: Incident,
    bytes: u64,
}

#[derive(Debug)]
struct Registry {
    dir: PathBuf,
    window: IncidentWindow,
    by_id: BTreeMap<u64, Stored>,
    next_id: u64,
}

/// What is told of each incident made (not of one a cause joins): the OTLP export's log record.
pub type OnCreated = Box<dyn Fn(&Incident) + Send + Sync>;

/// The store's incidents; cloning shares them. Recording takes its own lock, not the store's,
/// so a rule firing never waits for a profile query.
#[derive(Clone)]
pub struct Incidents {
    inner: Arc<Mutex<Registry>>,
    on_created: Arc<std::sync::OnceLock<OnCreated>>,
}

impl std::fmt::Debug for Incidents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incidents")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl Incidents {
    /// Opens (creating, mode 0700) `dir`, removing files a crash left half-written. Files that
    /// cannot be read are skipped and returned as problems.
    pub(crate) fn open(
        dir: PathBuf,
        window: IncidentWindow,
    ) -> Result<(Incidents, Vec<BlockProblem>)> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io(&dir))?;
        let mut by_id = BTreeMap::new();
        let mut problems = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io(&dir))? {
            let path = entry.map_err(io(&dir))?.path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if name.ends_with(TEMP_SUFFIX) {
                fs::remove_file(&path).map_err(io(&path))?;
                continue;
            }
            if !name.ends_with(SUFFIX) {
                continue;
            }
            match read(&path) {
                Ok(stored) => {
                    by_id.insert(stored.incident.id, stored);
                }
                Err(message) => problems.push(BlockProblem { path, message }),
            }
        }
        let next_id = by_id.keys().next_back().map_or(1, |id| id + 1);
        let registry = Registry {
            dir,
            window,
            by_id,
            next_id,
        };
        let incidents = Incidents {
            inner: Arc::new(Mutex::new(registry)),
            on_created: Arc::default(),
        };
        Ok((incidents, problems))
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        // Entries are replaced whole, after their file is written.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The window incidents get.
    pub fn window(&self) -> IncidentWindow {
        self.lock().window
    }

    /// Tells `notify` of every incident made from now on, after it is on disk (the first one
    /// given stays); it runs on the recording thread, so it must not block.
    pub fn on_created(&self, notify: OnCreated) {
        let _ = self.on_created.set(notify);
    }

    /// Records `cause`: it joins the incident it belongs to (merging any others it now
    /// overlaps), or starts one (told to [`Incidents::on_created`]). Returns the incident as
    /// written to disk.
    pub fn record(&self, cause: IncidentCause) -> Result<Incident> {
        let (incident, created) = self.record_locked(cause)?;
        if let Some(notify) = self.on_created.get().filter(|_| created) {
            notify(&incident);
        }
        Ok(incident)
    }

    /// [`Incidents::record`] under the lock; whether the incident is new.
    fn record_locked(&self, cause: IncidentCause) -> Result<(Incident, bool)> {
        if cause.processes.is_empty() {
            return Err(StoreError::InvalidQuery(
                "an incident cause names at least one process".into(),
            ));
        }
        let mut registry = self.lock();
        let window = registry.window;
        let joined: Vec<u64> = registry
            .by_id
            .values()
            .filter(|s| s.incident.takes(&cause, window))
            .map(|s| s.incident.id)
            .collect();
        let mut incident = match joined.first() {
            Some(id) => registry.by_id[id].incident.clone(),
            None => Incident::new(registry.next_id, cause.clone(), window),
        };
        if !joined.is_empty() {
            incident.add(cause, window);
        }
        for id in joined.iter().skip(1) {
            incident.absorb(registry.by_id[id].incident.clone(), window);
        }
        let bytes = write(&registry.dir, &incident)?;
        for id in joined.iter().skip(1) {
            registry.remove(*id)?;
        }
        registry.next_id = registry.next_id.max(incident.id + 1);
        registry.by_id.insert(
            incident.id,
            Stored {
                incident: incident.clone(),
                bytes,
            },
        );
        Ok((incident, joined.is_empty()))
    }

    /// The incidents `filter` keeps, newest first.
    pub fn list(&self, filter: &IncidentFilter) -> Vec<Incident> {
        self.lock()
            .by_id
            .values()
            .rev()
            .filter(|s| s.incident.matches(filter))
            .map(|s| s.incident.clone())
            .collect()
    }

    pub fn get(&self, id: u64) -> Option<Incident> {
        self.lock().by_id.get(&id).map(|s| s.incident.clone())
    }

    /// Bytes the incident files take.
    pub fn bytes(&self) -> u64 {
        self.lock().by_id.values().map(|s| s.bytes).sum()
    }

    /// Deletes the incidents whose window ended before `horizon_unix_ms`, then, while
    /// `over(bytes they take)` holds, the oldest of the rest. Returns the deleted ids.
    pub(crate) fn retain(
        &self,
        horizon_unix_ms: i64,
        mut over: impl FnMut(u64) -> bool,
    ) -> Result<Vec<u64>> {
        let mut registry = self.lock();
        let mut deleted: Vec<u64> = registry
            .by_id
            .values()
            .filter(|s| s.incident.until_unix_ms <= horizon_unix_ms)
            .map(|s| s.incident.id)
            .collect();
        for &id in &deleted {
            registry.remove(id)?;
        }
        let mut by_end: Vec<(i64, u64)> = registry
            .by_id
            .values()
            .map(|s| (s.incident.until_unix_ms, s.incident.id))
            .collect();
        by_end.sort_unstable();
        for (_, id) in by_end {
            let bytes = registry.by_id.values().map(|s| s.bytes).sum();
            if !over(bytes) {
                break;
            }
            registry.remove(id)?;
            deleted.push(id);
        }
        Ok(deleted)
    }
}

impl Registry {
    fn remove(&mut self, id: u64) -> Result<()> {
        let path = self.dir.join(file_name(id));
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&path)(e)),
        }
        self.by_id.remove(&id);
        Ok(())
    }
}

fn file_name(id: u64) -> String {
    format!("incident-{id:010}{SUFFIX}")
}

/// Writes `incident` atomically (a temp file, fsynced, renamed), mode 0600; returns its bytes.
fn write(dir: &Path, incident: &Incident) -> Result<u64> {
    let path = dir.join(file_name(incident.id));
    let tmp = dir.join(format!("{}{TEMP_SUFFIX}", file_name(incident.id)));
    let body = serde_json::to_vec(incident).expect("an incident serializes");
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io(&tmp))?;
    file.write_all(&body)
        .and_then(|()| file.sync_all())
        .map_err(io(&tmp))?;
    fs::rename(&tmp, &path).map_err(io(&path))?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    Ok(body.len() as u64)
}

fn read(path: &Path) -> std::result::Result<Stored, String> {
    let len = fs::metadata(path).map_err(|e| e.to_string())?.len();
    if len > MAX_FILE_BYTES {
        return Err(format!(
            "{len} bytes, more than an incident file ever takes ({MAX_FILE_BYTES}); move it away"
        ));
    }
    let body = fs::read(path).map_err(|e| e.to_string())?;
    let mut incident: Incident = serde_json::from_slice(&body)
        .map_err(|e| format!("not an incident file ({e}); move it away"))?;
    if incident.onset_unix_ms == 0 {
        incident.onset_unix_ms = incident
            .causes
            .iter()
            .map(IncidentCause::onset_unix_ms)
            .fold(incident.first_cause_unix_ms, i64::min);
    }
    if path
        .file_name()
        .is_some_and(|n| *n != *file_name(incident.id))
    {
        return Err(format!(
            "holds incident {} under another incident's name; move it away",
            incident.id
        ));
    }
    Ok(Stored {
        incident,
        bytes: len,
    })
}

/// One function's share of a profile before and during an incident, in percent of each
/// side's total: `total` of the samples it is on (inclusive, what it and its callees cost),
/// `self` of those it is the leaf of.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShareChange {
    pub function: String,
    pub module: String,
    pub total_before: f64,
    pub total_during: f64,
    pub self_before: f64,
    pub self_during: f64,
}

impl ShareChange {
    /// Percentage points its inclusive share grew by (negative: shrank).
    pub fn growth(&self) -> f64 {
        self.total_during - self.total_before
    }
}

/// A function whose growth lies at least this much in its calls to one callee is left out of
/// a diff in favour of that callee.
pub const PASSED_ON: f64 = 0.9;

type FunctionKey = (String, String);

/// One side of a diff: each function's self and total share, and each call's (caller,
/// callee) share, in percent of the side's total.
#[derive(Default)]
struct Shares {
    functions: BTreeMap<FunctionKey, (f64, f64)>,
    calls: BTreeMap<(FunctionKey, FunctionKey), f64>,
}

impl Shares {
    fn of(profile: &Profile) -> Shares {
        let mut shares = Shares::default();
        let total = profile.total(0);
        if total == 0 {
            return shares;
        }
        let key = |i: u32| {
            let f = &profile.functions[i as usize];
            (f.name.clone(), f.module.clone())
        };
        let percent = |v: i64| v as f64 * 100.0 / total as f64;
        for t in profile.function_totals(0) {
            let entry = shares.functions.entry(key(t.function)).or_default();
            entry.0 += percent(t.self_value);
            entry.1 += percent(t.total_value);
        }
        let mut calls: BTreeMap<(u32, u32), i64> = BTreeMap::new();
        let mut seen = Vec::new();
        for sample in &profile.samples {
            seen.clear();
            for pair in sample.stack.windows(2) {
                // Leaf first: pair[1] calls pair[0]; a recursion's call to itself explains nothing.
                let call = (pair[1], pair[0]);
                if call.0 != call.1 && !seen.contains(&call) {
                    seen.push(call);
                    *calls.entry(call).or_default() += sample.values[0];
                }
            }
        }
        for ((caller, callee), value) in calls {
            *shares.calls.entry((key(caller), key(callee))).or_default() += percent(value);
        }
        shares
    }
}

/// The functions of `before` and `during` (profiles of one sample type), ranked by how much
/// their inclusive share grew, largest growth first; at most `limit`. A function whose growth
/// lies ([`PASSED_ON`]) in its calls to one callee is left out: the request pipeline above a
/// regressed method grows by as much as the method, and the method is what changed. Ranking by
/// self share instead would put a leaf the regression calls (a clock read, an allocation) first.
pub fn share_changes(before: &Profile, during: &Profile, limit: usize) -> Vec<ShareChange> {
    let (before, during) = (Shares::of(before), Shares::of(during));
    let mut call_growth: BTreeMap<&FunctionKey, f64> = BTreeMap::new();
    for ((caller, callee), share) in &during.calls {
        let was = before.calls.get(&(caller.clone(), callee.clone()));
        let growth = share - was.copied().unwrap_or(0.0);
        let best = call_growth.entry(caller).or_insert(f64::MIN);
        *best = best.max(growth);
    }
    let keys: std::collections::BTreeSet<&FunctionKey> = before
        .functions
        .keys()
        .chain(during.functions.keys())
        .collect();
    let mut changes: Vec<ShareChange> = keys
        .into_iter()
        .map(|k| {
            let (self_before, total_before) = before.functions.get(k).copied().unwrap_or_default();
            let (self_during, total_during) = during.functions.get(k).copied().unwrap_or_default();
            ShareChange {
                function: k.0.clone(),
                module: k.1.clone(),
                total_before,
                total_during,
                self_before,
                self_during,
            }
        })
        .filter(|c| {
            let key = (c.function.clone(), c.module.clone());
            let passed = call_growth.get(&key).copied().unwrap_or(f64::MIN);
            c.growth() <= 0.0 || passed < PASSED_ON * c.growth()
        })
        .collect();
    changes.sort_by(|a, b| {
        b.growth()
            .total_cmp(&a.growth())
            .then_with(|| b.total_during.total_cmp(&a.total_during))
            .then_with(|| a.function.cmp(&b.function))
    });
    changes.truncate(limit);
    changes
}

/// The flame-graph diff of one process of an incident: its profiles before the first cause
/// (`[from, first cause)`) and during (`[first cause, until)`, cut at `now`), and the
/// functions ranked by [`share_changes`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IncidentDiff {
    pub incident: u64,
    pub pid: u64,
    pub profile_type: String,
    pub unit: String,
    pub before_from_unix_ms: i64,
    pub before_until_unix_ms: i64,
    pub during_from_unix_ms: i64,
    pub during_until_unix_ms: i64,
    /// Each side's total, in `unit`.
    pub before_total: i64,
    pub during_total: i64,
    pub functions: Vec<ShareChange>,
}

/// The profiles a diff compares, as [`crate::tsdb::Store::profile`] answers them (without
/// sample labels), for a bundle's pprof files.
#[derive(Debug, Clone)]
pub struct DiffProfiles {
    pub before: Profile,
    pub during: Profile,
}

impl Incident {
    /// `(before, during)` in Unix ms, each non-empty and meeting at the onset (the start of the
    /// first trigger's window: the minutes the trigger judged are "during", never "before");
    /// during ends at `now_unix_ms` while the window is still open.
    pub fn ranges(&self, now_unix_ms: i64) -> ((i64, i64), (i64, i64)) {
        let onset = self.onset_unix_ms;
        let before = (self.from_unix_ms.min(onset - 1), onset);
        let during = (onset, self.until_unix_ms.min(now_unix_ms).max(onset + 1));
        (before, during)
    }
}

/// The diff of process `pid` of `incident` in profile type `profile_type` (one the store
/// holds), its `limit` largest growers; queries carry `control`.
pub fn incident_diff(
    store: &crate::tsdb::Store,
    incident: &Incident,
    pid: u64,
    profile_type: &profile::ProfileType,
    now_unix_ms: i64,
    limit: usize,
    control: &crate::tsdb::QueryControl,
) -> Result<(IncidentDiff, DiffProfiles)> {
    let (before_ms, during_ms) = incident.ranges(now_unix_ms);
    let query = |range| side_query(range, pid, profile_type, Vec::new(), control);
    let before = store.profile(&query(before_ms))?;
    let during = store.profile(&query(during_ms))?;
    let diff = IncidentDiff {
        incident: incident.id,
        pid,
        profile_type: profile_type.name.clone(),
        unit: profile_type.unit.clone(),
        before_from_unix_ms: before_ms.0,
        before_until_unix_ms: before_ms.1,
        during_from_unix_ms: during_ms.0,
        during_until_unix_ms: during_ms.1,
        before_total: before.total(0),
        during_total: during.total(0),
        functions: share_changes(&before, &during, limit),
    };
    Ok((diff, DiffProfiles { before, during }))
}

/// The query of one side (`[from, until)` in Unix ms) of an incident on process `pid`, keeping
/// the sample labels `keep`.
fn side_query(
    (from, until): (i64, i64),
    pid: u64,
    profile_type: &profile::ProfileType,
    keep: Vec<String>,
    control: &crate::tsdb::QueryControl,
) -> crate::tsdb::Query {
    crate::tsdb::Query {
        from: from.saturating_mul(1_000_000),
        until: until.saturating_mul(1_000_000),
        profile_type: profile_type.clone(),
        matchers: vec![("process_id".to_string(), pid.to_string())],
        sample_matchers: Vec::new(),
        sample_labels: crate::tsdb::SampleLabels::Only(keep),
        control: control.clone(),
    }
}

/// The stored profile type that counts exceptions thrown, one sample per throw, labelled with
/// the thrown type ([`profile::labels::TYPE`]).
pub const EXCEPTION_TYPE: &str = "exception";

/// One exception type's throws before and during an incident, as the store counted them (every
/// `ExceptionThrown` event of the runtime, first chance, not sampled).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExceptionChange {
    pub type_name: String,
    pub before: i64,
    pub during: i64,
    /// Throws a minute on each side: the sides differ in length.
    pub before_per_minute: f64,
    pub during_per_minute: f64,
    /// Thrown during and never before.
    pub new: bool,
    /// The function it was thrown from most often (during, else before), the app's own before
    /// the framework's (an `await` passing an exception on throws it again in the framework).
    pub thrown_at: String,
    /// Throws from `thrown_at` on that side.
    pub thrown_at_count: i64,
}

impl ExceptionChange {
    /// Throws a minute it grew by.
    pub fn growth(&self) -> f64 {
        self.during_per_minute - self.before_per_minute
    }
}

/// The exception types of one process that are new or grew in an incident.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IncidentExceptions {
    pub incident: u64,
    pub pid: u64,
    pub before_from_unix_ms: i64,
    pub before_until_unix_ms: i64,
    pub during_from_unix_ms: i64,
    pub during_until_unix_ms: i64,
    /// All throws on each side, of every type.
    pub before_total: i64,
    pub during_total: i64,
    /// Largest growth of the rate first, at most the limit asked.
    pub exceptions: Vec<ExceptionChange>,
    /// Types thrown in the window that did not grow, or beyond the limit: not listed.
    pub types_left_out: usize,
}

/// One exception type's throws on one side, and where it was thrown from.
#[derive(Debug, Clone, Default)]
struct Throws {
    count: i64,
    site: String,
    site_count: i64,
}

/// Whether `module` is the runtime's or the framework's: a throw there passes an exception on
/// (`ExceptionDispatchInfo.Throw` at an `await`) more often than it makes one.
fn framework_module(module: &str) -> bool {
    module.starts_with("System.") || module.starts_with("Microsoft.")
}

/// Throws per type in `profile` (an [`EXCEPTION_TYPE`] profile keeping the `type` label), with
/// each type's most frequent throwing function, the app's own before the framework's: an
/// exception an `await` passes on is thrown again there, as often as it was made.
fn throws_by_type(profile: &Profile) -> BTreeMap<String, Throws> {
    let mut sites: BTreeMap<(String, u32), i64> = BTreeMap::new();
    for sample in &profile.samples {
        let type_name = sample
            .labels
            .iter()
            .find(|(key, _)| key == profile::labels::TYPE)
            .map_or_else(String::new, |(_, value)| match value {
                profile::LabelValue::Str(s) => s.clone(),
                profile::LabelValue::Num(n) => n.to_string(),
            });
        let leaf = sample.stack.first().copied().unwrap_or(u32::MAX);
        *sites.entry((type_name, leaf)).or_default() += sample.values[0];
    }
    let mut out: BTreeMap<String, (Throws, (bool, i64))> = BTreeMap::new();
    for ((type_name, leaf), count) in sites {
        let function = profile.functions.get(leaf as usize);
        let app = function.is_some_and(|f| !framework_module(&f.module));
        let (throws, best) = out.entry(type_name).or_default();
        throws.count += count;
        if (app, count) > *best {
            *best = (app, count);
            throws.site = function.map_or_else(String::new, |f| f.name.clone());
            throws.site_count = count;
        }
    }
    out.into_iter()
        .map(|(k, (throws, _))| (k, throws))
        .collect()
}

/// The exception types of process `pid` thrown in `incident`'s window whose rate grew from
/// before to during (new ones included), largest growth first; at most `limit`.
pub fn incident_exceptions(
    store: &crate::tsdb::Store,
    incident: &Incident,
    pid: u64,
    now_unix_ms: i64,
    limit: usize,
    control: &crate::tsdb::QueryControl,
) -> Result<IncidentExceptions> {
    let (before_ms, during_ms) = incident.ranges(now_unix_ms);
    let profile_type = profile::ProfileType::known(EXCEPTION_TYPE)
        .ok_or_else(|| StoreError::InvalidQuery(format!("no profile type {EXCEPTION_TYPE}")))?;
    let keep = vec![profile::labels::TYPE.to_string()];
    let query = |range| side_query(range, pid, &profile_type, keep.clone(), control);
    let before = throws_by_type(&store.profile(&query(before_ms))?);
    let during = throws_by_type(&store.profile(&query(during_ms))?);
    let per_minute =
        |n: i64, (from, until): (i64, i64)| n as f64 * 60_000.0 / (until - from) as f64;
    let types: std::collections::BTreeSet<&String> = before.keys().chain(during.keys()).collect();
    let mut changes: Vec<ExceptionChange> = types
        .iter()
        .map(|&type_name| {
            let b = before.get(type_name).cloned().unwrap_or_default();
            let d = during.get(type_name).cloned().unwrap_or_default();
            let (before_count, during_count) = (b.count, d.count);
            let site = if during_count > 0 { d } else { b };
            ExceptionChange {
                type_name: type_name.clone(),
                before: before_count,
                during: during_count,
                before_per_minute: per_minute(before_count, before_ms),
                during_per_minute: per_minute(during_count, during_ms),
                new: before_count == 0 && during_count > 0,
                thrown_at: site.site,
                thrown_at_count: site.site_count,
            }
        })
        .filter(|c| c.growth() > 0.0)
        .collect();
    changes.sort_by(|a, b| {
        b.growth()
            .total_cmp(&a.growth())
            .then_with(|| a.type_name.cmp(&b.type_name))
    });
    changes.truncate(limit);
    Ok(IncidentExceptions {
        incident: incident.id,
        pid,
        before_from_unix_ms: before_ms.0,
        before_until_unix_ms: before_ms.1,
        during_from_unix_ms: during_ms.0,
        during_until_unix_ms: during_ms.1,
        before_total: before.values().map(|v| v.count).sum(),
        during_total: during.values().map(|v| v.count).sum(),
        types_left_out: types.len() - changes.len(),
        exceptions: changes,
    })
}
