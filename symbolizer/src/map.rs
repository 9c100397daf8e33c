//! The per-process code map: address → code version → function.
//!
//! Addresses are kept as disjoint segments in a `BTreeMap` keyed by start address, each owned by one
//! code version. A new code version takes every part of its range owned by an *older* one ("older"
//! = smaller `(timestamp, arrival)`), so reused code-heap memory resolves to the newest code while
//! an out-of-order event (a rundown from another session processed late) cannot hide newer code.
//! Unloading only marks a code version: samples taken before the unload still resolve, until the
//! memory is reused or [`CodeMap::prune_unloaded`] drops it.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use hashbrown::hash_table::{Entry, HashTable};

use crate::error::EventError;
use crate::events::{
    LoadSource, MethodFlags, MethodLoad, MethodUnload, ModuleFlags, ModuleLoad, ModuleUnload,
    OptimizationTier, PdbInfo, R2rEntryPoint,
};
use crate::images::{file_name, ImageRange};
use crate::method_names::{self, MethodNames};
use crate::r2r::ImageMethods;

/// Largest code size accepted for one method. RyuJIT methods stay far below; a larger value is a
/// corrupt event that would otherwise shadow everything it overlaps.
pub const MAX_METHOD_SIZE: u32 = 16 << 20;

/// How far past an entry point (ReadyToRun, or a load with size 0) an address is still attributed
/// to it when nothing closer is known.
pub const MAX_INFERRED_EXTENT: u64 = 64 << 10;

/// Index of a [`CodeMapFunction`] in one [`CodeMap`]. Dense from 0, never reused, valid only with
/// the map that returned it; for anything that outlives the process use
/// [`CodeMapFunction::key`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FunctionId(u32);

impl FunctionId {
    /// The function of addresses nothing is known about.
    pub const UNRESOLVED: FunctionId = FunctionId(0);

    /// The position in [`CodeMap::functions`].
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A content hash of a function's identity: FNV-1a over the runtime's namespace, name and
/// signature strings (or the image file name for an image pseudo-function). Equal across code
/// versions, method-id reuse, processes and restarts, so the store can deduplicate with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FunctionKey(pub u64);

impl FunctionKey {
    fn hash(tag: u8, parts: &[&[u8]]) -> Self {
        const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let mut hash = OFFSET;
        let mut feed = |byte: u8| {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(PRIME);
        };
        feed(tag);
        for part in parts {
            for &byte in *part {
                feed(byte);
            }
            // 0xff never occurs in UTF-8, so parts cannot run into each other.
            feed(0xff);
        }
        FunctionKey(hash)
    }
}

/// What a [`CodeMapFunction`] stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FunctionKind {
    /// A managed method with metadata.
    Method,
    /// An LCG method or IL stub (`MethodFlags` dynamic; namespace `dynamicClass`).
    DynamicMethod,
    /// A JIT helper (`MethodFlags` JitHelper).
    JitHelper,
    /// A mapped file whose code at the address is not known method by method.
    Image,
    /// Nothing is known about the address.
    Unresolved,
}

/// A function as the code map knows it: the runtime's ids and raw strings, shared by all code
/// versions of one method. A profile names it with a [`profile::Function`] (display name and
/// module) made from this one.
#[derive(Clone, Debug)]
pub struct CodeMapFunction {
    /// Stable identity for deduplication across processes.
    pub key: FunctionKey,
    /// Method, dynamic method, helper, image or unresolved.
    pub kind: FunctionKind,
    /// The runtime's `ModuleID` (0 when unknown, for helpers and images).
    pub module_id: u64,
    /// The module's file name (`System.Linq.dll`); empty until the module's load event arrives
    /// (rundown sends methods before modules, so the name is filled in when it does).
    pub module: Arc<str>,
    /// The `MethodID` of the first code version seen.
    pub method_id: u64,
    /// `MethodDef` token (0 for dynamic methods, helpers, R2R entry points).
    pub token: u32,
    /// `MethodFlags` without tier and extent.
    pub flags: MethodFlags,
    /// The raw strings and the display name, shared with every code map of the program that
    /// knows the same method (the framework's code is the same in every process).
    names: Arc<MethodNames>,
}

impl CodeMapFunction {
    /// Raw `MethodNamespace`.
    pub fn namespace(&self) -> &str {
        self.names.namespace()
    }

    /// Raw `MethodName`.
    pub fn name(&self) -> &str {
        self.names.name()
    }

    /// Raw `MethodSignature`.
    pub fn signature(&self) -> &str {
        self.names.signature()
    }

    /// The names, shared with other code maps that know the same method.
    pub fn names(&self) -> &Arc<MethodNames> {
        &self.names
    }

    /// The C#-like name, see the crate documentation.
    pub fn display_name(&self) -> &str {
        self.names.display()
    }

    /// `module!display_name`, PerfView style; just the display name when the module is unknown.
    pub fn qualified_name(&self) -> String {
        if self.module.is_empty() {
            self.display_name().to_string()
        } else {
            format!("{}!{}", self.module, self.display_name())
        }
    }
}

/// How an address was resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// Inside managed code of the frame's function.
    Managed {
        /// The code version's tier.
        tier: OptimizationTier,
        /// The method's size was not reported (R2R entry point, size 0): the extent was inferred
        /// from the next known code, so the attribution is a best guess.
        inferred_extent: bool,
    },
    /// Inside a mapped image, but no method there is known; the frame's function is the image.
    Unknown {
        /// Offset from the image start.
        offset: u64,
        /// The image is a ReadyToRun module: a rundown would likely name this code.
        in_r2r_image: bool,
    },
    /// Inside precompiled code no event named, named from the image's own tables
    /// ([`crate::ImageMethods`]); the frame's function is the image.
    ImageMethod {
        /// The method's entry address: names it through [`CodeMap::image_method_name`].
        entry: u64,
    },
    /// Nothing is known; the frame's function is [`FunctionId::UNRESOLVED`].
    Unresolved,
}

