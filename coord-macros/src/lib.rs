//! The attribute macros of coord: `#[idempotent]`, `#[cached]`, `#[single_flight]` and
//! `#[distributed_lock]`.
//!
//! Use them through `coord_core`, which re-exports them; the code they generate calls into
//! `coord_core`. Each attribute goes on an `async fn` with a body: a free function, an
//! inherent method (`&self`, `&mut self`, `self: Arc<Self>`, ...) or a method of a trait impl.
//! The signature is kept as written, and the body runs inside the layers.
//!
//! # Stacking
//!
//! The attributes can be combined on one function, in any order. The first one to expand
//! takes in the others and emits one function whose layers always nest the same way:
//! idempotency outermost, the cache next, then single-flight, the lock innermost. A replay or a
//! cache hit therefore never touches single-flight or the lock, and concurrent duplicates
//! share one lock acquisition.
//!
//! The layers share the call: its key is derived once, from the `key_from` given on any of
//! them. `key_from`, `name`, `coordinator`, `crate` and `record_key` may be written on one attribute or
//! repeated with the same value on several; different values are an error. Each attribute
//! may appear once per function.
//!
//! # Options every attribute takes
//!
//! * `key_from`: the parameters that make up the key, as a name (`"tenant_id"` or
//!   `tenant_id`), a field of one (`"order.customer_id"`, `"self.id"`) or a list
//!   (`["tenant_id", "region"]`). Each part is a `coord_core::KeyPart`. Without it the key is
//!   the operation name alone, so every call shares one key.
//! * `name = "payments.charge"`: the operation name, the first part of every key. ASCII
//!   letters, digits and `. _ - /`. Defaults to the module path and the function name.
//! * `coordinator = <expr>`: the coordinator to use, evaluated on every call (a
//!   `coord_core::Coordinator`, or anything that is `AsRef` of one). Defaults to the installed
//!   one. The expression may also be given in a string.
//! * `crate = "path"`: where `coord_core` is, for a renamed dependency. Defaults to
//!   `::coord_core`.
//! * `record_key = true | false`: record the call's key on its `coord` span (keys can carry
//!   personal data, so it is off unless asked for). Default `false`.
//! * `profile = "payments"`: take `lease`, `wait`, `retention`, `in_flight_lease`, `renew`
//!   and `on_backend_error` from the coordinator's configured profile of that name at run
//!   time; a field the profile does not set keeps the attribute's literal. A name the
//!   coordinator's configuration does not have is `CoordError::UnknownProfile` at the call,
//!   before anything runs. Needs `#[idempotent]` or `#[distributed_lock]` on the function.
//!
//! # Durations
//!
//! Written as strings: a whole number and a unit (`ms`, `s`, `m`, `h`, `d`), such as `"250ms"`,
//! `"30s"`, `"5m"`, `"24h"`, or several terms from the largest unit down, such as `"1m30s"`.
//! The grammar is the `coord-duration` crate's, the one the run-time configuration reads too,
//! so a duration means the same in an attribute and in a configuration file.

mod args;
mod errors;
mod expand;
mod fallback;
mod model;
mod multi_lock_model;
mod options;
mod parse_key_paths;
mod parse_value;
mod suggest;
mod value;

use proc_macro::TokenStream;

use crate::options::Kind;

