//! Blocks on disk: one directory per block holding `meta.json` and four Parquet files.
//! See `store/FORMAT.md`.

use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int64Array, StringArray, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::metadata::RowGroupMetaData;
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{ChunkReader, Length};
use parquet::file::statistics::Statistics;
use parquet::schema::types::ColumnPath;
use serde::{Deserialize, Serialize};

use super::error::{corrupt, io, Result, StoreError};
use super::head::{Dicts, SampleColumns, StackNode, EMPTY_STACK, NO_PARENT};
use super::model::Series;
use profile::{Function, LabelValue};

/// Major version of blocks of full detail; a reader refuses majors it does not know.
pub const FORMAT_MAJOR: u32 = 1;
/// Minor version: additions older readers may ignore.
pub const FORMAT_MINOR: u32 = 1;
/// Major version of downsampled blocks (a level's): a reader of major 1 only would add their
/// rows to those of the blocks they were made from, so it must refuse them.
pub const FORMAT_MAJOR_DOWNSAMPLED: u32 = 2;
/// Value of [`BlockMeta::format`].
pub const FORMAT_NAME: &str = "clrscope-tsdb";

pub(crate) const META: &str = "meta.json";
pub(crate) const SAMPLES: &str = "samples.parquet";
pub(crate) const STACKS: &str = "stacks.parquet";
pub(crate) const FUNCTIONS: &str = "functions.parquet";
pub(crate) const LABELS: &str = "labels.parquet";
/// Suffix of a block directory still being written; such directories are removed on open.
pub(crate) const TEMP_SUFFIX: &str = ".tmp";

/// Row counts of a block's tables.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockRows {
    pub samples: u64,
    pub stacks: u64,
    pub functions: u64,
    pub label_sets: u64,
}

/// `meta.json`: enough to prune a block by time and series without opening its Parquet files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockMeta {
    pub format: String,
    pub format_major: u32,
    pub format_minor: u32,
    /// Oldest sample time, Unix nanoseconds, inclusive.
    pub min_time: i64,
    /// Newest sample time, Unix nanoseconds, inclusive.
    pub max_time: i64,
    /// Samples appended before merging equal stacks; `rows.samples` counts stored rows.
    pub samples_appended: u64,
    pub rows: BlockRows,
    /// Series ids in `samples.parquet` index this list. The store shares each series among
    /// the blocks that list it: a series lives in every block of every level it reached.
    pub series: Vec<Arc<Series>>,
    /// Names of blocks this one replaces (compaction); those are deleted on open if still there.
    #[serde(default)]
    pub compacted_from: Vec<String>,
    /// Of a downsampled block (format 2): its span and time resolution in nanoseconds; its
    /// samples are all at `min_time`, the span's start. 0 in a block of full detail.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resolution: i64,
    /// Of a downsampled block: the sample labels removed from its rows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped_labels: Vec<String>,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

impl BlockMeta {
    /// Start and end (exclusive) of the time the block stands for: a downsampled block's
    /// whole span, else its samples' range.
    pub fn span(&self) -> (i64, i64) {
        match self.resolution {
            0 => (self.min_time, self.max_time.saturating_add(1)),
            r => (self.min_time, self.min_time.saturating_add(r)),
        }
    }
}

