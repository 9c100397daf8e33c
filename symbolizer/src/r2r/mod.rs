//! Names for ReadyToRun code from the image itself.
//!
//! The runtime reports a precompiled method only once its entry point is bound (a rundown, or
//! `R2RGetEntryPoint`). Code that only other precompiled code of the same image calls is never
//! bound (the call goes straight through), so no event ever names it: the socket engine's epoll
//! loop, most of `System.Private.CoreLib`'s reflection. The image names it: its ReadyToRun header
//! lists every compiled `MethodDef` with the index of its code in the `RUNTIME_FUNCTION` table,
//! and its metadata holds the names. [`ImageMethods::parse`] reads both, so a frame in such code
//! gets the same name a rundown would give it.
//!
//! Where each method's code ends: a method owns its `RUNTIME_FUNCTION` and the ones after it (its
//! funclets) up to the next method's. Method starts are the `MethodDef` entry points and the
//! entries of the debug-info table, which the runtime indexes by a method's first
//! `RUNTIME_FUNCTION` and which also covers generic instantiations (named elsewhere, left
//! unnamed here), so no method swallows the code of the one after it.

mod metadata;
mod native;
mod pe;

use metadata::Metadata;
use native::{decode_unsigned, NativeArray};
use pe::PeImage;

/// `READYTORUN_SIGNATURE` ("RTR").
const READYTORUN_SIGNATURE: u32 = 0x0052_5452;
/// `READYTORUN_FLAG_COMPONENT`: the code lives in a composite image elsewhere.
const FLAG_COMPONENT: u32 = 0x20;
const SECTION_RUNTIME_FUNCTIONS: u32 = 102;
const SECTION_METHOD_DEF_ENTRY_POINTS: u32 = 103;
const SECTION_DEBUG_INFO: u32 = 105;
/// More header sections than any image has (the format defines about 25).
const MAX_HEADER_SECTIONS: u32 = 256;
/// `RUNTIME_FUNCTION` on x64: begin, end, unwind data.
const RUNTIME_FUNCTION_SIZE: u32 = 12;

/// Why an image's methods could not be read. Frames in the image then stay `module!+0xOFFSET`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum R2rError {
    /// Not a .NET image at all.
    #[error("not a managed image: {0}")]
    NotManaged(&'static str),
    /// A managed image without precompiled code: every method it runs is jitted and reported.
    #[error("not a ReadyToRun image")]
    NotReadyToRun,
    /// Precompiled for another processor.
    #[error("ReadyToRun code for machine {0:#06x}, only x64 is read")]
    UnsupportedMachine(u16),
    /// A valid layout this reader does not handle.
    #[error("unsupported ReadyToRun layout: {0}")]
    Unsupported(&'static str),
    /// Headers or tables point outside the file or contradict each other.
    #[error("malformed image: {0}")]
    Malformed(&'static str),
    /// The file is larger than the budget for reading images.
    #[error("image of {size} bytes is over the {limit}-byte budget for reading method names")]
    TooLarge {
        /// The file's size.
        size: u64,
        /// The budget.
        limit: u64,
    },
    /// The file could not be opened or read.
    #[error("reading the image: {0}")]
    Io(String),
    /// The file at the path is not the file the process mapped.
    #[error("the file at the image's path is not the one the process mapped")]
    Replaced,
}

/// One stretch of a method's code: `[begin, end)` RVAs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    begin: u32,
    end: u32,
    /// Index into [`ImageMethods::methods`].
    method: u32,
}

/// The named precompiled methods of one image, by RVA.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ImageMethods {
    /// Sorted by `begin`, disjoint.
    spans: Vec<Span>,
    /// Entry RVA and display name of each method.
    methods: Vec<(u32, Box<str>)>,
}

impl std::fmt::Debug for ImageMethods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageMethods")
            .field("methods", &self.methods.len())
            .field("spans", &self.spans.len())
            .finish()
    }
}

