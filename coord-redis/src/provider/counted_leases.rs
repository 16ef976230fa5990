//! Counted leases on Redis, the shape semaphores and read-write locks share: holds kept under
//! two keys of one hash tag (a counter or hash beside a sorted set of holds scored by the end
//! of their lease on the server's clock), each hold with its own fencing token, taken by one
//! script that grants or says how soon the first hold in the way ends, released and renewed
//! by one owner-checked script each, waiters woken by the release message.
//!
//! Each kind names its scripts, keys, arguments and words ([`CountedKind`]); the attempt, the
//! wait for a release and the reading of the scripts' replies are written here once.

use std::sync::LazyLock;
use std::time::Duration;

use coord_core::provider::waiting::TimedOutLooks;
use coord_core::provider::{ReleaseOutcome, RenewOutcome};
use coord_core::{BackendError, CallKey};
use tokio::time::Instant;

use super::Inner;
use super::locks::{backstop_after, renew_outcome};
use crate::keys::Names;
use crate::scripts::Script;
use crate::transport::Reply;
use crate::waiters::{Cue, Look, Wake};

/// One kind of counted lease: its scripts, its two keys, how its waiters are woken, and the
/// words its errors use.
pub(super) struct CountedKind {
    /// Grants a hold (a positive token) or answers `[0, ms until the first hold in the way
    /// ends]`; its last argument is `1` when the caller waits (so releases publish).
    pub(super) acquire: &'static LazyLock<Script>,
    /// Answers 1 (released) or 0 (not held).
    pub(super) release: &'static LazyLock<Script>,
    /// Answers as a lock's renewal does (`renew_outcome`).
    pub(super) renew: &'static LazyLock<Script>,
    /// The kind's two keys (the hash tag of `key`).
    pub(super) keys: fn(&Names<'_>) -> [String; 2],
    /// A hand-off of one hold at a time, or every waiter at once.
    pub(super) wake: Wake,
    /// "semaphore acquire", "read-write lock release", ...
    pub(super) acquiring: &'static str,
    pub(super) releasing: &'static str,
    pub(super) renewing: &'static str,
}

/// How an acquisition ended.
pub(super) enum Acquired {
    /// Granted, with the hold's token; `contended`: only after waiting.
    Granted { token: u64, contended: bool },
    /// Refused at once, and the caller did not ask to wait.
    Refused,
    /// Waited until the deadline without a grant.
    WaitEnded,
}

/// What one attempt found.
enum Attempt {
    /// The hold is ours, with its token.
    Won(u64),
    /// Not now; the first hold (or claim) in the way ends in this many ms (server clock).
    Blocked(i64),
}

/// The most arguments a kind's acquire script takes before the "waits" flag.
const MAX_ARGS: usize = 7;

impl CountedKind {
    fn keys_of(&self, key: &CallKey) -> [String; 2] {
        (self.keys)(&Names::of(key))
    }
}

impl Inner {
    /// One attempt; `waits` notes the waiter so releases publish (and whatever else the
    /// kind's script leaves for a waiter, such as a writer's claim).
    async fn counted_attempt(
        &self,
        kind: &CountedKind,
        key: &CallKey,
        keys: &[String; 2],
        args: &[&[u8]],
        waits: bool,
    ) -> Result<Attempt, BackendError> {
        let mut all: [&[u8]; MAX_ARGS + 1] = [b""; MAX_ARGS + 1];
        all[..args.len()].copy_from_slice(args);
        all[args.len()] = if waits { b"1" } else { b"0" };
        let (reply, acks) = self
            .eval_granting(
                kind.acquire,
                &[&keys[0], &keys[1]],
                &all[..=args.len()],
                key,
            )
            .await?;
        match reply {
            Reply::Int(tok) if tok > 0 => {
                // As for a lock grant: a hold the replicas lack fails, and is released by its
                // owner.
                self.replicated(acks, kind.acquiring, key)?;
                Ok(Attempt::Won(tok as u64))
            }
            Reply::Array(items) => match items.as_slice() {
                [Reply::Int(0), Reply::Int(left)] => Ok(Attempt::Blocked(*left)),
                _ => Err(self.protocol(kind.acquiring, key, "unexpected script reply")),
            },
            _ => Err(self.protocol(kind.acquiring, key, "unexpected script reply")),
        }
    }

