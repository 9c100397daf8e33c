//! client (in progress)
