//! Read-write locks: many readers or one writer of a key, each hold a leased, fenced hold of
//! its own. An optional capability ([`Capability::ReadWriteLocks`](crate::Capability)).
//!
//! One hold, as a provider sees it:
//!
//! 1. [`RwLockStore::acquire_rw`] takes a read hold of `key` while no writer holds it and no
//!    writer waits for it, or a write hold while nobody holds it, minting a fencing token from
//!    the key's one counter (shared by both modes); while it cannot, it waits (woken when a
//!    hold ends, with a bounded re-check as a backstop) until `wait` has passed;
//! 2. the holder renews its hold ([`RwLockStore::renew_rw`]) while its work runs;
//! 3. the holder releases it ([`RwLockStore::release_rw`]), which wakes the waiters.
//!
//! A hold whose lease ran out no longer counts and is removed by the next operation on the
//! key; its holder's late release or renewal finds it gone and changes nothing.
//!
//! **Writer preference.** A writer that finds the key held leaves a *claim* (its owner and an
//! expiry of its own, [`RwLockRequest::claim`]) that stops new readers until the writer gets
//! in or the claim expires. The waiting writer re-asserts its claim at every look, and looks
//! at least twice per claim, so a live waiting writer keeps it and a crashed one blocks new
//! readers for at most one claim. Holders already in keep their holds.

use std::sync::Arc;
use std::time::Duration;

use crate::BoxFuture;
use crate::call_key::CallKey;
use crate::error::{BackendError, BackendErrorKind};
use crate::locks::{ReleaseOutcome, RenewOutcome};
use crate::tokens::{FencingToken, OwnerToken};

/// Which side of a read-write lock a hold is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RwMode {
    /// Shared with other readers; excludes writers.
    Read,
    /// Alone: excludes readers and other writers.
    Write,
}

impl RwMode {
    /// `read` or `write`.
    pub fn as_str(self) -> &'static str {
        match self {
            RwMode::Read => "read",
            RwMode::Write => "write",
        }
    }
}

impl std::fmt::Display for RwMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One request for a hold of a read-write lock.
#[derive(Debug, Clone)]
pub struct RwLockRequest<'a> {
    /// The read-write lock's key. Read-write locks are apart from locks and semaphores: the
    /// same key as a lock names another thing.
    pub key: &'a CallKey,
    /// The token that will own the hold.
    pub owner: OwnerToken,
    /// Read or write.
    pub mode: RwMode,
    /// How long the hold lasts if never released or renewed.
    pub lease: Duration,
    /// How long to keep trying while the hold cannot be granted. Zero means one attempt (a
    /// writer's one attempt leaves no claim).
    pub wait: Duration,
    /// How long a waiting writer's claim stops new readers if the writer stops re-asserting
    /// it (it crashed): [`default_claim`] of the lease unless the caller knows better.
    /// Ignored for readers.
    pub claim: Duration,
}

/// The claim a waiting writer leaves for a hold of `lease`: a third of the lease, between
/// 50 ms and 5 s. Short, so a crashed waiting writer holds readers back only briefly; a live
/// writer re-asserts it at least twice per claim.
pub fn default_claim(lease: Duration) -> Duration {
    (lease / 3).clamp(Duration::from_millis(50), Duration::from_secs(5))
}

/// A hold this process has, as the provider granted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RwGrant {
    /// This hold's fencing token: greater than every token minted before it for the same key,
    /// by readers and writers alike, so a resource can refuse a writer older than a reader or
    /// writer it has already seen.
    pub fencing_token: FencingToken,
    /// True when the first attempt could not be granted and the grant came after waiting.
    pub contended: bool,
    /// When the lease began on this process's clock, for a provider that knows it; `None`
    /// lets the runtime time the lease from when the successful attempt was sent.
    pub lease_began: Option<tokio::time::Instant>,
}

/// The error of a provider without read-write locks, from the defaults of [`RwLockStore`].
fn unsupported() -> BackendError {
    BackendError::new(
        BackendErrorKind::Config,
        "this provider does not support read-write locks (`mode`)",
    )
}

