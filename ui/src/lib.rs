//! The agent's HTTP surface: dotnet-monitor-compatible API, profile queries, metrics and the web UI.
