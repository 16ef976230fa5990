//! The lock half of the contract: acquire (waiting for a hand-over), release (handing over),
//! renew.
//!
//! The first waiter of each process stands in the lock's queue in Redis with its own entry
//! (process, owner, lease, fenced; the others of the process join when they become first),
//! and the release of a marked lock makes the first entry the holder in the same
//! script (see `scripts::RELEASE`): a waiter of this provider is told in memory
//! ([`Hub::hand_locally`]) and holds the lock with its whole lease and token without a command
//! of its own; a waiter of another process is told in a message and confirms within the claim
//! window ([`CLAIM_WINDOW`]) with one look, which makes the lease whole and mints its token.
//! A waiter that gives up (deadline, or its future dropped) takes its entry out, and gives a
//! lock handed to it meanwhile onward, through the same release.

use std::sync::Arc;
use std::time::Duration;

use coord_core::provider::waiting::{TIMED_OUT_LOOK_BACKOFF, TimedOutLooks};
use coord_core::provider::{
    BoxFuture, LockGrant, LockProvider, LockRequest, OwnerToken, ReleaseOutcome, RenewOutcome,
    background,
};
use coord_core::{BackendError, CallKey, FencingToken, LossCause};
use tokio::time::Instant;

use super::commands::{Acks, is_own, is_token, millis};
use super::{BACKSTOP_CAP, FENCE_RETENTION_FLOOR, Inner, MAX_MILLIS, RedisProvider};
use crate::encode::{Decimal, TokenText};
use crate::keys::{self, NameSet, Names};
use crate::scripts;
use crate::transport::{Command, Reply, boxed_in_place};
use crate::waiters::Handed;

/// How long a lock handed over to a waiter of another process stays its own unconfirmed: the
/// waiter confirms within it (one look, which makes the lease whole), or, if it has gone
/// (crashed, or cut off), the lock lapses and the next waiter's look takes it. What a crashed
/// waiter costs the waiters behind it: this window, plus the re-check interval of the next
/// process's head ([`BACKSTOP_CAP`] at most).
pub(crate) const CLAIM_WINDOW: Duration = Duration::from_secs(1);

/// Which attempt at a lock this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TryMode {
    /// The caller will not wait: the bare command.
    Once,
    /// The caller will wait if the lock is held: the remaining lease comes back in the same
    /// round trip.
    FirstOfWait,
}

