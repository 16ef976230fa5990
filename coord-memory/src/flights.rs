//! Cluster-scope single-flight in the in-process provider: claims and hand-overs in a map, so
//! that two coordinators over one `MemoryProvider` share flights as two instances over one
//! Redis would.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use coord_contract::BackendError;
use coord_contract::CallKey;
use coord_contract::time::deadline_after;
use coord_contract::{BoxFuture, OwnerToken};
use coord_contract::{FlightClaim, FlightStore, FlightWait};

/// The flights of one in-process provider.
#[derive(Debug, Default)]
pub(crate) struct FlightTable {
    state: Mutex<Flights>,
    /// Woken on every finish and abandon; waiters look again (and sleep until a lease ends).
    changed: Notify,
}

/// A hand-over: the outcome bytes, and when they are dropped.
type HandOver = (Arc<[u8]>, Instant);

#[derive(Debug, Default)]
struct Flights {
    /// The claim of each key: its owner and when its lease ends.
    claims: HashMap<CallKey, (OwnerToken, Instant)>,
    /// Hand-overs by key and leader, with when they are dropped.
    outcomes: HashMap<(CallKey, OwnerToken), HandOver>,
}

impl Flights {
    fn live_claim(&self, key: &CallKey, now: Instant) -> Option<(OwnerToken, Instant)> {
        self.claims
            .get(key)
            .copied()
            .filter(|(_, ends)| *ends > now)
    }

    fn sweep(&mut self, now: Instant) {
        self.claims.retain(|_, (_, ends)| *ends > now);
        self.outcomes.retain(|_, (_, ends)| *ends > now);
    }
}

impl FlightTable {
    fn lock(&self) -> MutexGuard<'_, Flights> {
        // Every critical section leaves the maps consistent: a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many claims and hand-overs are kept, expired ones not yet swept included.
    pub(crate) fn len(&self) -> usize {
        let flights = self.lock();
        flights.claims.len() + flights.outcomes.len()
    }
}

/// The table is the flight store; `MemoryProvider` hands its flight calls to it.
impl FlightStore for FlightTable {
    fn flight_claim<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<FlightClaim, BackendError>> {
        let now = Instant::now();
        let mut flights = self.lock();
        let claim = match flights.live_claim(key, now) {
            Some((leader, ends)) if leader != owner => FlightClaim::Joined {
                leader,
                lease_left: ends - now,
            },
            _ => {
                flights.sweep(now);
                flights
                    .claims
                    .insert(key.clone(), (owner, deadline_after(now, lease)));
                FlightClaim::Claimed
            }
        };
        Box::pin(std::future::ready(Ok(claim)))
    }

    fn flight_renew<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let now = Instant::now();
        let mut flights = self.lock();
        let renewed = match flights.live_claim(key, now) {
            Some((leader, _)) if leader == owner => {
                flights
                    .claims
                    .insert(key.clone(), (owner, deadline_after(now, lease)));
                true
            }
            _ => false,
        };
        Box::pin(std::future::ready(Ok(renewed)))
    }

    fn flight_finish<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        outcome: &'a [u8],
        hand_over: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let now = Instant::now();
        let mut flights = self.lock();
        let finished = match flights.live_claim(key, now) {
            Some((leader, _)) if leader == owner => {
                flights.claims.remove(key);
                flights.outcomes.insert(
                    (key.clone(), owner),
                    (Arc::from(outcome), deadline_after(now, hand_over)),
                );
                true
            }
            // A resend of a finish that landed.
            _ => flights
                .outcomes
                .get(&(key.clone(), owner))
                .is_some_and(|(_, ends)| *ends > now),
        };
        drop(flights);
        self.changed.notify_waiters();
        Box::pin(std::future::ready(Ok(finished)))
    }

    fn flight_abandon<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let now = Instant::now();
        let mut flights = self.lock();
        let abandoned = match flights.live_claim(key, now) {
            Some((leader, _)) if leader == owner => {
                flights.claims.remove(key);
                true
            }
            _ => false,
        };
        drop(flights);
        self.changed.notify_waiters();
        Box::pin(std::future::ready(Ok(abandoned)))
    }

    fn flight_wait<'a>(
        &'a self,
        key: &'a CallKey,
        leader: OwnerToken,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<FlightWait, BackendError>> {
        Box::pin(async move {
            let deadline = deadline_after(Instant::now(), timeout);
            loop {
                let changed = self.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                let now = Instant::now();
                let lease_ends = {
                    let flights = self.lock();
                    if let Some((bytes, ends)) = flights.outcomes.get(&(key.clone(), leader)) {
                        if *ends > now {
                            return Ok(FlightWait::Finished(bytes.to_vec()));
                        }
                    }
                    match flights.live_claim(key, now) {
                        Some((owner, ends)) if owner == leader => ends,
                        _ => return Ok(FlightWait::Vacant),
                    }
                };
                if now >= deadline {
                    return Ok(FlightWait::Expired);
                }
                tokio::select! {
                    () = &mut changed => {}
                    () = tokio::time::sleep_until(lease_ends.min(deadline)) => {}
                }
            }
        })
    }
}
