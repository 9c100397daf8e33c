//! Byte-exact tests of every encoder and decoder against bytes written out by hand from the
//! protocol doc and the runtime sources, and robustness tests on garbage and truncated input.

mod replies;
mod requests;
mod robustness;
mod samples;
