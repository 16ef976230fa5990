//! The idempotency half of the contract: claim, complete, abandon, end a marker's lease, wait,
//! renew, purge.

use std::sync::Arc;
use std::time::Duration;

use coord_core::provider::{
    BackendErrorKind, BoxFuture, ClaimOutcome, ClaimRequest, CompleteOutcome, CompleteRequest,
    Fingerprint, IdempotencyStore, OwnerToken, RenewOutcome,
};
use coord_core::{BackendError, CallKey};
use tokio::time::Instant;

use super::commands::{millis, parse_token};
use super::locks::renew_outcome;
use super::{Inner, MAX_MILLIS, RedisProvider, server_time};
use crate::encode::{Decimal, TokenText};
use crate::keys::Names;
use crate::scripts::{self, Script};
use crate::transport::Reply;
use crate::waiters::{Cue, Look, Wake};

fn fingerprint(value: &[u8]) -> Option<Option<Fingerprint>> {
    match value.len() {
        0 => Some(None),
        16 => {
            let mut fp = [0u8; 16];
            fp.copy_from_slice(value);
            Some(Some(Fingerprint(fp)))
        }
        _ => None,
    }
}

impl Inner {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<ClaimOutcome, BackendError> {
        let key = req.key;
        let names = Names::of(key);
        let token = TokenText::new(req.owner);
        let fp: &[u8] = match &req.fingerprint {
            Some(fp) => &fp.0,
            None => &[],
        };
        let lease = millis(req.in_flight_lease);
        // Lease plus keep must stay within what Redis accepts.
        let keep = req
            .keep_abandoned_for
            .map(|d| Decimal::new(millis(d).min(MAX_MILLIS - lease).max(1)));
        // Past this instant (server clock) the claim must not take effect: by then this call
        // has given up waiting for the reply (a call is bounded by the command timeout, the
        // NOSCRIPT fallback by another), and a marker created now would belong to nobody.
        let grace = self.timeout.max(Duration::from_millis(250));
        let window = millis(self.timeout.saturating_mul(2).saturating_add(grace)) as i64;
        let mut remeasured = false;
        let reply = loop {
            let not_after = self.clock.now_ms().saturating_add(window).max(0) as u64;
            let not_after = Decimal::new(not_after);
            let (reply, acks) = self
                .eval_granting(
                    &scripts::CLAIM,
                    &[&names.record()],
                    &[
                        token.as_ref(),
                        Decimal::new(lease).as_ref(),
                        fp,
                        keep.as_ref().map_or(&[][..], |k| k.as_ref()),
                        not_after.as_ref(),
                    ],
                    key,
                )
                .await?;
            let late = matches!(&reply, Reply::Array(items) if matches!(items.as_slice(), [Reply::Int(3)]));
            if late && !remeasured {
                // Refused as late while this call was still waiting for it: the estimate of
                // the server's clock is off (its clock was stepped). Measure again, send once
                // more.
                remeasured = true;
                let (at, server_ms) = server_time(&*self.transport)
                    .await
                    .map_err(|fault| fault.into_backend("claim: reading the server's clock"))?;
                tracing::warn!(
                    key = %key,
                    "coord-redis: a claim came back refused as late although it was answered in time: the server's clock moved; measured it again"
                );
                self.clock.set(at, server_ms);
                continue;
            }
            break (reply, acks);
        };
        let (reply, acks) = reply;
        let corrupt = |detail: &str| self.corrupt("claim", key, detail);
        let Reply::Array(items) = reply else {
            return Err(corrupt("unexpected script reply"));
        };
        match items.as_slice() {
            [Reply::Int(1)] => {
                // A marker the replicas do not have would vanish in a failover and let a
                // duplicate run beside this call: the claim fails, and the runtime removes the
                // marker by its owner.
                self.replicated(acks, "claim", key)?;
                Ok(ClaimOutcome::Claimed)
            }
            [Reply::Int(3)] => Err(BackendError::new(
                BackendErrorKind::Timeout,
                "claim: the command reached Redis after this call had given up on it; it was not applied",
            )
            .with_key(key)),
            [Reply::Int(2), Reply::Data(fp)] => Ok(ClaimOutcome::Abandoned {
                fingerprint: fingerprint(fp)
                    .ok_or_else(|| corrupt("the record's fingerprint is not one coord wrote"))?,
            }),
            [Reply::Int(0), state, fp, payload, Reply::Int(pttl), Reply::Int(age)] => {
                let fingerprint = match fp {
                    Reply::Data(fp) => fingerprint(fp),
                    _ => None,
                }
                .ok_or_else(|| corrupt("the record's fingerprint is not one coord wrote"))?;
                match (state, payload) {
                    (Reply::Data(st), _) if st == b"i" => Ok(ClaimOutcome::InFlight {
                        fingerprint,
                        remaining: Duration::from_millis((*pttl).max(0) as u64),
                    }),
                    (Reply::Data(st), Reply::Data(payload)) if st == b"c" => {
                        Ok(ClaimOutcome::Completed {
                            payload: Arc::from(payload.as_slice()),
                            fingerprint,
                            // -1: a record written before coord stored write times.
                            age: u64::try_from(*age).ok().map(Duration::from_millis),
                        })
                    }
                    _ => Err(corrupt("the record at the key is not one coord wrote")),
                }
            }
            _ => Err(corrupt("the record at the key is not one coord wrote")),
        }
    }

    async fn settle(
        &self,
        script: &Script,
        key: &CallKey,
        args: &[&[u8]],
        what: &str,
    ) -> Result<bool, BackendError> {
        let names = Names::of(key);
        let reply = self.eval(script, &[&names.record()], args, key).await?;
        match reply {
            Reply::Int(1) => Ok(true),
            Reply::Int(0) => Ok(false),
            _ => Err(self.protocol(what, key, "unexpected script reply")),
        }
    }

