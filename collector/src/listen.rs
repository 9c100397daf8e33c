//! listen (in progress)