fn read_meta(dir: &Path) -> Result<BlockMeta> {
    let path = dir.join(META);
    let text = fs::read(&path).map_err(|e| corrupt(&path, e))?;
    let value: serde_json::Value = serde_json::from_slice(&text).map_err(|e| corrupt(&path, e))?;
    let major = value.get("format_major").and_then(|v| v.as_u64());
    let name = value.get("format").and_then(|v| v.as_str());
    if name != Some(FORMAT_NAME) {
        return Err(corrupt(&path, format!("not a {FORMAT_NAME} block")));
    }
    if major != Some(u64::from(FORMAT_MAJOR)) && major != Some(u64::from(FORMAT_MAJOR_DOWNSAMPLED))
    {
        let minor = value.get("format_minor").and_then(|v| v.as_u64());
        return Err(StoreError::UnsupportedVersion {
            path,
            found: format!(
                "{}.{}",
                major.map_or("?".into(), |m| m.to_string()),
                minor.map_or("?".into(), |m| m.to_string())
            ),
            supported: FORMAT_MAJOR_DOWNSAMPLED,
        });
    }
    let meta: BlockMeta = serde_json::from_value(value).map_err(|e| corrupt(&path, e))?;
    if meta.min_time > meta.max_time {
        return Err(corrupt(&path, "min_time is after max_time"));
    }
    let downsampled = meta.format_major == FORMAT_MAJOR_DOWNSAMPLED;
    if downsampled != (meta.resolution > 0) || meta.resolution < 0 {
        return Err(corrupt(
            &path,
            "resolution must be positive in a format 2 block and absent in format 1",
        ));
    }
    if downsampled && meta.max_time != meta.min_time {
        return Err(corrupt(
            &path,
            "a downsampled block's samples are all at min_time",
        ));
    }
    Ok(meta)
}

/// A block found on disk whose metadata and Parquet footers check out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockInfo {
    /// Directory name, `<min_time>-<sequence>`.
    pub name: String,
    pub path: PathBuf,
    pub meta: BlockMeta,
    /// Bytes of all its files.
    pub bytes: u64,
}

/// Checks a block directory: its meta, and that every table's footer reads and agrees with it.
pub(crate) fn inspect(dir: &Path) -> Result<BlockInfo> {
    let meta = read_meta(dir)?;
    let mut bytes = 0;
    let expected = [
        (SAMPLES, Some(meta.rows.samples)),
        (STACKS, Some(meta.rows.stacks)),
        (FUNCTIONS, Some(meta.rows.functions)),
        // One row per label of a set, so not comparable with `rows.label_sets`.
        (LABELS, None),
    ];
    for (file, rows) in expected {
        let path = dir.join(file);
        let table = TableFile::for_metadata(&path)?;
        bytes += table.len();
        let builder = table.reader(&path)?;
        let found = builder.metadata().file_metadata().num_rows();
        if let Some(rows) = rows.filter(|&r| u64::try_from(found).ok() != Some(r)) {
            return Err(corrupt(
                &path,
                format!("{found} rows where meta.json says {rows}"),
            ));
        }
    }
    bytes += fs::metadata(dir.join(META))
        .map_err(io(dir.join(META)))?
        .len();
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(BlockInfo {
        name,
        path: dir.to_path_buf(),
        meta,
        bytes,
    })
}

/// Tables up to this size are read whole, once, when their rows are read.
const WHOLE_TABLE_BYTES: u64 = 4 << 20;

/// A Parquet file of a block, as the Parquet reader reads it. Its reader for a `File`
/// duplicates the descriptor, seeks and fills a new 8 KiB buffer for every page (thousands of
/// pages a block when every series had a row group), so reading flushed blocks back to compact
/// them cost more in system calls than in decoding. A table whose rows are read is read whole when
/// small (every block compaction and downsampling read); otherwise pages are read at their
/// offsets, each with one call.
enum TableFile {
    Whole(Bytes),
    Positioned { file: Arc<File>, len: u64 },
}

impl TableFile {
    /// For reading rows.
    fn for_rows(path: &Path) -> Result<TableFile> {
        let (file, len) = open_table(path)?;
        if len > WHOLE_TABLE_BYTES {
            return Ok(TableFile::Positioned { file, len });
        }
        let mut bytes = vec![0; len as usize];
        file.read_exact_at(&mut bytes, 0).map_err(io(path))?;
        Ok(TableFile::Whole(Bytes::from(bytes)))
    }

    /// For reading the footer (and what it describes) alone.
    fn for_metadata(path: &Path) -> Result<TableFile> {
        let (file, len) = open_table(path)?;
        Ok(TableFile::Positioned { file, len })
    }

    fn reader(self, path: &Path) -> Result<ParquetRecordBatchReaderBuilder<TableFile>> {
        ParquetRecordBatchReaderBuilder::try_new(self).map_err(|e| corrupt(path, e))
    }
}