/// One symbolized address: small and `Copy`, so stacks cost no allocation per frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// The function; look it up with [`CodeMap::function`].
    pub function: FunctionId,
    /// How the address was resolved.
    pub kind: FrameKind,
}

/// A module as its load event described it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    /// `ModuleID`.
    pub module_id: u64,
    /// `AssemblyID`.
    pub assembly_id: u64,
    /// `ModuleFlags`.
    pub flags: ModuleFlags,
    /// `ModuleILPath`.
    pub il_path: String,
    /// `ModuleNativePath`.
    pub native_path: String,
    /// File name shown in frames.
    pub file_name: Arc<str>,
    /// Managed PDB identity, if reported.
    pub managed_pdb: Option<PdbInfo>,
    /// A `ModuleUnload` arrived; kept so functions of the module keep their name.
    pub unloaded: bool,
}

/// Counters for `/metrics` and debugging.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodeMapStats {
    /// Interned functions, pseudo-functions included.
    pub functions: usize,
    /// Code versions that own at least one segment.
    pub code_versions: usize,
    /// Code versions unloaded but still resolvable.
    pub unloaded_code_versions: usize,
    /// Disjoint address segments.
    pub segments: usize,
    /// Entry points with inferred extent.
    pub entry_points: usize,
    /// Modules seen.
    pub modules: usize,
    /// Mapped images.
    pub images: usize,
    /// Method loads applied from the runtime provider.
    pub live_loads: u64,
    /// Method loads applied from the rundown provider.
    pub rundown_loads: u64,
    /// Events refused with an [`EventError`].
    pub refused: u64,
}

/// Orders code versions: later timestamp wins, arrival order breaks ties.
type Rank = (u64, u64);

/// `(method_id, start, rejit_id)`: how load and unload events name a code version.
type CodeIdentity = (u64, u64, u64);

/// One code version, in 64 bytes: a node agent keeps a few thousand per process it follows.
#[derive(Clone, Debug)]
struct CodeVersion {
    function: FunctionId,
    /// How many segments it owns; a version that owns none is freed.
    segments: u32,
    method_id: u64,
    start: u64,
    rejit_id: u64,
    rank: Rank,
    /// When an unload event named it, or [`NOT_UNLOADED`].
    unloaded_at: u64,
    /// At most [`MAX_METHOD_SIZE`], checked before a version is made.
    size: u32,
    tier: OptimizationTier,
}

/// [`CodeVersion::unloaded_at`] of a version no unload named (an unload stamped with this very
/// value is kept as one tick earlier).
const NOT_UNLOADED: u64 = u64::MAX;

impl CodeVersion {
    fn identity(&self) -> CodeIdentity {
        (self.method_id, self.start, self.rejit_id)
    }

    fn end(&self) -> u64 {
        self.start.saturating_add(u64::from(self.size))
    }

    fn unloaded(&self) -> Option<u64> {
        (self.unloaded_at != NOT_UNLOADED).then_some(self.unloaded_at)
    }
}

/// The live code version in slot `c`, if any.
fn code_in(codes: &[Option<CodeVersion>], c: u32) -> Option<&CodeVersion> {
    codes.get(c as usize).and_then(Option::as_ref)
}

/// Pushes, growing by an eighth rather than doubling: the code tables grow for as long as a
/// process runs (tiering, late loads), and doubling would leave up to half of each one empty in
/// every process a node agent follows.
fn push_compact<T>(items: &mut Vec<T>, item: T) {
    if items.len() == items.capacity() {
        items.reserve_exact(items.len() / 8 + 16);
    }
    items.push(item);
}

/// Addresses `[start, start + len)` of code version `code`, filed under `start`. A segment lies
/// within its code version, so its length fits the 32 bits of a method's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Segment {
    len: u32,
    code: u32,
}

impl Segment {
    fn new(start: u64, end: u64, code: u32) -> Segment {
        debug_assert!(end - start <= u64::from(MAX_METHOD_SIZE));
        Segment {
            len: u32::try_from(end.saturating_sub(start)).unwrap_or(MAX_METHOD_SIZE),
            code,
        }
    }

    fn end(&self, start: u64) -> u64 {
        start.saturating_add(u64::from(self.len))
    }
}

/// What a lookup needs from a segment, flattened so one probe answers it.
#[derive(Clone, Copy, Debug)]
struct Slot {
    end: u64,
    function: FunctionId,
    tier: OptimizationTier,
}

/// The segments as two sorted arrays: binary search touches only the dense `starts`.
#[derive(Debug, Default)]
struct FlatIndex {
    starts: Vec<u64>,
    slots: Vec<Slot>,
}

impl FlatIndex {
    fn lookup(&self, ip: u64) -> Option<Slot> {
        let after = self.starts.partition_point(|&start| start <= ip);
        let slot = *self.slots.get(after.checked_sub(1)?)?;
        (ip < slot.end).then_some(slot)
    }
}

#[derive(Clone, Copy, Debug)]
struct EntryPoint {
    function: FunctionId,
    tier: OptimizationTier,
    rank: Rank,
    /// `(method_id, rejit_id)`, so an unload can find it.
    method: (u64, u64),
}

