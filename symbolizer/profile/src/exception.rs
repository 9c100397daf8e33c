//! Exceptions: a first-chance exception as the agent keeps, serves and exports it.

use std::sync::Arc;

use crate::span::Span;

/// `ExceptionFlags` bit: the exception has an inner exception.
pub const FLAG_HAS_INNER: u16 = 0x1;
/// `ExceptionFlags` bit: thrown while another was being handled.
pub const FLAG_NESTED: u16 = 0x2;
/// `ExceptionFlags` bit: rethrown (`throw;`).
pub const FLAG_RETHROWN: u16 = 0x4;

/// One named frame of a throwing stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExceptionFrame {
    /// The C#-style method name, `Type.Method(args)`, or `[unknown]`: shared with the code map
    /// that named it (a process's history repeats the same throwing frames).
    pub method_name: Arc<str>,
    /// The module's file name, empty when unknown.
    pub module_name: Arc<str>,
}

/// One thrown exception.
#[derive(Debug, Clone, PartialEq)]
pub struct ExceptionRecord {
    /// Unique within its process, increasing.
    pub id: u64,
    pub unix_nanos: i64,
    pub thread_id: u64,
    pub type_name: String,
    pub message: String,
    pub hresult: u32,
    pub flags: u16,
    /// The exception thrown just before on the same thread, when this one says it has an inner
    /// exception: how wrapping code (`catch (E e) { throw new F(.., e); }`) runs. An inference:
    /// the runtime's event does not name the inner exception.
    pub inner_id: Option<u64>,
    /// The throwing stack, innermost first.
    pub frames: Vec<ExceptionFrame>,
    /// The span it was thrown in, when trace linkage is on.
    pub span: Option<Span>,
}
