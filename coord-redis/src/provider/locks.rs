//! The lock half of the contract: acquire (waiting on release messages), release, renew.

use std::time::Duration;

use coord_core::provider::waiting::TimedOutLooks;
use coord_core::provider::{
    BoxFuture, LockGrant, LockProvider, LockRequest, OwnerToken, ReleaseOutcome, RenewOutcome,
};
use coord_core::{BackendError, CallKey, FencingToken, LossCause};
use tokio::time::Instant;

use super::commands::{Acks, is_own, is_token, millis};
use super::{BACKSTOP_CAP, FENCE_RETENTION_FLOOR, Inner, MAX_MILLIS, RedisProvider};
use crate::encode::{Decimal, TokenText};
use crate::keys::{self, NameSet, Names};
use crate::scripts;
use crate::transport::{Command, Reply, boxed_in_place};
use crate::waiters::{Cue, Look, Wake};

/// Which attempt at a lock this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TryMode {
    /// The caller will not wait: the bare command.
    Once,
    /// The caller will wait if the lock is held: the remaining lease comes back in the same
    /// round trip.
    FirstOfWait,
    /// The caller is subscribed to releases: a holder found is marked as waited for, so its
    /// release publishes, and this process is queued to be woken. With `more`, other tasks
    /// of this process wait behind the caller: a lock taken is taken marked, with this process
    /// queued again, so its release wakes this process's next waiter.
    Watching { more: bool },
}

enum Attempt {
    /// The lock is ours (with a fencing token when fenced).
    Won(Option<u64>),
    /// Someone else holds it; the remaining lease in ms as `PTTL` reports it (-1: no expiry,
    /// -2: gone by now, `None`: not asked).
    Held(Option<i64>),
}

/// One acquisition, with everything its attempts send worked out once.
struct LockTry<'a> {
    /// The lock's Redis name, its fencing counter's and its queue's, rendered once.
    names: NameSet<3>,
    token: TokenText,
    lease_ms: u64,
    fenced: bool,
    key: &'a CallKey,
}

impl<'a> LockTry<'a> {
    fn of(req: &LockRequest<'a>) -> LockTry<'a> {
        LockTry {
            names: Names::of(req.key).set([keys::LOCK, keys::FENCE, keys::LOCK_QUEUE]),
            token: TokenText::new(req.owner),
            lease_ms: millis(req.lease),
            fenced: req.fenced,
            key: req.key,
        }
    }

    /// The lock's Redis name.
    fn lock(&self) -> &str {
        self.names.get(0)
    }
}

impl Inner {
    async fn try_lock(
        &self,
        attempt: &LockTry<'_>,
        mode: TryMode,
    ) -> Result<Attempt, BackendError> {
        let LockTry {
            names,
            token,
            lease_ms,
            fenced,
            key,
        } = attempt;
        let (lease_ms, fenced) = (*lease_ms, *fenced);
        let [lock, fence, queue] = names.all();
        let lease = Decimal::new(lease_ms);
        let watch: &[u8] = match mode {
            TryMode::Watching { more: true } => b"2",
            TryMode::Watching { more: false } => b"1",
            _ => b"0",
        };
        let watching = matches!(mode, TryMode::Watching { .. });
        let pid = self.hub.id().as_bytes();
        if fenced {
            let fence_ms = millis(FENCE_RETENTION_FLOOR).max(lease_ms.saturating_mul(10));
            let fence_ms = Decimal::new(fence_ms.min(MAX_MILLIS));
            let (reply, acks) = if watching {
                let args = [
                    token.as_ref(),
                    lease.as_ref(),
                    watch,
                    fence_ms.as_ref(),
                    pid,
                ];
                self.eval_granting(&scripts::FENCED_ACQUIRE, &[lock, fence, queue], &args, key)
                    .await?
            } else {
                let args = [token.as_ref(), lease.as_ref(), watch, fence_ms.as_ref()];
                self.eval_granting(&scripts::FENCED_ACQUIRE, &[lock, fence], &args, key)
                    .await?
            };
            return self.granted_attempt(self.scripted_attempt(reply, true, key)?, acks, key);
        }
        if watching {
            let (reply, acks) = self
                .eval_granting(
                    &scripts::WAITING_ACQUIRE,
                    &[lock, queue],
                    &[token.as_ref(), lease.as_ref(), watch, pid],
                    key,
                )
                .await?;
            return self.granted_attempt(self.scripted_attempt(reply, false, key)?, acks, key);
        }
        // SET .. NX .. GET answers with the current holder when the key is taken (and fails
        // with WRONGTYPE on a foreign value) in the same single command.
        let set = Command::new("SET")
            .key(lock)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(&lease)
            .arg("GET");
        let then = (mode == TryMode::FirstOfWait).then(|| Command::new("PTTL").key(lock));
        let (replies, acks) = self.run_granting(set, then, key).await?;
        match &replies[0] {
            Reply::Nil => self.granted_attempt(Attempt::Won(None), acks, key),
            // Our own token: an earlier send of this very SET landed (a client retry).
            Reply::Data(holder) if is_own(holder, token) => {
                self.granted_attempt(Attempt::Won(None), acks, key)
            }
            Reply::Data(holder) if is_token(holder) => {
                let pttl = match replies.get(1) {
                    Some(Reply::Int(ms)) => Some(*ms),
                    Some(_) => return Err(self.protocol("PTTL", key, "unexpected reply")),
                    None => None,
                };
                Ok(Attempt::Held(pttl))
            }
            Reply::Data(_) => Err(self.foreign_lock(key)),
            _ => Err(self.protocol("SET", key, "unexpected reply")),
        }
    }

