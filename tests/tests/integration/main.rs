//! coord's integration tests on the in-process provider, in one test binary: one link step
//! instead of one per file (the suite's build time is mostly linking). Each module is one
//! promise area.
//!
//! Kept in binaries of their own: tests that read or set process-wide state (the installed
//! default coordinator in `installed_default.rs` and `fallback_default.rs`, the once-per-process
//! fallback warning in `config_fallback.rs`, the process-wide flight count in
//! `single_flight.rs` and `memory_bounds.rs`, the global metrics exporter in `prometheus.rs`),
//! the run that re-executes itself as child processes (`stall_history.rs`), and the trybuild
//! projects (`ui.rs`, `readme_examples.rs`).

mod bad_inputs;
mod cached;
mod cached_orders;
mod cluster_flight;
mod config_env;
mod config_runtime;
mod conformance_memory;
mod handle_api;
mod idempotency_layer;
mod idempotency_transaction;
mod lease_renewal;
mod lock_layer;
mod macro_shapes;
mod metrics;
mod observability;
mod ordering;
mod outcome_integrity;
mod provider_inputs;
mod renewal_runtimes;
mod replica_acks;
mod shutdown;