#[derive(Clone, Debug)]
struct Image {
    start: u64,
    end: u64,
    path: String,
    function: FunctionId,
    module_id: Option<u64>,
    methods: Option<Arc<ImageMethods>>,
}

/// The code map of one process. Feed it events in stream order, then symbolize.
///
/// Lookups take `&self` and may run from several threads. They go through a flat sorted index
/// (about 5× faster than walking the tree, see BENCHMARKS.md) that a change to the code invalidates and
/// the lookups rebuild: after a change, lookups use the tree until they have paid for a rebuild
/// (one per ~n/8 lookups), so interleaved loads and samples never rebuild on every sample.
#[derive(Debug)]
pub struct CodeMap {
    functions: Vec<CodeMapFunction>,
    /// Functions by `(module_id, key)`, to share one function among code versions. The tables
    /// hold bare indexes and hash what they point at: a few bytes per entry, not a key's 24.
    interned: HashTable<FunctionId>,
    /// Latest function seen per `MethodID` (finds the module of an R2R entry point).
    by_method: HashMap<u64, FunctionId>,
    /// Functions created before their module's load event.
    awaiting_module: HashMap<u64, Vec<FunctionId>>,
    codes: Vec<Option<CodeVersion>>,
    free_codes: Vec<u32>,
    /// Code versions by [`CodeIdentity`].
    code_index: HashTable<u32>,
    /// Seeded per map, so a target cannot choose colliding identities.
    hasher: RandomState,
    segments: BTreeMap<u64, Segment>,
    entries: BTreeMap<u64, EntryPoint>,
    modules: HashMap<u64, Module>,
    module_by_path: HashMap<String, u64>,
    images: Vec<Image>,
    next_seq: u64,
    stats: CodeMapStats,
    index: OnceLock<FlatIndex>,
    lookups_since_change: AtomicU64,
}

impl Default for CodeMap {
    fn default() -> Self {
        Self::new()
    }
}

impl CodeMap {
    /// An empty map; [`FunctionId::UNRESOLVED`] is its first function.
    pub fn new() -> Self {
        let unresolved = CodeMapFunction {
            key: FunctionKey::hash(b'u', &[]),
            kind: FunctionKind::Unresolved,
            module_id: 0,
            module: Arc::from(""),
            method_id: 0,
            token: 0,
            flags: MethodFlags::default(),
            names: MethodNames::labelled("[unknown]".to_string()),
        };
        Self {
            functions: vec![unresolved],
            interned: HashTable::new(),
            by_method: HashMap::new(),
            awaiting_module: HashMap::new(),
            codes: Vec::new(),
            free_codes: Vec::new(),
            code_index: HashTable::new(),
            hasher: RandomState::new(),
            segments: BTreeMap::new(),
            entries: BTreeMap::new(),
            modules: HashMap::new(),
            module_by_path: HashMap::new(),
            images: Vec::new(),
            next_seq: 0,
            stats: CodeMapStats::default(),
            index: OnceLock::new(),
            lookups_since_change: AtomicU64::new(0),
        }
    }

    // ----- lookups -------------------------------------------------------------------------

    /// Resolves one address. Never fails: unknown addresses become [`FrameKind::Unknown`] (inside a
    /// mapped image) or [`FrameKind::Unresolved`].
    pub fn symbolize(&self, ip: u64) -> Frame {
        if let Some(slot) = self.code_at(ip) {
            return Frame {
                function: slot.function,
                kind: FrameKind::Managed {
                    tier: slot.tier,
                    inferred_extent: false,
                },
            };
        }
        if let Some(frame) = self.symbolize_entry(ip) {
            return frame;
        }
        if let Some(image) = self.image_at(ip) {
            let offset = ip - image.start;
            if let Some((entry, _)) = image.methods.as_ref().and_then(|m| m.method_at(offset)) {
                return Frame {
                    function: image.function,
                    kind: FrameKind::ImageMethod {
                        entry: image.start + u64::from(entry),
                    },
                };
            }
            return Frame {
                function: image.function,
                kind: FrameKind::Unknown {
                    offset,
                    in_r2r_image: self.image_is_r2r(image),
                },
            };
        }
        Frame {
            function: FunctionId::UNRESOLVED,
            kind: FrameKind::Unresolved,
        }
    }

    /// Resolves a stack, innermost frame first, into `out` (cleared first), reusing its allocation.
    ///
    /// Every frame but the first holds a return address, which can point just past the end of
    /// the calling method; those are looked up at `ip - 1`, inside the call instruction.
    ///
    /// Leaf frames of the runtime's GC poll (see [`CodeMap::is_gc_poll`]) are left out: they are
    /// where the sampler stopped the thread, not what it was doing.
    pub fn symbolize_stack_into(&self, ips: &[u64], out: &mut Vec<Frame>) {
        out.clear();
        out.reserve(ips.len());
        let mut at_leaf = true;
        for (i, &ip) in ips.iter().enumerate() {
            let ip = if i == 0 { ip } else { ip.saturating_sub(1) };
            let frame = self.symbolize(ip);
            at_leaf = at_leaf && self.is_gc_poll(frame);
            if !at_leaf {
                out.push(frame);
            }
        }
    }

    /// A throw's stack (`ips`, innermost first) from the method that threw: since .NET 9
    /// exceptions are dispatched in managed code (`System.Runtime.EH`), so the runtime's event
    /// stacks start there, inside the runtime (`docs/runtimes.md`). The frames of the dispatch are
    /// left out; the first frame kept, a return address, becomes an exact address inside its call.
    pub fn throw_site(&self, ips: &[u64]) -> Vec<u64> {
        const EH: &str = "System.Runtime.EH.";
        let dispatch = ips
            .iter()
            .enumerate()
            .take_while(|&(i, &ip)| {
                let ip = if i == 0 { ip } else { ip.saturating_sub(1) };
                self.method_name(self.symbolize(ip))
                    .is_some_and(|name| name.starts_with(EH))
            })
            .count();
        let mut site = ips[dispatch..].to_vec();
        if dispatch > 0 {
            if let Some(first) = site.first_mut() {
                *first = first.saturating_sub(1);
            }
        }
        site
    }

