//! The symbolizer stage: raw samples and events in, named profiles (the `profile` model) out.
//!
//! - The per-process code map (the pure core: no I/O, no clock, no threads) turns raw instruction
//!   pointers from EventPipe samples into managed frames. It is fed by the collector's method
//!   and module events (through a thin adapter that copies decoded fields into [`MethodLoad`],
//!   [`MethodUnload`], [`R2rEntryPoint`], [`ModuleLoad`] and [`ModuleUnload`]), and by the
//!   target's mapped files ([`read_proc_maps`]).
//! - [`profiles`]: events → named profiles, one path with two outputs: the cpu and wall
//!   profile of a recording (`record`, `convert`, `top`) and the always-on profile of one
//!   process as batches for the store (the agent).
//! - [`stacks`]: every thread's named stack at one moment ([`stacks::capture`]).
//!
//! # Frames
//! [`CodeMap::symbolize`] never fails and never drops an address: it returns a [`Frame`] whose
//! [`FrameKind`] says whether the address was in known managed code (with its JIT tier), inside a
//! mapped module image with no known method (`module!+0xOFFSET`), or unknown (`[unknown]`).
//! Frames point at interned [`CodeMapFunction`]s shared by every code version of a method
//! (tier 0, tier 1, OSR, ReJIT), so a stack costs no allocation per frame. Their names
//! ([`MethodNames`]) are shared by every code map of the program: the framework's methods, the
//! same in every process, are held once however many processes an agent profiles.
//!
//! # Names
//! [`CodeMapFunction::display_name`] is the C#-like name .NET developers read:
//! - the declaring type fully qualified, nested types joined with `.`, generic arguments in
//!   `<...>` with C# keywords for primitives:
//!   `System.Collections.Generic.Dictionary<string, int>.Enumerator`;
//! - then `.Method` as in metadata (`.ctor`, `<Main>b__0_0`, `get_Count`);
//! - then the parameter types, without namespaces, `ref`/`in` for byrefs:
//!   `(ReadOnlySpan<char>, ref int)`; class type parameters are replaced by the declaring type's
//!   arguments (`List<int>.Add(int)`), method type parameters stay `!!0` (the runtime does not
//!   report the method instantiation); shared generic code shows `System.__Canon`.
//!
//! The module is its own field ([`CodeMapFunction::module`], the file name), so exporters can
//! print `System.Linq.dll!System.Linq.Enumerable.Where(IEnumerable<!!0>, Func<!!0, bool>)` like PerfView.
//! The raw runtime strings stay available, and anything that does not parse falls back to them.

mod error;
mod events;
mod images;
mod map;
mod method_names;
mod names;
pub mod native_aot;
pub mod nettrace;
pub mod profiles;
mod r2r;
mod refresh;
pub mod stacks;

pub use error::EventError;
pub use events::{
    LoadSource, MethodFlags, MethodLoad, MethodUnload, ModuleFlags, ModuleLoad, ModuleUnload,
    OptimizationTier, PdbInfo, R2rEntryPoint,
};
pub use images::{parse_proc_maps, read_proc_maps, reread_proc_maps, ImageRange};
pub use map::{
    CodeMap, CodeMapFunction, CodeMapStats, Frame, FrameKind, FunctionId, FunctionKey,
    FunctionKind, Module, MAX_INFERRED_EXTENT, MAX_METHOD_SIZE,
};
pub use method_names::MethodNames;
pub use r2r::{ImageMethods, R2rError};
pub use refresh::RundownRefreshPolicy;
