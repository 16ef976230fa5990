//! The read-write lock capability: a hash with the writer, the waiting writer's claim, the
//! readers' tokens and the key's one fencing counter, beside a sorted set of readers scored by
//! the end of their lease on the server's clock; waiters woken by the release message (see
//! `scripts::rw_locks` for the layout).

use std::time::Duration;

use coord_core::provider::{
    BoxFuture, OwnerToken, ReleaseOutcome, RenewOutcome, RwGrant, RwLockRequest, RwLockStore,
    RwMode,
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

/// What one attempt found.
enum Attempt {
    /// The hold is ours, with its token.
    Won(u64),
    /// Not now; the first thing in the way ends in this many ms (server clock).
    Blocked(i64),
}

fn mode_arg(mode: RwMode) -> &'static [u8] {
    match mode {
        RwMode::Read => b"r",
        RwMode::Write => b"w",
    }
}

impl Inner {
    async fn try_rw(
        &self,
        req: &RwLockRequest<'_>,
        names: &[String; 2],
        waits: bool,
    ) -> Result<Attempt, BackendError> {
        let token = TokenText::new(req.owner);
        let (reply, acks) = self
            .eval_granting(
                &scripts::RW_ACQUIRE,
                &[&names[0], &names[1]],
                &[
                    token.as_ref(),
                    mode_arg(req.mode),
                    Decimal::new(millis(req.lease)).as_ref(),
                    Decimal::new(millis(req.claim).max(2)).as_ref(),
                    if waits { b"1" } else { b"0" },
                ],
                req.key,
            )
            .await?;
        match reply {
            Reply::Int(tok) if tok > 0 => {
                // As for a lock grant: a hold the replicas lack fails, and is released by its
                // owner.
                self.replicated(acks, "read-write lock acquire", req.key)?;
                Ok(Attempt::Won(tok as u64))
            }
            Reply::Array(items) => match items.as_slice() {
                [Reply::Int(0), Reply::Int(left)] => Ok(Attempt::Blocked(*left)),
                _ => Err(self.protocol(
                    "read-write lock acquire",
                    req.key,
                    "unexpected script reply",
                )),
            },
            _ => Err(self.protocol(
                "read-write lock acquire",
                req.key,
                "unexpected script reply",
            )),
        }
    }

    async fn acquire_rw(&self, req: RwLockRequest<'_>) -> Result<Option<RwGrant>, BackendError> {
        let n = Names::of(req.key);
        let names = [n.rw_lock(), n.rw_readers()];
        let deadline = Instant::now().checked_add(req.wait);
        match self.try_rw(&req, &names, false).await? {
            Attempt::Won(token) => return Ok(Some(grant(token, false))),
            Attempt::Blocked(_) if req.wait.is_zero() => return Ok(None),
            Attempt::Blocked(_) => {}
        }
        // Subscribed before the next look, which notes the waiter (and leaves a writer's
        // claim) so releases publish. Every waiter of the key is woken by a release, since
        // one release can let several readers in; the backstop is the first hold or claim in
        // the way ending (for a claiming writer, half its claim), capped and jittered.
        let (rq, nm) = (&req, &names);
        let look = move |_: Cue| async move {
            Ok(match self.try_rw(rq, nm, true).await? {
                Attempt::Won(token) => Look::Done(Some(grant(token, true))),
                Attempt::Blocked(left) => Look::Pending(Some(backstop_after(Some(left.max(0))))),
            })
        };
        let granted = self
            .hub
            .wait(
                &self.transport,
                names[0].clone(),
                Wake::All,
                deadline,
                None,
                look,
            )
            .await?;
        if granted.is_none() && req.mode == RwMode::Write {
            // Gave up: withdraw the claim now rather than hold readers back until it ends.
            // Best effort: the claim ends on its own anyway.
            let _ = self.release_rw(req.key, req.owner, RwMode::Write).await;
        }
        Ok(granted)
    }

    async fn release_rw(
        &self,
        key: &CallKey,
        owner: OwnerToken,
        mode: RwMode,
    ) -> Result<ReleaseOutcome, BackendError> {
        let names = Names::of(key);
        let token = TokenText::new(owner);
        let reply = self
            .eval(
                &scripts::RW_RELEASE,
                &[&names.rw_lock(), &names.rw_readers()],
                &[token.as_ref(), mode_arg(mode)],
                key,
            )
            .await?;
        match reply {
            Reply::Int(1) => Ok(ReleaseOutcome::Released),
            Reply::Int(0) => Ok(ReleaseOutcome::NotHeld),
            _ => Err(self.protocol("read-write lock release", key, "unexpected script reply")),
        }
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
            let inner = &*self.inner;
            let names = Names::of(key);
            let token = TokenText::new(owner);
            let lease = Decimal::new(millis(lease));
            let (reply, acks) = inner
                .eval_granting(
                    &scripts::RW_RENEW,
                    &[&names.rw_lock(), &names.rw_readers()],
                    &[token.as_ref(), mode_arg(mode), lease.as_ref()],
                    key,
                )
                .await?;
            let outcome = renew_outcome(inner, reply, "read-write lock renew", key)?;
            if outcome == RenewOutcome::Renewed {
                inner.replicated(acks, "read-write lock renew", key)?;
            }
            Ok(outcome)
        })
    }
}