    /// Whether `frame` is the managed GC poll that .NET 9 and later call from loops
    /// (`Thread.PollGC` and its worker): a thread the sampler suspends while it runs a loop stops
    /// there, so on those runtimes most samples of a busy loop end in it. Its caller is what the
    /// thread was doing (`docs/runtimes.md`).
    pub fn is_gc_poll(&self, frame: Frame) -> bool {
        const THREAD: &str = "System.Threading.Thread.";
        self.method_name(frame)
            .and_then(|name| name.strip_prefix(THREAD))
            .is_some_and(|name| {
                name == "PollGC"
                    || name.starts_with("PollGC(")
                    || name.starts_with("<PollGC>g__PollGCWorker|")
            })
    }

    /// Like [`CodeMap::symbolize_stack_into`], into a new vector.
    pub fn symbolize_stack(&self, ips: &[u64]) -> Vec<Frame> {
        let mut out = Vec::with_capacity(ips.len());
        self.symbolize_stack_into(ips, &mut out);
        out
    }

    /// The function behind a frame. An id this map never returned (out of range) yields the
    /// unresolved function rather than a panic.
    pub fn function(&self, id: FunctionId) -> &CodeMapFunction {
        self.functions
            .get(id.index())
            .unwrap_or_else(|| &self.functions[FunctionId::UNRESOLVED.index()])
    }

    /// All functions, indexed by [`FunctionId::index`].
    pub fn functions(&self) -> &[CodeMapFunction] {
        &self.functions
    }

    /// A module by `ModuleID`.
    pub fn module(&self, module_id: u64) -> Option<&Module> {
        self.modules.get(&module_id)
    }

    /// The name of the precompiled method at `entry` of a [`FrameKind::ImageMethod`] frame.
    pub fn image_method_name(&self, entry: u64) -> Option<&str> {
        let image = self.image_at(entry)?;
        let (_, name) = image.methods.as_ref()?.method_at(entry - image.start)?;
        Some(name)
    }

    /// The C#-like name of a frame in a known method (see the crate documentation); `None` for
    /// frames in no known method.
    pub fn method_name(&self, frame: Frame) -> Option<&str> {
        match frame.kind {
            FrameKind::Managed { .. } => Some(self.function(frame.function).display_name()),
            FrameKind::ImageMethod { entry } => self.image_method_name(entry),
            FrameKind::Unknown { .. } | FrameKind::Unresolved => None,
        }
    }

    /// A frame as text: `module!Name(args)`, `module!+0x1a2b`, or `[unknown]`.
    pub fn frame_label(&self, frame: Frame) -> String {
        let function = self.function(frame.function);
        match frame.kind {
            FrameKind::Managed { .. } => function.qualified_name(),
            FrameKind::ImageMethod { entry } => format!(
                "{}!{}",
                function.module,
                self.image_method_name(entry).unwrap_or("[unknown]")
            ),
            FrameKind::Unknown { offset, .. } => format!("{}!+{offset:#x}", function.module),
            FrameKind::Unresolved => function.display_name().to_string(),
        }
    }

    /// Gives back what the tables grew beyond what they hold: a rundown lists thousands of
    /// methods at once, and tables grown by doubling keep up to half their room empty, per
    /// process a node agent follows.
    pub fn shrink_to_fit(&mut self) {
        self.functions.shrink_to_fit();
        let (functions, hasher) = (&self.functions, &self.hasher);
        self.interned
            .shrink_to_fit(|&id| function_hash(hasher, &functions[id.index()]));
        let codes = &self.codes;
        self.code_index
            .shrink_to_fit(|&c| code_hash(hasher, codes, c));
        self.by_method.shrink_to_fit();
        self.awaiting_module.shrink_to_fit();
        self.codes.shrink_to_fit();
        self.free_codes.shrink_to_fit();
        self.modules.shrink_to_fit();
        self.module_by_path.shrink_to_fit();
        self.images.shrink_to_fit();
    }

    /// Counters.
    pub fn stats(&self) -> CodeMapStats {
        let mut stats = self.stats;
        stats.functions = self.functions.len();
        stats.code_versions = self.codes.iter().flatten().count();
        stats.unloaded_code_versions = self
            .codes
            .iter()
            .flatten()
            .filter(|c| c.unloaded().is_some())
            .count();
        stats.segments = self.segments.len();
        stats.entry_points = self.entries.len();
        stats.modules = self.modules.len();
        stats.images = self.images.len();
        stats
    }

    fn code_at(&self, ip: u64) -> Option<Slot> {
        if let Some(index) = self.index.get() {
            return index.lookup(ip);
        }
        let stale = self.lookups_since_change.fetch_add(1, Ordering::Relaxed);
        if stale >= self.segments.len() as u64 / 8 + 64 {
            return self.index.get_or_init(|| self.build_index()).lookup(ip);
        }
        let (&start, segment) = self.segments.range(..=ip).next_back()?;
        let end = segment.end(start);
        if ip >= end {
            return None;
        }
        let code = self.code(segment.code)?;
        Some(Slot {
            end,
            function: code.function,
            tier: code.tier,
        })
    }

