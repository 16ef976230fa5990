//! The idempotency half of the contract: claim, complete, abandon, end a marker's lease, wait,
//! renew, purge.
//!
//! Each step is one statement (see the `sql` module). Completion is written by the statement
//! of [`completion_statement`](crate::sql::completion_statement), the one place an outcome is
//! stored; it touches only the key's row, so the same statement can later run inside an
//! application's own transaction (the records table's `transactional` column says which
//! completions did).
//!
//! # A replay is a read
//! A claim first reads the live record at its key with a plain `SELECT` (`RECORD_READ`), and
//! sends the claim statement (`RECORD_CLAIM`, which inserts the marker or reads what is there,
//! in one statement) only when that read cannot answer. So a replay of a completed record, and
//! a duplicate that finds another caller's marker, take no row lock, are given no transaction
//! id, write no WAL and never wait for a row another session holds: one round trip of a plain
//! read, the statement an application would write by hand. A first call pays one extra round
//! trip (the read that finds nothing) before its claim.
//!
//! Every answer is the one the claim statement alone would give:
//!
//! | What the read finds | Answer | Why it is the same |
//! |---|---|---|
//! | a completed record within its retention | `Completed` (the caller checks the fingerprint: a different one is `KeyReused`) | the claim statement writes only over an expired row, and would have reported this one |
//! | another caller's marker in its lease | `InFlight` with its lease left (the caller waits, then claims again) | as above; the claim statement reported it the same way |
//! | another caller's marker past its lease, kept (`on_abandoned = "fail"`) | `Abandoned` | as above |
//! | nothing, or a row past its expiry (any retention: the row's own expiry decides) | the claim statement is sent | it decides on the newest row: it claims, or, if a record was completed or claimed since the read, reports that one |
//! | a transactional marker | the claim statement is sent | only its `FOR UPDATE SKIP LOCKED` tells a marker whose owner's transaction holds the row (in flight however its lease stands) from one that lapsed (taken over) |
//! | this caller's own marker | the claim statement is sent | a resend whose first send landed is answered `Claimed` under the claim's not-after rule, as before |
//!
//! A record completed, purged or expired between the read and the answer changes nothing:
//! the answer is what the key held at the read's instant, inside the call. A waiter
//! (`wait_settled`) reads first too (`RECORD_PEEK`): a marker already marked as waited for is
//! answered from the read; only the first look at a marker marks it (one write per marker, so
//! that its settling notifies).

use std::sync::Arc;
use std::time::Duration;

use coord_core::provider::{
    BackendErrorKind, BoxFuture, ClaimOutcome, ClaimRequest, CompleteOutcome, CompleteRequest,
    Fingerprint, IdempotencyStore, OwnerToken, RenewOutcome,
};
use coord_core::{BackendError, CallKey};
use tokio::time::Instant;

use super::locks::renew_outcome;
use super::{
    Inner, MAX_MILLIS, PostgresProvider, from_ms, millis, owner_of, uuid_of, wake_payload,
};
use crate::waiters::{Cue, Look, Wake};

/// How many times a statement is sent again when the key's row changed under it (another
/// caller's write landed between its snapshot and its write); each send is replay-safe.
const RACE_RETRIES: usize = 8;

/// What a claim reports as the time left of a transactional marker whose row its owner's
/// transaction holds, when its lease has already lapsed: the transaction is about to end.
const BUSY_REMAINING_MS: i64 = 25;

/// How often an abandon or a renewal is sent again, a few milliseconds apart, when the row is
/// locked elsewhere (55P03) before the error is returned: a lock held by one statement of
/// another caller ends within that time; one held by a transaction of the application's may
/// not, and the caller then retries later or leaves the marker to lapse.
const LOCKED_RETRIES: u32 = 4;

/// Whether `err` is PostgreSQL's "lock not available" (a `NOWAIT` lock on a row locked
/// elsewhere).
pub(crate) fn is_locked(err: &BackendError) -> bool {
    err.to_string().contains("(55P03)")
}

fn fingerprint_of(
    inner: &Inner,
    bytes: Option<Vec<u8>>,
    key: &CallKey,
) -> Result<Option<Fingerprint>, BackendError> {
    match bytes {
        None => Ok(None),
        Some(bytes) => <[u8; 16]>::try_from(bytes.as_slice())
            .map(|fp| Some(Fingerprint(fp)))
            .map_err(|_| {
                BackendError::new(
                    BackendErrorKind::Corrupt,
                    format!(
                        "claim at {}: the record's fingerprint is not 16 bytes",
                        inner.address
                    ),
                )
                .with_key(key)
            }),
    }
}

