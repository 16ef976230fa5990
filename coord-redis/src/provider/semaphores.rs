//! The semaphore capability: permits in a sorted set scored by the end of their lease on the
//! server's clock, one fencing token per permit, waiters woken by the release message.

use std::time::Duration;

use coord_core::provider::{
    BackendErrorKind, BoxFuture, OwnerToken, PermitGrant, PermitRequest, ReleaseOutcome,
    RenewOutcome, SemaphoreStore,
};
use coord_core::{BackendError, CallKey, FencingToken};
use tokio::time::Instant;

use super::commands::millis;
use super::locks::{backstop_after, renew_outcome};
use super::{Inner, RedisProvider};
use crate::encode::{Decimal, TokenText};
use crate::keys::Names;
use crate::scripts;
use crate::transport::Reply;
use crate::waiters::{Cue, Look, Wake};

/// What one attempt at a permit found.
enum Attempt {
    /// A permit is ours, with its token.
    Won(u64),
    /// Every permit is held; the soonest ends in this many ms (server clock).
    Full(i64),
}

impl Inner {
    async fn try_permit(
        &self,
        req: &PermitRequest<'_>,
        names: &[String; 2],
        watch: bool,
    ) -> Result<Attempt, BackendError> {
        let lease_ms = millis(req.lease);
        let token = TokenText::new(req.owner);
        let (reply, acks) = self
            .eval_granting(
                &scripts::SEM_ACQUIRE,
                &[&names[0], &names[1]],
                &[
                    token.as_ref(),
                    Decimal::new(u64::from(req.limit)).as_ref(),
                    Decimal::new(lease_ms).as_ref(),
                    if watch { b"1" } else { b"0" },
                ],
                req.key,
            )
            .await?;
        match reply {
            Reply::Int(tok) if tok > 0 => {
                // As for a lock grant: a permit the replicas lack fails, and is released by
                // its owner.
                self.replicated(acks, "semaphore acquire", req.key)?;
                Ok(Attempt::Won(tok as u64))
            }
            Reply::Array(items) => match items.as_slice() {
                [Reply::Int(0), Reply::Int(left)] => Ok(Attempt::Full(*left)),
                _ => Err(self.protocol("semaphore acquire", req.key, "unexpected script reply")),
            },
            _ => Err(self.protocol("semaphore acquire", req.key, "unexpected script reply")),
        }
    }

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
        let n = Names::of(req.key);
        let names = [n.semaphore(), n.semaphore_tokens()];
        let deadline = Instant::now().checked_add(req.wait);
        match self.try_permit(&req, &names, false).await? {
            Attempt::Won(token) => return Ok(Some(grant(token, false))),
            Attempt::Full(_) if req.wait.is_zero() => return Ok(None),
            Attempt::Full(_) => {}
        }
        // Subscribed before the next look, which notes the waiter so releases publish; the
        // backstop is the soonest-ending permit's lease (capped, jittered), so a lost message
        // costs at most that long.
        let (req, names) = (&req, &names);
        let look = move |_: Cue| async move {
            Ok(match self.try_permit(req, names, true).await? {
                Attempt::Won(token) => Look::Done(Some(grant(token, true))),
                Attempt::Full(left) => Look::Pending(Some(backstop_after(Some(left.max(0))))),
            })
        };
        self.hub
            .wait(
                &self.transport,
                names[0].clone(),
                Wake::Head,
                deadline,
                None,
                look,
            )
            .await
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
            let inner = &*self.inner;
            let names = Names::of(key);
            let token = TokenText::new(owner);
            let reply = inner
                .eval(
                    &scripts::SEM_RELEASE,
                    &[&names.semaphore(), &names.semaphore_tokens()],
                    &[token.as_ref()],
                    key,
                )
                .await?;
            match reply {
                Reply::Int(1) => Ok(ReleaseOutcome::Released),
                Reply::Int(0) => Ok(ReleaseOutcome::NotHeld),
                _ => Err(inner.protocol("semaphore release", key, "unexpected script reply")),
            }
        })
    }

    fn renew_permit<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let names = Names::of(key);
            let token = TokenText::new(owner);
            let lease = Decimal::new(millis(lease));
            let (reply, acks) = inner
                .eval_granting(
                    &scripts::SEM_RENEW,
                    &[&names.semaphore(), &names.semaphore_tokens()],
                    &[token.as_ref(), lease.as_ref()],
                    key,
                )
                .await?;
            let outcome = renew_outcome(inner, reply, "semaphore renew", key)?;
            if outcome == RenewOutcome::Renewed {
                inner.replicated(acks, "semaphore renew", key)?;
            }
            Ok(outcome)
        })
    }
}