    fn build_index(&self) -> FlatIndex {
        let mut index = FlatIndex {
            starts: Vec::with_capacity(self.segments.len()),
            slots: Vec::with_capacity(self.segments.len()),
        };
        for (&start, segment) in &self.segments {
            if let Some(code) = self.code(segment.code) {
                index.starts.push(start);
                index.slots.push(Slot {
                    end: segment.end(start),
                    function: code.function,
                    tier: code.tier,
                });
            }
        }
        index
    }

    /// Called by everything that changes segments or what they point at.
    fn invalidate_index(&mut self) {
        self.index = OnceLock::new();
        *self.lookups_since_change.get_mut() = 0;
    }

    fn symbolize_entry(&self, ip: u64) -> Option<Frame> {
        let (&entry, info) = self.entries.range(..=ip).next_back()?;
        let mut limit = entry.saturating_add(MAX_INFERRED_EXTENT);
        if let Some(after) = entry.checked_add(1) {
            if let Some((&next, _)) = self.entries.range(after..).next() {
                limit = limit.min(next);
            }
            if let Some((&next, _)) = self.segments.range(after..).next() {
                limit = limit.min(next);
            }
        }
        // Known code covering the entry point bounds the guess too.
        if let Some((&start, segment)) = self.segments.range(..=entry).next_back() {
            let end = segment.end(start);
            if end > entry {
                limit = limit.min(end);
            }
        }
        if let Some(image) = self.image_at(entry) {
            limit = limit.min(image.end);
        }
        (ip < limit).then_some(Frame {
            function: info.function,
            kind: FrameKind::Managed {
                tier: info.tier,
                inferred_extent: true,
            },
        })
    }

    fn image_at(&self, ip: u64) -> Option<&Image> {
        let after = self.images.partition_point(|image| image.start <= ip);
        let image = self.images.get(after.checked_sub(1)?)?;
        (ip < image.end).then_some(image)
    }

    fn image_is_r2r(&self, image: &Image) -> bool {
        image
            .module_id
            .and_then(|id| self.modules.get(&id))
            .is_some_and(|module| !module.unloaded && module.flags.is_ready_to_run())
    }

    // ----- method events -------------------------------------------------------------------

    /// Applies a `MethodLoadVerbose` / `MethodDC*Verbose` event and returns the method's function.
    pub fn load_method(&mut self, event: &MethodLoad) -> Result<FunctionId, EventError> {
        let end = match validate_range(event.method_id, event.start_address, event.size) {
            Ok(end) => end,
            Err(error) => {
                self.stats.refused += 1;
                return Err(error);
            }
        };
        match event.source {
            LoadSource::Live => self.stats.live_loads += 1,
            LoadSource::Rundown => self.stats.rundown_loads += 1,
        }
        let flags = MethodFlags::from_raw(event.flags);
        let kind = if flags.contains(MethodFlags::JIT_HELPER) {
            FunctionKind::JitHelper
        } else if flags.contains(MethodFlags::DYNAMIC) {
            FunctionKind::DynamicMethod
        } else {
            FunctionKind::Method
        };
        let function = self.intern_method(MethodIdentity {
            kind,
            module_id: event.module_id,
            method_id: event.method_id,
            token: event.method_token,
            flags,
            namespace: &event.namespace,
            name: &event.name,
            signature: &event.signature,
        });
        self.by_method.insert(event.method_id, function);
        let tier = OptimizationTier::from_method_flags(event.flags);
        let rank = (event.timestamp, self.next_rank());
        if event.size == 0 {
            self.add_entry(
                event.start_address,
                EntryPoint {
                    function,
                    tier,
                    rank,
                    method: (event.method_id, event.rejit_id),
                },
            );
            return Ok(function);
        }
        let identity = (event.method_id, event.start_address, event.rejit_id);
        let existing = self
            .find_code(identity)
            .filter(|&c| self.code(c).is_some_and(|code| code.function == function));
        let code = match existing {
            Some(c) => {
                // The same code version reported again (a rundown after live loads): keep one
                // version, at the newer of the two ranks, and repaint its (possibly new) range.
                self.unpaint(c);
                if let Some(Some(code)) = self.codes.get_mut(c as usize) {
                    code.rank = code.rank.max(rank);
                    code.size = event.size;
                    code.tier = tier;
                    if code.unloaded().is_some_and(|t| t <= event.timestamp) {
                        code.unloaded_at = NOT_UNLOADED;
                    }
                }
                c
            }
            None => {
                let c = self.allocate_code(CodeVersion {
                    function,
                    segments: 0,
                    method_id: event.method_id,
                    start: event.start_address,
                    rejit_id: event.rejit_id,
                    rank,
                    unloaded_at: NOT_UNLOADED,
                    size: event.size,
                    tier,
                });
                self.index_code(c);
                c
            }
        };
        self.paint(event.start_address, end, code);
        Ok(function)
    }

    /// Applies an `R2RGetEntryPoint` event: the method's code starts at `entry_point`, its size is
    /// unknown. The module comes from an earlier event of the same method, or from the image that
    /// holds the address.
    pub fn add_r2r_entry_point(&mut self, event: &R2rEntryPoint) -> Result<FunctionId, EventError> {
        if event.entry_point == 0 {
            self.stats.refused += 1;
            return Err(EventError::ZeroStartAddress {
                method_id: event.method_id,
            });
        }
        let module_id = self
            .by_method
            .get(&event.method_id)
            .map(|&f| self.function(f).module_id)
            .filter(|&id| id != 0)
            .or_else(|| self.image_at(event.entry_point).and_then(|i| i.module_id))
            .unwrap_or(0);
        let function = self.intern_method(MethodIdentity {
            kind: FunctionKind::Method,
            module_id,
            method_id: event.method_id,
            token: 0,
            flags: MethodFlags::default(),
            namespace: &event.namespace,
            name: &event.name,
            signature: &event.signature,
        });
        self.by_method.insert(event.method_id, function);
        let rank = (event.timestamp, self.next_rank());
        self.add_entry(
            event.entry_point,
            EntryPoint {
                function,
                tier: OptimizationTier::ReadyToRun,
                rank,
                method: (event.method_id, 0),
            },
        );
        Ok(function)
    }