impl Length for TableFile {
    fn len(&self) -> u64 {
        match self {
            TableFile::Whole(bytes) => bytes.len() as u64,
            TableFile::Positioned { len, .. } => *len,
        }
    }
}

impl ChunkReader for TableFile {
    type T = TableRead;

    fn get_read(&self, start: u64) -> parquet::errors::Result<TableRead> {
        match self {
            TableFile::Whole(bytes) => bytes.get_read(start).map(TableRead::Whole),
            TableFile::Positioned { file, len } => {
                if start > *len {
                    return Err(past_end(start, 0, *len));
                }
                Ok(TableRead::Positioned(BufReader::new(PositionedRead {
                    file: file.clone(),
                    at: start,
                })))
            }
        }
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        match self {
            TableFile::Whole(bytes) => bytes.get_bytes(start, length),
            TableFile::Positioned { file, len } => {
                // The length comes from the file's own metadata: checked before allocating.
                if start.saturating_add(length as u64) > *len {
                    return Err(past_end(start, length, *len));
                }
                let mut bytes = vec![0; length];
                file.read_exact_at(&mut bytes, start)?;
                Ok(Bytes::from(bytes))
            }
        }
    }
}

/// A table's file and its length.
fn open_table(path: &Path) -> Result<(Arc<File>, u64)> {
    let file = File::open(path).map_err(|e| corrupt(path, e))?;
    let len = file.metadata().map_err(io(path))?.len();
    Ok((Arc::new(file), len))
}

fn past_end(start: u64, length: usize, len: u64) -> ParquetError {
    ParquetError::EOF(format!(
        "{length} bytes at {start} reach past the end of the file ({len} bytes)"
    ))
}

/// A reader of [`TableFile`], from where the Parquet reader asked.
enum TableRead {
    Whole(bytes::buf::Reader<Bytes>),
    Positioned(BufReader<PositionedRead>),
}

impl Read for TableRead {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            TableRead::Whole(reader) => reader.read(buf),
            TableRead::Positioned(reader) => reader.read(buf),
        }
    }
}

/// Reads a file from a position onwards without moving the descriptor's offset.
struct PositionedRead {
    file: Arc<File>,
    at: u64,
}

impl Read for PositionedRead {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read_at(buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

fn read_table(path: &Path) -> Result<Vec<RecordBatch>> {
    read_row_groups(path, |_| true)
}

/// The rows of the row groups `keep` accepts.
fn read_row_groups(
    path: &Path,
    keep: impl Fn(&RowGroupMetaData) -> bool,
) -> Result<Vec<RecordBatch>> {
    let builder = TableFile::for_rows(path)?.reader(path)?;
    let groups = builder
        .metadata()
        .row_groups()
        .iter()
        .enumerate()
        .filter(|(_, g)| keep(g))
        .map(|(i, _)| i)
        .collect();
    let reader = builder
        .with_row_groups(groups)
        .with_batch_size(64 * 1024)
        .build()
        .map_err(|e| corrupt(path, e))?;
    reader
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| corrupt(path, e))
}

/// The range of series ids a row group of `samples.parquet` holds, from its statistics; `None`
/// when it has none, so it must be read.
fn series_range(group: &RowGroupMetaData) -> Option<(u32, u32)> {
    let column = group
        .columns()
        .iter()
        .find(|c| c.column_path().string() == "series")?;
    match column.statistics()? {
        // uint32 is stored as Parquet INT32: the bits are the same.
        Statistics::Int32(s) => Some((*s.min_opt()? as u32, *s.max_opt()? as u32)),
        _ => None,
    }
}

fn column<'a, T: Array + 'static>(
    batch: &'a RecordBatch,
    name: &str,
    path: &Path,
) -> Result<&'a T> {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<T>())
        .ok_or_else(|| corrupt(path, format!("column {name} missing or of the wrong type")))
}

