//! The contract between coord's runtime and a coordination backend.
//!
//! A provider implements [`LockProvider`], [`IdempotencyStore`] and [`CacheStore`] (whose
//! methods all have defaults). The runtime owns everything
//! that is the same for every backend (reentrancy, the fencing-token scope, release on drop,
//! the fingerprint check, replay decoding, tracing); a provider owns only the state that must be
//! shared between callers, and the way its waiters are woken.
//!
//! Keys reach a provider as [`CallKey`] values, already escaped so that they contain no `{`,
//! `}` or control bytes: a provider takes [`CallKey::namespace`] and [`CallKey::op_key`] (or the
//! whole [`CallKey::qualified`] text) as they are, and never needs to split text. Two keys are
//! the same call exactly when they are equal.
//!
//! Every method is bounded in time: a provider that talks to a server applies its command
//! timeout and reports a [`BackendError`] instead of hanging.
//!
//! The `coord-conformance` crate pins the behaviour every provider must share; run it against a
//! new provider (`coord_conformance::conformance_suite!(fresh_coordinator);` in its tests)
//! before trusting it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::call_key::CallKey;
use crate::error::BackendError;

/// A boxed, `Send` future, the return type of provider methods (they are called through `dyn`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A random 128-bit token naming one acquisition (of a lock, or of an idempotency claim).
///
/// Release, renewal, completion and abandonment succeed only while the stored owner is this
/// token, so a holder whose lease lapsed can never free or overwrite a newer holder's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken(u128);

impl OwnerToken {
    /// A fresh token, unique within this process and, with overwhelming probability, across
    /// processes: 64 random bits drawn once per process, then a per-process counter.
    pub fn new() -> OwnerToken {
        static PROCESS_NONCE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let nonce = *PROCESS_NONCE.get_or_init(|| {
            let mut bytes = [0u8; 8];
            // If the OS has no entropy source, fall back to time and pid: tokens stay unique
            // within the process thanks to the counter, and unlikely to collide across processes.
            if getrandom::fill(&mut bytes).is_err() {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0);
                bytes = (now ^ ((std::process::id() as u64) << 32)).to_le_bytes();
            }
            u64::from_le_bytes(bytes)
        });
        let counter = NEXT.fetch_add(1, Ordering::Relaxed);
        OwnerToken(((nonce as u128) << 64) | counter as u128)
    }

    /// The token as a number.
    pub fn as_u128(self) -> u128 {
        self.0
    }

    /// Rebuilds a token from [`OwnerToken::as_u128`].
    pub fn from_u128(value: u128) -> OwnerToken {
        OwnerToken(value)
    }
}

impl Default for OwnerToken {
    fn default() -> Self {
        OwnerToken::new()
    }
}

impl std::fmt::Display for OwnerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// A number minted with every fenced acquisition, strictly greater than every token minted
/// before it for the same key.
///
/// Pass it along with every write the lock protects and have the resource reject a write whose
/// token is older than the newest it has seen: a holder that stalled past its lease then gets
/// its late writes refused instead of silently overwriting its successor's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token.
    pub fn new(value: u64) -> FencingToken {
        FencingToken(value)
    }

    /// The token as a number, for storing beside the data it guards.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for FencingToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// One request to take a lock.
#[derive(Debug, Clone)]
pub struct LockRequest<'a> {
    /// The call key to lock.
    pub key: &'a CallKey,
    /// The token that will own the lock.
    pub owner: OwnerToken,
    /// How long the lock is held if never released or renewed.
    pub lease: Duration,
    /// How long to keep trying. Zero means one attempt.
    pub wait: Duration,
    /// Whether to mint a fencing token with the acquisition.
    pub fenced: bool,
}

/// A lock this process holds, as the provider granted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockGrant {
    /// Present exactly when the request was fenced.
    pub fencing_token: Option<FencingToken>,
    /// True when the first attempt found the lock held and the grant came after waiting.
    pub contended: bool,
    /// When the lease began on this process's clock, for a provider that knows it (the
    /// in-process one does). `None` lets the runtime time the lease from when the successful
    /// attempt was sent, which is never later than when it began.
    pub lease_began: Option<tokio::time::Instant>,
}