/// Runs the function at most once per key: a successful outcome is stored and replayed to
/// later calls with the same key, for `retention`. Errors are not stored, so a failed call can
/// be retried.
///
/// The function must return `Result<T, E>` (any alias of it) where `E: From<CoordError>` and
/// `T` is serializable, since a replay hands back the stored `T`.
///
/// ```
/// # use coord_core::{CoordError, idempotent};
/// # #[derive(serde::Serialize)] struct Order { cents: u64 }
/// # type PaymentError = CoordError;
/// #[idempotent(key_from = "idempotency_key", fingerprint = ["order"], retention = "24h")]
/// async fn charge(idempotency_key: String, order: Order) -> Result<u64, PaymentError> {
///     // runs once per idempotency key
///     Ok(order.cents)
/// }
/// ```
///
/// # Options
///
/// Besides `key_from` (required, on this attribute or on another coord attribute of the same
/// function), `name`, `coordinator`, `crate` and `record_key` (see the crate documentation):
///
/// * `retention = "24h"`: how long a successful outcome is kept and replayed. Default `"24h"`.
/// * `in_flight_lease = "30s"`: how long a running call's claim on the key lasts if its
///   process dies before finishing. Default `"30s"`.
/// * `wait = "0s"`: how long a duplicate waits for a running call with the same key before
///   failing with `CoordError::InFlight`. Default `"0s"` (fail at once).
/// * `fingerprint = ["order", ..]`: parameters (or fields of them) whose serialized value is
///   stored with the outcome; reusing the key with different values fails with
///   `CoordError::KeyReused` instead of replaying another request's outcome.
/// * `on_backend_error = "fail_closed" | "fail_open"`: what to do when the store fails.
///   Default: the coordinator's policy.
/// * `renew = true | "10s"`: renew the in-flight marker while the body runs (every third of
///   `in_flight_lease`, or at the interval given), so a long call is not taken for a crashed
///   one. Must be shorter than `in_flight_lease`. Default `false` (no renewal).
/// * `on_lost = "cancel" | "signal"`: what happens when the marker's lease is lost while the
///   body runs. `cancel` (the default when renewing) drops the body and returns
///   `CoordError::LockLost`; `signal` lets the body run on.
/// * `replica_acks = 1` with `replica_acks_timeout = "500ms"`: wait until this many replicas
///   hold the claim, the completion and each marker renewal, for at most the timeout, whatever
///   the provider's own setting (`RedisProviderBuilder::replica_acks`); fewer acknowledgements
///   fail the write as the provider's setting does (`NotReplicated`: the claim is undone and
///   refused, the completion retried, then `OutcomeNotStored`). `replica_acks = 0` turns
///   waiting off for this operation even when the provider waits. Without it, the provider's
///   setting. A provider that does not replicate (in-process, PostgreSQL) refuses `n` of 1 or
///   more with `CoordError::Unsupported` before anything is written; `0` is accepted everywhere.
/// * `replica_acks_timeout = "500ms"`: how long each write waits for the `replica_acks`
///   replicas; required with `replica_acks` of 1 or more, refused without it or with `0`. Must
///   be below the provider's command timeout (the `WAIT` shares its round trip).
/// * `on_abandoned = "rerun" | "fail"`: what a duplicate does when an earlier call's marker
///   lapsed without completing. `rerun` runs the body again (at-least-once); `fail` returns
///   `CoordError::OutcomeUnknown` and keeps the record for an operator (at-most-once, for
///   payments). Under `fail`, a call whose future is dropped or whose body panics mid-way
///   also leaves its marker to lapse into that state (the body may have had effects); under
///   `rerun` it is cleared at once. Default `"rerun"`.
/// * `on_store_error = "error" | "return_ok"`: what a call returns when its body succeeded but
///   the `Ok` outcome could not be stored. `error` returns `CoordError::OutcomeNotStored` (not
///   retryable: the work ran); `return_ok` returns the `Ok`, flags the call's `CallReport` and
///   counts it. Default `"error"`.
/// * `on_missing_key = "fail" | "run_unprotected"`: what a call does when a part of its key is
///   `None` (such as an absent idempotency key). `fail` returns `CoordError::MissingKey` before
///   the body runs, so keyless calls never share one record; `run_unprotected` runs the body
///   without this layer and counts it in `Coordinator::metrics().unprotected_runs()`. Default
///   `"fail"`.
/// * `transaction = "tx"`: write the outcome **in the caller's database transaction**, the
///   parameter `tx` (a `&mut` reference to a transaction of the provider's database, such as
///   `coord_postgres::Transaction`), instead of on the provider's own connection: the record
///   then commits if and only if the body's writes in `tx` commit. The key is claimed first, on
///   the provider's connection, so duplicates see it at once; the body uses `tx` as written;
///   then the completion is written in `tx`, owner-checked inside it. If that fails (the
///   marker lapsed during the body and another caller took the key, or the write failed), the
///   call returns `CoordError::TransactionRollbackOnly` and `tx` can no longer commit: roll it
///   back. A replay never touches `tx`; an `Err` from the body frees the key as usual. Needs a
///   provider that takes transactional claims (others refuse the call before the body, even
///   under `fail_open`); cannot go with `on_abandoned = "fail"` (a transactional run never
///   leaves an unknown outcome) or `on_store_error = "return_ok"`. What each failure leaves is
///   tabled in `coord_core::handle::TransactionRun`.
///
/// ```
/// # use coord_core::provider::{BackendError, BoxFuture, CompleteRequest, OutcomeTransaction, TransactionalCompletion};
/// # use coord_core::{CoordError, idempotent};
/// # struct Transaction;
/// # impl OutcomeTransaction for Transaction {
/// #     fn complete_in_transaction<'a>(&'a mut self, _: CompleteRequest<'a>) -> BoxFuture<'a, Result<TransactionalCompletion, BackendError>> { Box::pin(async { Ok(TransactionalCompletion::Written) }) }
/// #     fn set_rollback_only<'a>(&'a mut self, _: &'a str) -> BoxFuture<'a, Result<(), BackendError>> { Box::pin(async { Ok(()) }) }
/// # }
/// # impl Transaction { async fn insert_charge(&mut self, _: &str, cents: u64) -> Result<u64, CoordError> { Ok(cents) } }
/// #[idempotent(key_from = "order_id", transaction = "tx")]
/// async fn charge(tx: &mut Transaction, order_id: &str, cents: u64) -> Result<u64, CoordError> {
///     // the charge row and the idempotency record commit together, or not at all
///     tx.insert_charge(order_id, cents).await
/// }
/// ```
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand_stack(Kind::Idempotent, args.into(), item.into()).into()
}

