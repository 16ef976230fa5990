//! Counted leases on PostgreSQL, the shape semaphores (migration 2) and read-write locks
//! (migration 3) share: one row per key, locked by every acquire, release and renewal of the
//! key, and one row per hold with its own lease and fencing token; one function call per
//! operation, which grants or says how soon the first hold in the way ends; waiters sleep on
//! `LISTEN` and are woken by a release.
//!
//! Each kind names its functions, tables, payload and words ([`CountedKind`]); the
//! statements, the attempt, the wait for a release and the release's answer are written here
//! once.

use std::marker::PhantomData;
use std::time::Duration;

use coord_core::provider::waiting::TimedOutLooks;
use coord_core::provider::{ReleaseOutcome, RenewOutcome};
use coord_core::{BackendError, CallKey};
use tokio::time::Instant;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::{Inner, from_ms, wake_payload};
use crate::sql::{Slots, Sql};
use crate::waiters::{Cue, Look, Wake};

/// One kind of counted lease.
pub(crate) trait CountedKind {
    /// The kind in the notification payload of a key's waiters.
    const PAYLOAD: &'static str;
    /// A hand-off of one hold at a time, or every waiter at once.
    const WAKE: Wake;
    /// The hold table and the key table, in that order (the sweeper's order).
    const TABLES: [&'static str; 2];
    /// "semaphore acquire", "read-write lock release", ...
    const ACQUIRING: &'static str;
    /// The release's word in errors.
    const RELEASING: &'static str;
    /// The renewal's word in errors.
    const RENEWING: &'static str;

    /// The acquire, release and renew statements for the schema whose quoted name is
    /// `schema`. Acquire answers `(token, left_ms)` and takes the "watch" flag last; release
    /// answers a boolean and takes the notification channel and payload last.
    fn statements(schema: &str) -> [String; 3];

    /// The renewal's answer, read from its one row.
    fn renewed(inner: &Inner, rows: &[Row], key: &CallKey) -> Result<RenewOutcome, BackendError>;
}

/// The statements of one kind of counted lease, with the provider's schema in them.
#[derive(Debug)]
pub(crate) struct CountedStatements<K> {
    acquire: Sql,
    release: Sql,
    renew: Sql,
    /// Housekeeping: ended holds, and key rows whose every hold (and claim) has ended.
    pub(crate) sweep: [Sql; 2],
    kind: PhantomData<K>,
}

impl<K: CountedKind> CountedStatements<K> {
    /// The statements for the schema whose quoted name is `schema`, numbered by `slots`.
    pub(crate) fn new(schema: &str, slots: &mut Slots) -> CountedStatements<K> {
        let sweep = |table: &str| {
            format!(
                "WITH doomed AS (
  SELECT ctid FROM {schema}.{table} WHERE expires_at <= clock_timestamp()
  LIMIT $1::bigint FOR UPDATE SKIP LOCKED
),
gone AS (DELETE FROM {schema}.{table} t USING doomed WHERE t.ctid = doomed.ctid RETURNING 1)
SELECT count(*) AS swept FROM gone"
            )
        };
        let [acquire, release, renew] = K::statements(schema).map(|text| slots.sql(text));
        CountedStatements {
            acquire,
            release,
            renew,
            sweep: K::TABLES.map(|table| slots.sql(sweep(table))),
            kind: PhantomData,
        }
    }

    /// Every statement, for checking that each prepares against the schema.
    #[cfg(test)]
    pub(crate) fn all(&self) -> Vec<&str> {
        let mut all = vec![self.acquire.text(), self.release.text(), self.renew.text()];
        all.extend(self.sweep.iter().map(Sql::text));
        all
    }
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
    /// Not now; the first hold (or claim) in the way ends within this (server clock; `None`:
    /// unknown).
    Blocked(Option<Duration>),
}

/// The most parameters a kind's acquire or release takes before the ones added here.
const MAX_PARAMS: usize = 6;

type Param<'a> = &'a (dyn ToSql + Sync);