    /// Takes a hold of `kind` on `key`, waiting up to `wait`. `args` are the acquire script's
    /// arguments before the "waits" flag (at most [`MAX_ARGS`]).
    ///
    /// One attempt first; refused with a wait to spend, the waiter subscribes, then looks
    /// again noting itself so releases publish, and without a message looks again when the
    /// first hold in the way ends (capped, jittered), so a lost message costs at most that.
    /// With a wait to spend, a look that timed out is looked at again ([`TimedOutLooks`]); a
    /// wait that ends while the latest look's reply was lost is a `Timeout` error.
    pub(super) async fn counted_acquire(
        &self,
        kind: &CountedKind,
        key: &CallKey,
        args: &[&[u8]],
        wait: Duration,
    ) -> Result<Acquired, BackendError> {
        debug_assert!(args.len() <= MAX_ARGS);
        let keys = kind.keys_of(key);
        let deadline = Instant::now().checked_add(wait);
        let first = self.counted_attempt(kind, key, &keys, args, false).await;
        if wait.is_zero() {
            // One attempt: no time to look again, a timeout is the answer.
            return Ok(match first? {
                Attempt::Won(token) => Acquired::Granted {
                    token,
                    contended: false,
                },
                Attempt::Blocked(_) => Acquired::Refused,
            });
        }
        // As for locks: an attempt or look that timed out (a paused or slow server) does not
        // end a wait that has time left. The acquire scripts answer their owner's resend with
        // the hold it already has, so a grant whose reply was lost is found by the next look.
        let timed_out = TimedOutLooks::new();
        let timed_out = &timed_out;
        if let Some(Attempt::Won(token)) = timed_out.note(first)? {
            return Ok(Acquired::Granted {
                token,
                contended: false,
            });
        }
        let keys = &keys;
        let look =
            move |_: Cue| async move {
                timed_out.look(self.counted_attempt(kind, key, keys, args, true).await.map(
                    |attempt| match attempt {
                        Attempt::Won(token) => Look::Done(Acquired::Granted {
                            token,
                            contended: true,
                        }),
                        Attempt::Blocked(left) => {
                            Look::Pending(Some(backstop_after(Some(left.max(0)))))
                        }
                    },
                ))
            };
        let answer = self
            .hub
            .wait(
                &self.transport,
                keys[0].clone(),
                kind.wake,
                deadline,
                Acquired::WaitEnded,
                look,
            )
            .await;
        // Ended while the latest look's reply was lost: unknown (the runtime releases by
        // owner), not a refusal.
        timed_out.settle(answer, |acquired| matches!(acquired, Acquired::WaitEnded))
    }

    /// Releases `key`'s hold named by the release script's `args` (owner-checked).
    pub(super) async fn counted_release(
        &self,
        kind: &CountedKind,
        key: &CallKey,
        args: &[&[u8]],
    ) -> Result<ReleaseOutcome, BackendError> {
        let keys = kind.keys_of(key);
        let reply = self
            .eval(kind.release, &[&keys[0], &keys[1]], args, key)
            .await?;
        match reply {
            Reply::Int(1) => Ok(ReleaseOutcome::Released),
            Reply::Int(0) => Ok(ReleaseOutcome::NotHeld),
            _ => Err(self.protocol(kind.releasing, key, "unexpected script reply")),
        }
    }

    /// Renews `key`'s hold named by the renew script's `args` (owner-checked); a renewal the
    /// replicas lack fails, as for a lock.
    pub(super) async fn counted_renew(
        &self,
        kind: &CountedKind,
        key: &CallKey,
        args: &[&[u8]],
    ) -> Result<RenewOutcome, BackendError> {
        let keys = kind.keys_of(key);
        let (reply, acks) = self
            .eval_granting(kind.renew, &[&keys[0], &keys[1]], args, key)
            .await?;
        let outcome = renew_outcome(self, reply, kind.renewing, key)?;
        if outcome == RenewOutcome::Renewed {
            self.replicated(acks, kind.renewing, key)?;
        }
        Ok(outcome)
    }
}