    /// Applies a `MethodUnloadVerbose` event. The code stays resolvable (samples taken before the
    /// unload still point at it) until newer code reuses the memory or
    /// [`CodeMap::prune_unloaded`] runs. Returns whether a known code version matched.
    pub fn unload_method(&mut self, event: &MethodUnload) -> bool {
        let identity = (event.method_id, event.start_address, event.rejit_id);
        let mut matched = false;
        if let Some(c) = self.find_code(identity) {
            if let Some(Some(code)) = self.codes.get_mut(c as usize) {
                // An unload older than the load it names is stale (events from two sessions).
                if code.rank.0 <= event.timestamp {
                    code.unloaded_at = event.timestamp.min(NOT_UNLOADED - 1);
                    matched = true;
                }
            }
        }
        if let Some(entry) = self.entries.get(&event.start_address) {
            if entry.method == (event.method_id, event.rejit_id) && entry.rank.0 <= event.timestamp
            {
                self.entries.remove(&event.start_address);
                matched = true;
            }
        }
        matched
    }

    /// Drops code versions unloaded before `timestamp` (same clock as the events). Their addresses
    /// become unresolved unless other code or an image covers them. Returns how many were dropped.
    pub fn prune_unloaded(&mut self, timestamp: u64) -> usize {
        let doomed: Vec<u32> = self
            .codes
            .iter()
            .enumerate()
            .filter_map(|(i, code)| {
                let code = code.as_ref()?;
                (code.unloaded()? < timestamp).then_some(i as u32)
            })
            .collect();
        for &c in &doomed {
            self.unpaint(c);
            self.free_code(c);
        }
        doomed.len()
    }

    // ----- module events -------------------------------------------------------------------

    /// Applies a `ModuleLoad` / `ModuleDC*` event. Functions that arrived before it get its name.
    pub fn load_module(&mut self, event: &ModuleLoad) {
        let path = if event.il_path.is_empty() {
            &event.native_path
        } else {
            &event.il_path
        };
        let name: Arc<str> = Arc::from(file_name(path));
        for path in [&event.il_path, &event.native_path] {
            if !path.is_empty() {
                self.module_by_path.insert(path.clone(), event.module_id);
            }
        }
        for image in &mut self.images {
            if image.path == event.il_path || image.path == event.native_path {
                image.module_id = Some(event.module_id);
            }
        }
        if let Some(waiting) = self.awaiting_module.remove(&event.module_id) {
            for id in waiting {
                if let Some(function) = self.functions.get_mut(id.index()) {
                    function.module = name.clone();
                }
            }
        }
        self.modules.insert(
            event.module_id,
            Module {
                module_id: event.module_id,
                assembly_id: event.assembly_id,
                flags: ModuleFlags::from_raw(event.flags),
                il_path: event.il_path.clone(),
                native_path: event.native_path.clone(),
                file_name: name,
                managed_pdb: event.managed_pdb.clone(),
                unloaded: false,
            },
        );
    }

    /// Applies a `ModuleUnload` event: the module keeps naming its functions, but no longer asks
    /// for rundown refreshes.
    pub fn unload_module(&mut self, event: &ModuleUnload) {
        if let Some(module) = self.modules.get_mut(&event.module_id) {
            module.unloaded = true;
        }
    }

    /// Replaces the known file images (see [`crate::parse_proc_maps`]). Overlapping images keep the
    /// lower one; empty ranges are ignored.
    pub fn set_images(&mut self, images: impl IntoIterator<Item = ImageRange>) {
        let mut ranges: Vec<ImageRange> = images.into_iter().filter(|i| i.start < i.end).collect();
        ranges.sort_by_key(|i| i.start);
        let mut kept: Vec<Image> = Vec::with_capacity(ranges.len());
        for range in ranges {
            if kept.last().is_some_and(|last| range.start < last.end) {
                continue;
            }
            let function = self.intern_image(file_name(&range.path));
            let module_id = self.module_by_path.get(&range.path).copied();
            kept.push(Image {
                start: range.start,
                end: range.end,
                path: range.path,
                function,
                module_id,
                methods: range.methods,
            });
        }
        self.images = kept;
    }

    // ----- interning -----------------------------------------------------------------------

    fn intern_method(&mut self, method: MethodIdentity<'_>) -> FunctionId {
        let unnamed = method.namespace.is_empty() && method.name.is_empty();
        let key = if unnamed {
            FunctionKey::hash(b'n', &[&method.method_id.to_le_bytes()])
        } else {
            FunctionKey::hash(
                b'm',
                &[
                    method.namespace.as_bytes(),
                    method.name.as_bytes(),
                    method.signature.as_bytes(),
                ],
            )
        };
        if let Some(id) = self.interned_function(method.module_id, key) {
            let known = self.function(id);
            if known.namespace() == method.namespace
                && known.name() == method.name
                && known.signature() == method.signature
                && (!unnamed || known.method_id == method.method_id)
            {
                return id;
            }
        }
        let names = if unnamed {
            MethodNames::labelled(format!("[method {:#x}]", method.method_id))
        } else {
            method_names::intern(key, method.namespace, method.name, method.signature)
        };
        let module = match self.modules.get(&method.module_id) {
            Some(module) => module.file_name.clone(),
            None => Arc::from(""),
        };
        let id = self.push_function(CodeMapFunction {
            key,
            kind: method.kind,
            module_id: method.module_id,
            module,
            method_id: method.method_id,
            token: method.token,
            flags: method.flags,
            names,
        });
        if method.module_id != 0 && !self.modules.contains_key(&method.module_id) {
            self.awaiting_module
                .entry(method.module_id)
                .or_default()
                .push(id);
        }
        id
    }

