//! The records the agent keeps of a process's signals, as its live readers receive them.

use std::sync::Arc;

use crate::budget::Charged;
use crate::exception::ExceptionRecord;
use crate::log::LogRecord;

/// A log record as it is kept and handed out: charged to its process's signal budget.
pub type KeptLog = Arc<Charged<LogRecord>>;
/// An exception as it is kept and handed out: charged to its process's signal budget.
pub type KeptException = Arc<Charged<ExceptionRecord>>;

/// A record as the live readers receive it.
#[derive(Debug, Clone)]
pub enum Signal {
    Log(KeptLog),
    Exception(KeptException),
}