/// Reads a block's dictionaries and validates every reference between them.
pub(crate) fn read_dicts(info: &BlockInfo) -> Result<Dicts> {
    let dir = &info.path;
    let mut dicts = Dicts {
        series: info.meta.series.clone(),
        ..Dicts::default()
    };
    let path = dir.join(FUNCTIONS);
    for batch in read_table(&path)? {
        let names = column::<StringArray>(&batch, "name", &path)?;
        let modules = column::<StringArray>(&batch, "module", &path)?;
        for i in 0..batch.num_rows() {
            dicts.functions.push(Function {
                name: names.value(i).to_string(),
                module: modules.value(i).to_string(),
            });
        }
    }
    let path = dir.join(STACKS);
    for batch in read_table(&path)? {
        let parents = column::<UInt32Array>(&batch, "parent", &path)?;
        let functions = column::<UInt32Array>(&batch, "function", &path)?;
        for i in 0..batch.num_rows() {
            let id = dicts.stacks.len();
            let node = StackNode {
                parent: parents.value(i),
                function: functions.value(i),
            };
            if (node.parent != NO_PARENT && node.parent as usize >= id)
                || node.function as usize >= dicts.functions.len()
            {
                return Err(corrupt(
                    &path,
                    format!("stack node {id} refers past its table"),
                ));
            }
            dicts.stacks.push(node);
        }
    }
    let path = dir.join(LABELS);
    let batches = read_table(&path)?;
    let label_rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let sets = usize::try_from(info.meta.rows.label_sets).unwrap_or(usize::MAX);
    // Only one set can be empty (they are interned), so each other set has a row: this bounds
    // what a damaged meta.json can make us allocate.
    if sets > label_rows + 1 {
        return Err(corrupt(
            &path,
            "fewer label rows than meta.json's label sets",
        ));
    }
    for batch in &batches {
        let set_ids = column::<UInt32Array>(batch, "set", &path)?;
        let keys = column::<StringArray>(batch, "key", &path)?;
        let strs = column::<StringArray>(batch, "str", &path)?;
        let nums = column::<Int64Array>(batch, "num", &path)?;
        for i in 0..batch.num_rows() {
            let set = set_ids.value(i) as usize;
            // Empty sets have no rows, so ids may skip; they never go backwards.
            if set >= sets || set + 1 < dicts.label_sets.len() {
                return Err(corrupt(&path, "label set ids are out of order or range"));
            }
            dicts
                .label_sets
                .resize(dicts.label_sets.len().max(set + 1), Vec::new());
            let value = if strs.is_valid(i) {
                LabelValue::Str(strs.value(i).to_string())
            } else if nums.is_valid(i) {
                LabelValue::Num(nums.value(i))
            } else {
                return Err(corrupt(
                    &path,
                    format!("label row {i} has neither str nor num"),
                ));
            };
            dicts.label_sets[set].push((keys.value(i).to_string(), value));
        }
    }
    dicts.label_sets.resize(sets, Vec::new());
    if dicts.functions.len() as u64 != info.meta.rows.functions
        || dicts.stacks.len() as u64 != info.meta.rows.stacks
        || dicts.label_sets.len() as u64 != info.meta.rows.label_sets
    {
        return Err(corrupt(dir, "dictionary sizes disagree with meta.json"));
    }
    Ok(dicts)
}

/// Sample rows of a block, every reference checked against the sizes `meta.json` gives its
/// tables (which [`read_dicts`] checks in turn): those of the series `wanted` accepts (by
/// `meta.json` index), and any others that share a row group with them.
pub(crate) fn read_samples(
    info: &BlockInfo,
    wanted: &dyn Fn(usize) -> bool,
) -> Result<Vec<RecordBatch>> {
    let rows = &info.meta.rows;
    let path = info.path.join(SAMPLES);
    let batches = read_row_groups(&path, |group| match series_range(group) {
        Some((min, max)) => (min..=max).any(|s| wanted(s as usize)),
        None => true,
    })?;
    for batch in &batches {
        let series = column::<UInt32Array>(batch, "series", &path)?;
        column::<Int64Array>(batch, "time", &path)?;
        let stacks = column::<UInt32Array>(batch, "stack", &path)?;
        let labels = column::<UInt32Array>(batch, "labels", &path)?;
        column::<Int64Array>(batch, "value", &path)?;
        let bad = series
            .values()
            .iter()
            .any(|&s| s as usize >= info.meta.series.len())
            || stacks
                .values()
                .iter()
                .any(|&s| s != EMPTY_STACK && u64::from(s) >= rows.stacks)
            || labels
                .values()
                .iter()
                .any(|&l| u64::from(l) >= rows.label_sets);
        if bad || batch.columns().iter().any(|c| c.null_count() > 0) {
            return Err(corrupt(&path, "a sample row refers past a dictionary"));
        }
    }
    Ok(batches)
}