    /// Reads the reply of an acquire script: the fencing token (fenced) or 0 when taken,
    /// `{holder, pttl}` when held.
    fn scripted_attempt(
        &self,
        reply: Reply,
        fenced: bool,
        key: &CallKey,
    ) -> Result<Attempt, BackendError> {
        match reply {
            Reply::Int(tok) if fenced && tok > 0 => Ok(Attempt::Won(Some(tok as u64))),
            Reply::Int(0) if !fenced => Ok(Attempt::Won(None)),
            Reply::Array(items) => match items.as_slice() {
                [Reply::Data(holder), Reply::Int(pttl)] if is_token(holder) => {
                    Ok(Attempt::Held(Some(*pttl)))
                }
                [Reply::Data(_), _] => Err(self.foreign_lock(key)),
                _ => Err(self.protocol("acquire", key, "unexpected script reply")),
            },
            _ => Err(self.protocol("acquire", key, "unexpected script reply")),
        }
    }

    /// A won attempt counts only once enough replicas have it (when the provider waits for
    /// replicas); the runtime releases a grant that fails here, by its owner.
    fn granted_attempt(
        &self,
        attempt: Attempt,
        acks: Acks,
        key: &CallKey,
    ) -> Result<Attempt, BackendError> {
        if let Attempt::Won(_) = attempt {
            self.replicated(acks, "acquire", key)?;
        }
        Ok(attempt)
    }

    fn foreign_lock(&self, key: &CallKey) -> BackendError {
        self.corrupt(
            "acquire",
            key,
            "the lock key holds a value coord did not write",
        )
    }

    async fn acquire(&self, req: LockRequest<'_>) -> Result<Option<LockGrant>, BackendError> {
        let attempt = LockTry::of(&req);
        if !req.wait.is_zero() {
            // The waiting machinery lives in its own allocation, so the single attempt (the
            // common case) stays a small future.
            return Box::pin(self.acquire_waiting(&attempt, &req)).await;
        }
        match self.try_lock(&attempt, TryMode::Once).await? {
            Attempt::Won(fence) => Ok(Some(grant(fence, false))),
            Attempt::Held(_) => Ok(None),
        }
    }

