//! coord-http's tests with a real HTTP client against servers on loopback ports, in one test
//! binary (one link step instead of one per file). Kept apart: `secrecy.rs` (it installs a
//! global log subscriber at trace level) and `ui.rs` (a trybuild project).

#[path = "../support/mod.rs"]
mod support;

mod disconnects;
#[cfg(feature = "axum")]
mod handler_errors;
mod memory;
mod redis;
