//! The read-write lock capability: a hash with the writer, the waiting writer's claim, the
//! readers' tokens and the key's one fencing counter, beside a sorted set of readers scored by
//! the end of their lease on the server's clock; waiters woken by the release message (see
//! `scripts::rw_locks` for the layout; the counted-lease shape, `counted_leases`).

use std::time::Duration;

use coord_core::provider::{
    BoxFuture, OwnerToken, ReleaseOutcome, RenewOutcome, RwGrant, RwLockRequest, RwLockStore,
    RwMode,
};
use coord_core::{BackendError, CallKey, FencingToken};

use super::commands::millis;
use super::counted_leases::{Acquired, CountedKind};
use super::{Inner, RedisProvider};
use crate::encode::{Decimal, TokenText};
use crate::scripts;
use crate::waiters::Wake;

/// Read-write locks as counted leases. Every waiter of the key is woken by a release, since
/// one release can let several readers in.
static RW_LOCKS: CountedKind = CountedKind {
    acquire: &scripts::RW_ACQUIRE,
    release: &scripts::RW_RELEASE,
    renew: &scripts::RW_RENEW,
    keys: |n| [n.rw_lock(), n.rw_readers()],
    wake: Wake::All,
    acquiring: "read-write lock acquire",
    releasing: "read-write lock release",
    renewing: "read-write lock renew",
};

fn mode_arg(mode: RwMode) -> &'static [u8] {
    match mode {
        RwMode::Read => b"r",
        RwMode::Write => b"w",
    }
}

impl Inner {
    async fn acquire_rw(&self, req: RwLockRequest<'_>) -> Result<Option<RwGrant>, BackendError> {
        let token = TokenText::new(req.owner);
        let lease = Decimal::new(millis(req.lease));
        let claim = Decimal::new(millis(req.claim).max(2));
        let args: [&[u8]; 4] = [
            token.as_ref(),
            mode_arg(req.mode),
            lease.as_ref(),
            claim.as_ref(),
        ];
        // A waiting look leaves a writer's claim; the backstop is the first hold or claim in
        // the way ending (for a claiming writer, half its claim).
        match self
            .counted_acquire(&RW_LOCKS, req.key, &args, req.wait)
            .await?
        {
            Acquired::Granted { token, contended } => Ok(Some(grant(token, contended))),
            Acquired::Refused => Ok(None),
            Acquired::WaitEnded => {
                if req.mode == RwMode::Write {
                    // Gave up: withdraw the claim now rather than hold readers back until it
                    // ends. Best effort: the claim ends on its own anyway.
                    let _ = self.release_rw(req.key, req.owner, RwMode::Write).await;
                }
                Ok(None)
            }
        }
    }

    async fn release_rw(
        &self,
        key: &CallKey,
        owner: OwnerToken,
        mode: RwMode,
    ) -> Result<ReleaseOutcome, BackendError> {
        let token = TokenText::new(owner);
        self.counted_release(&RW_LOCKS, key, &[token.as_ref(), mode_arg(mode)])
            .await
    }
}

fn grant(token: u64, contended: bool) -> RwGrant {
    RwGrant {
        fencing_token: FencingToken::new(token),
        contended,
        lease_began: None,
    }
}

/// Read-write locks on one Redis deployment (one server, or one slot of a cluster: both keys
/// of a read-write lock share its hash tag). Exclusion holds there; read-write locks are never
/// spread over several independent deployments.
impl RwLockStore for RedisProvider {
    fn supports_rw_locks(&self) -> bool {
        true
    }

    fn acquire_rw<'a>(
        &'a self,
        req: RwLockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<RwGrant>, BackendError>> {
        Box::pin(self.inner.acquire_rw(req))
    }

    fn release_rw<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        mode: RwMode,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        Box::pin(self.inner.release_rw(key, owner, mode))
    }

    fn renew_rw<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        mode: RwMode,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        Box::pin(async move {
            let token = TokenText::new(owner);
            let lease = Decimal::new(millis(lease));
            self.inner
                .counted_renew(
                    &RW_LOCKS,
                    key,
                    &[token.as_ref(), mode_arg(mode), lease.as_ref()],
                )
                .await
        })
    }
}
