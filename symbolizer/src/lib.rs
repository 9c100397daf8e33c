//! Per-process code maps: turns raw instruction pointers from EventPipe samples into managed frames.
//!
//! Fed by the collector's method and module events; read by the store. The core is pure (no I/O).

mod events;
mod images;
mod names;
mod refresh;

pub use events::{
    LoadSource, MethodFlags, MethodLoad, MethodUnload, ModuleFlags, ModuleLoad, ModuleUnload,
    OptimizationTier, PdbInfo, R2rEntryPoint,
};
pub use images::{parse_proc_maps, ImageRange};
pub use refresh::RundownRefreshPolicy;
