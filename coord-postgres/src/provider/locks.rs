//! The lock half of the contract: acquire (waiting on notifications), release, renew.

use std::time::Duration;

use coord_core::provider::waiting::TimedOutLooks;
use coord_core::provider::{
    BoxFuture, LockGrant, LockProvider, LockRequest, OwnerToken, ReleaseOutcome, RenewOutcome,
};
use coord_core::{BackendError, CallKey, FencingToken, LossCause};
use tokio::time::Instant;

use super::{Inner, PostgresProvider, from_ms, millis, uuid_of, wake_payload};
use crate::waiters::{Cue, Look, Wake};

/// What one attempt found.
enum Attempt {
    /// The lock is ours (with a fencing token when fenced).
    Won(Option<u64>),
    /// Someone else holds it, with this much of its lease left (`None`: not known).
    Held(Option<Duration>),
}

impl Inner {
    /// One attempt at the lock; `watch` marks a holder found as waited for, so that its
    /// release notifies.
    async fn try_lock(&self, req: &LockRequest<'_>, watch: bool) -> Result<Attempt, BackendError> {
        let key = req.key;
        let owner = uuid_of(req.owner);
        let lease = millis(req.lease);
        let rows = self
            .query(
                &self.sql.lock_acquire,
                &[&key.qualified(), &owner, &lease, &watch],
                "acquire",
                key,
            )
            .await?;
        let Some(row) = rows.first() else {
            // Held by a row newer than this statement's snapshot.
            return Ok(Attempt::Held(None));
        };
        let won: bool = self.get(row, 0, "acquire", key)?;
        if won {
            if !req.fenced {
                return Ok(Attempt::Won(None));
            }
            // The token is drawn only now that the key is ours (see `LOCK_MINT`).
            let minted = self
                .query(
                    &self.sql.lock_mint,
                    &[&key.qualified(), &owner],
                    "acquire",
                    key,
                )
                .await?;
            let Some(row) = minted.first() else {
                // Another owner took the key over (our lease had ended) before the token was
                // drawn: no grant.
                return Ok(Attempt::Held(None));
            };
            let fence: Option<i64> = self.get(row, 0, "acquire", key)?;
            let Some(fence) = fence else {
                return Err(self.protocol("acquire", key, "a fenced grant without a token"));
            };
            return Ok(Attempt::Won(Some(fence.max(0) as u64)));
        }
        let left: Option<i64> = self.get(row, 2, "acquire", key)?;
        Ok(Attempt::Held(left.map(from_ms)))
    }

    async fn acquire(&self, req: LockRequest<'_>) -> Result<Option<LockGrant>, BackendError> {
        if !req.wait.is_zero() {
            // The waiting machinery lives in its own allocation, so the single attempt (the
            // common case) stays a small future.
            return Box::pin(self.acquire_waiting(&req)).await;
        }
        match self.try_lock(&req, false).await? {
            Attempt::Won(fence) => Ok(Some(grant(fence, false))),
            Attempt::Held(_) => Ok(None),
        }
    }

    async fn acquire_waiting(
        &self,
        req: &LockRequest<'_>,
    ) -> Result<Option<LockGrant>, BackendError> {
        // `None`: a wait too long to represent: until granted or dropped.
        let deadline = Instant::now().checked_add(req.wait);
        // An attempt or look that timed out (the server is slow: a lock wait, a pause) does
        // not end a wait that has time left: the wait looks again, by the same owner, so a
        // grant made with its reply lost is found (the statement answers "won" to its owner's
        // resend).
        let timed_out = TimedOutLooks::new();
        let timed_out = &timed_out;
        if let Some(Attempt::Won(fence)) = timed_out.note(self.try_lock(req, false).await)? {
            return Ok(Some(grant(fence, false)));
        }
        // Held: listen, then try again marking the holder as waited for, so its release
        // notifies; look again at its lease's end at the latest.
        let retry = move |_: Cue| async move {
            timed_out.look(self.try_lock(req, true).await.map(|attempt| match attempt {
                Attempt::Won(fence) => Look::Done(Some(grant(fence, true))),
                Attempt::Held(left) => Look::Pending(left),
            }))
        };
        let answer = self
            .hub
            .wait(
                wake_payload("lock", req.key),
                Wake::Head,
                deadline,
                None,
                retry,
            )
            .await;
        // Not granted while the latest look's reply was lost: a fault (the runtime releases
        // by owner), not a refusal.
        timed_out.settle(answer, Option::is_none)
    }
}

fn grant(fencing_token: Option<u64>, contended: bool) -> LockGrant {
    LockGrant {
        fencing_token: fencing_token.map(FencingToken::new),
        contended,
        lease_began: None,
    }
}

/// A renewal statement's answer: 1 renewed, 2 another owner's, 0 free or lapsed.
pub(super) fn renew_outcome(
    inner: &Inner,
    rows: &[tokio_postgres::Row],
    what: &str,
    key: &CallKey,
) -> Result<RenewOutcome, BackendError> {
    let row = inner.one(rows, what, key)?;
    match inner.get::<i32>(row, 0, what, key)? {
        1 => Ok(RenewOutcome::Renewed),
        2 => Ok(RenewOutcome::Lost(LossCause::TakenByOther)),
        0 => Ok(RenewOutcome::Lost(LossCause::Expired)),
        _ => Err(inner.protocol(what, key, "unexpected answer")),
    }
}

impl LockProvider for PostgresProvider {
    fn acquire<'a>(
        &'a self,
        req: LockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<LockGrant>, BackendError>> {
        Box::pin(self.inner.acquire(req))
    }

    fn release<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let payload = wake_payload("lock", key);
            let rows = inner
                .query(
                    &inner.sql.lock_release,
                    &[&key.qualified(), &uuid_of(owner), &inner.channel, &payload],
                    "release",
                    key,
                )
                .await?;
            let row = inner.one(&rows, "release", key)?;
            Ok(if inner.get::<bool>(row, 0, "release", key)? {
                ReleaseOutcome::Released
            } else {
                ReleaseOutcome::NotHeld
            })
        })
    }

    fn renew<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let rows = inner
                .query(
                    &inner.sql.lock_renew,
                    &[&key.qualified(), &uuid_of(owner), &millis(lease)],
                    "renew",
                    key,
                )
                .await?;
            renew_outcome(inner, &rows, "renew", key)
        })
    }
}
