//! [`FlightStore`] over the flight table.
use std::time::Duration;

use coord_contract::{
    BackendError, BoxFuture, CallKey, FlightClaim, FlightStore, FlightWait, OwnerToken,
};

use super::MemoryProvider;

/// Cluster-scope flights live in the provider's flight table (`flights.rs`).
impl FlightStore for MemoryProvider {
    fn flight_claim<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<FlightClaim, BackendError>> {
        self.flights.flight_claim(key, owner, lease)
    }

    fn flight_renew<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        self.flights.flight_renew(key, owner, lease)
    }

    fn flight_finish<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        outcome: &'a [u8],
        hand_over: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        self.flights.flight_finish(key, owner, outcome, hand_over)
    }

    fn flight_abandon<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        self.flights.flight_abandon(key, owner)
    }

    fn flight_wait<'a>(
        &'a self,
        key: &'a CallKey,
        leader: OwnerToken,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<FlightWait, BackendError>> {
        self.flights.flight_wait(key, leader, timeout)
    }
}