    fn intern_image(&mut self, name: &str) -> FunctionId {
        let key = FunctionKey::hash(b'i', &[name.as_bytes()]);
        if let Some(id) = self.interned_function(0, key) {
            if self.function(id).module.as_ref() == name {
                return id;
            }
        }
        let id = self.push_function(CodeMapFunction {
            key,
            kind: FunctionKind::Image,
            module_id: 0,
            module: Arc::from(name),
            method_id: 0,
            token: 0,
            flags: MethodFlags::default(),
            names: MethodNames::labelled(format!("[{name}]")),
        });
        id
    }

    /// Adds a function and indexes it by `(module_id, key)`. A 64-bit collision keeps the first
    /// function indexed; the second is still correct, only not shared.
    fn push_function(&mut self, function: CodeMapFunction) -> FunctionId {
        // u32::MAX functions would need hundreds of GiB of names; saturate instead of wrapping.
        let id = FunctionId(u32::try_from(self.functions.len()).unwrap_or(u32::MAX));
        let (module_id, key) = (function.module_id, function.key);
        push_compact(&mut self.functions, function);
        let hash = interned_hash(&self.hasher, module_id, key);
        let (functions, hasher) = (&self.functions, &self.hasher);
        if let Entry::Vacant(vacant) = self.interned.entry(
            hash,
            |&known| {
                let known = &functions[known.index()];
                (known.module_id, known.key) == (module_id, key)
            },
            |&known| function_hash(hasher, &functions[known.index()]),
        ) {
            vacant.insert(id);
        }
        id
    }

    /// The function first indexed under `(module_id, key)`.
    fn interned_function(&self, module_id: u64, key: FunctionKey) -> Option<FunctionId> {
        let hash = interned_hash(&self.hasher, module_id, key);
        self.interned
            .find(hash, |&known| {
                let known = self.function(known);
                (known.module_id, known.key) == (module_id, key)
            })
            .copied()
    }

    /// The code version indexed under `identity`.
    fn find_code(&self, identity: CodeIdentity) -> Option<u32> {
        let hash = self.hasher.hash_one(identity);
        self.code_index
            .find(hash, |&c| {
                code_in(&self.codes, c).is_some_and(|code| code.identity() == identity)
            })
            .copied()
    }

    /// Indexes code version `c` under its identity, in place of any other version of the same
    /// identity.
    fn index_code(&mut self, c: u32) {
        let Some(identity) = self.code(c).map(CodeVersion::identity) else {
            return;
        };
        let hash = self.hasher.hash_one(identity);
        let (codes, hasher) = (&self.codes, &self.hasher);
        match self.code_index.entry(
            hash,
            |&known| code_in(codes, known).is_some_and(|code| code.identity() == identity),
            |&known| code_hash(hasher, codes, known),
        ) {
            Entry::Occupied(mut occupied) => *occupied.get_mut() = c,
            Entry::Vacant(vacant) => {
                vacant.insert(c);
            }
        }
    }

    // ----- segments ------------------------------------------------------------------------