    async fn wait_settled(&self, key: &CallKey, timeout: Duration) -> Result<(), BackendError> {
        if timeout.is_zero() {
            return Ok(());
        }
        // `None`: no end (a timeout too long to represent): wait until the marker settles.
        let deadline = Instant::now().checked_add(timeout);
        let record = Names::of(key).record();
        let record_name = &record;
        let probe = move |cue: Cue| async move {
            match cue {
                Cue::Subscribed => {}
                // A message on a record's channel is its settling; the marker's lapse or the
                // deadline ends the wait too.
                Cue::Message | Cue::Timer => return Ok(Look::Done(())),
                // A reconnection, not a settle: look again, unless the wait is over.
                Cue::Resync if deadline.is_some_and(|d| Instant::now() >= d) => {
                    return Ok(Look::Done(()));
                }
                // Never on a record's channel (every waiter is woken); looked at like a resync.
                Cue::Resync | Cue::Promoted => {}
            }
            let reply = self.eval(&scripts::PROBE, &[record_name], &[], key).await?;
            let remaining = match reply {
                Reply::Array(items) => match items.as_slice() {
                    [Reply::Int(0)] => return Ok(Look::Done(())),
                    [Reply::Int(1), Reply::Data(st)] if st == b"c" => return Ok(Look::Done(())),
                    // A kept marker whose lease has ended is abandoned: nothing is in flight.
                    [Reply::Int(3), Reply::Int(ms)] if *ms <= 0 => return Ok(Look::Done(())),
                    [Reply::Int(2 | 3), Reply::Int(ms)] if *ms > 0 => *ms,
                    // A marker that lapses this very millisecond.
                    [Reply::Int(2), Reply::Int(_)] => 0,
                    _ => {
                        return Err(self.corrupt(
                            "wait",
                            key,
                            "the record at the key is not one coord wrote",
                        ));
                    }
                },
                _ => return Err(self.protocol("wait", key, "unexpected script reply")),
            };
            // The marker settles by message, or lapses at its expiry (server time, read as a
            // remaining duration, so no clocks are compared).
            Ok(Look::Pending(Some(Duration::from_millis(
                remaining as u64 + 1,
            ))))
        };
        self.hub
            .wait(
                &self.transport,
                record.clone(),
                Wake::All,
                deadline,
                (),
                probe,
            )
            .await
    }
}

impl IdempotencyStore for RedisProvider {
    fn claim<'a>(
        &'a self,
        req: ClaimRequest<'a>,
    ) -> BoxFuture<'a, Result<ClaimOutcome, BackendError>> {
        Box::pin(self.inner.claim(req))
    }

    fn complete<'a>(
        &'a self,
        req: CompleteRequest<'a>,
    ) -> BoxFuture<'a, Result<CompleteOutcome, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let key = req.key;
            let names = Names::of(key);
            let token = TokenText::new(req.owner);
            let retention = Decimal::new(millis(req.retention));
            let fp: &[u8] = match &req.fingerprint {
                Some(fp) => &fp.0,
                None => &[],
            };
            let (reply, acks) = inner
                .eval_granting(
                    &scripts::COMPLETE,
                    &[&names.record()],
                    &[token.as_ref(), &req.payload, retention.as_ref(), fp],
                    key,
                )
                .await?;
            let unexpected = || inner.protocol("complete", key, "unexpected script reply");
            let Reply::Array(items) = reply else {
                return Err(unexpected());
            };
            match items.as_slice() {
                // A record the replicas do not have is not stored as far as a failover goes:
                // the runtime completes again (the script answers "stored" to a repeat by the
                // same owner) and, while the replicas stay away, reports the outcome as not
                // stored.
                [Reply::Int(1)] => {
                    inner.replicated(acks, "complete", key)?;
                    Ok(CompleteOutcome::Stored)
                }
                [Reply::Int(2)] => {
                    inner.replicated(acks, "complete", key)?;
                    Ok(CompleteOutcome::StoredWithoutMarker)
                }
                [Reply::Int(0), other, Reply::Int(completed @ (0 | 1))] => {
                    let other = match other {
                        Reply::Data(token) => Some(parse_token(token).ok_or_else(|| {
                            inner.corrupt("complete", key, "the record's owner is not a token")
                        })?),
                        _ => None,
                    };
                    Ok(CompleteOutcome::Superseded {
                        other,
                        completed: *completed == 1,
                    })
                }
                _ => Err(unexpected()),
            }
        })
    }

    fn abandon<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let token = TokenText::new(owner);
            self.inner
                .settle(&scripts::ABANDON, key, &[token.as_ref()], "abandon")
                .await
        })
    }

    fn end_marker_lease<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let token = TokenText::new(owner);
            self.inner
                .settle(
                    &scripts::END_MARKER_LEASE,
                    key,
                    &[token.as_ref()],
                    "end marker lease",
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
            let token = TokenText::new(owner);
            let lease = Decimal::new(millis(lease));
            let inner = &*self.inner;
            let names = Names::of(key);
            let (reply, acks) = inner
                .eval_granting(
                    &scripts::RENEW_MARKER,
                    &[&names.record()],
                    &[token.as_ref(), lease.as_ref()],
                    key,
                )
                .await?;
            let outcome = renew_outcome(inner, reply, "renew marker", key)?;
            if outcome == RenewOutcome::Renewed {
                inner.replicated(acks, "renew marker", key)?;
            }
            Ok(outcome)
        })
    }

    fn purge<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(self.inner.settle(&scripts::PURGE, key, &[], "purge"))
    }
}
