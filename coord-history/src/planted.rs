//! Providers with a deliberate bug, to show that a history check fails when it should.
//!
//! [`Planted`] wraps any provider and passes everything through, except what its
//! [`PlantedBug`] breaks. Never use it outside tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::CallKey;
use coord_core::provider::{
    BackendError, BoxFuture, CacheEntry, CacheStore, ClaimOutcome, ClaimRequest, CompleteOutcome,
    CompleteRequest, FencingToken, FlightStore, IdempotencyStore, LockGrant, LockProvider,
    LockRequest, Operations, OwnerToken, ReleaseOutcome, RenewOutcome, RwLockStore, SemaphoreStore,
};

/// The bug planted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlantedBug {
    /// Locks are granted without asking the backend, all with fencing token 1: two holders
    /// at once, and a resource that checks tokens cannot tell them apart.
    GrantWithoutCheck,
    /// A completed record is reported as free: a replay runs the body again and answers
    /// fresh instead of the stored answer.
    FreshAnswerOnReplay,
    /// The shared cache keeps every entry 30 times as long as it was asked to: reads are
    /// served answers far older than their ttl.
    CacheBeyondTtl,
    /// A lock whose acquire's answer was not read is released until the first answer, as an
    /// answered one is: a release that finds nothing (the grant not visible yet, e.g. its
    /// commit waiting for a synchronous standby) ends the clean-up, and a grant that lands
    /// after it keeps the key until its lease ends.
    UnansweredReleaseStopsAtNothing,
}

/// How much longer [`PlantedBug::CacheBeyondTtl`] keeps a shared cache entry.
const CACHE_STRETCH: u32 = 30;

/// `inner` with `bug` planted; every other operation goes to `inner` unchanged.
#[derive(Debug, Clone)]
pub struct Planted<P> {
    inner: Arc<P>,
    bug: PlantedBug,
    /// Clean-ups of unanswered acquires ended under
    /// [`PlantedBug::UnansweredReleaseStopsAtNothing`].
    unanswered_releases_ended: Arc<AtomicUsize>,
}

impl<P> Planted<P> {
    /// Wraps `inner`.
    pub fn new(inner: P, bug: PlantedBug) -> Planted<P> {
        Planted {
            inner: Arc::new(inner),
            bug,
            unanswered_releases_ended: Arc::default(),
        }
    }

    /// How many clean-ups of acquires whose answer was not read have ended (at their first
    /// answer) under [`PlantedBug::UnansweredReleaseStopsAtNothing`]: what a test waits for
    /// before it lets a late grant land.
    pub fn unanswered_releases_ended(&self) -> usize {
        self.unanswered_releases_ended.load(Ordering::Acquire)
    }
}

impl<P: LockProvider> LockProvider for Planted<P> {
    fn acquire<'a>(
        &'a self,
        req: LockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<LockGrant>, BackendError>> {
        if self.bug == PlantedBug::GrantWithoutCheck {
            let fenced = req.fenced;
            return Box::pin(async move {
                Ok(Some(LockGrant {
                    fencing_token: fenced.then(|| FencingToken::new(1)),
                    contended: false,
                    lease_began: Some(tokio::time::Instant::now()),
                }))
            });
        }
        self.inner.acquire(req)
    }

    fn release<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        if self.bug == PlantedBug::GrantWithoutCheck {
            return Box::pin(async { Ok(ReleaseOutcome::Released) });
        }
        self.inner.release(key, owner)
    }

    fn renew<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        if self.bug == PlantedBug::GrantWithoutCheck {
            return Box::pin(async { Ok(RenewOutcome::Renewed) });
        }
        self.inner.renew(key, owner, lease)
    }

    fn release_unanswered_detached(
        self: Arc<Self>,
        key: CallKey,
        owner: OwnerToken,
        lease_left: Duration,
    ) {
        if self.bug == PlantedBug::UnansweredReleaseStopsAtNothing {
            // As an answered release: done at the first answer, whatever it found.
            let ended = self.unanswered_releases_ended.clone();
            return coord_core::provider::background::spawn_retried(
                "releasing the lock",
                key,
                lease_left,
                move |key| {
                    let this = self.clone();
                    let ended = ended.clone();
                    async move {
                        this.release(&key, owner).await?;
                        ended.fetch_add(1, Ordering::AcqRel);
                        Ok(true)
                    }
                },
            );
        }
        // Each try goes through `release` above, so the bug of the wrapper (if any) applies.
        coord_core::provider::background::spawn_retried(
            "releasing a lock whose grant was not read",
            key,
            lease_left,
            move |key| {
                let this = self.clone();
                async move {
                    let released = this.release(&key, owner).await?;
                    Ok(released != ReleaseOutcome::NotHeld)
                }
            },
        );
    }
}

impl<P: IdempotencyStore> IdempotencyStore for Planted<P> {
    fn claim<'a>(
        &'a self,
        req: ClaimRequest<'a>,
    ) -> BoxFuture<'a, Result<ClaimOutcome, BackendError>> {
        let bug = self.bug;
        Box::pin(async move {
            let outcome = self.inner.claim(req).await?;
            Ok(match outcome {
                ClaimOutcome::Completed { .. } if bug == PlantedBug::FreshAnswerOnReplay => {
                    ClaimOutcome::Claimed
                }
                other => other,
            })
        })
    }

    fn complete<'a>(
        &'a self,
        req: CompleteRequest<'a>,
    ) -> BoxFuture<'a, Result<CompleteOutcome, BackendError>> {
        if self.bug == PlantedBug::FreshAnswerOnReplay {
            // The record is already there: say the (fresh) outcome was stored.
            return Box::pin(async move {
                let _ = self.inner.complete(req).await?;
                Ok(CompleteOutcome::Stored)
            });
        }
        self.inner.complete(req)
    }

    fn abandon<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        self.inner.abandon(key, owner)
    }

    fn end_marker_lease<'a>(
        &'a self,

        key: &'a CallKey,

        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        self.inner.end_marker_lease(key, owner)
    }

    fn wait_settled<'a>(
        &'a self,
        key: &'a CallKey,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.inner.wait_settled(key, timeout)
    }

    fn renew_marker<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        self.inner.renew_marker(key, owner, lease)
    }
}

impl<P: CacheStore> CacheStore for Planted<P> {
    fn cache_get<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<Option<CacheEntry>, BackendError>> {
        self.inner.cache_get(key)
    }

    fn cache_set<'a>(
        &'a self,
        key: &'a CallKey,
        value: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        if self.bug == PlantedBug::CacheBeyondTtl {
            return self
                .inner
                .cache_set(key, value, ttl.saturating_mul(CACHE_STRETCH));
        }
        self.inner.cache_set(key, value, ttl)
    }

    fn cache_delete<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        self.inner.cache_delete(key)
    }
}

// The planted provider serves no cluster flight or operator call.
impl<P: Send + Sync + 'static> FlightStore for Planted<P> {}
impl<P: Send + Sync + 'static> Operations for Planted<P> {}
// No semaphores: the planted bugs are in locks and records, and a provider without the
// capability refuses permits with a typed error.
impl<P: Send + Sync + 'static> SemaphoreStore for Planted<P> {}
impl<P: Send + Sync + 'static> RwLockStore for Planted<P> {}
impl<P: Send + Sync + 'static> coord_core::provider::MultiLockStore for Planted<P> {}