/// Sample rows per series of a block (by `meta.json` index), from its row groups' metadata
/// alone: a row group that holds several series spreads its rows evenly over them (rounded up),
/// or over every series when it has no statistics. An estimate for sizing reads: a group shared
/// by several series holds at most [`SHARED_ROW_GROUP_ROWS`] rows (but in blocks of format 1.0,
/// one group for all).
pub(crate) fn rows_per_series(info: &BlockInfo) -> Result<Vec<u64>> {
    let path = info.path.join(SAMPLES);
    let builder = TableFile::for_metadata(&path)?.reader(&path)?;
    let mut rows = vec![0u64; info.meta.series.len()];
    for group in builder.metadata().row_groups() {
        let (min, max) = series_range(group).unwrap_or((0, u32::MAX));
        let spanned = rows
            .iter_mut()
            .take((max as usize).saturating_add(1))
            .skip(min as usize);
        let n = u64::try_from(group.num_rows()).unwrap_or(0);
        let share = n.div_ceil(spanned.len().max(1) as u64);
        for count in spanned {
            *count += share;
        }
    }
    Ok(rows)
}

/// Creates a file only this user can read, as profiles name code and carry trace ids.
fn create_private(path: &Path) -> Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io(path))
}

/// Codec of a flushed block: it lives until its minute is compacted, so writing and reading it
/// cheaply matters more than its size. Parquet makes a zstd compression and a decompression
/// context for every column chunk it writes or reads, and making them took a fifth of a node
/// agent's CPU when each series had a row group of its own; Snappy keeps no context.
const FLUSHED_CODEC: Compression = Compression::SNAPPY;

/// zstd level of a compacted block, written once per minute and kept for days. Parquet starts a
/// new zstd stream for every page it compresses, and a stream's tables grow with the level: level
/// 15's take ~65 MB more than level 3's and are cleared for each page, which put a node agent of
/// 110 processes at 650 MiB of RSS and a fifth of its CPU in compaction; level 9's take ~11 MB
/// more, for nearly the same bytes (BENCHMARKS.md, "A full node").
const COMPACTED_ZSTD_LEVEL: i32 = 9;

/// Columns written without a dictionary, in their own encoding (`None`: plain); every other
/// column goes through a dictionary.
const COLUMN_ENCODINGS: [(&str, Option<Encoding>); 6] = [
    // Integers that ascend in small steps (sorted times and stack ids, breadth-first parents) or
    // run along chains of new nodes: deltas are near zero.
    ("parent", Some(Encoding::DELTA_BINARY_PACKED)),
    ("function", Some(Encoding::DELTA_BINARY_PACKED)),
    ("time", Some(Encoding::DELTA_BINARY_PACKED)),
    ("stack", Some(Encoding::DELTA_BINARY_PACKED)),
    // Values that rarely repeat within a block (every function's name is there once): a
    // dictionary only adds to them.
    ("name", None),
    // A sample's label set is one of a few hundred, in no order, so its high bytes are zero runs
    // that zstd takes for nearly nothing; 9 % smaller than through a dictionary in a busy
    // service's compacted minute (BENCHMARKS.md, "Store").
    ("labels", Some(Encoding::BYTE_STREAM_SPLIT)),
];

