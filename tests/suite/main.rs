//! clrscope's integration suite: one test binary (one link, one process) holding every scenario,
//! a module each. Tests start real processes (the agent, .NET targets of `tests/targets/`, real
//! peers) and kill them on drop; `tests/support/` is what they share.
//!
//! Tiers (`tests/testbed/run-tests.sh`): `make check` runs the modules that need no .NET runtime
//! (`OFFLINE` there), `make test` all of them on .NET 10, `make test-matrix` the runtime-dependent
//! ones on every runtime of the test bed (`CLRSCOPE_DOTNET=8|9|10|11`).

#[path = "../support/mod.rs"]
mod support;

mod agent;
mod agent_config;
mod api_load;
mod api_monitor;
mod auth;
mod azure_blob;
mod cli_dump;
mod cli_live;
mod cli_ps;
mod cli_record;
mod cli_trace;
mod convert;
mod counters;
mod crate_graph;
mod demo;
mod deploy;
mod entra_id;
mod exporters;
mod gcdump;
mod hostile_clients;
mod hostile_targets;
mod incident_evidence;
mod incidents;
mod inspect;
mod ipc;
mod linkage;
mod metrics;
mod metrics_export;
mod native_aot;
mod nettrace_live;
mod node;
mod openapi;
mod packaging;
mod peers;
mod querier;
mod r2r_images;
mod readme;
mod rules;
mod signals;
mod startup;
mod storefront;
mod storefront_twin;
mod targets;
mod traces;
mod webui;
mod wire_types;