    fn next_rank(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    fn code(&self, c: u32) -> Option<&CodeVersion> {
        code_in(&self.codes, c)
    }

    fn rank_of(&self, c: u32) -> Rank {
        self.code(c).map_or((0, 0), |code| code.rank)
    }

    fn adjust_segments(&mut self, c: u32, delta: i32) {
        if let Some(Some(code)) = self.codes.get_mut(c as usize) {
            code.segments = code.segments.saturating_add_signed(delta);
        }
    }

    fn allocate_code(&mut self, code: CodeVersion) -> u32 {
        match self.free_codes.pop() {
            Some(c) => {
                self.codes[c as usize] = Some(code);
                c
            }
            None => {
                push_compact(&mut self.codes, Some(code));
                (self.codes.len() - 1) as u32
            }
        }
    }

    fn free_code(&mut self, c: u32) {
        let Some(identity) = self.code(c).map(CodeVersion::identity) else {
            return;
        };
        let hash = self.hasher.hash_one(identity);
        if let Ok(indexed) = self.code_index.find_entry(hash, |&known| known == c) {
            indexed.remove();
        }
        self.codes[c as usize] = None;
        self.free_codes.push(c);
    }

    fn add_entry(&mut self, address: u64, entry: EntryPoint) {
        let keep_old = self
            .entries
            .get(&address)
            .is_some_and(|old| old.rank > entry.rank);
        if !keep_old {
            self.entries.insert(address, entry);
        }
    }

    /// Splits the segment containing `at` (strictly inside) in two.
    fn split_at(&mut self, at: u64) {
        let Some((&start, &segment)) = self.segments.range(..at).next_back() else {
            return;
        };
        let end = segment.end(start);
        if end <= at {
            return;
        }
        self.segments
            .insert(start, Segment::new(start, at, segment.code));
        self.segments
            .insert(at, Segment::new(at, end, segment.code));
        self.adjust_segments(segment.code, 1);
    }

    /// Gives `[start, end)` to code `c` wherever the current owner is older.
    fn paint(&mut self, start: u64, end: u64, c: u32) {
        self.invalidate_index();
        if self.is_free(start, end) {
            // The common case: fresh code in fresh memory. Nothing to merge: `c` owns no other
            // segment (new, or just unpainted) and the neighbours belong to other code.
            self.segments.insert(start, Segment::new(start, end, c));
            self.adjust_segments(c, 1);
            return;
        }
        let rank = self.rank_of(c);
        self.split_at(start);
        self.split_at(end);
        let existing: Vec<(u64, Segment)> = self
            .segments
            .range(start..end)
            .map(|(&s, &segment)| (s, segment))
            .collect();
        let mut claimed: Vec<(u64, u64)> = Vec::new();
        let mut losers: Vec<u32> = Vec::new();
        let mut cursor = start;
        for (s, segment) in existing {
            if cursor < s {
                claimed.push((cursor, s));
            }
            if segment.code != c && self.rank_of(segment.code) < rank {
                self.segments.remove(&s);
                self.adjust_segments(segment.code, -1);
                losers.push(segment.code);
                claimed.push((s, segment.end(s)));
            }
            cursor = segment.end(s);
        }
        if cursor < end {
            claimed.push((cursor, end));
        }
        for (s, e) in claimed {
            self.segments.insert(s, Segment::new(s, e, c));
            self.adjust_segments(c, 1);
        }
        self.coalesce(start, end);
        // Codes left without addresses (shadowed entirely, or an out-of-order event that claimed
        // nothing) can never resolve again.
        losers.push(c);
        for code in losers {
            if self.code(code).is_some_and(|code| code.segments == 0) {
                self.free_code(code);
            }
        }
    }

    /// Whether no segment touches `[start, end)`.
    fn is_free(&self, start: u64, end: u64) -> bool {
        let before_ends_in_time = self
            .segments
            .range(..start)
            .next_back()
            .is_none_or(|(&s, segment)| segment.end(s) <= start);
        before_ends_in_time && self.segments.range(start..end).next().is_none()
    }

    /// Removes every segment of code `c`, leaving its addresses to whatever else covers them.
    fn unpaint(&mut self, c: u32) {
        self.invalidate_index();
        let Some(code) = self.code(c) else {
            return;
        };
        let owned: Vec<u64> = self
            .segments
            .range(code.start..code.end())
            .filter(|(_, segment)| segment.code == c)
            .map(|(&s, _)| s)
            .collect();
        for s in owned {
            self.segments.remove(&s);
        }
        if let Some(Some(code)) = self.codes.get_mut(c as usize) {
            code.segments = 0;
        }
    }

    /// Merges touching segments of the same owner around `[start, end]`.
    fn coalesce(&mut self, start: u64, end: u64) {
        let from = self
            .segments
            .range(..start)
            .next_back()
            .map_or(start, |(&s, _)| s);
        let keys: Vec<u64> = self.segments.range(from..=end).map(|(&s, _)| s).collect();
        let mut previous: Option<u64> = None;
        for key in keys {
            if let Some(p) = previous {
                if let (Some(&before), Some(&this)) =
                    (self.segments.get(&p), self.segments.get(&key))
                {
                    if before.end(p) == key && before.code == this.code {
                        self.segments.remove(&key);
                        self.segments
                            .insert(p, Segment::new(p, this.end(key), this.code));
                        self.adjust_segments(this.code, -1);
                        continue;
                    }
                }
            }
            previous = Some(key);
        }
    }
}

/// The hash [`CodeMap::interned`] files a function of `module_id` and `key` under.
fn interned_hash(hasher: &RandomState, module_id: u64, key: FunctionKey) -> u64 {
    hasher.hash_one((module_id, key.0))
}

fn function_hash(hasher: &RandomState, function: &CodeMapFunction) -> u64 {
    interned_hash(hasher, function.module_id, function.key)
}

/// The hash [`CodeMap::code_index`] files code version `c` under.
fn code_hash(hasher: &RandomState, codes: &[Option<CodeVersion>], c: u32) -> u64 {
    code_in(codes, c).map_or(0, |code| hasher.hash_one(code.identity()))
}

/// The parts of a method event that identify its function.
struct MethodIdentity<'a> {
    kind: FunctionKind,
    module_id: u64,
    method_id: u64,
    token: u32,
    flags: MethodFlags,
    namespace: &'a str,
    name: &'a str,
    signature: &'a str,
}

/// Checks a method's range and returns its end.
fn validate_range(method_id: u64, start: u64, size: u32) -> Result<u64, EventError> {
    if start == 0 {
        return Err(EventError::ZeroStartAddress { method_id });
    }
    if size > MAX_METHOD_SIZE {
        return Err(EventError::ImplausibleSize {
            method_id,
            size,
            max: MAX_METHOD_SIZE,
        });
    }
    start
        .checked_add(u64::from(size))
        .ok_or(EventError::RangeOverflow {
            method_id,
            start,
            size,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node agent keeps a few thousand code versions for each of up to a hundred processes.
    #[test]
    fn a_code_version_slot_takes_64_bytes_and_a_segment_8() {
        assert!(std::mem::size_of::<Option<CodeVersion>>() <= 64);
        assert_eq!(std::mem::size_of::<Segment>(), 8);
    }

    #[test]
    fn tables_grow_by_an_eighth() {
        let mut items: Vec<u64> = Vec::new();
        for i in 0..10_000 {
            push_compact(&mut items, i);
        }
        assert!(items.capacity() <= items.len() + items.len() / 8 + 16);
    }
}
