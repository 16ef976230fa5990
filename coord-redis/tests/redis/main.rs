//! coord-redis's integration tests against real redis-server processes, in one test binary:
//! one link step instead of one per file (the suite's build time is mostly linking). Each
//! module is one promise area; every test starts its own servers on free loopback ports.
//!
//! Kept in binaries of their own: tests that set process-wide state (`env.rs` changes the
//! environment, `connect_checks.rs` installs a global log subscriber) and the multi-process
//! runs with their own `main` (`processes.rs`, `fresh_processes.rs`, `cluster_flight.rs`,
//! `fault_suite.rs`, `histories.rs`).

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

mod bad_inputs;
mod cache;
mod caller_deadlines;
mod cancellation;
mod conformance;
mod connections;
mod connectivity;
mod contention;
mod corrupt_state;
mod durations;
mod faults;
mod flight_redis;
mod from_config;
mod handoff;
mod handover;
mod lease_faults;
mod locks;
mod multi_lock_faults;
mod multi_locks;
mod operations;
mod outcome_faults;
mod own_client;
mod reconnect;
mod records;
mod replays;
mod replica_acks;
mod replica_acks_per_operation;
mod replicated;
mod resharding;
mod round_trips;
mod rw_lock_faults;
mod rw_locks;
mod semaphore_faults;
mod semaphores;
mod shutdown;
mod stalls;
mod topologies;
