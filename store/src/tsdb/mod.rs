//! The on-disk time series of profiles the agent keeps, so the flame graph of any past minute
//! can be answered.
//!
//! Appended batches land in an in-memory Arrow head ([`head`]), which is flushed at least every
//! `flush_interval` (and early past a byte budget) into one immutable block per time partition
//! ([`block`]): Parquet sample rows referring to stack, function and label-set dictionaries.
//! Whole blocks are the unit of retention and compaction. The layout is in `store/FORMAT.md`.
//! Queries translate each block's dictionaries into one id space, kept between queries within a
//! byte budget ([`cache`]), and merge blocks on one thread per core ([`query`]).

mod block;
mod cache;
mod error;
mod head;
mod model;
mod query;
mod tree;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::array::UInt32Array;
use arrow::compute::take_record_batch;
use arrow::record_batch::RecordBatch;

pub use block::{
    BlockInfo, BlockMeta, BlockRows, FORMAT_MAJOR, FORMAT_MAJOR_DOWNSAMPLED, FORMAT_MINOR,
    FORMAT_NAME,
};
pub use error::{Result, StoreError};
pub use model::{parse_selector, Level, Query, QueryControl, SampleLabels, Series, StoreOptions};

use crate::incidents::{Incidents, INCIDENTS_DIR};
use cache::{BlockIds, QueryCache};
use error::io;
use head::{Dicts, Downsampling, Head, LevelMerge, SampleColumns};
use profile::{Batch, CallTree, LabelValue, Profile, ProfileType, ValueType};
use query::{ProfileMerge, Selection, SKIP};
use tree::TreeMerge;

/// Most points [`Store::series`] returns, so a tiny step cannot exhaust memory.
pub const MAX_SERIES_POINTS: u64 = 1_000_000;

/// Most threads one query reads and merges blocks on (one per core up to this). Each holds a
/// block and a partial answer, so this also bounds what a query can take in memory.
pub const MAX_QUERY_THREADS: usize = 4;

/// Threads a query works on: one per core, up to [`MAX_QUERY_THREADS`].
fn query_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .clamp(1, MAX_QUERY_THREADS)
}

/// What a query reads: see [`Store::plan`].
struct Plan<'a> {
    blocks: Vec<&'a BlockInfo>,
    /// Spans the downsampled blocks of `blocks` answer for.
    downsampled: Vec<(i64, i64)>,
}

/// A block that was skipped because it could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockProblem {
    pub path: PathBuf,
    /// What was wrong and what to do, from [`StoreError`].
    pub message: String,
}

/// A directory of blocks plus the head; see the module documentation.
///
/// Nothing is flushed on drop: call [`Store::flush`] on shutdown, or lose the head as a crash
/// would. One `Store` per directory: [`Store::open`] takes an exclusive lock on it.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    /// Holds the directory's `flock` for as long as the store lives.
    _lock: fs::File,
    options: StoreOptions,
    head: Head,
    /// Sorted oldest first.
    blocks: Vec<BlockInfo>,
    /// Each series the blocks list, once: a series is listed by every block of every level its
    /// samples reached, and a node's restarted processes make many (see [`share_series`]).
    series: HashSet<Arc<Series>>,
    next_sequence: u64,
    problems: Mutex<Vec<BlockProblem>>,
    cache: QueryCache,
    incidents: Incidents,
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

fn remove_dir(path: &Path) -> Result<()> {
    fs::remove_dir_all(path).map_err(io(path))
}

/// File in the data directory a store keeps `flock`ed while open.
pub const LOCK_FILE: &str = "LOCK";

/// Takes the data directory's exclusive lock, without waiting: two writers would interleave
/// block sequence numbers and delete each other's blocks. The kernel drops the lock when the
/// process dies, so a SIGKILLed agent never leaves a stale lock behind.
fn lock(dir: &Path) -> Result<fs::File> {
    let path = dir.join(LOCK_FILE);
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(io(&path))?;
    // SAFETY: flock only reads the descriptor, which `file` keeps open.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(file);
    }
    let error = std::io::Error::last_os_error();
    if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Err(StoreError::Locked {
            dir: dir.to_path_buf(),
            lock: path,
        });
    }
    Err(StoreError::Io {
        path,
        source: error,
    })
}

/// `rows` (of a head with `dicts`) with dictionaries of their own: the entries they use alone,
/// the rows renumbered into them and in block order.
fn own_dicts(dicts: &Dicts, rows: RecordBatch, partition: i64) -> Result<(Dicts, RecordBatch)> {
    let mut alone = Head::new();
    alone.absorb(dicts, &[rows], 0)?;
    Ok(block_contents(&mut alone, partition, false))
}

/// Takes the dictionaries and rows of a block out of `head`, the rows in [`block_order`].
/// `renumber` also sorts functions by name and numbers stacks breadth first, which compresses
/// better: worth it for a block that stays (compaction's), not for a flushed one.
fn block_contents(head: &mut Head, partition: i64, renumber: bool) -> (Dicts, RecordBatch) {
    let mut dicts = std::mem::take(&mut head.interner.dicts);
    let rows = if renumber {
        dicts.sort_functions();
        head::renumber_stacks(&head.record_batch(), &dicts.breadth_first())
    } else {
        head.record_batch()
    };
    let order = UInt32Array::from(block_order(&rows, partition));
    let rows = take_record_batch(&rows, &order).expect("indices are in range");
    (dicts, rows)
}

