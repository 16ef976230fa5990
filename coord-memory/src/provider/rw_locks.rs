//! [`RwLockStore`] over the read-write lock table.
use std::sync::Arc;
use std::time::Duration;

use coord_contract::{
    BackendError, BoxFuture, CallKey, OwnerToken, ReleaseOutcome, RenewOutcome, RwGrant,
    RwLockRequest, RwLockStore, RwMode,
};

use super::MemoryProvider;

/// Read-write locks, exact among the tasks of this process.
impl RwLockStore for MemoryProvider {
    fn supports_rw_locks(&self) -> bool {
        true
    }

    fn acquire_rw<'a>(
        &'a self,
        req: RwLockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<RwGrant>, BackendError>> {
        Box::pin(async move {
            Ok(self
                .rw_locks
                .acquire(
                    req.key.qualified(),
                    req.owner,
                    req.mode,
                    req.lease,
                    req.wait,
                    req.claim,
                )
                .await)
        })
    }

    fn release_rw<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        mode: RwMode,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        let outcome = self.rw_locks.release(key.qualified(), owner, mode);
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn renew_rw<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        mode: RwMode,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        let outcome = self.rw_locks.renew(key.qualified(), owner, mode, lease);
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn release_rw_detached(
        self: Arc<Self>,
        key: CallKey,
        owner: OwnerToken,
        mode: RwMode,
        _lease_left: Duration,
    ) {
        self.rw_locks.release(key.qualified(), owner, mode);
    }

    fn release_unanswered_rw_detached(
        self: Arc<Self>,
        key: CallKey,
        owner: OwnerToken,
        mode: RwMode,
        _lease_left: Duration,
    ) {
        // An acquire whose future is gone grants nothing more: one release settles it.
        self.rw_locks.release(key.qualified(), owner, mode);
    }
}