/// Writes a table, each of `groups` as row groups of its own (split further past 2^20 rows).
fn write_table(
    dir: &Path,
    file: &str,
    schema: SchemaRef,
    groups: &[RecordBatch],
    codec: Compression,
) -> Result<()> {
    let path = dir.join(file);
    let f = create_private(&path)?;
    let mut props = WriterProperties::builder()
        .set_compression(codec)
        .set_max_row_group_row_count(Some(1 << 20));
    for (name, encoding) in COLUMN_ENCODINGS {
        if schema.column_with_name(name).is_some() {
            let col = ColumnPath::from(name);
            props = props.set_column_dictionary_enabled(col.clone(), false);
            if let Some(encoding) = encoding {
                props = props.set_column_encoding(col, encoding);
            }
        }
    }
    let props = props.build();
    let parquet_err = |source| StoreError::Parquet {
        path: path.clone(),
        source,
    };
    let mut writer = ArrowWriter::try_new(f, schema, Some(props)).map_err(parquet_err)?;
    for group in groups {
        writer.write(group).map_err(parquet_err)?;
        writer.flush().map_err(parquet_err)?;
    }
    let f = writer.into_inner().map_err(parquet_err)?;
    f.sync_all().map_err(io(&path))
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// Writes a block atomically: into `<name>.tmp`, fsynced, then renamed to `<name>`.
pub(crate) fn write(
    root: &Path,
    name: &str,
    dicts: &Dicts,
    samples: RecordBatch,
    meta: &BlockMeta,
) -> Result<BlockInfo> {
    let codec = if meta.compacted_from.is_empty() && meta.resolution == 0 {
        FLUSHED_CODEC
    } else {
        Compression::ZSTD(ZstdLevel::try_new(COMPACTED_ZSTD_LEVEL).unwrap_or_default())
    };
    let tmp = root.join(format!("{name}{TEMP_SUFFIX}"));
    let dir = root.join(name);
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&tmp)
        .map_err(io(&tmp))?;
    write_table(&tmp, SAMPLES, samples.schema(), &by_series(&samples), codec)?;
    for (file, table) in [
        (FUNCTIONS, functions_batch(dicts)),
        (STACKS, stacks_batch(dicts)),
        (LABELS, labels_batch(dicts)),
    ] {
        write_table(&tmp, file, table.schema(), &[table], codec)?;
    }
    let path = tmp.join(META);
    let mut f = create_private(&path)?;
    let json = serde_json::to_vec_pretty(meta).expect("block meta serializes");
    f.write_all(&json)
        .and_then(|()| f.sync_all())
        .map_err(io(&path))?;
    sync_dir(&tmp)?;
    fs::rename(&tmp, &dir).map_err(io(&dir))?;
    sync_dir(root)?;
    inspect(&dir)
}

/// Rows up to which consecutive series share a row group: a node's minute holds hundreds of
/// series of a few dozen rows each, and Parquet makes a zstd compression and a decompression
/// context for every column chunk it writes or reads (measured: a sixth of a node agent's CPU
/// with a row group per series, BENCHMARKS.md, "Fewer row groups"). A query of one series reads
/// at most this many rows of its neighbours.
const SHARED_ROW_GROUP_ROWS: usize = 1 << 14;

/// Sample rows cut where the series changes, so that queries of other series skip a group by its
/// statistics: sorted rows give a row group to each series of [`SHARED_ROW_GROUP_ROWS`] rows or
/// more, and pack the smaller ones between them into groups of at most that many rows.
fn by_series(samples: &RecordBatch) -> Vec<RecordBatch> {
    let series = SampleColumns::of(samples).map_or(&[][..], |c| c.series.values());
    let mut groups = Vec::new();
    // The group being packed: `len` rows from `start`.
    let (mut start, mut len) = (0, 0);
    for run in series.chunk_by(|a, b| a == b) {
        if len > 0 && len + run.len() > SHARED_ROW_GROUP_ROWS {
            groups.push(samples.slice(start, len));
            (start, len) = (start + len, 0);
        }
        len += run.len();
        if len >= SHARED_ROW_GROUP_ROWS {
            groups.push(samples.slice(start, len));
            (start, len) = (start + len, 0);
        }
    }
    if len > 0 {
        groups.push(samples.slice(start, len));
    }
    groups
}

fn batch(fields: Vec<Field>, columns: Vec<ArrayRef>) -> RecordBatch {
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .expect("dictionary columns match their schema")
}