/// Serves the function's answer from a cache for `ttl`: a later call with the same key gets a
/// clone of it without running the body (nor single-flight or the lock, which sit inside the
/// cache). Only `Ok` outcomes are cached unless `cache_err = true`.
///
/// The function must return `Result<T, E>` with `T` and `E` `Clone + Send + Sync + 'static`
/// (a hit hands out a clone). A shared scope also needs `T` (and, with `cache_err`, `E`) to be
/// serde-serializable: entries are stored with the coordinator's codec.
///
/// ```
/// # use coord_core::cached;
/// #[cached(key_from = "symbol", ttl = "30s", max_capacity = 1_000)]
/// async fn quote(symbol: String) -> Result<u64, String> {
///     // runs at most once per symbol every 30 s in this process
///     Ok(symbol.len() as u64)
/// }
/// ```
///
/// Nothing the cache does becomes an error for the caller: a shared read that fails is a miss
/// (counted with `outcome = "error"`), a shared entry that does not decode (written by another
/// build) is a miss with a warning (`outcome = "stale"`), and a shared write that fails is
/// logged and counted. Expired entries are never served. Remove an entry in code with
/// `Coordinator::invalidate`.
///
/// # Options
///
/// Besides `key_from` (optional: without it, one answer for the whole operation), `name`,
/// `coordinator`, `crate` and `record_key` (see the crate documentation):
///
/// * `ttl = "30s"`: how long an answer is served. Required.
/// * `scope = "local" | "shared" | "two_tier"`: where answers are kept. `local`, a bounded
///   in-memory cache of this operation in this process; `shared`, the provider, so every
///   process sharing it sees one entry; `two_tier`, a local tier in front of the shared one.
///   Default `"local"`.
/// * `max_capacity = 10_000`: how many entries the local tier holds (moka's bound, which may
///   be exceeded briefly). Not for `shared`. Default `10_000`.
/// * `local_ttl = "5s"`: how long `two_tier` keeps an answer in this process, never past the
///   shared entry's expiry. Must be shorter than `ttl`; without it, a tenth of `ttl`.
/// * `cache_err = true | false`: cache `Err` outcomes too. Default `false`.
#[proc_macro_attribute]
pub fn cached(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand_stack(Kind::Cached, args.into(), item.into()).into()
}