/// What a waiter's look does with its queue entry when the lock is someone else's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    /// A new waiter: append the entry.
    Join,
    /// A waiter already queued: append the entry only if it is missing (a hand-over it did
    /// not confirm in time took it off), keeping its place otherwise.
    Keep,
    /// The waiter gives up: take the entry out.
    Leave,
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

    /// The owner token as text.
    fn owner(&self) -> &str {
        std::str::from_utf8(self.token.as_ref()).expect("a token is hex")
    }

    /// The fencing counter's retention, ms: ten leases, at least an hour.
    fn fence_ms(&self) -> Decimal {
        let fence_ms = millis(FENCE_RETENTION_FLOOR).max(self.lease_ms.saturating_mul(10));
        Decimal::new(fence_ms.min(MAX_MILLIS))
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
        let [lock, fence, _] = names.all();
        let lease = Decimal::new(lease_ms);
        if fenced {
            let fence_ms = attempt.fence_ms();
            let args = [token.as_ref(), lease.as_ref(), b"0", fence_ms.as_ref()];
            let (reply, acks) = self
                .eval_granting(&scripts::FENCED_ACQUIRE, &[lock, fence], &args, key)
                .await?;
            return self.granted_attempt(self.scripted_attempt(reply, true, key)?, acks, key);
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

    async fn acquire(
        self: &Arc<Self>,
        req: LockRequest<'_>,
    ) -> Result<Option<LockGrant>, BackendError> {
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

    /// A waiter's look (`scripts::LOCK_LOOK`): the lock taken if free, confirmed if handed
    /// over already, else the entry placed as `standing` says.
    async fn look(
        &self,
        attempt: &LockTry<'_>,
        entry: &str,
        standing: Standing,
    ) -> Result<Attempt, BackendError> {
        let [lock, fence, queue] = attempt.names.all();
        let lease = Decimal::new(attempt.lease_ms);
        let fence_ms = attempt.fence_ms();
        let fenced: &[u8] = if attempt.fenced { b"1" } else { b"0" };
        let mode: &[u8] = match standing {
            Standing::Join => b"n",
            Standing::Keep => b"q",
            Standing::Leave => b"w",
        };
        let args = [
            attempt.token.as_ref(),
            lease.as_ref(),
            entry.as_bytes(),
            fenced,
            fence_ms.as_ref(),
            mode,
        ];
        let (reply, acks) = self
            .eval_granting(
                &scripts::LOCK_LOOK,
                &[lock, fence, queue],
                &args,
                attempt.key,
            )
            .await?;
        let attempt_seen = self.scripted_attempt(reply, attempt.fenced, attempt.key)?;
        self.granted_attempt(attempt_seen, acks, attempt.key)
    }

    /// An acquisition that may wait until `req.wait` has passed.
    ///
    /// The waiter stands in the lock's queue in Redis and is handed the lock by a release;
    /// only the head of this process's waiters for the lock keeps a re-check timer (the
    /// holder's remaining lease, at most [`BACKSTOP_CAP`]), against a lost message or a lock
    /// that lapsed instead of being released.
    async fn acquire_waiting(
        self: &Arc<Self>,
        attempt: &LockTry<'_>,
        req: &LockRequest<'_>,
    ) -> Result<Option<LockGrant>, BackendError> {
        let lock = attempt.lock();
        // `None`: no end (a wait too long to represent, such as `Duration::MAX`), the wait
        // lasts until the lock is ours or the future is dropped.
        let deadline = Instant::now().checked_add(req.wait);
        // An attempt or look that timed out (a paused or slow server) does not end a wait
        // that has time left: the wait looks again with the same token, so a grant made with
        // its reply lost is found (the scripts answer "taken" to their owner's resend). A wait
        // that ends while the latest of them was unanswered is a `Timeout` saying so, on
        // which the runtime releases by owner, not a refusal.
        let timed_out = TimedOutLooks::new();
        let answer = self
            .wait_in_queue(attempt, lock, deadline, &timed_out)
            .await;
        timed_out.settle(answer, Option::is_none)
    }

    /// [`acquire_waiting`](Self::acquire_waiting)'s wait, its unanswered attempts and looks
    /// noted in `timed_out`.
    async fn wait_in_queue(
        self: &Arc<Self>,
        attempt: &LockTry<'_>,
        lock: &str,
        deadline: Option<Instant>,
        timed_out: &TimedOutLooks,
    ) -> Result<Option<LockGrant>, BackendError> {
        // Tasks of this process already wait for this lock: queue behind them (a first
        // attempt would only find the lock held, or take it ahead of them).
        if !self.hub.has_waiters(lock) {
            match timed_out.note(self.try_lock(attempt, TryMode::FirstOfWait).await)? {
                Some(Attempt::Won(fence)) => return Ok(Some(grant(fence, false))),
                Some(Attempt::Held(_)) | None => {}
            }
        }
        let owner = attempt.owner();
        let entry = format!(
            "{}:{owner}:{}:{}",
            self.hub.id(),
            attempt.lease_ms,
            u8::from(attempt.fenced)
        );
        // The mailbox before the subscription, the subscription before the entry: no
        // hand-over can find the waiter unreachable.
        let mut mailbox = self.hub.mailbox(lock, owner);
        let joining = self.hub.join_lock(&self.transport, lock.to_owned());
        let (mut ticket, subscribed) = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, joining).await {
                Ok(joined) => joined,
                Err(_) => return Ok(None),
            },
            None => joining.await,
        };
        if let Err(err) = subscribed {
            // Waiting goes on without messages (the subscriber connection is down or slow):
            // a hand-over by this process's releases still reaches the waiter in memory, and
            // the head's re-check (at most [`BACKSTOP_CAP`]) takes a lock released or lapsed
            // meanwhile, so contended locks stay available while pub/sub is not.
            tracing::debug!(
                key = %attempt.key,
                error = %err,
                "coord-redis: waiting for a lock without wake-up messages"
            );
        }
        // Armed at the first look, after which the entry may be in the queue: giving up takes
        // it out.
        let mut queued = Queued {
            inner: None,
            key: attempt.key.clone(),
            owner: attempt.token,
            entry: entry.clone(),
            lease: Duration::from_millis(attempt.lease_ms),
        };
        let mut standing = Standing::Join;
        // Only the head of this process's waiters stands in the queue in Redis; the others
        // join it (one command each) when they become head, so a burst of waiters in one
        // process costs Redis nothing until their turn comes near.
        let mut look_now = ticket.is_head();
        loop {
            let mut timer = None;
            if look_now {
                if queued.inner.is_none() {
                    queued.inner = Some(self.clone());
                }
                let lapse = match timed_out.note(self.look(attempt, &entry, standing).await)? {
                    Some(Attempt::Won(fence)) => {
                        queued.settled();
                        ticket.leave_quietly();
                        return Ok(Some(grant(fence, true)));
                    }
                    Some(Attempt::Held(pttl)) => backstop_after(pttl),
                    // Unanswered: look again soon. The entry may or may not be in the queue
                    // now; the next look keeps it there without adding it twice.
                    None => TIMED_OUT_LOOK_BACKOFF,
                };
                standing = Standing::Keep;
                timer = Instant::now().checked_add(lapse);
            }
            look_now = true;
            // Sleep until handed the lock, woken (a follower: made head), or (the head only)
            // the re-check is due.
            let woken = loop {
                let now = Instant::now();
                if deadline.is_some_and(|d| now >= d) {
                    break None;
                }
                let due = timer.filter(|_| ticket.is_head());
                let until = match (due, deadline) {
                    (Some(t), Some(d)) => Some(t.min(d)),
                    (t, d) => t.or(d),
                };
                let sleep = async {
                    match until {
                        Some(until) => tokio::time::sleep_until(until).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    handed = mailbox.handed() => break Some(handed),
                    // A message, a resync, or made head (the previous head left): look.
                    _ = ticket.next_wake_up() => break Some(Handed::Remote),
                    () = sleep => {
                        // At the deadline, the last look follows at the top.
                        if deadline.is_none_or(|d| Instant::now() < d) {
                            break Some(Handed::Remote);
                        }
                    }
                }
            };
            match woken {
                // Handed over by this provider's release, with its lease and token: held,
                // unless replicas must acknowledge the grant (then a look confirms it, with a
                // `WAIT` of this waiter's own).
                Some(Handed::Local(token)) if self.ack_wait(attempt.key)?.is_none() => {
                    queued.settled();
                    ticket.leave_quietly();
                    let fence = attempt.fenced.then_some(token);
                    return Ok(Some(grant(fence, true)));
                }
                Some(_) => {}
                // The deadline, never having stood in the queue: nothing to take out.
                None if queued.inner.is_none() => return Ok(None),
                // The deadline: one last look, which takes the lock if it is ours by now, or
                // takes the entry out.
                None => {
                    let last = timed_out.note(self.look(attempt, &entry, Standing::Leave).await)?;
                    return Ok(match last {
                        Some(Attempt::Won(fence)) => {
                            queued.settled();
                            ticket.leave_quietly();
                            Some(grant(fence, true))
                        }
                        Some(Attempt::Held(_)) => {
                            queued.settled();
                            None
                        }
                        // Unanswered: whether the entry left is unknown, so the queued guard,
                        // dropped unsettled, takes it out (and releases onward a lock handed
                        // over meanwhile) in the background.
                        None => None,
                    });
                }
            }
        }
    }

    /// Releases `owner`'s hold of `key`, handing the lock to the first waiter in its queue
    /// (telling it in memory when it waits here); with `leaving`, a waiter that gives up, also
    /// takes that queue entry out.
    async fn release_handing(
        &self,
        key: &CallKey,
        owner: &TokenText,
        leaving: Option<&str>,
    ) -> Result<ReleaseOutcome, BackendError> {
        let names =
            Names::of(key).set([keys::LOCK, keys::FENCE, keys::LOCK_QUEUE, keys::LOCK_FORCED]);
        let pid = self.hub.id().as_bytes();
        let claim = Decimal::new(millis(CLAIM_WINDOW));
        let reply = match leaving {
            None => {
                let args = [owner.as_ref(), pid, claim.as_ref()];
                self.eval(&scripts::RELEASE, &names.all(), &args, key)
                    .await?
            }
            Some(entry) => {
                let args = [owner.as_ref(), pid, claim.as_ref(), entry.as_bytes()];
                self.eval(&scripts::RELEASE, &names.all(), &args, key)
                    .await?
            }
        };
        match reply {
            Reply::Int(1) => Ok(ReleaseOutcome::Released),
            Reply::Int(0) => Ok(ReleaseOutcome::NotHeld),
            Reply::Int(2) => Ok(ReleaseOutcome::ForceReleased),
            Reply::Array(items) => match items.as_slice() {
                [Reply::Int(1), Reply::Data(next), Reply::Int(token)]
                    if is_token(next) && *token >= 0 =>
                {
                    let next = std::str::from_utf8(next).expect("a token is hex");
                    // A waiter that is gone by now withdraws, which releases the lock onward.
                    self.hub.hand_locally(names.get(0), next, *token as u64);
                    Ok(ReleaseOutcome::Released)
                }
                _ => Err(self.protocol("release", key, "unexpected script reply")),
            },
            _ => Err(self.protocol("release", key, "unexpected script reply")),
        }
    }
}

/// A waiter's entry in the lock's queue while it waits. Dropped unsettled (the waiting future
/// was dropped), it takes the entry out in the background, and releases (onward) a lock handed
/// to the waiter meanwhile, retried until the waiter's lease would have ended.
struct Queued {
    /// `None` once settled.
    inner: Option<Arc<Inner>>,
    key: CallKey,
    owner: TokenText,
    entry: String,
    lease: Duration,
}

impl Queued {
    /// The waiter holds the lock or has taken its entry out itself: nothing to clean up.
    fn settled(&mut self) {
        self.inner = None;
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else {
            return;
        };
        let (owner, entry) = (self.owner, std::mem::take(&mut self.entry));
        background::spawn_retried(
            "withdrawing a lock waiter",
            self.key.clone(),
            self.lease.max(CLAIM_WINDOW),
            move |key| {
                let (inner, entry) = (inner.clone(), entry.clone());
                async move {
                    inner.release_handing(&key, &owner, Some(&entry)).await?;
                    Ok(true)
                }
            },
        );
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
            let token = TokenText::new(owner);
            self.inner.release_handing(key, &token, None).await
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
