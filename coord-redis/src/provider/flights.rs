//! Cluster-scope single-flight: a leased claim per key and a short-lived hand-over of the
//! leader's outcome, announced on the claim's channel.
//!
//! The claim is a string at `ns:flight:{op:parts}` holding the leader's token with a `PX`
//! lease; the hand-over is a string at `ns:flight:{op:parts}:<leader token>` with the
//! hand-over time as its `PX`. Finishing and abandoning are owner-checked scripts that publish
//! on the claim's channel after their write. A follower subscribes (through the provider's one
//! subscriber connection), then reads: an outcome published before it subscribed is found by
//! the read, one published after wakes it. It reads again after every wake-up and after the
//! subscriber reconnects (a message may have been missed), and at most when the leader's lease
//! ends, so a crashed leader is noticed without polling.

use std::time::Duration;

use coord_core::provider::{
    BoxFuture, FlightClaim, FlightStore, FlightWait, OwnerToken, SentNotice,
};
use coord_core::{BackendError, CallKey};
use tokio::time::Instant;

use super::commands::{millis, parse_token};
use super::{Inner, RedisProvider};
use crate::encode::{Decimal, TokenText};
use crate::keys::Names;
use crate::scripts;
use crate::transport::Reply;
use crate::waiters::{Cue, Look, Wake};

impl Inner {
    async fn flight_wait(
        &self,
        key: &CallKey,
        leader: OwnerToken,
        timeout: Duration,
    ) -> Result<FlightWait, BackendError> {
        // `None`: no end (a timeout too long to represent).
        let deadline = Instant::now().checked_add(timeout);
        let names = Names::of(key);
        let claim = names.flight();
        let token = TokenText::new(leader);
        let leader_text = std::str::from_utf8(token.as_ref()).unwrap_or_default();
        let outcome = names.flight_outcome(leader_text);
        let (claim_key, outcome_key, token_text) = (&claim, &outcome, &token);
        // Read after every wake-up and reconnection; the claim settles by message, or lapses
        // at its expiry (server time, read as a remaining duration, so no clocks are
        // compared): read again then.
        let peek = move |_: Cue| async move {
            let reply = self
                .eval(
                    &scripts::FLIGHT_PEEK,
                    &[claim_key, outcome_key],
                    &[token_text.as_ref()],
                    key,
                )
                .await?;
            let lease_left = match reply {
                Reply::Array(items) => match items.as_slice() {
                    [Reply::Int(1), Reply::Data(bytes)] => {
                        return Ok(Look::Done(FlightWait::Finished(bytes.clone())));
                    }
                    [Reply::Int(0)] => return Ok(Look::Done(FlightWait::Vacant)),
                    [Reply::Int(2), Reply::Int(ms)] if *ms >= 0 => *ms as u64,
                    // A claim without an expiry is not one coord wrote.
                    [Reply::Int(2), Reply::Int(_)] => {
                        return Err(self.corrupt(
                            "flight wait",
                            key,
                            "the flight claim has no expiry",
                        ));
                    }
                    _ => return Err(self.protocol("flight wait", key, "unexpected script reply")),
                },
                _ => return Err(self.protocol("flight wait", key, "unexpected script reply")),
            };
            Ok(Look::Pending(Some(Duration::from_millis(lease_left + 1))))
        };
        self.hub
            .wait(
                &self.transport,
                claim.clone(),
                Wake::All,
                deadline,
                FlightWait::Expired,
                peek,
            )
            .await
    }
}

impl FlightStore for RedisProvider {
    fn flight_claim<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<FlightClaim, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let token = TokenText::new(owner);
            let lease = Decimal::new(millis(lease));
            let claim = Names::of(key).flight();
            let (reply, acks) = inner
                .eval_granting(
                    &scripts::FLIGHT_CLAIM,
                    &[&claim],
                    &[token.as_ref(), lease.as_ref()],
                    key,
                )
                .await?;
            match reply {
                Reply::Array(items) => match items.as_slice() {
                    [Reply::Int(1)] => {
                        inner.replicated(acks, "flight claim", key)?;
                        Ok(FlightClaim::Claimed)
                    }
                    [Reply::Int(0), Reply::Data(holder), Reply::Int(ms)] => {
                        let leader = parse_token(holder).ok_or_else(|| {
                            inner.corrupt("flight claim", key, "the claim is not an owner token")
                        })?;
                        if *ms < 0 {
                            return Err(inner.corrupt(
                                "flight claim",
                                key,
                                "the flight claim has no expiry",
                            ));
                        }
                        Ok(FlightClaim::Joined {
                            leader,
                            lease_left: Duration::from_millis(*ms as u64),
                        })
                    }
                    _ => Err(inner.protocol("flight claim", key, "unexpected script reply")),
                },
                _ => Err(inner.protocol("flight claim", key, "unexpected script reply")),
            }
        })
    }

    fn flight_renew<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let token = TokenText::new(owner);
            let lease = Decimal::new(millis(lease));
            let claim = Names::of(key).flight();
            let (reply, acks) = inner
                .eval_granting(
                    &scripts::FLIGHT_RENEW,
                    &[&claim],
                    &[token.as_ref(), lease.as_ref()],
                    key,
                )
                .await?;
            let renewed = flag(inner, reply, "flight renew", key)?;
            if renewed {
                inner.replicated(acks, "flight renew", key)?;
            }
            Ok(renewed)
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
            let token = TokenText::new(owner);
            let hand_over = Decimal::new(millis(hand_over));
            let names = Names::of(key);
            let claim = names.flight();
            let kept =
                names.flight_outcome(std::str::from_utf8(token.as_ref()).unwrap_or_default());
            let reply = inner
                .eval(
                    &scripts::FLIGHT_FINISH,
                    &[&claim, &kept],
                    &[token.as_ref(), outcome, hand_over.as_ref()],
                    key,
                )
                .await?;
            flag(inner, reply, "flight finish", key)
        })
    }

    /// The finish, told as sent once the kernel accepted its last byte (redis-rs over a plain
    /// TCP or Unix socket; otherwise once answered). Its hand-over key followed by the owner
    /// token is in no other request: the claim and renewals carry the token, not that key.
    fn flight_finish_noting_sent<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        outcome: &'a [u8],
        hand_over: Duration,
        sent: SentNotice,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let token = TokenText::new(owner);
            let hand_over = Decimal::new(millis(hand_over));
            let names = Names::of(key);
            let claim = names.flight();
            let kept =
                names.flight_outcome(std::str::from_utf8(token.as_ref()).unwrap_or_default());
            // Written as `.. <claim> <kept> <token> <outcome> <hand-over>`: `kept` (whose name
            // ends in the token) then the token itself mark this request.
            let reply = inner
                .eval_noting_sent(
                    &scripts::FLIGHT_FINISH,
                    &[&claim, &kept],
                    &[token.as_ref(), outcome, hand_over.as_ref()],
                    1..3,
                    key,
                    sent,
                )
                .await?;
            flag(inner, reply, "flight finish", key)
        })
    }

    fn flight_abandon<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let token = TokenText::new(owner);
            let claim = Names::of(key).flight();
            let reply = inner
                .eval(&scripts::FLIGHT_ABANDON, &[&claim], &[token.as_ref()], key)
                .await?;
            flag(inner, reply, "flight abandon", key)
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

/// A script's 0 / 1 answer.
fn flag(inner: &Inner, reply: Reply, what: &str, key: &CallKey) -> Result<bool, BackendError> {
    match reply {
        Reply::Int(1) => Ok(true),
        Reply::Int(0) => Ok(false),
        _ => Err(inner.protocol(what, key, "unexpected script reply")),
    }
}
