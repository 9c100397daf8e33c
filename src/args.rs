//! Argument value parsers shared by several commands: the same notations as settings files and
//! the agent's HTTP API.

pub use collector::config::{parse_bytes, parse_duration};