impl Inner {
    /// One attempt; `watch` asks the next release to notify (and leaves whatever else the
    /// kind's function leaves for a waiter, such as a writer's claim).
    async fn counted_attempt<K: CountedKind>(
        &self,
        statements: &CountedStatements<K>,
        key: &CallKey,
        params: &[Param<'_>],
        watch: bool,
    ) -> Result<Attempt, BackendError> {
        let what = K::ACQUIRING;
        let mut all: [Param<'_>; MAX_PARAMS + 1] = [&watch; MAX_PARAMS + 1];
        all[..params.len()].copy_from_slice(params);
        let rows = self
            .query(&statements.acquire, &all[..=params.len()], what, key)
            .await?;
        let row = self.one(&rows, what, key)?;
        let token: Option<i64> = self.get(row, 0, what, key)?;
        let left: Option<i64> = self.get(row, 1, what, key)?;
        Ok(match token {
            Some(token) => Attempt::Won(token.max(0) as u64),
            None => Attempt::Blocked(left.map(from_ms)),
        })
    }

    /// Takes a hold of kind `K` on `key`, waiting up to `wait`. `params` are the acquire
    /// statement's parameters before the "watch" flag (at most [`MAX_PARAMS`]).
    ///
    /// One attempt first; refused with a wait to spend, the waiter listens, then looks again
    /// asking the next release to notify; without a notification it looks again when the
    /// first hold in its way ends (capped, jittered: the waiters' rules). With a wait to
    /// spend, a look that timed out is looked at again ([`TimedOutLooks`]); a wait that ends
    /// while the latest look's reply was lost is a `Timeout` error, not a refusal.
    pub(super) async fn counted_acquire<K: CountedKind>(
        &self,
        statements: &CountedStatements<K>,
        key: &CallKey,
        params: &[Param<'_>],
        wait: Duration,
    ) -> Result<Acquired, BackendError> {
        debug_assert!(params.len() <= MAX_PARAMS);
        // `None`: a wait too long to represent: until granted or dropped.
        let deadline = Instant::now().checked_add(wait);
        let first = self.counted_attempt(statements, key, params, false).await;
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
        // As for locks: an attempt or look that timed out (the key's row locked by a slow
        // statement, a paused server) does not end a wait that has time left. The acquire
        // statements answer their owner's resend with the hold it already has, so a grant
        // whose reply was lost is found by the next look.
        let timed_out = TimedOutLooks::new();
        let timed_out = &timed_out;
        if let Some(Attempt::Won(token)) = timed_out.note(first)? {
            return Ok(Acquired::Granted {
                token,
                contended: false,
            });
        }
        let look = move |_: Cue| async move {
            timed_out.look(
                self.counted_attempt(statements, key, params, true)
                    .await
                    .map(|attempt| match attempt {
                        Attempt::Won(token) => Look::Done(Acquired::Granted {
                            token,
                            contended: true,
                        }),
                        Attempt::Blocked(left) => Look::Pending(left),
                    }),
            )
        };
        let answer = self
            .hub
            .wait(
                wake_payload(K::PAYLOAD, key),
                K::WAKE,
                deadline,
                Acquired::WaitEnded,
                look,
            )
            .await;
        // Ended while the latest look's reply was lost: unknown (the runtime releases by
        // owner), not a refusal.
        timed_out.settle(answer, |acquired| matches!(acquired, Acquired::WaitEnded))
    }

    /// Releases `key`'s hold named by `params` (the release statement's parameters before
    /// the channel and payload its release notifies on; owner-checked).
    pub(super) async fn counted_release<K: CountedKind>(
        &self,
        statements: &CountedStatements<K>,
        key: &CallKey,
        params: &[Param<'_>],
    ) -> Result<ReleaseOutcome, BackendError> {
        debug_assert!(params.len() + 2 <= MAX_PARAMS + 1);
        let what = K::RELEASING;
        let payload = wake_payload(K::PAYLOAD, key);
        let mut all: [Param<'_>; MAX_PARAMS + 1] = [&payload; MAX_PARAMS + 1];
        all[..params.len()].copy_from_slice(params);
        all[params.len()] = &self.channel;
        all[params.len() + 1] = &payload;
        let rows = self
            .query(&statements.release, &all[..params.len() + 2], what, key)
            .await?;
        let row = self.one(&rows, what, key)?;
        Ok(if self.get::<bool>(row, 0, what, key)? {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }

    /// Renews `key`'s hold named by `params` (the renew statement's parameters;
    /// owner-checked).
    pub(super) async fn counted_renew<K: CountedKind>(
        &self,
        statements: &CountedStatements<K>,
        key: &CallKey,
        params: &[Param<'_>],
    ) -> Result<RenewOutcome, BackendError> {
        let rows = self
            .query(&statements.renew, params, K::RENEWING, key)
            .await?;
        K::renewed(self, &rows, key)
    }
}
