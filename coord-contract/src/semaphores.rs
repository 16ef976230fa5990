//! Semaphores: up to `limit` holders of one key at once, each holding a leased permit with its
//! own owner and fencing token. An optional capability ([`Capability::Semaphores`]).
//!
//! One permit, as a provider sees it:
//!
//! 1. [`SemaphoreStore::acquire_permit`] takes one permit of `key` for `owner` while fewer than
//!    `limit` live permits of the key are held, minting a fencing token for it; when the
//!    semaphore is full it waits (woken when a permit frees, with a bounded re-check as a
//!    backstop) until `wait` has passed;
//! 2. the holder renews its permit ([`SemaphoreStore::renew_permit`]) while its work runs;
//! 3. the holder releases it ([`SemaphoreStore::release_permit`]), which wakes a waiter.
//!
//! A permit whose lease ran out (its holder crashed, stalled or stopped renewing) no longer
//! counts against the limit, and is removed by the next operation on the key: its holder's
//! late release or renewal finds it gone and changes nothing.
//!
//! Each acquisition takes exactly one permit: there is no "take n permits at once", so a
//! waiter is never woken for fewer permits than it needs.

use std::sync::Arc;
use std::time::Duration;

use crate::BoxFuture;
use crate::call_key::CallKey;
use crate::error::{BackendError, BackendErrorKind};
use crate::locks::{ReleaseOutcome, RenewOutcome};
use crate::tokens::{FencingToken, OwnerToken};

/// An optional capability of a provider: a kind of coordination beyond the plain lock, the
/// records, the cache and the flights that every [`Provider`](crate::Provider) serves (or
/// refuses method by method). The runtime asks before using one and answers a typed "not
/// supported" error (never a silent no-op) when the provider lacks it; a coordinator builder
/// can require it, so the mismatch is found when the coordinator is built.
///
/// Each kind beyond the plain lock is a variant here, with a
/// store trait of its own beside [`SemaphoreStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Capability {
    /// Counting semaphores with leased, fenced permits ([`SemaphoreStore`]).
    Semaphores,
    /// Read-write locks with leased, fenced holds and writer preference
    /// ([`RwLockStore`](crate::RwLockStore)).
    ReadWriteLocks,
    /// Several plain locks taken in one atomic step
    /// ([`MultiLockStore`](crate::MultiLockStore)). Multi-key locks work without it (taken
    /// key by key in canonical order, with rollback); with it, a set of keys the provider
    /// keeps together is taken all or nothing.
    MultiKeyLocks,
    /// Granting writes that wait for replicas as each operation asks
    /// ([`ReplicaAcks`](crate::ReplicaAcks), read with
    /// [`replicas::in_scope`](crate::replicas::in_scope);
    /// [`LockProvider::supports_replica_acks`](crate::LockProvider::supports_replica_acks)).
    /// Without it, an operation that asks for replicas is refused; one that turns waiting off
    /// runs.
    ReplicaAcks,
}

impl Capability {
    /// A short, stable name: `semaphores`, `read_write_locks`, `multi_key_locks`,
    /// `replica_acks`.
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::Semaphores => "semaphores",
            Capability::ReadWriteLocks => "read_write_locks",
            Capability::MultiKeyLocks => "multi_key_locks",
            Capability::ReplicaAcks => "replica_acks",
        }
    }
}

impl std::fmt::Display for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One request to take a permit of a semaphore.
#[derive(Debug, Clone)]
pub struct PermitRequest<'a> {
    /// The semaphore's key. Semaphores are apart from locks: the same key as a lock names
    /// another thing.
    pub key: &'a CallKey,
    /// The token that will own the permit.
    pub owner: OwnerToken,
    /// How many permits of `key` may be held at once, this one included; at least 1. The
    /// limit is the caller's: callers of one key are meant to agree on it, and a caller with a
    /// smaller limit than the permits already held simply finds the semaphore full.
    pub limit: u32,
    /// How long the permit is held if never released or renewed.
    pub lease: Duration,
    /// How long to keep trying while the semaphore is full. Zero means one attempt.
    pub wait: Duration,
}

/// A permit this process holds, as the provider granted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermitGrant {
    /// This permit's fencing token: greater than every token minted before it for the same
    /// semaphore key (by any holder of any of its permits).
    pub fencing_token: FencingToken,
    /// True when the first attempt found the semaphore full and the grant came after waiting.
    pub contended: bool,
    /// When the lease began on this process's clock, for a provider that knows it; `None`
    /// lets the runtime time the lease from when the successful attempt was sent.
    pub lease_began: Option<tokio::time::Instant>,
}

/// The error of a provider without semaphores, from the defaults of [`SemaphoreStore`].
fn unsupported() -> BackendError {
    BackendError::new(
        BackendErrorKind::Config,
        "this provider does not support semaphores (`permits`)",
    )
}