impl Inner {
    /// A claim: the record read first, the claim statement sent only when the read cannot
    /// answer (see [`Inner::replay`]).
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<ClaimOutcome, BackendError> {
        if let Some(found) = self.replay(&req).await? {
            return Ok(found);
        }
        self.claim_or_read(req).await
    }

    /// The claim's first step: a plain read of the live record at the key (`RECORD_READ`: no
    /// row lock, no transaction id, no WAL, never waiting for a writer). Answers when the
    /// claim statement could not have applied to what it found, which is every live record
    /// but a transactional marker and the caller's own marker: a completed record (a replay,
    /// or a fingerprint mismatch the caller reports as key reuse), another caller's marker in
    /// its lease (in flight) or kept after it (abandoned). `None`: no live record, a
    /// transactional marker (its row may be held by its owner's transaction, which only the
    /// claim statement's `SKIP LOCKED` tells) or this owner's marker (a resend, which the claim
    /// statement answers under its not-after rule): send the claim statement, which decides
    /// again on the newest row, whatever happened since this read.
    async fn replay(&self, req: &ClaimRequest<'_>) -> Result<Option<ClaimOutcome>, BackendError> {
        let key = req.key;
        let rows = self
            .query(&self.sql.record_read, &[&key.qualified()], "claim", key)
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let state: String = self.get(row, 0, "claim", key)?;
        let stored_owner: uuid::Uuid = self.get(row, 1, "claim", key)?;
        let expires_in: i64 = self.get(row, 5, "claim", key)?;
        let transactional: bool = self.get(row, 7, "claim", key)?;
        if expires_in <= 0
            || (transactional && state == "in_flight")
            || stored_owner == uuid_of(req.owner)
        {
            return Ok(None);
        }
        self.found(row, 0, uuid_of(req.owner), key).map(Some)
    }

    /// What a live record read at columns `at..at + 7` (`state, owner, fingerprint, payload,
    /// lease_left_ms, expires_in_ms, age_ms`) answers a claim by `owner` that did not write.
    fn found(
        &self,
        row: &tokio_postgres::Row,
        at: usize,
        owner: uuid::Uuid,
        key: &CallKey,
    ) -> Result<ClaimOutcome, BackendError> {
        let state: Option<String> = self.get(row, at, "claim", key)?;
        let stored_owner: Option<uuid::Uuid> = self.get(row, at + 1, "claim", key)?;
        let fingerprint = fingerprint_of(self, self.get(row, at + 2, "claim", key)?, key)?;
        match state.as_deref() {
            Some("in_flight") => {
                let lease_left: Option<i64> = self.get(row, at + 4, "claim", key)?;
                match lease_left {
                    Some(ms) if ms > 0 => {
                        if stored_owner == Some(owner) {
                            // A resend whose first send landed.
                            Ok(ClaimOutcome::Claimed)
                        } else {
                            Ok(ClaimOutcome::InFlight {
                                fingerprint,
                                remaining: from_ms(ms),
                            })
                        }
                    }
                    // Past its lease but kept: abandoned.
                    _ => Ok(ClaimOutcome::Abandoned { fingerprint }),
                }
            }
            Some("completed") => {
                let payload: Option<Vec<u8>> = self.get(row, at + 3, "claim", key)?;
                let age: Option<i64> = self.get(row, at + 6, "claim", key)?;
                let payload = payload.ok_or_else(|| {
                    self.protocol("claim", key, "a completed record without a payload")
                })?;
                Ok(ClaimOutcome::Completed {
                    payload: Arc::from(payload),
                    fingerprint,
                    age: age.map(from_ms),
                })
            }
            _ => Err(BackendError::new(
                BackendErrorKind::Corrupt,
                format!("claim at {}: the record has an unknown state", self.address),
            )
            .with_key(key)),
        }
    }

