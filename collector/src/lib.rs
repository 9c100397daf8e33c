//! The collector: everything that talks to a .NET runtime.
//!
//! - [`activity`]: trace linkage, which span was current on a thread at a time.
//! - [`artifacts`]: traces, gcdumps and dumps of a live process, and their file names.
//! - [`attached`]: the processes an agent profiles right now.
//! - [`inspect`]: what a nettrace file holds, for `clrscope inspect`.
//! - [`discovery`]: finding runtimes' default diagnostic sockets (connect mode).
//! - [`listen`]: the reverse server runtimes dial with `DOTNET_DiagnosticPorts` (listen mode).
//! - [`client`]: one command per connection, on either transport.
//! - [`counters`]: EventCounters and System.Diagnostics.Metrics values as typed samples.
//! - [`providers`]: trace profiles and provider specifications.
//! - [`rules`]: collection rules (dotnet-monitor's schema) and the pre-trigger ring buffer.
//! - [`sampler`]: when the continuous sampler samples (duty cycle, boost).
//! - [`samples`]: the sampler's stacks, counted, with the measured sampling period.
//! - [`session`]: running one EventPipe session from start to rundown.
//! - [`timer_grid`]: the instants periodic work falls on, so that it wakes the agent together.
//! - [`gcdump`]: heap snapshots and their type histograms.
//! - [`processes`]: the .NET processes reachable from here, as `clrscope ps` lists them.

pub mod activity;
pub mod artifacts;
pub mod attached;
pub mod client;
pub mod connections;
pub mod counters;
pub mod discovery;
pub mod gcdump;
pub mod inspect;
pub mod listen;
pub mod local;
pub mod processes;
pub mod providers;
pub mod rules;
pub mod sampler;
pub mod samples;
pub mod session;
pub mod signals;
pub mod startup;
pub mod timer_grid;
