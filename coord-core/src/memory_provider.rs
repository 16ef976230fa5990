//! The in-process provider: coord's contract over the `coord-memory` engine.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use tokio::time::Instant;

use coord_memory::{Attempt, Claim, Completion, LockTable, RecordStore, Renewal};

use crate::call_key::CallKey;
use crate::error::BackendError;
use crate::provider::{
    BoxFuture, CacheEntry, CacheStore, ClaimOutcome, ClaimRequest, CompleteOutcome,
    CompleteRequest, FencingToken, Fingerprint, IdempotencyStore, LockGrant, LockProvider,
    LockRequest, LossCause, OwnerToken, ReleaseOutcome, RenewOutcome,
};

/// Coordination within this process: leases, fencing, FIFO hand-off and idempotency records
/// held in memory.
///
/// Exclusion and at-most-once hold among the tasks of this process only. Chosen with
/// `Coordinator::builder().memory()`, and used as the fallback when no coordinator is
/// installed. Never returns a backend error.
///
/// Every duration in a request is accepted, from zero to [`Duration::MAX`]: deadlines
/// saturate at about a century, so a lease, keep or retention of `Duration::MAX` lasts as
/// long as the process, and a wait of `Duration::MAX` waits until the lock is granted or the
/// `acquire` future is dropped. A zero lease or retention makes state that has already
/// expired.
///
/// A resent claim by the owner of the live marker answers [`ClaimOutcome::Claimed`] and
/// restarts the marker's lease from that claim.
#[derive(Debug, Default)]
pub struct MemoryProvider {
    locks: LockTable,
    records: RecordStore,
    /// The shared tier of `#[cached]`: bytes and their expiry (tokio's clock, like the rest).
    cache: DashMap<CallKey, (Arc<[u8]>, Instant)>,
    /// Sets since the last sweep of expired cache entries.
    cache_sets: AtomicU64,
}

/// Expired cache entries are swept once per this many sets, so keys never read again do not
/// accumulate (a read removes an expired entry at once).
const CACHE_SWEEP_EVERY: u64 = 1024;

impl MemoryProvider {
    /// An empty provider.
    pub fn new() -> MemoryProvider {
        MemoryProvider::default()
    }

    /// How many lock keys are held or waited for (zero once all locks are released).
    pub fn lock_keys(&self) -> usize {
        self.locks.len()
    }

    /// How many shared cache entries are kept, expired ones not yet swept included.
    pub fn cache_entries(&self) -> usize {
        self.cache.len()
    }

    /// How many idempotency records are stored.
    pub fn records(&self) -> u64 {
        self.records.len()
    }
}

impl LockProvider for MemoryProvider {
    fn acquire<'a>(
        &'a self,
        req: LockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<LockGrant>, BackendError>> {
        let grant = |g: coord_memory::Grant| LockGrant {
            fencing_token: g.fencing_token.map(FencingToken::new),
            contended: g.contended,
            lease_began: Some(g.granted_at),
        };
        let (owner, lease, wait, fenced) = (req.owner.as_u128(), req.lease, req.wait, req.fenced);
        match self
            .locks
            .attempt_shared(req.key.shared(), owner, lease, wait, fenced)
        {
            // The common grant (first attempt, unfenced) is one constant: the runtime times the
            // lease from just before the attempt, which is never later than it began.
            Attempt::Granted(g) if g.fencing_token.is_none() && !g.contended => {
                Box::pin(ReadyWith(|| {
                    Ok(Some(LockGrant {
                        fencing_token: None,
                        contended: false,
                        lease_began: None,
                    }))
                }))
            }
            Attempt::Granted(g) => Box::pin(std::future::ready(Ok(Some(grant(g))))),
            Attempt::Held => Box::pin(ReadyWith(|| Ok(None))),
            Attempt::Queued(waiter) => Box::pin(async move { Ok(waiter.wait().await.map(grant)) }),
        }
    }

    fn release<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        if self.locks.release(key.qualified(), owner.as_u128()) {
            Box::pin(ReadyWith(|| Ok(ReleaseOutcome::Released)))
        } else {
            Box::pin(ReadyWith(|| Ok(ReleaseOutcome::NotHeld)))
        }
    }

    fn renew<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        let outcome = renew_outcome(self.locks.renew(key.qualified(), owner.as_u128(), lease));
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn release_detached(self: Arc<Self>, key: CallKey, owner: OwnerToken, _lease_left: Duration) {
        // Release is synchronous here: do it now rather than on another task.
        self.locks.release(key.qualified(), owner.as_u128());
    }
}

/// A future ready at once with what `make` returns. Given a closure that captures nothing it is
/// zero-sized, so boxing it (as the provider traits require) allocates nothing: the answers
/// of the hot path (a free lock granted, a lock released) cost no allocation.
struct ReadyWith<M>(M);

impl<T, M: Fn() -> T + Unpin> Future for ReadyWith<M> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<T> {
        Poll::Ready((self.0)())
    }
}