/// What releasing a lock found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The lock was ours and is now free.
    Released,
    /// The lock was no longer ours: the lease lapsed (and perhaps someone else holds it now).
    /// Nothing was changed.
    NotHeld,
}

/// What renewing a lease found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewOutcome {
    /// The lease now ends `lease` from the moment of renewal.
    Renewed,
    /// The token is gone: the hold is lost, for the reason given ([`LossCause::TakenByOther`]
    /// or [`LossCause::Expired`]; a provider never reports [`LossCause::BackendUnreachable`],
    /// which the runtime decides on its own clock).
    Lost(LossCause),
}

/// Why a hold (a lock, or an in-flight marker) was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossCause {
    /// Another owner holds the key now: our lease ended and someone else took it.
    TakenByOther,
    /// The lease ended before a renewal reached the backend, and the key was found free (or
    /// in a state that is no longer ours, such as an in-flight marker past its lease).
    Expired,
    /// The backend could not confirm a renewal for a whole lease (unreachable, or slower than
    /// the lease): the lease may have ended there, so the hold is treated as lost.
    BackendUnreachable,
    /// [`Coordinator::shutdown`](crate::Coordinator::shutdown) released the lock while the
    /// body still ran: the process is going away.
    ShutDown,
}

impl LossCause {
    /// A short, stable name: `taken_by_other`, `expired`, `backend_unreachable`, `shut_down`.
    pub fn as_str(self) -> &'static str {
        match self {
            LossCause::TakenByOther => "taken_by_other",
            LossCause::Expired => "expired",
            LossCause::BackendUnreachable => "backend_unreachable",
            LossCause::ShutDown => "shut_down",
        }
    }
}

impl std::fmt::Display for LossCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LossCause::TakenByOther => "taken by another owner",
            LossCause::Expired => "the lease expired before it was renewed",
            LossCause::BackendUnreachable => "the backend was unreachable for a whole lease",
            LossCause::ShutDown => "the coordinator shut down and released it",
        })
    }
}

/// Mutual exclusion with leases. Waiting is the provider's business, because how waiters are
/// woken is what distinguishes backends.
///
/// # Contract
/// * `acquire` returns `Ok(Some(grant))` when `req.owner` now holds `req.key`, `Ok(None)` when
///   the key stayed held by others for all of `req.wait` (one attempt when zero). A lock whose
///   lease ran out is free. A release must wake waiters without polling (a backstop at the
///   holder's remaining lease is allowed), and one release wakes one waiter.
/// * With `req.fenced`, the grant carries a fencing token greater than any earlier one for the
///   key; without it, no token, and no fence state is created.
/// * `release` and `renew` are owner-scoped: they change nothing unless `owner` holds `key`.
///   Both are idempotent.
/// * If the future of `acquire` is dropped before it completes, the provider must not leave
///   the lock held by `req.owner` beyond what the runtime's follow-up `release` cleans: the
///   runtime always releases a token whose acquire was cancelled.
pub trait LockProvider: Send + Sync + 'static {
    /// Takes `req.key` for `req.owner`, waiting up to `req.wait`.
    fn acquire<'a>(
        &'a self,
        req: LockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<LockGrant>, BackendError>>;

    /// Frees `key` if `owner` holds it.
    fn release<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>>;

    /// Extends `owner`'s lease on `key` to `lease` from now.
    fn renew<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>>;

    /// Releases `key` for `owner` in the background: called when a guard is dropped without
    /// being released (the caller was cancelled or the body panicked), when an acquire failed
    /// in a way that may have landed (its reply was lost), and when a release itself failed.
    /// The default spawns `release` on the current tokio runtime and retries it with backoff
    /// until it gets an answer or `lease_left` has passed (after that the lease has freed the
    /// lock anyway); a provider whose release is synchronous can do it inline.
    fn release_detached(self: Arc<Self>, key: CallKey, owner: OwnerToken, lease_left: Duration) {
        crate::runtime::detach::spawn_retried("releasing the lock", key, lease_left, move |key| {
            let this = self.clone();
            async move { this.release(&key, owner).await.map(|_| true) }
        });
    }
}

