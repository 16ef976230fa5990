//! [`LockProvider`] and [`MultiLockStore`]: the lock table's answers, boxed without allocating
//! on the hot path.
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Context;
use std::task::Poll;
use std::time::Duration;

use crate::Attempt;
use coord_contract::{
    BackendError, BoxFuture, CallKey, LockGrant, LockProvider, LockRequest, MultiLockGrant,
    MultiLockRequest, MultiLockStore, OwnerToken, ReleaseOutcome, RenewOutcome,
};

use super::MemoryProvider;

impl LockProvider for MemoryProvider {
    fn acquire<'a>(
        &'a self,
        req: LockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<LockGrant>, BackendError>> {
        let attempt =
            self.locks
                .attempt_shared(req.key.shared(), req.owner, req.lease, req.wait, req.fenced);
        match attempt {
            // The common grant (first attempt, unfenced) is one constant, so its answer boxes
            // without allocating: the runtime times the lease from just before the attempt,
            // which is never later than it began.
            Attempt::Granted(LockGrant {
                fencing_token: None,
                contended: false,
                ..
            }) => Box::pin(ReadyWith(|| {
                Ok(Some(LockGrant {
                    fencing_token: None,
                    contended: false,
                    lease_began: None,
                }))
            })),
            Attempt::Granted(grant) => Box::pin(std::future::ready(Ok(Some(grant)))),
            Attempt::Held => Box::pin(ReadyWith(|| Ok(None))),
            Attempt::Queued(waiter) => Box::pin(async move { Ok(waiter.wait().await) }),
        }
    }

    fn release<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        // One zero-sized future per answer, so that boxing it allocates nothing.
        match self.locks.release(key.qualified(), owner) {
            ReleaseOutcome::Released => Box::pin(ReadyWith(|| Ok(ReleaseOutcome::Released))),
            ReleaseOutcome::NotHeld => Box::pin(ReadyWith(|| Ok(ReleaseOutcome::NotHeld))),
            ReleaseOutcome::ForceReleased => {
                Box::pin(ReadyWith(|| Ok(ReleaseOutcome::ForceReleased)))
            }
        }
    }

    fn renew<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        let outcome = self.locks.renew(key.qualified(), owner, lease);
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn release_detached(self: Arc<Self>, key: CallKey, owner: OwnerToken, _lease_left: Duration) {
        // Release is synchronous here: do it now rather than on another task.
        self.locks.release(key.qualified(), owner);
    }

    fn release_unanswered_detached(
        self: Arc<Self>,
        key: CallKey,
        owner: OwnerToken,
        _lease_left: Duration,
    ) {
        // Once an acquire's future is gone it grants nothing more (a queued waiter leaves the
        // queue when dropped, under the table's lock): one release settles it.
        self.locks.release(key.qualified(), owner);
    }
}

/// Multi-key locks taken in one synchronous pass over the lock table (see
/// [`LockTable::acquire_all`](crate::LockTable::acquire_all)).
impl MultiLockStore for MemoryProvider {
    fn supports_multi_locks(&self) -> bool {
        true
    }

    fn acquire_all<'a>(
        &'a self,
        req: MultiLockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<MultiLockGrant>, BackendError>> {
        Box::pin(async move { Ok(self.locks.acquire_all(&req).await) })
    }
}

/// A future ready at once with what `make` returns. Given a closure that captures nothing it is
/// zero-sized, so boxing it (as the provider traits require) allocates nothing: the answers
/// of the hot path (a free lock granted, a lock released) cost no allocation.
pub(super) struct ReadyWith<M>(pub(super) M);

impl<T, M: Fn() -> T + Unpin> Future for ReadyWith<M> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<T> {
        Poll::Ready((self.0)())
    }
}
