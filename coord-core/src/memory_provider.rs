//! The in-process provider: coord's contract over the `coord-memory` engine.

use std::sync::Arc;
use std::time::Duration;

use coord_memory::{Attempt, Claim, Completion, LockTable, RecordStore, Renewal};

use crate::error::BackendError;
use crate::provider::{
    BoxFuture, ClaimOutcome, ClaimRequest, CompleteOutcome, CompleteRequest, FencingToken,
    Fingerprint, IdempotencyStore, LockGrant, LockProvider, LockRequest, LossCause, OwnerToken,
    ReleaseOutcome, RenewOutcome,
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
}

impl MemoryProvider {
    /// An empty provider.
    pub fn new() -> MemoryProvider {
        MemoryProvider::default()
    }

    /// How many lock keys are held or waited for (zero once all locks are released).
    pub fn lock_keys(&self) -> usize {
        self.locks.len()
    }

    /// The lock acquire without the boxed future of the trait: the runtime calls this
    /// directly when the coordinator's provider is this one.
    pub(crate) async fn acquire_inline(
        &self,
        req: LockRequest<'_>,
        shared_key: Option<&Arc<str>>,
    ) -> Option<(LockGrant, tokio::time::Instant)> {
        let grant = |g: coord_memory::Grant| {
            let grant = LockGrant {
                fencing_token: g.fencing_token.map(FencingToken::new),
                contended: g.contended,
            };
            (grant, g.granted_at)
        };
        let (owner, lease, wait, fenced) = (req.owner.as_u128(), req.lease, req.wait, req.fenced);
        let attempt = match shared_key {
            Some(key) => self.locks.attempt_shared(key, owner, lease, wait, fenced),
            None => self.locks.attempt(req.key, owner, lease, wait, fenced),
        };
        match attempt {
            Attempt::Granted(g) => Some(grant(g)),
            Attempt::Held => None,
            // Boxed: the waiting state machine is large, and only contended calls need it.
            Attempt::Queued(waiter) => Box::pin(waiter.wait()).await.map(grant),
        }
    }

    /// The lock release without the boxed future of the trait.
    pub(crate) fn release_inline(&self, key: &str, owner: OwnerToken) -> ReleaseOutcome {
        if self.locks.release(key, owner.as_u128()) {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        }
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
        Box::pin(async move { Ok(self.acquire_inline(req, None).await.map(|(grant, _)| grant)) })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        Box::pin(std::future::ready(Ok(self.release_inline(key, owner))))
    }

    fn renew<'a>(
        &'a self,
        key: &'a str,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        let outcome = renew_outcome(self.locks.renew(key, owner.as_u128(), lease));
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn release_detached(self: Arc<Self>, key: String, owner: OwnerToken, _lease_left: Duration) {
        // Release is synchronous here: do it now rather than on another task.
        self.locks.release(&key, owner.as_u128());
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
            req.key,
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
            req.key,
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
        key: &'a str,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let done = self.records.abandon(key, owner.as_u128());
        Box::pin(std::future::ready(Ok(done)))
    }

    fn wait_settled<'a>(
        &'a self,
        key: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            self.records.wait_settled(key, timeout).await;
            Ok(())
        })
    }

    fn renew_marker<'a>(
        &'a self,
        key: &'a str,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        let outcome = renew_outcome(self.records.renew(key, owner.as_u128(), lease));
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn purge<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(std::future::ready(Ok(self.records.purge(key))))
    }

    fn abandon_detached(self: Arc<Self>, key: String, owner: OwnerToken, _lease_left: Duration) {
        self.records.abandon(&key, owner.as_u128());
    }
}