/// A 128-bit digest of the parameters an idempotency key was first used with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 16]);

/// What a claim found at an idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// No record existed (or the last one expired): the caller now owns an in-flight marker and
    /// must complete or abandon it.
    Claimed,
    /// Another caller's in-flight marker holds the key.
    InFlight {
        /// The fingerprint stored with that marker.
        fingerprint: Option<Fingerprint>,
        /// How long until that marker's lease ends, as the backend sees it.
        remaining: Duration,
    },
    /// A completed outcome is stored.
    Completed {
        /// The encoded outcome.
        payload: Arc<[u8]>,
        /// The fingerprint stored with it.
        fingerprint: Option<Fingerprint>,
        /// How long ago the outcome was stored, by the backend's clock (Redis: the server's;
        /// in-process: this process's monotonic clock). `None` when the backend does not know,
        /// as for records written by a version of coord that did not store write times.
        age: Option<Duration>,
    },
    /// An earlier caller's marker lapsed without completion, and was kept (the claim that made
    /// it asked for `keep_abandoned_for`): the outcome of that call is unknown. Nothing was
    /// claimed.
    Abandoned {
        /// The fingerprint stored with the marker.
        fingerprint: Option<Fingerprint>,
    },
}

/// One request to claim an idempotency key.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// The call key.
    pub key: &'a CallKey,
    /// The token that owns the in-flight marker if the claim succeeds.
    pub owner: OwnerToken,
    /// How long the in-flight marker lives if never completed, abandoned or renewed.
    pub in_flight_lease: Duration,
    /// The fingerprint to store with the marker (and, later, with the completed record).
    pub fingerprint: Option<Fingerprint>,
    /// `None`: a marker whose lease lapses disappears, and the next claim succeeds
    /// (at-least-once). `Some(d)`: the marker is kept for `d` after it lapses without
    /// completion, and claims report [`ClaimOutcome::Abandoned`] (at-most-once); only
    /// [`IdempotencyStore::purge`] or expiry removes it.
    pub keep_abandoned_for: Option<Duration>,
}

/// One request to store the outcome of a claimed call.
#[derive(Debug, Clone)]
pub struct CompleteRequest<'a> {
    /// The call key.
    pub key: &'a CallKey,
    /// The token that claimed the key.
    pub owner: OwnerToken,
    /// The encoded outcome.
    pub payload: Arc<[u8]>,
    /// How long the completed record is kept.
    pub retention: Duration,
    /// The fingerprint given at claim time. Stored only when completion has to create the
    /// record because the marker is gone (see [`CompleteOutcome::StoredWithoutMarker`]).
    pub fingerprint: Option<Fingerprint>,
}

/// What storing an outcome found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompleteOutcome {
    /// The owner's marker (live, or lapsed and kept) became the completed record. Also the
    /// answer when this very completion was already stored (a resent command): completing is
    /// idempotent for its owner.
    Stored,
    /// The marker was gone (its lease lapsed, it was evicted, the server restarted without
    /// persistence) and no other caller had claimed the key: the completed record was created
    /// with the request's fingerprint, so a duplicate replays instead of running again.
    StoredWithoutMarker,
    /// Another caller claimed the key after this owner's marker was lost: nothing was stored,
    /// and the body has run (or is running) twice.
    Superseded {
        /// The owner found at the key, when the backend records it.
        other: Option<OwnerToken>,
        /// Whether that other caller has already completed.
        completed: bool,
    },
}

impl CompleteOutcome {
    /// True when the outcome is now stored at the key.
    pub fn is_stored(self) -> bool {
        matches!(
            self,
            CompleteOutcome::Stored | CompleteOutcome::StoredWithoutMarker
        )
    }
}