    /// The claim statement (`RECORD_CLAIM`): writes the marker when no live record is there,
    /// or reads what is, in one statement, under the not-after rule.
    async fn claim_or_read(&self, req: ClaimRequest<'_>) -> Result<ClaimOutcome, BackendError> {
        let key = req.key;
        let owner = uuid_of(req.owner);
        let lease = millis(req.in_flight_lease);
        // Lease plus keep stays within what is written.
        let keep = req
            .keep_abandoned_for
            .map(|d| millis(d).min(MAX_MILLIS as i64 - lease).max(1));
        let fp: Option<&[u8]> = req.fingerprint.as_ref().map(|fp| &fp.0[..]);
        // Past this instant (server clock) the claim must not take effect: by then this call
        // has given up waiting for it, and a marker made now would belong to nobody.
        let grace = self.timeout.max(Duration::from_millis(250));
        let window = millis(self.timeout.saturating_mul(2).saturating_add(grace));
        let mut remeasured = false;
        let mut attempt = 0;
        loop {
            let sent = std::time::Instant::now();
            let not_after = self.clock.now_ms().saturating_add(window);
            let rows = self
                .query(
                    &self.sql.record_claim,
                    &[
                        &key.qualified(),
                        &owner,
                        &lease,
                        &fp,
                        &keep,
                        &Some(not_after),
                        &req.transactional,
                    ],
                    "claim",
                    key,
                )
                .await?;
            let row = self.one(&rows, "claim", key)?;
            let claimed: i64 = self.get(row, 0, "claim", key)?;
            let in_time: bool = self.get(row, 1, "claim", key)?;
            if !in_time {
                if !remeasured && sent.elapsed() < self.timeout {
                    // Refused as late though answered in time: the estimate of the server's
                    // clock is off (its clock was stepped). Measure again, send once more.
                    remeasured = true;
                    tracing::warn!(key = %key, "coord-postgres: a claim came back refused as late although it was answered in time: the server's clock moved; measuring it again");
                    self.remeasure_clock().await?;
                    continue;
                }
                return Err(BackendError::new(
                    BackendErrorKind::Timeout,
                    "claim: the statement reached PostgreSQL after this call had given up on it; it was not applied",
                )
                .with_key(key));
            }
            if claimed == 1 {
                return Ok(ClaimOutcome::Claimed);
            }
            let state: Option<String> = self.get(row, 2, "claim", key)?;
            let busy: bool = self.get(row, 9, "claim", key)?;
            if busy {
                if state.as_deref() == Some("in_flight") {
                    // A transactional marker whose owner's transaction holds its row (the
                    // completion is written there, the commit not yet made): in flight, however
                    // its lease stands, until that transaction ends.
                    let lease_left: Option<i64> = self.get(row, 6, "claim", key)?;
                    let fingerprint = fingerprint_of(self, self.get(row, 4, "claim", key)?, key)?;
                    return Ok(ClaimOutcome::InFlight {
                        fingerprint,
                        remaining: from_ms(lease_left.unwrap_or(0).max(BUSY_REMAINING_MS)),
                    });
                }
                // The row changed since the snapshot: look again.
                attempt += 1;
                if attempt >= RACE_RETRIES {
                    return Err(self.contended("claim", key));
                }
                continue;
            }
            let expires_in: Option<i64> = self.get(row, 7, "claim", key)?;
            let live = state.is_some() && expires_in.is_some_and(|ms| ms > 0);
            if !live {
                // No live record in the snapshot, yet the claim did not apply: another
                // caller's write landed in between. Look again.
                attempt += 1;
                if attempt >= RACE_RETRIES {
                    return Err(self.contended("claim", key));
                }
                continue;
            }
            return self.found(row, 2, owner, key);
        }
    }

    async fn complete(&self, req: CompleteRequest<'_>) -> Result<CompleteOutcome, BackendError> {
        let key = req.key;
        let owner = uuid_of(req.owner);
        let retention = millis(req.retention);
        let fp: Option<&[u8]> = req.fingerprint.as_ref().map(|fp| &fp.0[..]);
        let payload: &[u8] = &req.payload;
        let wake = wake_payload("record", key);
        let transactional = false;
        for _ in 0..RACE_RETRIES {
            let rows = self
                .query(
                    &self.sql.record_complete,
                    &[
                        &key.qualified(),
                        &owner,
                        &payload,
                        &retention,
                        &fp,
                        &transactional,
                        &self.channel,
                        &wake,
                    ],
                    "complete",
                    key,
                )
                .await?;
            let row = self.one(&rows, "complete", key)?;
            let stored: i64 = self.get(row, 0, "complete", key)?;
            let created: i64 = self.get(row, 1, "complete", key)?;
            if stored == 1 {
                return Ok(CompleteOutcome::Stored);
            }
            if created == 1 {
                return Ok(CompleteOutcome::StoredWithoutMarker);
            }
            let state: Option<String> = self.get(row, 3, "complete", key)?;
            let found: Option<uuid::Uuid> = self.get(row, 4, "complete", key)?;
            let live: Option<bool> = self.get(row, 5, "complete", key)?;
            if live != Some(true) {
                // A concurrent writer created the row after this statement locked nothing.
                continue;
            }
            let completed = state.as_deref() == Some("completed");
            if found == Some(owner) {
                if completed {
                    // This very completion, sent again.
                    return Ok(CompleteOutcome::Stored);
                }
                return Err(self.protocol("complete", key, "the owner's marker was not completed"));
            }
            return Ok(CompleteOutcome::Superseded {
                other: found.map(owner_of),
                completed,
            });
        }
        Err(self.contended("complete", key))
    }