/// Counting semaphores whose permits are leases: an optional capability.
///
/// A provider without semaphores opts out with `impl SemaphoreStore for MyProvider {}`:
/// [`SemaphoreStore::supports_semaphores`] then answers `false`, the runtime refuses a
/// semaphore on it with a typed "not supported" error before asking it anything, and every
/// method answers a [`BackendErrorKind::Config`] error saying so.
///
/// # Contract
/// * **Exact limit.** `acquire_permit` grants a permit only while fewer than `req.limit` live
///   permits of the key are held, checked and taken in one atomic step on one store, so the
///   limit holds under any interleaving. A permit whose lease ran out by the store's clock does
///   not count, and is removed in that same step. A semaphore spread over several independent
///   stores (a Redlock-style majority) is not a semaphore, and no provider may claim one.
/// * **One permit per acquisition**, owned by `req.owner`. A resent acquire by the owner of a
///   live permit answers the same permit (its token, its lease renewed), never a second one.
/// * **Fencing.** Every grant carries a token greater than every token minted before it for the
///   key.
/// * **Waiting.** `Ok(None)` when the semaphore stayed full for all of `req.wait` (one attempt
///   when zero). A release wakes a waiter without polling; a waiter also re-checks at the end
///   of the soonest-ending permit's lease (a bounded, jittered backstop), so a lost wake-up
///   costs at most that long, never the whole wait.
/// * `release_permit` and `renew_permit` are owner-scoped: they change nothing unless `owner`
///   holds a live permit of `key`, and a permit that expired before either arrives stays gone
///   (it frees no other holder's permit). Both are idempotent. A provider that keeps no
///   forced-release marker for permits answers [`ReleaseOutcome::NotHeld`] /
///   [`LossCause::Expired`](crate::LossCause::Expired) for a permit it no longer has.
/// * If the future of `acquire_permit` is dropped before it completes, the runtime releases the
///   owner's permit (which may have been granted) with `release_permit`.
pub trait SemaphoreStore: Send + Sync + 'static {
    /// Whether this provider keeps semaphores. `false` by default.
    fn supports_semaphores(&self) -> bool {
        false
    }

    /// Takes one permit of `req.key` for `req.owner`, waiting up to `req.wait`.
    fn acquire_permit<'a>(
        &'a self,
        req: PermitRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<PermitGrant>, BackendError>> {
        let _ = req;
        Box::pin(std::future::ready(Err(unsupported())))
    }

    /// Frees `owner`'s permit of `key`, if it still holds one.
    fn release_permit<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        let _ = (key, owner);
        Box::pin(std::future::ready(Err(unsupported())))
    }

    /// Extends `owner`'s permit of `key` to `lease` from now, if it still holds one.
    fn renew_permit<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        let _ = (key, owner, lease);
        Box::pin(std::future::ready(Err(unsupported())))
    }

    /// Releases `owner`'s permit of `key` in the background (a guard dropped unreleased, an
    /// acquire that may have landed, a release that failed): like
    /// [`LockProvider::release_detached`](crate::LockProvider::release_detached), retried with
    /// backoff until it gets an answer or `lease_left` has passed.
    fn release_permit_detached(
        self: Arc<Self>,
        key: CallKey,
        owner: OwnerToken,
        lease_left: Duration,
    ) {
        crate::background::spawn_retried("releasing the permit", key, lease_left, move |key| {
            let this = self.clone();
            async move { this.release_permit(&key, owner).await.map(|_| true) }
        });
    }

    /// Releases `owner`'s permit of `key` in the background after an acquire whose answer was
    /// never read: like
    /// [`LockProvider::release_unanswered_detached`](crate::LockProvider::release_unanswered_detached),
    /// retried until a release removes the permit or `lease_left` has passed (a release that
    /// finds nothing proves nothing: the grant may land after it).
    fn release_unanswered_permit_detached(
        self: Arc<Self>,
        key: CallKey,
        owner: OwnerToken,
        lease_left: Duration,
    ) {
        crate::background::spawn_retried(
            "releasing a permit whose grant was not read",
            key,
            lease_left,
            move |key| {
                let this = self.clone();
                async move {
                    let released = this.release_permit(&key, owner).await?;
                    Ok(released != ReleaseOutcome::NotHeld)
                }
            },
        );
    }
}

/// A shared provider is a provider (see the same impl for [`LockProvider`](crate::LockProvider)).
impl<P: SemaphoreStore> SemaphoreStore for Arc<P> {
    fn supports_semaphores(&self) -> bool {
        (**self).supports_semaphores()
    }

    fn acquire_permit<'a>(
        &'a self,
        req: PermitRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<PermitGrant>, BackendError>> {
        (**self).acquire_permit(req)
    }

    fn release_permit<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        (**self).release_permit(key, owner)
    }

    fn renew_permit<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        (**self).renew_permit(key, owner, lease)
    }

    fn release_permit_detached(
        self: Arc<Self>,
        key: CallKey,
        owner: OwnerToken,
        lease_left: Duration,
    ) {
        P::release_permit_detached((*self).clone(), key, owner, lease_left)
    }

    fn release_unanswered_permit_detached(
        self: Arc<Self>,
        key: CallKey,
        owner: OwnerToken,
        lease_left: Duration,
    ) {
        P::release_unanswered_permit_detached((*self).clone(), key, owner, lease_left)
    }
}