/// Rows in the order blocks keep them: by partition, then series, time, stack and labels. A
/// series' rows are then one run (in one row group on disk, which queries of other series skip),
/// times repeat in long runs and stack ids ascend in small steps, both of which delta encoding
/// stores in a few bits. (Stack before time would keep a sample's rows together, but costs 3x
/// the bytes: the time column then jumps between windows on every row.)
fn block_order(rows: &RecordBatch, partition: i64) -> Vec<u32> {
    let columns = SampleColumns::of(rows).expect("the head's own batch has the samples schema");
    let (series, times, stacks, labels) = (
        columns.series.values(),
        columns.time.values(),
        columns.stack.values(),
        columns.labels.values(),
    );
    let key = |i: u32| {
        let i = i as usize;
        (
            times[i].div_euclid(partition),
            series[i],
            times[i],
            stacks[i],
            labels[i],
        )
    };
    let mut order: Vec<u32> = (0..rows.num_rows() as u32).collect();
    order.sort_unstable_by_key(|&i| key(i));
    order
}

/// Makes `meta` list the series `shared` holds already, and adds those it does not: equal
/// series of many blocks are then one allocation (the store holds every block's meta).
fn share_series(shared: &mut HashSet<Arc<Series>>, meta: &mut BlockMeta) {
    for series in &mut meta.series {
        match shared.get(series) {
            Some(known) => *series = Arc::clone(known),
            None => {
                shared.insert(Arc::clone(series));
            }
        }
    }
}

/// Refuses a data directory another user owns or may write; makes one others may read 0700.
fn check_data_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = fs::metadata(dir).map_err(io(dir))?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    let unsafe_dir = |problem: String| StoreError::UnsafeDataDir {
        dir: dir.to_path_buf(),
        problem,
    };
    if meta.uid() != me {
        return Err(unsafe_dir(format!(
            "is owned by uid {}, not by this user (uid {me})",
            meta.uid()
        )));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(unsafe_dir(format!(
            "is writable by its group or others (mode {mode:04o})"
        )));
    }
    if mode & 0o077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io(dir))?;
        tracing::warn!(
            dir = %dir.display(),
            was = format!("{mode:04o}"),
            "the data directory was readable by others; it is now 0700"
        );
    }
    Ok(())
}