    async fn wait_settled(&self, key: &CallKey, timeout: Duration) -> Result<(), BackendError> {
        if timeout.is_zero() {
            return Ok(());
        }
        // `None`: no end (a timeout too long to represent): until the marker settles.
        let deadline = Instant::now().checked_add(timeout);
        let probe = move |_: Cue| async move {
            // A plain read first: a marker already marked as waited for notifies when it
            // settles, so there is nothing to write; only a first look at it (or a
            // transactional marker, whose row its owner's transaction may hold) locks it.
            let seen = self
                .query(&self.sql.record_peek, &[&key.qualified()], "wait", key)
                .await?;
            let Some(row) = seen.first() else {
                // Nothing in flight: settled (completed, abandoned, lapsed or purged).
                return Ok(Look::Done(()));
            };
            let transactional: bool = self.get(row, 0, "wait", key)?;
            let waited: bool = self.get(row, 1, "wait", key)?;
            let in_lease: bool = self.get(row, 2, "wait", key)?;
            let left: Option<i64> = self.get(row, 3, "wait", key)?;
            if waited
                && in_lease
                && !transactional
                && let Some(ms) = left.filter(|ms| *ms > 0)
            {
                return Ok(Look::Pending(Some(from_ms(ms))));
            }
            let rows = self
                .query(&self.sql.record_probe, &[&key.qualified()], "wait", key)
                .await?;
            match rows.first() {
                // Nothing in flight: settled (completed, abandoned, lapsed or purged).
                None => Ok(Look::Done(())),
                Some(row) => {
                    let left: Option<i64> = self.get(row, 0, "wait", key)?;
                    Ok(Look::Pending(Some(from_ms(left.unwrap_or(0)))))
                }
            }
        };
        self.hub
            .wait(wake_payload("record", key), Wake::All, deadline, (), probe)
            .await
    }

    /// Runs a statement that fails with 55P03 rather than wait for a row locked elsewhere,
    /// sending it again a few times, a few milliseconds apart, while it does.
    pub(crate) async fn query_unlocked(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        what: &str,
        key: &CallKey,
    ) -> Result<Vec<tokio_postgres::Row>, BackendError> {
        let mut attempt = 0;
        loop {
            match self.query(sql, params, what, key).await {
                Err(err) if is_locked(&err) && attempt < LOCKED_RETRIES => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(2u64 << attempt)).await;
                }
                outcome => return outcome,
            }
        }
    }

    /// Runs a statement answering `(flag, ...)` and returns the flag.
    async fn flag(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        what: &str,
        key: &CallKey,
    ) -> Result<bool, BackendError> {
        let rows = self.query_unlocked(sql, params, what, key).await?;
        let row = self.one(&rows, what, key)?;
        self.get(row, 0, what, key)
    }
}

impl IdempotencyStore for PostgresProvider {
    fn claim<'a>(
        &'a self,
        req: ClaimRequest<'a>,
    ) -> BoxFuture<'a, Result<ClaimOutcome, BackendError>> {
        Box::pin(self.inner.claim(req))
    }

    /// True: a transactional claim's marker is stored with the `transactional` column set and
    /// counts as absent once its lease lapses, even under a keep (what
    /// [`ClaimRequest::transactional`] asks); its completion is written inside the caller's
    /// own transaction through [`Transaction`](crate::Transaction).
    fn transactional_claims(&self) -> bool {
        true
    }

    fn complete<'a>(
        &'a self,
        req: CompleteRequest<'a>,
    ) -> BoxFuture<'a, Result<CompleteOutcome, BackendError>> {
        Box::pin(self.inner.complete(req))
    }

    fn abandon<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let wake = wake_payload("record", key);
            inner
                .flag(
                    &inner.sql.record_abandon,
                    &[&key.qualified(), &uuid_of(owner), &inner.channel, &wake],
                    "abandon",
                    key,
                )
                .await
        })
    }

    fn end_marker_lease<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let wake = wake_payload("record", key);
            inner
                .flag(
                    &inner.sql.record_end_lease,
                    &[&key.qualified(), &uuid_of(owner), &inner.channel, &wake],
                    "end marker lease",
                    key,
                )
                .await
        })
    }

    fn wait_settled<'a>(
        &'a self,
        key: &'a CallKey,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(self.inner.wait_settled(key, timeout))
    }

    fn renew_marker<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let rows = inner
                .query_unlocked(
                    &inner.sql.record_renew,
                    &[&key.qualified(), &uuid_of(owner), &millis(lease)],
                    "renew marker",
                    key,
                )
                .await?;
            renew_outcome(inner, &rows, "renew marker", key)
        })
    }

    fn purge<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let wake = wake_payload("record", key);
            inner
                .flag(
                    &inner.sql.record_purge,
                    &[&key.qualified(), &inner.channel, &wake],
                    "purge",
                    key,
                )
                .await
        })
    }
}
