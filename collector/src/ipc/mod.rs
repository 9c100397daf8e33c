//! Diagnostics IPC wire protocol (placeholder: filled by the ipc work).