impl ImageMethods {
    /// Reads the precompiled methods of a PE file's bytes. Never panics; everything it keeps is
    /// bounded by the file's size.
    pub fn parse(bytes: &[u8]) -> Result<Self, R2rError> {
        let image = PeImage::parse(bytes)?;
        let (cli, cli_size) = image.cli_header;
        if cli_size < 72 {
            return Err(R2rError::NotManaged("CLI header too small"));
        }
        let metadata_rva = image
            .u32_at(cli + 8)
            .ok_or(R2rError::Malformed("CLI header"))?;
        let metadata_size = image
            .u32_at(cli + 12)
            .ok_or(R2rError::Malformed("CLI header"))?;
        let header = image
            .u32_at(cli + 64)
            .ok_or(R2rError::Malformed("CLI header"))?;
        if header == 0 || image.u32_at(header) != Some(READYTORUN_SIGNATURE) {
            return Err(R2rError::NotReadyToRun);
        }
        let flags = image
            .u32_at(header + 8)
            .ok_or(R2rError::Malformed("R2R header"))?;
        if flags & FLAG_COMPONENT != 0 {
            return Err(R2rError::Unsupported("component of a composite image"));
        }
        let section_count = image
            .u32_at(header + 12)
            .ok_or(R2rError::Malformed("R2R header"))?;
        if section_count > MAX_HEADER_SECTIONS {
            return Err(R2rError::Malformed("too many R2R sections"));
        }
        let mut sections = std::collections::HashMap::new();
        for i in 0..section_count {
            let at = header + 16 + i * 12;
            let kind = image
                .u32_at(at)
                .ok_or(R2rError::Malformed("R2R sections"))?;
            let rva = image
                .u32_at(at + 4)
                .ok_or(R2rError::Malformed("R2R sections"))?;
            let size = image
                .u32_at(at + 8)
                .ok_or(R2rError::Malformed("R2R sections"))?;
            sections.insert(kind, (rva, size));
        }
        let &(functions_rva, functions_size) = sections
            .get(&SECTION_RUNTIME_FUNCTIONS)
            .ok_or(R2rError::Malformed("no runtime functions"))?;
        let functions = image
            .slice(functions_rva, functions_size)
            .ok_or(R2rError::Malformed("runtime functions outside the file"))?;
        let functions: Vec<(u32, u32)> = functions
            .chunks_exact(RUNTIME_FUNCTION_SIZE as usize)
            .map(|f| {
                (
                    pe::read_u32(f, 0).unwrap_or(0),
                    pe::read_u32(f, 4).unwrap_or(0),
                )
            })
            .collect();
        let entry_points = sections
            .get(&SECTION_METHOD_DEF_ENTRY_POINTS)
            .and_then(|&(rva, _)| NativeArray::new(&image, rva))
            .ok_or(R2rError::Malformed("no method entry points"))?;
        let metadata = Metadata::parse(
            image
                .slice(metadata_rva, metadata_size)
                .ok_or(R2rError::Malformed("metadata outside the file"))?,
        )?;

        // Which RUNTIME_FUNCTION starts a method, and which MethodDef that is.
        let mut starts = vec![false; functions.len()];
        if let Some(debug_info) = sections
            .get(&SECTION_DEBUG_INFO)
            .and_then(|&(rva, _)| NativeArray::new(&image, rva))
        {
            for index in 0..debug_info.len().min(functions.len() as u32) {
                if debug_info.get(index).is_some() {
                    starts[index as usize] = true;
                }
            }
        }
        let mut named: Vec<(u32, u32)> = Vec::new();
        for rid in 1..=entry_points.len().min(metadata.method_count()) {
            let Some(offset) = entry_points.get(rid - 1) else {
                continue;
            };
            let Some((id, _)) = decode_unsigned(&image, offset) else {
                continue;
            };
            // Bit 0 says fixups precede the index (runtime's `GetEntryPoint`).
            let index = if id & 1 != 0 { id >> 2 } else { id >> 1 };
            if let Some(start) = starts.get_mut(index as usize) {
                *start = true;
                named.push((index, rid));
            }
        }
        named.sort_unstable();

        let mut methods = Vec::with_capacity(named.len());
        let mut spans = Vec::new();
        let mut name_bytes = 0usize;
        for &(index, rid) in &named {
            let Some((declaring, name, signature)) = metadata.method_strings(rid) else {
                continue;
            };
            let display = crate::names::display_name(&declaring, name, &signature);
            name_bytes += display.len();
            // Names are bounded per method; this bounds them per image, relative to its size.
            if name_bytes > bytes.len() {
                return Err(R2rError::Malformed("method names larger than the image"));
            }
            let method = methods.len() as u32;
            let entry = functions[index as usize].0;
            methods.push((entry, display.into_boxed_str()));
            let mut i = index as usize;
            loop {
                let (begin, end) = functions[i];
                if begin < end {
                    spans.push(Span { begin, end, method });
                }
                i += 1;
                if i >= functions.len() || starts[i] {
                    break;
                }
            }
        }
        spans.sort_unstable_by_key(|s| s.begin);
        // Overlapping spans only come from a corrupt table: keep the first of each overlap.
        let mut kept: Vec<Span> = Vec::with_capacity(spans.len());
        for span in spans {
            if kept.last().is_some_and(|last| span.begin < last.end) {
                continue;
            }
            kept.push(span);
        }
        Ok(Self {
            spans: kept,
            methods,
        })
    }

    /// Methods given as whole stretches of code, `(begin, end, display name)` RVAs (a NativeAOT
    /// executable's symbol table); where two overlap, the one that starts first is kept.
    pub(crate) fn from_spans(mut named: Vec<(u32, u32, Box<str>)>) -> Self {
        named.sort_unstable_by_key(|&(begin, end, _)| (begin, std::cmp::Reverse(end)));
        let mut spans: Vec<Span> = Vec::with_capacity(named.len());
        let mut methods = Vec::with_capacity(named.len());
        for (begin, end, name) in named {
            if begin >= end || spans.last().is_some_and(|last| begin < last.end) {
                continue;
            }
            let method = methods.len() as u32;
            methods.push((begin, name));
            spans.push(Span { begin, end, method });
        }
        Self { spans, methods }
    }

    /// The method whose code holds `rva`: its entry RVA and display name.
    pub fn method_at(&self, rva: u64) -> Option<(u32, &str)> {
        let rva = u32::try_from(rva).ok()?;
        let after = self.spans.partition_point(|s| s.begin <= rva);
        let span = self.spans.get(after.checked_sub(1)?)?;
        if rva >= span.end {
            return None;
        }
        let (entry, name) = self.methods.get(span.method as usize)?;
        Some((*entry, name))
    }

    /// How many methods are named.
    pub fn len(&self) -> usize {
        self.methods.len()
    }

    /// No method is named.
    pub fn is_empty(&self) -> bool {
        self.methods.is_empty()
    }
}
