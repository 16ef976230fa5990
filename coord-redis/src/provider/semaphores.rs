//! The semaphore capability: permits in a sorted set scored by the end of their lease on the
//! server's clock, one fencing token per permit, waiters woken by the release message (the
//! counted-lease shape, `counted_leases`).

use std::time::Duration;

use coord_core::provider::{
    BackendErrorKind, BoxFuture, OwnerToken, PermitGrant, PermitRequest, ReleaseOutcome,
    RenewOutcome, SemaphoreStore,
};
use coord_core::{BackendError, CallKey, FencingToken};

use super::commands::millis;
use super::counted_leases::{Acquired, CountedKind};
use super::{Inner, RedisProvider};
use crate::encode::{Decimal, TokenText};
use crate::scripts;
use crate::waiters::Wake;

/// Semaphores as counted leases: a permit is handed off to one waiter at a time.
static SEMAPHORES: CountedKind = CountedKind {
    acquire: &scripts::SEM_ACQUIRE,
    release: &scripts::SEM_RELEASE,
    renew: &scripts::SEM_RENEW,
    keys: |n| [n.semaphore(), n.semaphore_tokens()],
    wake: Wake::Head,
    acquiring: "semaphore acquire",
    releasing: "semaphore release",
    renewing: "semaphore renew",
};

impl Inner {
    async fn acquire_permit(
        &self,
        req: PermitRequest<'_>,
    ) -> Result<Option<PermitGrant>, BackendError> {
        if req.limit == 0 {
            return Err(BackendError::new(
                BackendErrorKind::Config,
                "a semaphore needs at least one permit (the limit was 0)",
            )
            .with_key(req.key));
        }
        let token = TokenText::new(req.owner);
        let limit = Decimal::new(u64::from(req.limit));
        let lease = Decimal::new(millis(req.lease));
        let args: [&[u8]; 3] = [token.as_ref(), limit.as_ref(), lease.as_ref()];
        // The backstop of a waiter is the soonest-ending permit's lease.
        Ok(
            match self
                .counted_acquire(&SEMAPHORES, req.key, &args, req.wait)
                .await?
            {
                Acquired::Granted { token, contended } => Some(grant(token, contended)),
                Acquired::Refused | Acquired::WaitEnded => None,
            },
        )
    }
}

fn grant(token: u64, contended: bool) -> PermitGrant {
    PermitGrant {
        fencing_token: FencingToken::new(token),
        contended,
        lease_began: None,
    }
}

/// Semaphores on one Redis deployment (one server, or one slot of a cluster: every key of a
/// semaphore shares its hash tag). The limit is exact there; semaphores are never spread over
/// several independent deployments.
impl SemaphoreStore for RedisProvider {
    fn supports_semaphores(&self) -> bool {
        true
    }

    fn acquire_permit<'a>(
        &'a self,
        req: PermitRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<PermitGrant>, BackendError>> {
        Box::pin(self.inner.acquire_permit(req))
    }

    fn release_permit<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        Box::pin(async move {
            let token = TokenText::new(owner);
            self.inner
                .counted_release(&SEMAPHORES, key, &[token.as_ref()])
                .await
        })
    }

    fn renew_permit<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        Box::pin(async move {
            let token = TokenText::new(owner);
            let lease = Decimal::new(millis(lease));
            self.inner
                .counted_renew(&SEMAPHORES, key, &[token.as_ref(), lease.as_ref()])
                .await
        })
    }
}