fn renew_outcome(renewal: Renewal) -> RenewOutcome {
    match renewal {
        Renewal::Renewed => RenewOutcome::Renewed,
        Renewal::TakenByOther => RenewOutcome::Lost(LossCause::TakenByOther),
        Renewal::Expired => RenewOutcome::Lost(LossCause::Expired),
    }
}

impl IdempotencyStore for MemoryProvider {
    fn claim<'a>(
        &'a self,
        req: ClaimRequest<'a>,
    ) -> BoxFuture<'a, Result<ClaimOutcome, BackendError>> {
        let found = self.records.claim(
            req.key.qualified(),
            req.owner.as_u128(),
            req.in_flight_lease,
            req.fingerprint.map(|f| f.0),
            req.keep_abandoned_for,
        );
        let outcome = match found {
            Claim::Claimed => ClaimOutcome::Claimed,
            Claim::InFlight {
                fingerprint,
                remaining,
            } => ClaimOutcome::InFlight {
                fingerprint: fingerprint.map(Fingerprint),
                remaining,
            },
            Claim::Abandoned { fingerprint } => ClaimOutcome::Abandoned {
                fingerprint: fingerprint.map(Fingerprint),
            },
            Claim::Completed {
                payload,
                fingerprint,
            } => ClaimOutcome::Completed {
                payload,
                fingerprint: fingerprint.map(Fingerprint),
            },
        };
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn complete<'a>(
        &'a self,
        req: CompleteRequest<'a>,
    ) -> BoxFuture<'a, Result<CompleteOutcome, BackendError>> {
        let outcome = match self.records.complete(
            req.key.qualified(),
            req.owner.as_u128(),
            req.payload,
            req.retention,
            req.fingerprint.map(|f| f.0),
        ) {
            Completion::Stored => CompleteOutcome::Stored,
            Completion::StoredWithoutMarker => CompleteOutcome::StoredWithoutMarker,
            Completion::Superseded { other, completed } => CompleteOutcome::Superseded {
                other: Some(OwnerToken::from_u128(other)),
                completed,
            },
        };
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn abandon<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let done = self.records.abandon(key.qualified(), owner.as_u128());
        Box::pin(std::future::ready(Ok(done)))
    }

    fn wait_settled<'a>(
        &'a self,
        key: &'a CallKey,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            self.records.wait_settled(key.qualified(), timeout).await;
            Ok(())
        })
    }

    fn renew_marker<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        let outcome = renew_outcome(self.records.renew(key.qualified(), owner.as_u128(), lease));
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn purge<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(std::future::ready(Ok(self.records.purge(key.qualified()))))
    }

    fn abandon_detached(self: Arc<Self>, key: CallKey, owner: OwnerToken, _lease_left: Duration) {
        self.records.abandon(key.qualified(), owner.as_u128());
    }
}

impl CacheStore for MemoryProvider {
    fn cache_get<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<Option<CacheEntry>, BackendError>> {
        let now = Instant::now();
        let found = match self.cache.get(key) {
            Some(entry) if entry.1 > now => Some(CacheEntry {
                value: entry.0.to_vec(),
                ttl_left: Some(entry.1 - now),
            }),
            Some(entry) => {
                drop(entry);
                self.cache.remove_if(key, |_, (_, expires)| *expires <= now);
                None
            }
            None => None,
        };
        Box::pin(std::future::ready(Ok(found)))
    }

    fn cache_set<'a>(
        &'a self,
        key: &'a CallKey,
        value: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        let now = Instant::now();
        let expires = coord_memory::deadline_after(now, ttl);
        self.cache.insert(key.clone(), (Arc::from(value), expires));
        if self.cache_sets.fetch_add(1, Ordering::Relaxed) + 1 >= CACHE_SWEEP_EVERY {
            self.cache_sets.store(0, Ordering::Relaxed);
            self.cache.retain(|_, (_, expires)| *expires > now);
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn cache_delete<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        let now = Instant::now();
        let removed = self.cache.remove(key);
        Box::pin(std::future::ready(Ok(
            removed.is_some_and(|(_, (_, expires))| expires > now)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_answers_box_without_allocating() {
        let answer = ReadyWith(|| Ok::<_, BackendError>(ReleaseOutcome::Released));
        assert_eq!(
            size_of_val(&answer),
            0,
            "a zero-sized future boxes for free"
        );
    }

    #[tokio::test]
    async fn the_hot_path_answers_are_the_contract_answers() {
        let provider = MemoryProvider::new();
        let key = CallKey::builder("mp", "op").finish();
        let owner = OwnerToken::new();
        let req = LockRequest {
            key: &key,
            owner,
            lease: Duration::from_secs(30),
            wait: Duration::ZERO,
            fenced: false,
        };
        let grant = provider.acquire(req.clone()).await.unwrap().unwrap();
        assert_eq!(grant.fencing_token, None);
        assert!(!grant.contended);
        let other = LockRequest {
            owner: OwnerToken::new(),
            ..req
        };
        assert_eq!(provider.acquire(other).await.unwrap(), None);
        let released = provider.release(&key, owner).await.unwrap();
        assert_eq!(released, ReleaseOutcome::Released);
        let again = provider.release(&key, owner).await.unwrap();
        assert_eq!(again, ReleaseOutcome::NotHeld);
    }
}
