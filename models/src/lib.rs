//! Explicit-state models of coord's coordination protocols, checked exhaustively with
//! [stateright](https://docs.rs/stateright).
//!
//! * [`record`]: the idempotency-record protocol behind `#[idempotent]` (claim, complete,
//!   abandon, renew, lease expiry, lost replies, client crashes, store data loss).
//! * [`lock`]: the lock protocol behind `#[distributed_lock]` (acquire, renew, release, lease
//!   expiry, pauses, lost replies, failover to a replica that missed the last write) and the
//!   fenced resource.
//! * [`lock_handover`]: the Redis lock's waiting path (queue entries, the release handing a
//!   contended lock to the first waiter in the same step, in memory or with a claim window,
//!   claims lapsing, waiters crashing or giving up and releasing onward, lost replies).
//! * [`semaphore`]: the semaphore protocol behind `#[distributed_lock(permits = n)]` (acquire
//!   with expired permits dropped in the same step, renew, owner-checked release, lease
//!   expiry, pauses, lost replies) and the per-permit fencing tokens.
//! * [`rw_lock`]: the read-write lock protocol behind `#[distributed_lock(mode = ..)]`
//!   (read and write acquires with writer preference by a waiting writer's claim,
//!   mode-scoped release, renew, lease and claim expiry, lost replies) and its one fencing
//!   counter across modes.
//! * [`flight`]: the cluster flight protocol behind `#[single_flight(scope = "cluster")]`
//!   (claim, renew, fenced finish with per-leader hand-overs, abandon, crashes, lease expiry,
//!   takeover).
//! * [`transactional`]: the record protocol of `#[idempotent(transaction = "tx")]` (the claim
//!   on the store's connection, the completion written and row-locked in the caller's
//!   transaction, commit, rollback, lost commit replies, crashes, drops, lease expiry,
//!   takeover, a reaper).
//!
//! The lock, semaphore and read-write lock models share their client side, [`holders`]: calls
//! that acquire, hold and release over a network that loses requests and replies.
//!
//! Each module's documentation states the protocol rules the model follows, written so a
//! reader can hold them against the providers and the runtime, and the properties checked.
//! The models are small hand-written abstractions of that code, not generated from it: a
//! change to the protocol must be made here too for the checks to mean anything.
//!
//! # What a check proves, and what it does not
//!
//! A passing check means every reachable state of the model *within its bounds* satisfies
//! the `always` properties. The bounds are small (2-3 clients, 1-2 keys, leases of 2 ticks,
//! 3 ticks of clock for the lock), chosen so that each check runs in seconds; bugs that
//! need more actors or longer histories are out of reach. Each property also has a test that
//! runs the same checker on a deliberately broken variant ([`record::RecordBug`],
//! [`lock::LockBug`], [`semaphore::SemBug`], [`rw_lock::RwBug`], [`flight::FlightBug`], [`transactional::TxBug`]) and expects a counterexample, which shows the property can fail; and the
//! `sometimes` properties show that the interesting situations (an overlap after expiry, an
//! `OutcomeUnknown`, a rerun) are reached at all.
//!
//! Not covered, in any model (the flight model also leaves out lost replies, delayed
//! requests and the local coalescing inside an instance):
//!
//! * Requests delayed in the network are modelled only when asked for
//!   (`delayed_requests`), one per client at a time; by default each command runs, or not,
//!   at the moment it is sent. With delays on, the record model shows that a claim running
//!   after its own cleanup leaves an abandoned record for a body that never started (see
//!   `record`'s property list); the lock stays safe.
//! * Clock skew between clients and the store, except the failover clock assumption that
//!   [`lock::LockBug::FailoverWithoutClockAdvance`] drops on purpose. Leases are measured by
//!   the store's clock only, as the providers do.
//! * Waiting and wake-ups outside [`lock_handover`] (there a waiter is a client that
//!   retries), liveness and fairness: only safety properties are checked (the hand-over's
//!   "a crashed waiter does not hold the lock for ever" in its bounded form: an unconfirmed
//!   claim never has more than the claim window left).
//! * Fingerprints, retention expiry (completed records live for ever in the record model),
//!   and `fail_open`, which runs the body unguarded after a backend error and so gives up
//!   these guarantees by design ([`record::RecordBug::RunAfterLostClaim`] and
//!   [`lock::LockBug::EnterAfterLostAcquire`] are what it looks like to the checker).
//! * An outcome that cannot be encoded: the runtime abandons the marker after a body that
//!   returned `Ok`, so a retry runs the body again; the model's bodies always encode.
//! * The runtime's own loss detection from its clock (`BackendUnreachable`) in the lock
//!   model, where it would only make a holder stop earlier. In the record model a lost hold
//!   is modelled (`cancel_on_lost`), as it can happen at any moment.
//!
//! # What the checks found
//!
//! * A caller's claim delayed in the network past its own cleanup leaves, under
//!   `on_abandoned = "fail"`, an abandoned record for a body that never started
//!   (`delayed_requests`); a command sent on the same connection as the claim cannot
//!   overtake it, so the cleanup should not switch connections while a claim may be
//!   pending.
//! * A call dropped before its body started (its claim in flight, or answered and the body
//!   not yet polled) that leaves its marker makes, under `on_abandoned = "fail"`, an abandoned
//!   record for a body that never ran ([`record::RecordBug::KeepMarkerOfUnstartedDrop`]): the
//!   runtime arms the owner-checked clean-up before the claim can leave the process, and keeps
//!   it armed under either mode until the body is first polled.
//! * Abandoning the marker after the body was cancelled for a lost hold lets the next claim
//!   run the body again ([`record::RecordBug::AbandonAfterLostHold`]): the model's protocol
//!   leaves the record alone instead.
//! * Under `on_abandoned = "rerun"`, a caller stalled between its claim reply and the body's
//!   start runs the body after its marker lapsed, exactly as one whose body was running.
//! * The fence survives failover only if the new primary's clock is past the lost token
//!   ([`lock::LockBug::FailoverWithoutClockAdvance`]).
//!
//! # Running
//!
//! `cargo test -p coord-models` runs every check; add `--release` for speed and
//! `-- --nocapture` to see the state counts and times each check prints.

#![warn(missing_docs)]

pub mod flight;
pub mod holders;
pub mod lock;
pub mod lock_handover;
pub mod record;
pub mod rw_lock;
pub mod semaphore;
pub mod transactional;
