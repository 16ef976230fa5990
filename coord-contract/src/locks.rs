//! Locks: mutual exclusion with leases, and why a hold can be lost.

use std::sync::Arc;
use std::time::Duration;

use crate::BoxFuture;
use crate::call_key::CallKey;
use crate::error::BackendError;
use crate::tokens::{FencingToken, OwnerToken};

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
    /// The lock was no longer ours, and the provider does not know why: the lease lapsed, or
    /// it was forced free longer ago than the provider remembers (see
    /// [`ReleaseOutcome::ForceReleased`]), or the backend lost it (a restart without
    /// persistence, an eviction, a failover). Someone else may hold it now. Nothing was
    /// changed.
    NotHeld,
    /// The lock was no longer ours because an operator forced it free while we held it
    /// ([`Operations::force_release`](crate::Operations::force_release)). Someone else may
    /// hold it now. Nothing was changed.
    ///
    /// A provider answers this while it remembers the forced release: coord's providers keep
    /// a marker naming the released owner for the rest of the released lease plus
    /// [`FORCED_RELEASE_MEMORY`]. Past that, or from a provider that keeps no marker, the
    /// answer is [`ReleaseOutcome::NotHeld`].
    ForceReleased,
}

/// How long past the end of the lease it cut short a forced release is remembered, so that the
/// former holder's release or renewal can answer [`ReleaseOutcome::ForceReleased`] /
/// [`LossCause::ForceReleased`] rather than a lapse: long enough for a holder whose body
/// outran its lease by a little to still be told the truth, short enough that the marker is
/// gone soon after nobody can ask any more.
pub const FORCED_RELEASE_MEMORY: Duration = Duration::from_secs(60);

/// What renewing a lease found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewOutcome {
    /// The lease now ends `lease` from the moment of renewal.
    Renewed,
    /// The token is gone: the hold is lost, for the reason given ([`LossCause::TakenByOther`],
    /// [`LossCause::Expired`], or [`LossCause::ForceReleased`] while the provider remembers a
    /// forced release of this owner's hold; a provider never reports
    /// [`LossCause::BackendUnreachable`], which the runtime decides on its own clock).
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
    /// `Coordinator::shutdown` released the lock while the
    /// body still ran: the process is going away.
    ShutDown,
    /// An operator forced the lock free while it was held (`coord locks release`,
    /// `Operator::release_lock`): the provider remembered the forced release of this very
    /// owner when the holder renewed or released.
    ForceReleased,
    /// The lock was gone when its holder released it, before its lease had run out by the
    /// holder's clock, and the provider could not say why: an operator forced it free (longer
    /// ago than the provider remembers, or with a provider that keeps no marker), or the
    /// backend let it expire or lost it (a clock running fast, a restart without persistence,
    /// an eviction, a failover). The two cannot be told apart here, so both are named.
    ForceReleasedOrExpired,
}

impl LossCause {
    /// A short, stable name (a metric label and span value): `taken_by_other`, `expired`,
    /// `backend_unreachable`, `shut_down`, `force_released`, `force_released_or_expired`.
    pub fn as_str(self) -> &'static str {
        match self {
            LossCause::TakenByOther => "taken_by_other",
            LossCause::Expired => "expired",
            LossCause::BackendUnreachable => "backend_unreachable",
            LossCause::ShutDown => "shut_down",
            LossCause::ForceReleased => "force_released",
            LossCause::ForceReleasedOrExpired => "force_released_or_expired",
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
            LossCause::ForceReleased => "an operator force-released it",
            LossCause::ForceReleasedOrExpired => {
                "it was gone before its lease ran out here: an operator force-released it, or it expired or was lost on the backend"
            }
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
///   runtime always releases a token whose acquire was cancelled, timed out or failed, through
///   [`LockProvider::release_unanswered_detached`], which by default keeps releasing until a
///   release removes the grant (or two leases have passed).
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

    /// Whether this provider honours a per-operation [`ReplicaAcks`](crate::ReplicaAcks)
    /// override ([`Capability::ReplicaAcks`](crate::Capability::ReplicaAcks)) in every store it
    /// serves (locks, records, permits, read-write and multi-key locks, flights): each granting
    /// write reads [`replicas::in_scope`](crate::replicas::in_scope) and waits as it says.
    /// `false` by default, and then the runtime refuses an operation that asks for replicas
    /// (one that turns waiting off runs). A wrapper around a provider forwards it.
    fn supports_replica_acks(&self) -> bool {
        false
    }

    /// Releases `key` for `owner` in the background: called when a guard is dropped without
    /// being released (the caller was cancelled or the body panicked), when an acquire failed
    /// in a way that may have landed (its reply was lost), and when a release itself failed.
    /// The default spawns `release` on the current tokio runtime and retries it with backoff
    /// until it gets an answer or `lease_left` has passed (after that the lease has freed the
    /// lock anyway); a provider whose release is synchronous can do it inline.
    fn release_detached(self: Arc<Self>, key: CallKey, owner: OwnerToken, lease_left: Duration) {
        crate::background::spawn_retried("releasing the lock", key, lease_left, move |key| {
            let this = self.clone();
            async move { this.release(&key, owner).await.map(|_| true) }
        });
    }

    /// Releases `key` for `owner` in the background after an acquire whose answer was never
    /// read (it timed out, failed in a way that may hide a grant, or its future was dropped
    /// with the request in flight). Such a grant may have landed, or may still land after a
    /// first release (a commit waiting on a synchronous standby, a command queued in a paused
    /// server), so a release that finds nothing proves nothing: the default retries `release`
    /// with backoff, each try a new command, until one answers
    /// [`ReleaseOutcome::Released`] (or [`ReleaseOutcome::ForceReleased`]: the grant landed
    /// and an operator freed it) or `lease_left` has passed (a grant landing later than that
    /// lapses with its own lease, which bounds how long the key stays blocked). A provider
    /// whose acquire cannot land once its future is gone (the in-process one) can release
    /// once, inline.
    fn release_unanswered_detached(
        self: Arc<Self>,
        key: CallKey,
        owner: OwnerToken,
        lease_left: Duration,
    ) {
        crate::background::spawn_retried(
            "releasing a lock whose grant was not read",
            key,
            lease_left,
            move |key| {
                let this = self.clone();
                async move {
                    // `NotHeld` proves nothing yet: the grant may land after it.
                    let released = this.release(&key, owner).await?;
                    Ok(released != ReleaseOutcome::NotHeld)
                }
            },
        );
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

    fn supports_replica_acks(&self) -> bool {
        (**self).supports_replica_acks()
    }

    fn release_detached(self: Arc<Self>, key: CallKey, owner: OwnerToken, lease_left: Duration) {
        P::release_detached((*self).clone(), key, owner, lease_left)
    }

    fn release_unanswered_detached(
        self: Arc<Self>,
        key: CallKey,
        owner: OwnerToken,
        lease_left: Duration,
    ) {
        P::release_unanswered_detached((*self).clone(), key, owner, lease_left)
    }
}