fn functions_batch(dicts: &Dicts) -> RecordBatch {
    let names: StringArray = dicts
        .functions
        .iter()
        .map(|f| Some(f.name.as_str()))
        .collect();
    let modules: StringArray = dicts
        .functions
        .iter()
        .map(|f| Some(f.module.as_str()))
        .collect();
    batch(
        vec![
            Field::new("name", DataType::Utf8, false),
            Field::new("module", DataType::Utf8, false),
        ],
        vec![Arc::new(names), Arc::new(modules)],
    )
}

fn stacks_batch(dicts: &Dicts) -> RecordBatch {
    let parents: UInt32Array = dicts.stacks.iter().map(|n| n.parent).collect();
    let functions: UInt32Array = dicts.stacks.iter().map(|n| n.function).collect();
    batch(
        vec![
            Field::new("parent", DataType::UInt32, false),
            Field::new("function", DataType::UInt32, false),
        ],
        vec![Arc::new(parents), Arc::new(functions)],
    )
}

fn labels_batch(dicts: &Dicts) -> RecordBatch {
    let rows = || {
        dicts
            .label_sets
            .iter()
            .enumerate()
            .flat_map(|(set, labels)| labels.iter().map(move |l| (set as u32, l)))
    };
    let sets: UInt32Array = rows().map(|(s, _)| s).collect();
    let keys: StringArray = rows().map(|(_, (k, _))| Some(k.as_str())).collect();
    let strs: StringArray = rows()
        .map(|(_, (_, v))| match v {
            LabelValue::Str(s) => Some(s.as_str()),
            LabelValue::Num(_) => None,
        })
        .collect();
    let nums: Int64Array = rows()
        .map(|(_, (_, v))| match v {
            LabelValue::Num(n) => Some(*n),
            LabelValue::Str(_) => None,
        })
        .collect();
    batch(
        vec![
            Field::new("set", DataType::UInt32, false),
            Field::new("key", DataType::Utf8, false),
            Field::new("str", DataType::Utf8, true),
            Field::new("num", DataType::Int64, true),
        ],
        vec![
            Arc::new(sets),
            Arc::new(keys),
            Arc::new(strs),
            Arc::new(nums),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table reads back the same rows whether it is read whole or at offsets, and an offset
    /// or length past its end is refused before anything is allocated.
    #[test]
    fn tables_read_the_same_whole_or_at_offsets() {
        let dir = std::env::temp_dir().join(format!("clrscope-block-read-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("stack", DataType::UInt32, false),
            Field::new("name", DataType::Utf8, false),
        ]));
        // A row group per batch, as blocks have one per large series.
        let groups: Vec<RecordBatch> = (0..50u32)
            .map(|g| {
                let columns: Vec<ArrayRef> = vec![
                    Arc::new(UInt32Array::from_iter_values(g * 100..g * 100 + 100)),
                    Arc::new(StringArray::from_iter_values(
                        (0..100).map(|i| format!("Group{g}.Method{i}")),
                    )),
                ];
                RecordBatch::try_new(schema.clone(), columns).unwrap()
            })
            .collect();
        write_table(&dir, "t.parquet", schema, &groups, Compression::SNAPPY).unwrap();
        let path = dir.join("t.parquet");

        let whole = TableFile::for_rows(&path).unwrap();
        assert!(
            matches!(whole, TableFile::Whole(_)),
            "a small table is read whole"
        );
        let positioned = TableFile::for_metadata(&path).unwrap();
        assert!(matches!(positioned, TableFile::Positioned { .. }));
        let len = fs::metadata(&path).unwrap().len();
        assert_eq!((whole.len(), positioned.len()), (len, len));
        for table in [&whole, &positioned] {
            assert!(table.get_bytes(len - 1, 2).is_err());
            assert!(table.get_bytes(0, usize::MAX).is_err());
            assert!(table.get_read(len + 1).is_err());
        }
        let rows = |table: TableFile| -> Vec<RecordBatch> {
            let builder = table.reader(&path).unwrap();
            assert_eq!(builder.metadata().num_row_groups(), groups.len());
            let batches: Vec<RecordBatch> = builder
                .with_batch_size(100)
                .build()
                .unwrap()
                .collect::<std::result::Result<_, _>>()
                .unwrap();
            batches
        };
        assert_eq!(rows(whole), groups);
        assert_eq!(rows(positioned), groups);
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Series of [`SHARED_ROW_GROUP_ROWS`] rows or more get a row group each; smaller ones
    /// between them share groups of at most that many rows; no series is split.
    #[test]
    fn small_series_share_row_groups_and_large_ones_have_their_own() {
        const T: usize = SHARED_ROW_GROUP_ROWS;
        let sizes = [10, 10, T + 1, 5, T - 3, 3, 2];
        let mut head = super::super::head::Head::new();
        let mut time = 0;
        for (series, &rows) in sizes.iter().enumerate() {
            for _ in 0..rows {
                head.push_row(series as u32, time, 0, 0, 1);
                time += 1;
            }
        }
        let samples = head.record_batch();
        let groups = by_series(&samples);
        let lens: Vec<usize> = groups.iter().map(RecordBatch::num_rows).collect();
        assert_eq!(lens, [20, T + 1, 5, T, 2]);
        let mut seen = Vec::new();
        for group in &groups {
            let series = SampleColumns::of(group).unwrap().series.values().to_vec();
            let mut distinct = series.clone();
            distinct.dedup();
            assert!(distinct.len() == 1 || series.len() <= T, "{distinct:?}");
            seen.extend(distinct);
        }
        assert_eq!(
            seen,
            (0..sizes.len() as u32).collect::<Vec<_>>(),
            "no series split"
        );
        assert!(by_series(&super::super::head::Head::new().record_batch()).is_empty());
    }

    /// Each column is written in the encoding [`COLUMN_ENCODINGS`] gives it, as the file's own
    /// metadata says; other columns through a dictionary.
    #[test]
    fn columns_are_written_in_their_encodings() {
        let dir = std::env::temp_dir().join(format!("clrscope-block-enc-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let rows = 1000u32;
        let schema = Arc::new(Schema::new(vec![
            Field::new("stack", DataType::UInt32, false),
            Field::new("labels", DataType::UInt32, false),
            Field::new("name", DataType::Utf8, false),
            Field::new("value", DataType::Int64, false),
        ]));
        let columns: Vec<ArrayRef> = vec![
            Arc::new(UInt32Array::from_iter_values(0..rows)),
            Arc::new(UInt32Array::from_iter_values(
                (0..rows).map(|i| i * 7 % 300),
            )),
            Arc::new(StringArray::from_iter_values(
                (0..rows).map(|i| format!("Method{i}")),
            )),
            Arc::new(Int64Array::from_iter_values(
                (0..rows).map(|i| i64::from(i % 5)),
            )),
        ];
        let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
        write_table(&dir, "t.parquet", schema, &[batch], Compression::SNAPPY).unwrap();

        let file = File::open(dir.join("t.parquet")).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
        let group = reader.metadata().row_group(0);
        let encodings = |name: &str| {
            let column = group
                .columns()
                .iter()
                .find(|c| c.column_path().string() == name)
                .unwrap();
            column.encodings().collect::<Vec<Encoding>>()
        };
        let dictionary = |e: &Vec<Encoding>| {
            e.contains(&Encoding::RLE_DICTIONARY) || e.contains(&Encoding::PLAIN_DICTIONARY)
        };
        let stack = encodings("stack");
        assert!(
            stack.contains(&Encoding::DELTA_BINARY_PACKED) && !dictionary(&stack),
            "{stack:?}"
        );
        let labels = encodings("labels");
        assert!(
            labels.contains(&Encoding::BYTE_STREAM_SPLIT) && !dictionary(&labels),
            "{labels:?}"
        );
        let name = encodings("name");
        assert!(
            name.contains(&Encoding::PLAIN) && !dictionary(&name),
            "{name:?}"
        );
        let value = encodings("value");
        assert!(dictionary(&value), "{value:?}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
