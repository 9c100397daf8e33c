//! Per-process code maps: turns raw instruction pointers from EventPipe samples into managed frames.
//!
//! Fed by the collector's method and module events; read by the store. The core is pure (no I/O).
