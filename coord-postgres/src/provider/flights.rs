//! Cluster-scope single-flight: a leased claim row per key, and the leader's outcome kept in
//! a row of its own (named by the leader's token) for the hand-over time.
//!
//! Finishing removes the claim and stores the outcome in one statement, and notifies; so does
//! abandoning (without an outcome). A follower listens, then reads: an outcome stored before
//! its read's snapshot is found by the read, one stored after it notifies. It reads again after
//! every notification, reconnection of the listener and re-check timer.

use std::time::Duration;

use coord_core::provider::{BoxFuture, FlightClaim, FlightStore, FlightWait, OwnerToken};
use coord_core::{BackendError, CallKey};
use tokio::time::Instant;

use super::{Inner, PostgresProvider, from_ms, millis, owner_of, uuid_of, wake_payload};
use crate::waiters::{Cue, Look, Wake};

/// How many times a claim is sent again when the claim row changed under it.
const RACE_RETRIES: usize = 8;

impl Inner {
    async fn flight_claim(
        &self,
        key: &CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> Result<FlightClaim, BackendError> {
        let lease = millis(lease);
        for _ in 0..RACE_RETRIES {
            let rows = self
                .query(
                    &self.sql.flight_claim,
                    &[&key.qualified(), &uuid_of(owner), &lease],
                    "flight claim",
                    key,
                )
                .await?;
            let row = self.one(&rows, "flight claim", key)?;
            if self.get::<i64>(row, 0, "flight claim", key)? == 1 {
                return Ok(FlightClaim::Claimed);
            }
            let leader: Option<uuid::Uuid> = self.get(row, 1, "flight claim", key)?;
            let left: Option<i64> = self.get(row, 2, "flight claim", key)?;
            match (leader, left) {
                (Some(leader), Some(left)) if leader != uuid_of(owner) => {
                    return Ok(FlightClaim::Joined {
                        leader: owner_of(leader),
                        lease_left: from_ms(left),
                    });
                }
                // The snapshot shows no other live leader, yet the claim did not apply: a
                // newer claim landed in between. Look again.
                _ => continue,
            }
        }
        Err(self.contended("flight claim", key))
    }

    async fn flight_wait(
        &self,
        key: &CallKey,
        leader: OwnerToken,
        timeout: Duration,
    ) -> Result<FlightWait, BackendError> {
        // `None`: no end (a timeout too long to represent).
        let deadline = Instant::now().checked_add(timeout);
        let leader = uuid_of(leader);
        let leader = &leader;
        let peek = move |_: Cue| async move {
            let rows = self
                .query(
                    &self.sql.flight_peek,
                    &[&key.qualified(), leader],
                    "flight wait",
                    key,
                )
                .await?;
            let row = self.one(&rows, "flight wait", key)?;
            let outcome: Option<Vec<u8>> = self.get(row, 0, "flight wait", key)?;
            if let Some(outcome) = outcome {
                return Ok(Look::Done(FlightWait::Finished(outcome)));
            }
            let leads: Option<bool> = self.get(row, 1, "flight wait", key)?;
            if leads != Some(true) {
                return Ok(Look::Done(FlightWait::Vacant));
            }
            let left: Option<i64> = self.get(row, 2, "flight wait", key)?;
            Ok(Look::Pending(Some(from_ms(left.unwrap_or(0)))))
        };
        self.hub
            .wait(
                wake_payload("flight", key),
                Wake::All,
                deadline,
                FlightWait::Expired,
                peek,
            )
            .await
    }
}

impl FlightStore for PostgresProvider {
    fn flight_claim<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<FlightClaim, BackendError>> {
        Box::pin(self.inner.flight_claim(key, owner, lease))
    }

    fn flight_renew<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let rows = inner
                .query(
                    &inner.sql.flight_renew,
                    &[&key.qualified(), &uuid_of(owner), &millis(lease)],
                    "flight renew",
                    key,
                )
                .await?;
            let row = inner.one(&rows, "flight renew", key)?;
            Ok(inner.get::<i64>(row, 0, "flight renew", key)? == 1)
        })
    }

    fn flight_finish<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        outcome: &'a [u8],
        hand_over: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let wake = wake_payload("flight", key);
            let rows = inner
                .query(
                    &inner.sql.flight_finish,
                    &[
                        &key.qualified(),
                        &uuid_of(owner),
                        &outcome,
                        &millis(hand_over),
                        &inner.channel,
                        &wake,
                    ],
                    "flight finish",
                    key,
                )
                .await?;
            let row = inner.one(&rows, "flight finish", key)?;
            let finished: i64 = inner.get(row, 0, "flight finish", key)?;
            let kept: bool = inner.get(row, 1, "flight finish", key)?;
            Ok(finished == 1 || kept)
        })
    }

    fn flight_abandon<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let wake = wake_payload("flight", key);
            let rows = inner
                .query(
                    &inner.sql.flight_abandon,
                    &[&key.qualified(), &uuid_of(owner), &inner.channel, &wake],
                    "flight abandon",
                    key,
                )
                .await?;
            let row = inner.one(&rows, "flight abandon", key)?;
            Ok(inner.get::<i64>(row, 0, "flight abandon", key)? == 1)
        })
    }

    fn flight_wait<'a>(
        &'a self,
        key: &'a CallKey,
        leader: OwnerToken,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<FlightWait, BackendError>> {
        Box::pin(self.inner.flight_wait(key, leader, timeout))
    }
}
