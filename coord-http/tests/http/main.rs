//! coord-http's tests with a real HTTP client against servers on loopback ports, in one test
//! binary (one link step instead of one per file). Kept apart: `secrecy.rs` (it installs a
//! global log subscriber at trace level). The builder's compile-fail cases live in the shared
//! trybuild project, `coord-macros/tests/ui.rs` (`tests/ui/*/http_*.rs` there).

#[path = "../support/mod.rs"]
mod support;

mod disconnects;
#[cfg(feature = "axum")]
mod handler_errors;
mod memory;
mod redis;