    /// An acquisition that may wait until `req.wait` has passed.
    async fn acquire_waiting(
        &self,
        attempt: &LockTry<'_>,
        req: &LockRequest<'_>,
    ) -> Result<Option<LockGrant>, BackendError> {
        let lock = attempt.lock();
        // `None`: no end (a wait too long to represent, such as `Duration::MAX`), the wait
        // lasts until the lock is ours or the future is dropped.
        let deadline = Instant::now().checked_add(req.wait);
        // Tasks of this process already wait for this lock: queue behind them without a
        // round trip (their head watches the lock for all of them).
        // An attempt or look that timed out (a paused or slow server) does not end a wait
        // that has time left: the wait looks again with the same token, so a grant made with
        // its reply lost is found (the scripts answer "taken" to their owner's resend).
        let timed_out = TimedOutLooks::new();
        let timed_out = &timed_out;
        if !self.hub.has_waiters(lock)
            && let Some(Attempt::Won(fence)) =
                timed_out.note(self.try_lock(attempt, TryMode::FirstOfWait).await)?
        {
            return Ok(Some(grant(fence, false)));
        }

        // The first waiting attempt found the lock held; from here on a retry also marks the
        // holder's token as waited for and queues this process, so the release wakes it. The
        // backstop is the holder's remaining lease (capped, with jitter).
        let retry = move |cue: Cue| async move {
            if cue == Cue::Promoted {
                // The previous head took the lock marked, with this process queued: its
                // release wakes us. Only the backstop against a lost message is kept.
                return Ok(Look::Pending(Some(backstop_after(None))));
            }
            let more = self.hub.has_others(lock);
            let tried = self.try_lock(attempt, TryMode::Watching { more }).await;
            timed_out.look(tried.map(|tried| match tried {
                Attempt::Won(fence) if more => Look::DoneWatched(Some(grant(fence, true))),
                Attempt::Won(fence) => Look::Done(Some(grant(fence, true))),
                Attempt::Held(pttl) => Look::Pending(Some(backstop_after(pttl))),
            }))
        };
        let answer = self
            .hub
            .wait(
                &self.transport,
                lock.to_owned(),
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

/// Reads the reply of a renewal script: 1 renewed, 0 free or no longer ours, 2 another
/// owner's, 3 forced free by an operator (locks only: the marker renewal never answers it).
pub(super) fn renew_outcome(
    inner: &Inner,
    reply: Reply,
    what: &str,
    key: &CallKey,
) -> Result<RenewOutcome, BackendError> {
    match reply {
        Reply::Int(1) => Ok(RenewOutcome::Renewed),
        Reply::Int(0) => Ok(RenewOutcome::Lost(LossCause::Expired)),
        Reply::Int(2) => Ok(RenewOutcome::Lost(LossCause::TakenByOther)),
        Reply::Int(3) => Ok(RenewOutcome::Lost(LossCause::ForceReleased)),
        _ => Err(inner.protocol(what, key, "unexpected script reply")),
    }
}

fn grant(fencing_token: Option<u64>, contended: bool) -> LockGrant {
    LockGrant {
        fencing_token: fencing_token.map(FencingToken::new),
        contended,
        lease_began: None,
    }
}

/// When to look again without a message: at the end of the holder's lease (plus jitter so
/// waiters of several processes do not retry in lock-step), at most [`BACKSTOP_CAP`].
pub(super) fn backstop_after(pttl: Option<i64>) -> Duration {
    let base = match pttl {
        Some(-2) => return Duration::ZERO,
        Some(ms) if ms >= 0 => Duration::from_millis(ms as u64).min(BACKSTOP_CAP),
        _ => BACKSTOP_CAP,
    };
    let spread = (base.as_micros() as u64 / 16).max(2000);
    base + Duration::from_micros(1000 + rand::random_range(0..=spread))
}

impl LockProvider for RedisProvider {
    fn acquire<'a>(
        &'a self,
        req: LockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<LockGrant>, BackendError>> {
        boxed_in_place(|| self.inner.acquire(req))
    }

    fn release<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        boxed_in_place(|| async move {
            let inner = &*self.inner;
            let names = Names::of(key).set([keys::LOCK, keys::LOCK_FORCED, keys::LOCK_QUEUE]);
            let token = TokenText::new(owner);
            let reply = inner
                .eval(&scripts::RELEASE, &names.all(), &[token.as_ref()], key)
                .await?;
            match reply {
                Reply::Int(1) => Ok(ReleaseOutcome::Released),
                Reply::Int(0) => Ok(ReleaseOutcome::NotHeld),
                Reply::Int(2) => Ok(ReleaseOutcome::ForceReleased),
                _ => Err(inner.protocol("release", key, "unexpected script reply")),
            }
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
            let names = Names::of(key).set([keys::LOCK, keys::LOCK_FORCED]);
            let token = TokenText::new(owner);
            let lease = Decimal::new(millis(lease));
            let (reply, acks) = inner
                .eval_granting(
                    &scripts::RENEW,
                    &names.all(),
                    &[token.as_ref(), lease.as_ref()],
                    key,
                )
                .await?;
            let outcome = renew_outcome(inner, reply, "renew", key)?;
            if outcome == RenewOutcome::Renewed {
                // A renewal the replicas do not have would not survive a failover: it fails,
                // so a holder cut off with a minority primary loses its hold within the lease.
                inner.replicated(acks, "renew", key)?;
            }
            Ok(outcome)
        })
    }

    /// Every granting write of this provider (locks, permits, read-write and multi-key locks,
    /// claims, completions, renewals, flight claims) reads the operation's override.
    fn supports_replica_acks(&self) -> bool {
        true
    }
}
