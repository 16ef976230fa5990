//! Recorded histories for coord's tests, checked against its promises: the Jepsen method on one
//! machine.
//!
//! A run has three parts, each a module here:
//!
//! - **Recording** ([`recorder`], [`event`]): every call's invocation and completion, with a
//!   monotonic timestamp (the same clock in every process of the machine), the process, the key,
//!   the owner, the fencing token, the outcome (`ok`, `fail` when it certainly had no effect,
//!   `info` when that is unknown) and the error kind. Histories are JSON lines, one [`Event`]
//!   a line, so a failed run can be read and re-checked later (the `check` binary of this
//!   crate does that).
//! - **Witnessing** ([`witness`]): a protected resource that takes fenced writes and body
//!   effects from every process over loopback TCP, and records what it saw, in its own order:
//!   which fenced writes it accepted or refused, and every effect of a body. Promises about
//!   fencing are judged where they matter, at the resource, not from what the clients believe.
//! - **Faults** ([`nemesis`]): a TCP proxy between clients and a server that delays, drops,
//!   holds, blackholes or half-opens connections, and seeded schedules that combine several
//!   faults in one run and hold every kind at least once. The check reports how many times
//!   each kind bit, and [`Report::faults_bit`] fails a run whose faults did not. Pausing,
//!   killing and restarting servers is left to the test (the testing crates of each backend
//!   do that); the schedule says when.
//! - **Checking** ([`mod@check`]): decides each promise on the whole history and reports every
//!   violation with the events that show it.
//!
//! [`crash`] is a run of its own, shared by the Redis and the PostgreSQL tests: lock holds
//! that span a server's kill and restart, and completed idempotent keys asked again after it,
//! so that a lock or a record lost in the crash is a violation the history shows.
//!
//! [`paused_holders`] is a run of its own, shared by the in-process and the Redis tests:
//! holders of one renewing fenced lock paused past their lease, judged at a resource.
//!
//! [`exiting_leader`] is a run of its own, shared by the Redis and the PostgreSQL tests: a
//! cluster single-flight leader whose process exits as soon as its callers are answered.
//!
//! [`child_process`] is the parent's side of a test binary with its own `main` that re-runs
//! itself as child processes, and the scenario runner of such a `main`.
//!
//! [`replica_acks`] declares operations of every kind that override the provider's replica
//! acknowledgement, which the replica-acknowledgement tests of every provider share.
//!
//! [`planted`] wraps a provider with a deliberate bug, so that a test can show the checker
//! fails when it should.
//!
//! This crate is test support: it is not published and promises nothing about compatibility.

pub mod check;
pub mod child_process;
pub mod clock;
pub mod crash;
pub mod event;
pub mod exiting_leader;
mod linearizable;
pub mod nemesis;
pub mod paused_holders;
pub mod planted;
pub mod recorder;
pub mod replica_acks;
pub mod witness;
pub mod workload;

pub use check::{Promise, Report, Violation, check};
pub use event::{CallId, Complete, Effect, EffectKind, Event, Fault, Invoke, Op, Outcome, Phase};
pub use recorder::{Recorder, read_jsonl, write_jsonl};