/// Makes concurrent calls with the same key in this process share one run: the first call
/// runs the body and the others receive a clone of its outcome.
///
/// The output must be `Clone + Send + 'static`. Any return type works otherwise; an error
/// outcome is shared like a success.
///
/// ```
/// # use std::sync::Arc;
/// # use coord_core::single_flight;
/// #[single_flight(key_from = "symbol")]
/// async fn quote(symbol: &str) -> Result<u64, Arc<std::io::Error>> {
///     // concurrent calls for one symbol fetch once
///     Ok(symbol.len() as u64)
/// }
/// ```
///
/// With `scope = "cluster"`, concurrent calls with one key on every instance sharing the
/// provider share one run: the calls of each instance coalesce locally first, then one leader
/// claims the flight with a lease and the other instances wait for its outcome (pub/sub with
/// Redis, no polling). The outcome is handed over for a few seconds only, never remembered. A
/// leader that is cancelled or crashes is replaced by exactly one waiting instance (at once, or
/// after its lease). The output must then be `Result<T, E>` with `T` serde-serializable and
/// `E: From<CoordError>`; an `Err` reaches the other instances when `E` is serde-serializable
/// too, else they get `CoordError::LeaderFailed`. This is an optimisation with a lease, not a
/// promise of one run: use `#[idempotent]` for that.
///
/// # Options
///
/// `key_from` (optional: without it, all concurrent calls share one run), `name`,
/// `coordinator`, `crate` and `record_key`; see the crate documentation.
///
/// * `replica_acks = 1` with `replica_acks_timeout = "500ms"`: wait until this many replicas
///   hold the leader's claim and each renewal of it, for at most the timeout,
///   whatever the provider's own setting (`RedisProviderBuilder::replica_acks`). A claim too
///   few replicas acknowledged is given up and fails as any fault of the claim does
///   (`NotReplicated`; the body does not run, unless the coordinator's policy is `fail_open`,
///   which runs it for this instance's callers only); a renewal too few acknowledged is retried
///   at the next one. `replica_acks = 0` turns waiting off for this flight even when the
///   provider waits. Without it, the provider's setting. `scope = "cluster"` only (a process
///   flight writes nothing to the provider). A provider that does not replicate (in-process,
///   PostgreSQL) refuses `n` of 1 or more with `CoordError::Unsupported` before anything is
///   claimed; `0` is accepted everywhere. The body is not in its scope: a lock the body takes
///   follows its own setting.
/// * `replica_acks_timeout = "500ms"`: how long each write waits for the `replica_acks`
///   replicas; required with `replica_acks` of 1 or more, refused without it or with `0`. Must
///   be below the provider's command timeout (the `WAIT` shares its round trip).
/// * `scope = "process" | "cluster"`: which calls share a run: this process's, or those of
///   every instance sharing the provider. Default `"process"`.
/// * `lease = "10s"`: how long a cluster leader's claim lasts if its instance dies (renewed
///   every third of it while the body runs). `scope = "cluster"` only; without it, 10 s.
#[proc_macro_attribute]
pub fn single_flight(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand_stack(Kind::SingleFlight, args.into(), item.into()).into()
}