/// Storage for idempotency records: an in-flight marker with its own lease, then the completed
/// outcome for the retention period.
///
/// # Contract
/// * `claim` is atomic: it either creates the in-flight marker or returns the existing record,
///   with the fingerprint stored in it. It never compares fingerprints: the runtime does, in one
///   place. A claim by the owner that already holds the live marker (a resent command whose
///   first send landed) answers [`ClaimOutcome::Claimed`] again.
/// * `complete` stores the outcome while `owner` holds the in-flight marker (a lapsed marker
///   kept under `keep_abandoned_for` is still its owner's: a late completion resolves the
///   unknown outcome), keeping the fingerprint given at claim time, for `retention`. When no
///   record is there at all, it creates the completed record in the same atomic step
///   ([`CompleteOutcome::StoredWithoutMarker`]); when another owner's marker or record is
///   there, it changes nothing ([`CompleteOutcome::Superseded`]). Completing twice with the
///   same owner answers `Stored` both times.
/// * `abandon` removes the marker and succeeds (`true`) only while `owner` holds it.
/// * `wait_settled` returns once the marker at `key` is gone or completed, or after `timeout`,
///   whichever is first; it returns at once when no marker is in flight. Completion and
///   abandonment wake waiters without polling.
/// * Expiry is measured by the backend's clock (for Redis, the server's), never by comparing
///   client timestamps.
pub trait IdempotencyStore: Send + Sync + 'static {
    /// Claims `req.key` or reads the record stored there.
    fn claim<'a>(
        &'a self,
        req: ClaimRequest<'a>,
    ) -> BoxFuture<'a, Result<ClaimOutcome, BackendError>>;

    /// Stores `req.payload` as the outcome of `req.key` (see the contract above).
    fn complete<'a>(
        &'a self,
        req: CompleteRequest<'a>,
    ) -> BoxFuture<'a, Result<CompleteOutcome, BackendError>>;

    /// Removes the in-flight marker of `key` if `owner` still holds it.
    fn abandon<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>>;

    /// Waits until the in-flight marker at `key` settles, at most `timeout`.
    fn wait_settled<'a>(
        &'a self,
        key: &'a CallKey,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>>;

    /// Extends `owner`'s in-flight marker at `key` to `lease` from now (for `renew = ..` on
    /// `#[idempotent]`). Owner-checked like `complete`. The default reports that the store
    /// cannot renew, which makes a renewing call treat its marker as lost once its lease
    /// passes: implement it in any store used with renewal.
    fn renew_marker<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        let _ = (key, owner, lease);
        Box::pin(std::future::ready(Err(BackendError::new(
            crate::error::BackendErrorKind::Config,
            "this idempotency store does not implement renew_marker",
        ))))
    }

    /// Removes whatever record is stored at `key` (an operator's tool, e.g. to resolve an
    /// abandoned record after reconciling by hand). Returns whether a record was there. The
    /// default reports that the store cannot purge.
    fn purge<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        let _ = key;
        Box::pin(std::future::ready(Err(BackendError::new(
            crate::error::BackendErrorKind::Config,
            "this idempotency store does not implement purge",
        ))))
    }

    /// Abandons `owner`'s marker at `key` in the background: called when the owner of a marker
    /// was dropped (cancelled or panicked), when a claim failed in a way that may have landed
    /// (its reply was lost: the key must not stay blocked for a body that never ran), and when
    /// an abandon itself failed. The default spawns `abandon` on the current tokio runtime and
    /// retries it with backoff until it gets an answer or `lease_left` has passed.
    fn abandon_detached(self: Arc<Self>, key: CallKey, owner: OwnerToken, lease_left: Duration) {
        crate::runtime::detach::spawn_retried(
            "clearing the in-flight marker",
            key,
            lease_left,
            move |key| {
                let this = self.clone();
                async move { this.abandon(&key, owner).await.map(|_| true) }
            },
        );
    }
}

/// An entry read from a [`CacheStore`]: the bytes `cache_set` stored, and how long the entry
/// has left, when the store can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEntry {
    /// The bytes as stored.
    pub value: Vec<u8>,
    /// The entry's remaining time to live by the store's clock; `None` when the store does not
    /// report it (the runtime then keeps a copy in a local tier for at most its own local TTL).
    pub ttl_left: Option<Duration>,
}

