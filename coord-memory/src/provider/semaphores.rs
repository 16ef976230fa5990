//! [`SemaphoreStore`] over the semaphore table.
use std::sync::Arc;
use std::time::Duration;

use coord_contract::{
    BackendError, BoxFuture, CallKey, OwnerToken, PermitGrant, PermitRequest, ReleaseOutcome,
    RenewOutcome, SemaphoreStore,
};

use super::MemoryProvider;

/// Semaphores, exact among the tasks of this process.
impl SemaphoreStore for MemoryProvider {
    fn supports_semaphores(&self) -> bool {
        true
    }

    fn acquire_permit<'a>(
        &'a self,
        req: PermitRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<PermitGrant>, BackendError>> {
        Box::pin(async move {
            Ok(self
                .semaphores
                .acquire(
                    req.key.qualified(),
                    req.owner,
                    req.limit,
                    req.lease,
                    req.wait,
                )
                .await)
        })
    }

    fn release_permit<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        let outcome = self.semaphores.release(key.qualified(), owner);
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn renew_permit<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        let outcome = self.semaphores.renew(key.qualified(), owner, lease);
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn release_permit_detached(
        self: Arc<Self>,
        key: CallKey,
        owner: OwnerToken,
        _lease_left: Duration,
    ) {
        self.semaphores.release(key.qualified(), owner);
    }

    fn release_unanswered_permit_detached(
        self: Arc<Self>,
        key: CallKey,
        owner: OwnerToken,
        _lease_left: Duration,
    ) {
        // An acquire whose future is gone grants nothing more: one release settles it.
        self.semaphores.release(key.qualified(), owner);
    }
}