/// Runs the body while holding a lock on the key, shared by every process using the same
/// coordinator. The lock is a lease: if the holder dies, it frees itself after `lease`.
///
/// The function must return `Result<T, E>` (any alias of it) where `E: From<CoordError>`: a
/// lock that could not be taken is reported as `CoordError::LockNotAcquired`.
///
/// ```
/// # use coord_core::{CoordError, distributed_lock, fencing_token};
/// #[distributed_lock(key_from = "tenant_id", lease = "5m", fenced = true)]
/// async fn rebuild(tenant_id: u64) -> Result<(), CoordError> {
///     // one holder per tenant at a time; pass the token to every write
///     let _token = fencing_token();
///     Ok(())
/// }
/// ```
///
/// # Options
///
/// Besides `key_from` (optional: without it, one lock for the whole operation), `name`,
/// `coordinator`, `crate` and `record_key` (see the crate documentation):
///
/// * `lease = "30s"`: how long the lock lasts if its holder stops without releasing it.
///   Default `"30s"`.
/// * `wait = "0s"`: how long to wait for the lock before failing with
///   `CoordError::LockNotAcquired`. Default `"0s"` (one attempt).
/// * `fenced = true | false`: mint a fencing token with each acquisition, read in the body
///   with `coord_core::fencing_token()`. Default `false`.
/// * `permits = 5`: a semaphore instead of a lock: at most this many calls hold the key at
///   once, each with one permit, a lease of its own and its own fencing token (always minted;
///   `fencing_token()` reads it). A whole number of at least 1. The limit is exact on one
///   store; a semaphore over several independent stores is not a semaphore. On a provider
///   without semaphores the call fails with `CoordError::Unsupported` and nothing runs.
///   Default: none (one holder, a lock).
/// * `mode = "read" | "write"`: a read-write lock instead of a lock: `"read"` holds the key
///   together with other readers, `"write"` alone. A waiting writer keeps new readers out
///   (writer preference), for a short claim of its own if it crashes. Every hold has its own
///   lease and fencing token, from one counter per key shared by both modes (always minted;
///   `fencing_token()` reads it). A `"read"` body that reaches a `"write"` call of the same
///   key fails at once with `CoordError::LockUpgrade` (no upgrade). Not with `permits` or
///   `fenced = false`. On a provider without read-write locks the call fails with
///   `CoordError::Unsupported` and nothing runs. Default: none (a lock).
/// * `key_from_each = "accounts"`: a multi-key lock instead of one lock: one key per element
///   of this collection parameter (a `Vec`, slice, array, `VecDeque`, `BTreeSet` or
///   `HashSet` of key parts; anything else fails to compile), each the operation's name with
///   the element as its part. The keys are de-duplicated and taken in one canonical order,
///   so calls listing them in different orders never deadlock; all together in one step
///   where the provider keeps them together (in-process, one Redis server or hash slot),
///   otherwise one by one with everything released if one cannot be had. Every key is fenced
///   (read each token with `coord_core::fencing_token_of(&key)`), excludes a single lock of
///   the same key (same `name`), and is renewed with the others; the loss of any key is the
///   loss of the whole. Not with `key_from` on the same attribute, `permits` or
///   `fenced = false`. Default: none (one lock on the call's key).
/// * `on_backend_error = "fail_closed" | "fail_open"`: what to do when the lock backend fails.
///   Default: the coordinator's policy.
/// * `renew = true | "10s"`: extend the lease while the body runs (every third of it, or at
///   the interval given), by one shared renewal task per coordinator. Must be shorter than
///   `lease`. Default `false` (no renewal).
/// * `on_lost = "cancel" | "signal"`: what happens when the lease is lost while the body runs
///   (renewal found another owner, or a whole lease passed without a confirmed renewal).
///   `cancel` (the default when renewing) drops the body at its next await and returns
///   `CoordError::LockLost`; `signal` lets the body watch `coord_core::lock_lost()` and
///   `coord_core::is_held()`.
/// * `replica_acks = 1` with `replica_acks_timeout = "500ms"`: wait until this many replicas
///   hold each grant and renewal of this lock (of every key with `key_from_each`; of the permit
///   with `permits`; of the hold with `mode`), for at most the timeout, whatever the provider's
///   own setting (`RedisProviderBuilder::replica_acks`); fewer acknowledgements fail the write
///   as the provider's setting does (a grant is released and refused with `NotReplicated`, a
///   renewal counts as failed and the hold is lost). `replica_acks = 0` turns waiting off for
///   this lock even when the provider waits. Without it, the provider's setting. A provider
///   that does not replicate (in-process, PostgreSQL) refuses `n` of 1 or more with
///   `CoordError::Unsupported` before anything is taken; `0` is accepted everywhere.
/// * `replica_acks_timeout = "500ms"`: how long each write waits for the `replica_acks`
///   replicas; required with `replica_acks` of 1 or more, refused without it or with `0`. Must
///   be below the provider's command timeout (the `WAIT` shares its round trip).
///
/// A lease bounds a crash; it is not consensus. Fence the writes the lock protects.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand_stack(Kind::DistributedLock, args.into(), item.into()).into()
}