/// The shared tier of `#[cached(scope = "shared" | "two_tier")]`: byte values with a time to
/// live, seen by every process sharing the provider.
///
/// # Contract
/// * `cache_set` stores `value` at `key`, replacing whatever was there, for `ttl` measured by
///   the store's clock (for Redis, the server's). `cache_get` never returns an entry whose
///   `ttl` has passed.
/// * `cache_delete` removes the entry and says whether one was there.
/// * The cache is separate from locks and idempotency records: the same `key` in both never
///   collide.
///
/// Every method has a default that reports the cache as not supported (a
/// [`BackendErrorKind::Config`](crate::BackendErrorKind::Config) error; `cache_delete`
/// answers `Ok(false)`, as a store that keeps no cache has nothing to delete). The runtime
/// treats a failed read as a miss and a failed write as a lost write, so a provider without a
/// cache still runs every call, only without the shared tier.
pub trait CacheStore: Send + Sync + 'static {
    /// The entry at `key`, unless there is none or it expired.
    fn cache_get<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<Option<CacheEntry>, BackendError>> {
        let _ = key;
        Box::pin(std::future::ready(Err(not_supported())))
    }

    /// Stores `value` at `key` for `ttl`.
    fn cache_set<'a>(
        &'a self,
        key: &'a CallKey,
        value: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        let _ = (key, value, ttl);
        Box::pin(std::future::ready(Err(not_supported())))
    }

    /// Removes the entry at `key`; `true` if there was one.
    fn cache_delete<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        let _ = key;
        Box::pin(std::future::ready(Ok(false)))
    }
}

fn not_supported() -> BackendError {
    BackendError::new(
        crate::error::BackendErrorKind::Config,
        "this provider does not implement CacheStore (no shared cache)",
    )
}

/// A monotonic deadline helper for providers implementing `wait`.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(Instant);

impl Deadline {
    /// The deadline `wait` from now. Saturates: a `wait` too large to add to the clock (e.g.
    /// `Duration::MAX`) is a deadline decades away, which means "until cancelled".
    pub fn after(wait: Duration) -> Deadline {
        let now = tokio::time::Instant::now();
        Deadline(crate::runtime::time::later(now, wait).into_std())
    }

    /// Time left, zero once passed.
    pub fn remaining(&self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }

    /// The instant itself.
    pub fn instant(&self) -> Instant {
        self.0
    }
}

/// A shared provider is a provider: lets callers keep a handle (`Arc<P>`) to a provider they
/// also give to a coordinator, e.g. to inspect it in tests.
impl<P: LockProvider> LockProvider for Arc<P> {
    fn acquire<'a>(
        &'a self,
        req: LockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<LockGrant>, BackendError>> {
        (**self).acquire(req)
    }

    fn release<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        (**self).release(key, owner)
    }

    fn renew<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        (**self).renew(key, owner, lease)
    }

    fn release_detached(self: Arc<Self>, key: CallKey, owner: OwnerToken, lease_left: Duration) {
        P::release_detached((*self).clone(), key, owner, lease_left)
    }
}

impl<P: IdempotencyStore> IdempotencyStore for Arc<P> {
    fn claim<'a>(
        &'a self,
        req: ClaimRequest<'a>,
    ) -> BoxFuture<'a, Result<ClaimOutcome, BackendError>> {
        (**self).claim(req)
    }

    fn complete<'a>(
        &'a self,
        req: CompleteRequest<'a>,
    ) -> BoxFuture<'a, Result<CompleteOutcome, BackendError>> {
        (**self).complete(req)
    }

    fn abandon<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        (**self).abandon(key, owner)
    }

    fn wait_settled<'a>(
        &'a self,
        key: &'a CallKey,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        (**self).wait_settled(key, timeout)
    }

    fn renew_marker<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        (**self).renew_marker(key, owner, lease)
    }

    fn purge<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        (**self).purge(key)
    }

    fn abandon_detached(self: Arc<Self>, key: CallKey, owner: OwnerToken, lease_left: Duration) {
        P::abandon_detached((*self).clone(), key, owner, lease_left)
    }
}

impl<P: CacheStore> CacheStore for Arc<P> {
    fn cache_get<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<Option<CacheEntry>, BackendError>> {
        (**self).cache_get(key)
    }

    fn cache_set<'a>(
        &'a self,
        key: &'a CallKey,
        value: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        (**self).cache_set(key, value, ttl)
    }

    fn cache_delete<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        (**self).cache_delete(key)
    }
}