/// Read-write locks whose holds are leases: an optional capability.
///
/// A provider without them opts out with `impl RwLockStore for MyProvider {}`:
/// [`RwLockStore::supports_rw_locks`] then answers `false`, the runtime refuses a read-write
/// lock on it with a typed "not supported" error before asking it anything, and every method
/// answers a [`BackendErrorKind::Config`] error saying so.
///
/// # Contract
/// * **Exclusion.** A write hold is granted only while no live hold (read or write) of the key
///   exists; a read hold only while no live write hold exists and no live claim of a waiting
///   writer exists (unless that claim is the requester's own, which a reader never has). The
///   check and the grant are one atomic step on one store. A hold whose lease ran out by the
///   store's clock does not count and is removed in that step.
/// * **Writer preference.** A writer that must wait (and `wait` is not zero) leaves a claim
///   that expires `req.claim` after its last attempt; while it is live, no new reader gets
///   in. A writer's grant removes its own claim. Only one claim exists per key: a second
///   waiting writer waits behind the first one's claim, and takes the claim over when it
///   lapses.
/// * **Fencing.** Every grant, read or write, carries a token from the key's one counter,
///   greater than every token minted before it for that key in either mode.
/// * **No upgrade, no re-grant across modes.** A resent acquire by the owner of a live hold in
///   the same mode answers the same hold (its token, its lease renewed); an owner never holds
///   both modes of a key (owners are per hold, and the runtime refuses an upgrade before it
///   asks).
/// * `release_rw` and `renew_rw` are owner- and mode-scoped: they touch only `owner`'s hold of
///   `mode`, never another holder's and never the other mode's (a read release cannot free a
///   write hold); a hold that expired before either arrives stays gone. Both are idempotent.
/// * **Waiting.** `Ok(None)` when the hold could not be granted for all of `req.wait`. A
///   release wakes the waiters without polling; a waiter also re-checks at the end of the
///   soonest-ending hold in its way and, for a writer, at least twice per claim.
/// * If the future of `acquire_rw` is dropped before it completes, the runtime releases the
///   owner's hold (which may have been granted) with `release_rw`; a claim it left lapses on
///   its own.
pub trait RwLockStore: Send + Sync + 'static {
    /// Whether this provider keeps read-write locks. `false` by default.
    fn supports_rw_locks(&self) -> bool {
        false
    }

    /// Takes a hold of `req.key` in `req.mode` for `req.owner`, waiting up to `req.wait`.
    fn acquire_rw<'a>(
        &'a self,
        req: RwLockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<RwGrant>, BackendError>> {
        let _ = req;
        Box::pin(std::future::ready(Err(unsupported())))
    }

    /// Frees `owner`'s hold of `key` in `mode`, if it still has one.
    fn release_rw<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        mode: RwMode,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        let _ = (key, owner, mode);
        Box::pin(std::future::ready(Err(unsupported())))
    }

    /// Extends `owner`'s hold of `key` in `mode` to `lease` from now, if it is still live.
    fn renew_rw<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        mode: RwMode,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        let _ = (key, owner, mode, lease);
        Box::pin(std::future::ready(Err(unsupported())))
    }

    /// Releases `owner`'s hold in the background (a guard dropped unreleased, an acquire that
    /// may have landed, a release that failed): like
    /// [`LockProvider::release_detached`](crate::LockProvider::release_detached), retried with
    /// backoff until it gets an answer or `lease_left` has passed.
    fn release_rw_detached(
        self: Arc<Self>,
        key: CallKey,
        owner: OwnerToken,
        mode: RwMode,
        lease_left: Duration,
    ) {
        crate::background::spawn_retried(
            "releasing the read-write lock",
            key,
            lease_left,
            move |key| {
                let this = self.clone();
                async move { this.release_rw(&key, owner, mode).await.map(|_| true) }
            },
        );
    }

    /// Releases `owner`'s hold in `mode` in the background after an acquire whose answer was
    /// never read: like
    /// [`LockProvider::release_unanswered_detached`](crate::LockProvider::release_unanswered_detached),
    /// retried until a release removes the hold or `lease_left` has passed (a release that
    /// finds nothing proves nothing: the grant may land after it).
    fn release_unanswered_rw_detached(
        self: Arc<Self>,
        key: CallKey,
        owner: OwnerToken,
        mode: RwMode,
        lease_left: Duration,
    ) {
        crate::background::spawn_retried(
            "releasing a read-write hold whose grant was not read",
            key,
            lease_left,
            move |key| {
                let this = self.clone();
                async move {
                    let released = this.release_rw(&key, owner, mode).await?;
                    Ok(released != ReleaseOutcome::NotHeld)
                }
            },
        );
    }
}

/// A shared provider is a provider (see the same impl for [`LockProvider`](crate::LockProvider)).
impl<P: RwLockStore> RwLockStore for Arc<P> {
    fn supports_rw_locks(&self) -> bool {
        (**self).supports_rw_locks()
    }

    fn acquire_rw<'a>(
        &'a self,
        req: RwLockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<RwGrant>, BackendError>> {
        (**self).acquire_rw(req)
    }

    fn release_rw<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        mode: RwMode,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        (**self).release_rw(key, owner, mode)
    }

    fn renew_rw<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        mode: RwMode,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        (**self).renew_rw(key, owner, mode, lease)
    }

    fn release_rw_detached(
        self: Arc<Self>,
        key: CallKey,
        owner: OwnerToken,
        mode: RwMode,
        lease_left: Duration,
    ) {
        P::release_rw_detached((*self).clone(), key, owner, mode, lease_left)
    }

    fn release_unanswered_rw_detached(
        self: Arc<Self>,
        key: CallKey,
        owner: OwnerToken,
        mode: RwMode,
        lease_left: Duration,
    ) {
        P::release_unanswered_rw_detached((*self).clone(), key, owner, mode, lease_left)
    }
}