impl Store {
    /// Opens or creates a store in `dir` (created with mode 0700) and locks it
    /// ([`StoreError::Locked`] while another store has it open). An existing directory must be
    /// this user's and writable by no one else ([`StoreError::UnsafeDataDir`]); one others may
    /// read is made 0700, with a warning (profiles name the targets' code and command lines).
    /// Half-written blocks left by a crash are removed; unreadable blocks are skipped and
    /// listed by [`Store::problems`].
    pub fn open(dir: impl Into<PathBuf>, options: StoreOptions) -> Result<Store> {
        options.check()?;
        let dir = dir.into();
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io(&dir))?;
        check_data_dir(&dir)?;
        let lock = lock(&dir)?;
        let mut blocks = Vec::new();
        let mut series = HashSet::new();
        let mut problems = Vec::new();
        let mut next_sequence = 0;
        for entry in fs::read_dir(&dir).map_err(io(&dir))? {
            let entry = entry.map_err(io(&dir))?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if !entry.file_type().map_err(io(&path))?.is_dir() || name == INCIDENTS_DIR {
                continue;
            }
            if name.ends_with(block::TEMP_SUFFIX) {
                remove_dir(&path)?;
                continue;
            }
            if let Some(seq) = name.rsplit('-').next().and_then(|s| s.parse::<u64>().ok()) {
                next_sequence = next_sequence.max(seq + 1);
            }
            match block::inspect(&path) {
                Ok(mut info) => {
                    share_series(&mut series, &mut info.meta);
                    blocks.push(info);
                }
                Err(e) => problems.push(BlockProblem {
                    path,
                    message: e.to_string(),
                }),
            }
        }
        // A crash between writing a compacted block and deleting its inputs leaves both.
        let replaced: HashSet<String> = blocks
            .iter()
            .flat_map(|b| b.meta.compacted_from.iter().cloned())
            .collect();
        for b in blocks.iter().filter(|b| replaced.contains(&b.name)) {
            remove_dir(&b.path)?;
        }
        blocks.retain(|b| !replaced.contains(&b.name));
        blocks.sort_by(|a, b| (a.meta.min_time, &a.name).cmp(&(b.meta.min_time, &b.name)));
        let cache = QueryCache::new(options.query_cache_bytes);
        let (incidents, unreadable) =
            Incidents::open(dir.join(INCIDENTS_DIR), options.incident_window)?;
        problems.extend(unreadable);
        Ok(Store {
            dir,
            _lock: lock,
            options,
            head: Head::new(),
            blocks,
            series,
            next_sequence,
            problems: Mutex::new(problems),
            cache,
            incidents,
        })
    }

    /// Adds a batch to the head; flushes when the flush interval passed or the head is full.
    pub fn append(&mut self, batch: &Batch) -> Result<()> {
        self.head.append(batch)?;
        if self.head.bytes() >= self.options.head_bytes {
            return self.flush();
        }
        self.flush_if_due()
    }

    /// Flushes if the oldest unflushed batch is `flush_interval` old; for the agent's timer,
    /// so a quiet store still honours the interval.
    pub fn flush_if_due(&mut self) -> Result<()> {
        match self.head.since {
            Some(since) if since.elapsed() >= self.options.flush_interval => self.flush(),
            _ => Ok(()),
        }
    }

    /// Writes the head as one block per partition it touches, then applies retention and
    /// compacts closed partitions. If the first block cannot be written the head is kept.
    pub fn flush(&mut self) -> Result<()> {
        if self.head.is_empty() {
            self.head.since = None;
            return Ok(());
        }
        let head = std::mem::replace(&mut self.head, Head::new());
        let rows = head.record_batch();
        let partition = nanos(self.options.partition);
        let order = block_order(&rows, partition);
        let times = SampleColumns::of(&rows)
            .expect("the head's own batch has the samples schema")
            .time
            .values()
            .clone();
        let part = |i: u32| times[i as usize].div_euclid(partition);
        let groups: Vec<&[u32]> = order.chunk_by(|&a, &b| part(a) == part(b)).collect();
        // A head that spans partitions holds dictionary entries of each: every block gets
        // only the series, stacks, functions and label sets its own rows use.
        let split = groups.len() > 1;
        let mut written = 0;
        for group in groups {
            match self.write_partition(&head, &rows, &times, group, part(group[0]), split) {
                Ok(()) => written += 1,
                Err(e) if written == 0 => {
                    self.head = head;
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
        }
        self.compact()?;
        self.downsample()?;
        self.apply_retention(profile::clock::unix_nanos())?;
        Ok(())
    }

    /// Writes the block of partition `part` of a flushed head: the rows `group` picks of
    /// `rows`, with dictionaries of their own when the head spans partitions (`split`).
    fn write_partition(
        &mut self,
        head: &Head,
        rows: &RecordBatch,
        times: &[i64],
        group: &[u32],
        part: i64,
        split: bool,
    ) -> Result<()> {
        let partition = nanos(self.options.partition);
        let taken = take_record_batch(rows, &UInt32Array::from(group.to_vec()))
            .expect("indices are in range");
        let (own, taken) = if split {
            let (dicts, rows) = own_dicts(head.dicts(), taken, partition)?;
            (Some(dicts), rows)
        } else {
            (None, taken)
        };
        let dicts = own.as_ref().unwrap_or(head.dicts());
        let min_time = group.iter().map(|&i| times[i as usize]).min().unwrap_or(0);
        let max_time = group.iter().map(|&i| times[i as usize]).max().unwrap_or(0);
        let samples_appended = head
            .appended_by_time
            .iter()
            .filter(|(t, _)| t.div_euclid(partition) == part)
            .map(|(_, n)| n)
            .sum();
        self.write_block(
            dicts,
            taken,
            (min_time, max_time),
            samples_appended,
            Vec::new(),
            None,
        )
    }

    fn write_block(
        &mut self,
        dicts: &Dicts,
        samples: RecordBatch,
        (min_time, max_time): (i64, i64),
        samples_appended: u64,
        compacted_from: Vec<String>,
        downsampling: Option<&Downsampling>,
    ) -> Result<()> {
        let name = format!("{min_time:020}-{:06}", self.next_sequence);
        self.next_sequence += 1;
        let meta = BlockMeta {
            format: FORMAT_NAME.to_string(),
            format_major: match downsampling {
                None => FORMAT_MAJOR,
                Some(_) => FORMAT_MAJOR_DOWNSAMPLED,
            },
            format_minor: match downsampling {
                None => FORMAT_MINOR,
                Some(_) => 0,
            },
            min_time,
            max_time,
            samples_appended,
            rows: BlockRows {
                samples: samples.num_rows() as u64,
                stacks: dicts.stacks.len() as u64,
                functions: dicts.functions.len() as u64,
                label_sets: dicts.label_sets.len() as u64,
            },
            series: dicts.series.clone(),
            compacted_from,
            resolution: downsampling.map_or(0, |d| d.resolution),
            dropped_labels: downsampling.map_or_else(Vec::new, |d| d.drop_labels.clone()),
        };
        let mut info = block::write(&self.dir, &name, dicts, samples, &meta)?;
        share_series(&mut self.series, &mut info.meta);
        let at = self
            .blocks
            .partition_point(|b| (b.meta.min_time, &b.name) < (min_time, &name));
        self.blocks.insert(at, info);
        Ok(())
    }

    /// Deletes blocks past their age, then while all blocks exceed `retention_bytes` the
    /// oldest of those a coarser block covers, then the oldest of the rest, always keeping one
    /// block. A block's age is `retention_age` at most; one a coarser block covers goes
    /// sooner, after `full_detail_age` (full detail) or its level's `retention_age`, so data
    /// leaves a level only once a coarser copy holds it. Returns the names of the deleted
    /// blocks. Flushing calls this with the current time.
    ///
    /// Incidents count in the same budget and age: those whose window ended `retention_age`
    /// ago go, and, should blocks and incidents still exceed `retention_bytes` once the
    /// blocks are down to one, the incidents whose windows ended first.
    pub fn apply_retention(&mut self, now_unix_nanos: i64) -> Result<Vec<String>> {
        let horizon = now_unix_nanos.saturating_sub(nanos(self.options.retention_age));
        let level_cutoff = |resolution: i64| {
            let age = match resolution {
                0 => Some(self.options.full_detail_age),
                r => self
                    .options
                    .levels
                    .iter()
                    .find(|l| nanos(l.resolution) == r)
                    .map(|l| l.retention_age),
            };
            age.map_or(horizon, |age| {
                horizon.max(now_unix_nanos.saturating_sub(nanos(age)))
            })
        };
        let covered = self.covered_by_coarser();
        let mut doomed = HashSet::new();
        self.incidents
            .retain(horizon.div_euclid(1_000_000), |_| false)?;
        let mut total: u64 =
            self.blocks.iter().map(|b| b.bytes).sum::<u64>() + self.incidents.bytes();
        for (i, b) in self.blocks.iter().enumerate() {
            let end = b.meta.span().1;
            if end <= horizon || (covered[i] && end <= level_cutoff(b.meta.resolution)) {
                doomed.insert(i);
                total -= b.bytes;
            }
        }
        let mut by_age: Vec<usize> = (0..self.blocks.len()).collect();
        by_age.sort_by_key(|&i| {
            let meta = &self.blocks[i].meta;
            (!covered[i], meta.max_time, meta.min_time, i)
        });
        let mut left = self.blocks.len() - doomed.len();
        for &i in &by_age {
            if total <= self.options.retention_bytes || left <= 1 {
                break;
            }
            if doomed.insert(i) {
                total -= self.blocks[i].bytes;
                left -= 1;
            }
        }
        let mut deleted = Vec::new();
        for &i in &by_age {
            if doomed.contains(&i) {
                self.delete_block(&self.blocks[i])?;
                deleted.push(self.blocks[i].name.clone());
            }
        }
        let mut i = 0;
        self.blocks.retain(|_| {
            i += 1;
            !doomed.contains(&(i - 1))
        });
        let blocks: u64 = self.blocks.iter().map(|b| b.bytes).sum();
        let budget = self.options.retention_bytes;
        self.incidents
            .retain(i64::MIN, |incidents| blocks + incidents > budget)?;
        // Series no block lists any more (deleted now, or replaced by compaction) are forgotten.
        self.series.retain(|s| Arc::strong_count(s) > 1);
        Ok(deleted)
    }

    /// The incidents kept beside the blocks; the handle records without the store's lock.
    pub fn incidents(&self) -> &Incidents {
        &self.incidents
    }

    /// Per block: whether a block of a coarser level holds its span.
    fn covered_by_coarser(&self) -> Vec<bool> {
        let coarse: HashSet<(i64, i64)> = self
            .blocks
            .iter()
            .filter(|b| b.meta.resolution > 0)
            .map(|b| (b.meta.resolution, b.meta.min_time))
            .collect();
        let mut resolutions: Vec<i64> = coarse.iter().map(|&(r, _)| r).collect();
        resolutions.sort_unstable();
        resolutions.dedup();
        self.blocks
            .iter()
            .map(|b| {
                let (start, end) = b.meta.span();
                resolutions
                    .iter()
                    .filter(|&&r| r > b.meta.resolution)
                    .any(|&r| {
                        let at = start.div_euclid(r) * r;
                        end <= at.saturating_add(r) && coarse.contains(&(r, at))
                    })
            })
            .collect()
    }

    /// Renames first, so a crash mid-delete leaves a temp directory (removed on open), never a
    /// half block.
    fn delete_block(&self, b: &BlockInfo) -> Result<()> {
        let doomed = self
            .dir
            .join(format!("{}.del{}", b.name, block::TEMP_SUFFIX));
        fs::rename(&b.path, &doomed).map_err(io(&b.path))?;
        self.cache.forget(&b.name);
        remove_dir(&doomed)
    }

    /// Merges the blocks of each partition older than the newest block's into one block.
    /// Returns how many blocks were replaced. Flushing calls this.
    pub fn compact(&mut self) -> Result<usize> {
        let partition = nanos(self.options.partition);
        let Some(newest) = self
            .blocks
            .iter()
            .map(|b| b.meta.max_time.div_euclid(partition))
            .max()
        else {
            return Ok(0);
        };
        let mut groups: HashMap<i64, Vec<BlockInfo>> = HashMap::new();
        for b in self.blocks.iter().filter(|b| b.meta.resolution == 0) {
            let part = b.meta.min_time.div_euclid(partition);
            if part < newest {
                groups.entry(part).or_default().push(b.clone());
            }
        }
        let mut groups: Vec<(i64, Vec<BlockInfo>)> =
            groups.into_iter().filter(|(_, g)| g.len() > 1).collect();
        groups.sort_by_key(|(part, _)| *part);
        let mut replaced = 0;
        for (_, inputs) in groups {
            let mut head = Head::new();
            let mut readable = Vec::new();
            for info in &inputs {
                match block::read_dicts(info)
                    .and_then(|d| block::read_samples(info, &|_| true).map(|s| (d, s)))
                {
                    Ok((dicts, samples)) => {
                        head.absorb(&dicts, &samples, info.meta.samples_appended)?;
                        readable.push(info.clone());
                    }
                    Err(e) => self.report(info, e),
                }
            }
            if readable.len() < 2 {
                continue;
            }
            let names: Vec<String> = readable.iter().map(|b| b.name.clone()).collect();
            let (dicts, rows) = block_contents(&mut head, partition, true);
            let (min, max) = (head.min_time, head.max_time);
            let appended = head.samples_appended;
            self.write_block(&dicts, rows, (min, max), appended, names.clone(), None)?;
            for b in &readable {
                self.delete_block(b)?;
            }
            self.blocks.retain(|b| !names.contains(&b.name));
            replaced += readable.len();
        }
        Ok(replaced)
    }

    /// Makes each level's blocks (see [`Level`]) from the next finer level's blocks once their
    /// span is closed (the newest block of full detail is in a later partition), and makes a
    /// level's block again when the finer blocks of its span hold samples it lacks (data that
    /// came late), reading a few series at a time so that its memory follows
    /// [`StoreOptions::level_pass_rows`], not the span's rows. Returns how many blocks it
    /// wrote. Flushing calls this after compaction.
    pub fn downsample(&mut self) -> Result<usize> {
        let partition = nanos(self.options.partition);
        let Some(closed) = self
            .blocks
            .iter()
            .filter(|b| b.meta.resolution == 0)
            .map(|b| b.meta.max_time.div_euclid(partition) * partition)
            .max()
        else {
            return Ok(0);
        };
        let mut written = 0;
        let mut finer = 0;
        for level in self.options.levels.clone() {
            let resolution = nanos(level.resolution);
            let mut groups: BTreeMap<i64, Vec<BlockInfo>> = BTreeMap::new();
            for b in &self.blocks {
                let start = b.meta.min_time.div_euclid(resolution) * resolution;
                if b.meta.resolution == finer
                    && start.saturating_add(resolution) <= closed
                    && !self.is_bad(b)
                {
                    groups.entry(start).or_default().push(b.clone());
                }
            }
            finer = resolution;
            for (start, inputs) in groups {
                let appended: u64 = inputs.iter().map(|b| b.meta.samples_appended).sum();
                let existing = self
                    .blocks
                    .iter()
                    .find(|b| b.meta.resolution == resolution && b.meta.min_time == start)
                    .cloned();
                if existing
                    .as_ref()
                    .is_some_and(|e| e.meta.samples_appended >= appended)
                {
                    continue;
                }
                let mut drop_labels = level.drop_labels.clone();
                for input in &inputs {
                    drop_labels.extend(input.meta.dropped_labels.iter().cloned());
                }
                drop_labels.sort();
                drop_labels.dedup();
                let downsampling = Downsampling {
                    resolution,
                    drop_labels,
                };
                let Some((dicts, rows, appended)) =
                    self.merge_level(&inputs, &downsampling.drop_labels, start)?
                else {
                    continue;
                };
                let replaced: Vec<String> = existing.iter().map(|b| b.name.clone()).collect();
                self.write_block(
                    &dicts,
                    rows,
                    (start, start),
                    appended,
                    replaced,
                    Some(&downsampling),
                )?;
                written += 1;
                if let Some(old) = existing {
                    self.delete_block(&old)?;
                    self.blocks.retain(|b| b.name != old.name);
                }
            }
        }
        Ok(written)
    }

    /// The dictionaries, rows (at `start`) and appended samples of the level block `inputs`
    /// make, or `None` when they hold no rows or one could not be read (reported; the next
    /// flush makes the block without it). Inputs are read a few series at a time, so that one
    /// pass's rows stay within [`StoreOptions::level_pass_rows`] but for a series larger on
    /// its own.
    fn merge_level(
        &self,
        inputs: &[BlockInfo],
        drop_labels: &[String],
        start: i64,
    ) -> Result<Option<(Dicts, RecordBatch, u64)>> {
        let mut readable = Vec::new();
        let mut dicts = Vec::new();
        let mut rows = Vec::new();
        for info in inputs {
            match block::read_dicts(info).and_then(|d| block::rows_per_series(info).map(|r| (d, r)))
            {
                Ok((d, r)) => {
                    readable.push(info);
                    dicts.push(d);
                    rows.push(r);
                }
                Err(e) => self.report(info, e),
            }
        }
        // Each series once, with where it is in each input and its rows in all of them.
        let mut where_series: HashMap<&Arc<Series>, usize> = HashMap::new();
        let mut series: Vec<(Vec<(usize, u32)>, u64)> = Vec::new();
        for (input, info) in readable.iter().enumerate() {
            for (id, s) in info.meta.series.iter().enumerate() {
                let at = *where_series.entry(s).or_insert_with(|| {
                    series.push((Vec::new(), 0));
                    series.len() - 1
                });
                series[at].0.push((input, id as u32));
                series[at].1 += rows[input][id];
            }
        }
        let mut merge = LevelMerge::new(&dicts, drop_labels);
        let mut next = 0;
        while next < series.len() {
            let mut end = next + 1;
            let mut pass_rows = series[next].1;
            while end < series.len() && pass_rows + series[end].1 <= self.options.level_pass_rows {
                pass_rows += series[end].1;
                end += 1;
            }
            // Per input, whether each of its series ids is in this pass.
            let mut wanted: Vec<Vec<bool>> = readable
                .iter()
                .map(|b| vec![false; b.meta.series.len()])
                .collect();
            for &(input, id) in series[next..end].iter().flat_map(|(at, _)| at) {
                wanted[input][id as usize] = true;
            }
            for (input, ids) in wanted.iter().enumerate() {
                if !ids.contains(&true) {
                    continue;
                }
                let info = readable[input];
                let wants = |s: usize| ids.get(s).copied().unwrap_or(false);
                match block::read_samples(info, &wants) {
                    Ok(samples) => merge.absorb(input, &samples, |s| wants(s as usize))?,
                    Err(e) => {
                        self.report(info, e);
                        return Ok(None);
                    }
                }
            }
            merge.end_pass();
            next = end;
        }
        if merge.is_empty() {
            return Ok(None);
        }
        let appended = readable.iter().map(|b| b.meta.samples_appended).sum();
        let (dicts, rows) = merge.finish(start);
        Ok(Some((dicts, rows, appended)))
    }

    fn report(&self, info: &BlockInfo, e: StoreError) {
        let mut problems = self.problems.lock().unwrap_or_else(|p| p.into_inner());
        if !problems.iter().any(|p| p.path == info.path) {
            problems.push(BlockProblem {
                path: info.path.clone(),
                message: e.to_string(),
            });
        }
    }

    fn is_bad(&self, info: &BlockInfo) -> bool {
        let problems = self.problems.lock().unwrap_or_else(|p| p.into_inner());
        problems.iter().any(|p| p.path == info.path)
    }

    /// Blocks that could not be read, found on open or while querying.
    pub fn problems(&self) -> Vec<BlockProblem> {
        self.problems
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The readable blocks, oldest first.
    pub fn blocks(&self) -> &[BlockInfo] {
        &self.blocks
    }

    /// The blocks a query reads, at the coarsest level that answers each part of its range
    /// exactly, and the spans the downsampled ones among them answer for:
    ///
    /// 1. coarsest level first, each downsampled block whose whole span lies in the range
    ///    (and, for a timeline, in one step) and no chosen block's span overlaps;
    /// 2. the blocks of full detail in the range outside those spans (the range's edges, and
    ///    what no level holds yet);
    /// 3. finest level first, each downsampled block that is not in the range whole but whose
    ///    start is, where no finer block of its span is left (older than the finer levels
    ///    keep): its rows count at that start.
    ///
    /// A block whose level dropped a label the query's sample matchers name is not read.
    fn plan(&self, query: &Query, step: Option<i64>) -> Plan<'_> {
        let usable = |b: &BlockInfo| {
            b.meta
                .series
                .iter()
                .any(|s| s.matches(&query.profile_type, &query.matchers))
                && !query
                    .sample_matchers
                    .iter()
                    .any(|(key, _)| b.meta.dropped_labels.contains(key))
                && !self.is_bad(b)
        };
        let overlaps = |spans: &[(i64, i64)], (start, end): (i64, i64)| {
            spans.iter().any(|&(s, e)| start < e && s < end)
        };
        let in_one_step = |(start, end): (i64, i64)| {
            step.is_none_or(|step| {
                (start - query.from).div_euclid(step) == (end - 1 - query.from).div_euclid(step)
            })
        };
        let mut resolutions: Vec<i64> = self
            .blocks
            .iter()
            .map(|b| b.meta.resolution)
            .filter(|&r| r > 0)
            .collect();
        resolutions.sort_unstable();
        resolutions.dedup();
        let mut plan = Plan {
            blocks: Vec::new(),
            downsampled: Vec::new(),
        };
        for &r in resolutions.iter().rev() {
            for b in self.blocks.iter().filter(|b| b.meta.resolution == r) {
                let span = b.meta.span();
                if span.0 >= query.from
                    && span.1 <= query.until
                    && in_one_step(span)
                    && !overlaps(&plan.downsampled, span)
                    && usable(b)
                {
                    plan.blocks.push(b);
                    plan.downsampled.push(span);
                }
            }
        }
        for b in self.blocks.iter().filter(|b| b.meta.resolution == 0) {
            if b.meta.max_time >= query.from
                && b.meta.min_time < query.until
                && !overlaps(&plan.downsampled, b.meta.span())
                && usable(b)
            {
                plan.blocks.push(b);
            }
        }
        for &r in &resolutions {
            for b in self.blocks.iter().filter(|b| b.meta.resolution == r) {
                let span = b.meta.span();
                let finer_left = self
                    .blocks
                    .iter()
                    .any(|f| f.meta.resolution < r && overlaps(&[span], f.meta.span()));
                if (query.from..query.until).contains(&span.0)
                    && (span.1 > query.until || !in_one_step(span))
                    && !finer_left
                    && !overlaps(&plan.downsampled, span)
                    && usable(b)
                {
                    plan.blocks.push(b);
                    plan.downsampled.push(span);
                }
            }
        }
        plan
    }

    /// Whether the head may hold rows for the query.
    fn head_selected(&self, query: &Query) -> bool {
        !self.head.is_empty()
            && self.head.max_time >= query.from
            && self.head.min_time < query.until
            && self
                .head
                .dicts()
                .series
                .iter()
                .any(|s| s.matches(&query.profile_type, &query.matchers))
    }

    /// Folds each block that may hold rows for the query (its rows of unselected series mostly
    /// skipped, plus what `prepare` gets for it) into per-thread states, returned in a fixed
    /// order so answers do not depend on scheduling. Blocks that cannot be read are reported
    /// and skipped. A cancelled [`QueryControl`] stops every thread before its next block.
    ///
    /// Blocks are striped over up to [`MAX_QUERY_THREADS`] threads, one per core, each reading
    /// (decompressing, decoding, checking) and folding one block at a time: a long range costs
    /// a block and a partial answer per thread in memory, and its wall time shrinks with cores.
    fn fold_blocks<S: Send, P>(
        &self,
        query: &Query,
        blocks: &[&BlockInfo],
        init: impl Fn() -> S + Sync,
        prepare: impl Fn(&BlockInfo) -> Result<P> + Sync,
        visit: impl Fn(&mut S, &BlockInfo, P, &[RecordBatch]) -> Result<()> + Sync,
    ) -> Result<Vec<S>> {
        let selects = |series: &Series| series.matches(&query.profile_type, &query.matchers);
        let stripes = query_threads().min(blocks.len()).max(1);
        // Set when a stripe fails, so the others stop early rather than finish for nothing.
        let failed = AtomicBool::new(false);
        let fold_stripe = |stripe: usize, state: &mut S| -> Result<()> {
            for &info in blocks.iter().skip(stripe).step_by(stripes) {
                if failed.load(Ordering::Relaxed) {
                    break;
                }
                if let Err(cancelled) = query.control.check() {
                    failed.store(true, Ordering::Relaxed);
                    return Err(cancelled);
                }
                let wanted =
                    |series: usize| info.meta.series.get(series).is_some_and(|s| selects(s));
                let read = block::read_samples(info, &wanted)
                    .and_then(|rows| prepare(info).map(|prepared| (prepared, rows)));
                query.control.block_read();
                let folded = match read {
                    Ok((prepared, rows)) => visit(state, info, prepared, &rows),
                    Err(e) => {
                        self.report(info, e);
                        Ok(())
                    }
                };
                if folded.is_err() {
                    failed.store(true, Ordering::Relaxed);
                    return folded;
                }
            }
            Ok(())
        };
        std::thread::scope(|scope| {
            let helpers: Vec<_> = (1..stripes)
                .map(|stripe| {
                    let fold_stripe = &fold_stripe;
                    let init = &init;
                    std::thread::Builder::new()
                        .name("store-query".into())
                        .spawn_scoped(scope, move || {
                            let mut state = init();
                            fold_stripe(stripe, &mut state).map(|()| state)
                        })
                        .map_err(|_| stripe)
                })
                .collect();
            let mut first = init();
            fold_stripe(0, &mut first)?;
            let mut states = vec![first];
            for helper in helpers {
                states.push(match helper {
                    Ok(thread) => thread
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?,
                    // No thread to spare: this one folds that stripe too.
                    Err(stripe) => {
                        let mut state = init();
                        fold_stripe(stripe, &mut state)?;
                        state
                    }
                });
            }
            Ok(states)
        })
    }

    /// The merged profile of the matching series over the query's time range (head included),
    /// with one sample type (the query's profile type) and the sample labels it keeps.
    ///
    /// Its `period` is 0 (unknown): values are already totals in the profile type's unit, each
    /// sample worth the sampler period measured in its window, which differs between windows
    /// and processes, so no single period is true of a merged range and nothing needs scaling.
    pub fn profile(&self, query: &Query) -> Result<Profile> {
        query.check()?;
        let plan = self.plan(query, None);
        let mut dropped: Vec<String> = plan
            .blocks
            .iter()
            .flat_map(|b| b.meta.dropped_labels.iter().cloned())
            .collect();
        dropped.sort();
        dropped.dedup();
        let epoch = self.cache.epoch();
        let select =
            |ids: &BlockIds, series: &[Arc<Series>]| epoch.select(ids, series, query, &dropped);
        let mut parts = self
            .fold_blocks(
                query,
                &plan.blocks,
                ProfileMerge::default,
                |info| epoch.block_ids(info),
                |merge, info, ids, rows| {
                    let selection = select(&ids, &info.meta.series)?;
                    merge.add(&selection, &ids.nodes, rows, query)
                },
            )?
            .into_iter();
        let mut merge = parts.next().unwrap_or_default();
        for part in parts {
            merge.absorb(part);
        }
        if self.head_selected(query) {
            let dicts = self.head.dicts();
            let rows = [self.head.record_batch()];
            let ids = epoch.map(dicts)?;
            let selection = select(&ids, &dicts.series)?.excluding(&plan.downsampled);
            merge.add(&selection, &ids.nodes, &rows, query)?;
        }
        let value_type = ValueType::new(&query.profile_type.name, &query.profile_type.unit);
        let state = epoch.lock();
        Ok(merge.build(
            &state.interner,
            query_threads(),
            value_type,
            query.from,
            query.until.saturating_sub(query.from),
        ))
    }

    /// The call tree of the matching samples as a flame graph shows it: cut to its `max_nodes`
    /// largest nodes (what was cut shows as a child [`profile::labels::OTHER_FRAME`] of the
    /// node above it), without sample labels. Unlike [`Store::profile`], its cost does not grow
    /// with the number of distinct stacks beyond reading them: see the `tree` module for how,
    /// and for the bound on what cutting may move from a node to `other` above it.
    pub fn call_tree(&self, query: &Query, max_nodes: usize) -> Result<CallTree> {
        query.check()?;
        if max_nodes == 0 {
            return Err(StoreError::InvalidQuery(
                "max_nodes must be at least 1".into(),
            ));
        }
        let value_type = ValueType::new(&query.profile_type.name, &query.profile_type.unit);
        let plan = self.plan(query, None);
        let mut parts = self
            .fold_blocks(
                query,
                &plan.blocks,
                || TreeMerge::new(&value_type),
                block::read_dicts,
                |merge, _, dicts, rows| merge.add(&dicts, rows, query, max_nodes, &[]),
            )?
            .into_iter();
        let mut merge = parts.next().unwrap_or_else(|| TreeMerge::new(&value_type));
        for part in parts {
            merge.absorb(part);
        }
        if self.head_selected(query) {
            let rows = [self.head.record_batch()];
            let head = self.head.dicts();
            merge.add(head, &rows, query, max_nodes, &plan.downsampled)?;
        }
        Ok(merge.build(
            max_nodes,
            query.from,
            query.until.saturating_sub(query.from),
        ))
    }

    /// Totals per `step` from `query.from`: `(step start, total)` for a timeline.
    pub fn series(&self, query: &Query, step: Duration) -> Result<Vec<(i64, i64)>> {
        query.check()?;
        let step = nanos(step);
        if step <= 0 {
            return Err(StoreError::InvalidQuery("step must be positive".into()));
        }
        let span = (query.until as i128 - query.from as i128) as u128;
        let points = span.div_ceil(step as u128);
        if points > u128::from(MAX_SERIES_POINTS) {
            return Err(StoreError::InvalidQuery(format!(
                "{points} points asked for, at most {MAX_SERIES_POINTS}: use a larger step"
            )));
        }
        // Without sample matchers a timeline needs no dictionary at all.
        let matching = |label_sets: &[Vec<(String, LabelValue)>]| {
            let matches = |l: &Vec<_>| {
                if query.sample_labels_match(l) {
                    0
                } else {
                    SKIP
                }
            };
            (!query.sample_matchers.is_empty()).then(|| label_sets.iter().map(matches).collect())
        };
        let plan = self.plan(query, Some(step));
        let add = |totals: &mut Vec<i64>, series: &[Arc<Series>], labels, rows: &[_], excluded| {
            let selection = Selection::new(series, query, labels).excluding(excluded);
            query::add_timeline(totals, step, &selection, rows, query)
        };
        let parts = self.fold_blocks(
            query,
            &plan.blocks,
            || vec![0; points as usize],
            |info| match query.sample_matchers.is_empty() {
                true => Ok(None),
                false => block::read_dicts(info).map(|d| matching(&d.label_sets)),
            },
            |totals, info, labels, rows| add(totals, &info.meta.series, labels, rows, &[]),
        )?;
        let mut totals = vec![0i64; points as usize];
        for part in parts {
            for (total, t) in totals.iter_mut().zip(part) {
                *total = total.saturating_add(t);
            }
        }
        if self.head_selected(query) {
            let dicts = self.head.dicts();
            let labels = matching(&dicts.label_sets);
            add(
                &mut totals,
                &dicts.series,
                labels,
                &[self.head.record_batch()],
                &plan.downsampled,
            )?;
        }
        Ok(totals
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                (
                    query.from.saturating_add((i as i64).saturating_mul(step)),
                    t,
                )
            })
            .collect())
    }

    fn all_series(&self) -> impl Iterator<Item = &Series> {
        self.head
            .dicts()
            .series
            .iter()
            .chain(self.blocks.iter().flat_map(|b| b.meta.series.iter()))
            .map(|s| &**s)
    }

    /// Every series in the store, each once, in no particular order: what callers filter
    /// themselves (by profile type, labels) to list label sets or group a timeline.
    pub fn series_list(&self) -> Vec<Series> {
        let distinct: HashSet<&Series> = self.all_series().collect();
        distinct.into_iter().cloned().collect()
    }

    /// Series label names present in the store, sorted.
    pub fn label_names(&self) -> Vec<String> {
        let names: BTreeSet<&String> = self
            .all_series()
            .flat_map(|s| s.labels.iter().map(|(k, _)| k))
            .collect();
        names.into_iter().cloned().collect()
    }

    /// Values of one series label present in the store, sorted.
    pub fn label_values(&self, name: &str) -> Vec<String> {
        let values: BTreeSet<&String> = self
            .all_series()
            .flat_map(|s| s.labels.iter().filter(|(k, _)| k == name).map(|(_, v)| v))
            .collect();
        values.into_iter().cloned().collect()
    }

    /// Profile types present in the store, sorted.
    pub fn profile_types(&self) -> Vec<ProfileType> {
        let types: BTreeSet<&ProfileType> = self.all_series().map(|s| &s.profile_type).collect();
        types.into_iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests;
