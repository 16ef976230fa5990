//! The provider side of `#[single_flight(scope = "cluster")]`: a leased claim on a key, and a
//! short-lived hand-over of the leader's outcome to the followers waiting on other instances.
//!
//! One flight, as a provider sees it:
//!
//! 1. every instance's local leader calls [`FlightStore::flight_claim`]; exactly one gets
//!    [`FlightClaim::Claimed`] and runs the body, the others get [`FlightClaim::Joined`] with
//!    the leader's token and what is left of its lease;
//! 2. the leader renews its claim ([`FlightStore::flight_renew`]) while its body runs;
//! 3. the followers call [`FlightStore::flight_wait`], which answers when the leader's outcome
//!    is handed over, when the claim is gone without one (the leader abandoned it, or its lease
//!    ran out), or when the follower's own timeout passed;
//! 4. the leader calls [`FlightStore::flight_finish`] with the encoded outcome (refused unless
//!    its claim is still its own: a leader whose lease lapsed never hands anything over), or
//!    [`FlightStore::flight_abandon`] when its caller was cancelled. The runtime calls it
//!    through [`FlightStore::flight_finish_noting_sent`], which also says when the request has
//!    left the process: the leader answers its callers then, before the reply, so a process
//!    that exits right after its callers were answered has still sent its hand-over.
//!
//! The outcome is kept only for the hand-over time the runtime gives, under a name that includes
//! the leader's token: a call that starts after the flight ended finds no claim and runs again;
//! nothing is remembered. The bytes are opaque to the provider.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::BoxFuture;
use crate::call_key::CallKey;
use crate::error::{BackendError, BackendErrorKind};
use crate::tokens::OwnerToken;

/// What a claim on a flight found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlightClaim {
    /// The caller now leads the flight: it runs the body and must finish or abandon the claim.
    /// Also the answer to a claim resent by the owner that already holds it.
    Claimed,
    /// Another owner leads the flight.
    Joined {
        /// The leader's token: the flight's generation, passed to
        /// [`FlightStore::flight_wait`].
        leader: OwnerToken,
        /// What is left of the leader's lease, by the store's clock.
        lease_left: Duration,
    },
}

/// What waiting on a flight found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlightWait {
    /// The leader handed its outcome over: the bytes given to
    /// [`FlightStore::flight_finish`].
    Finished(Vec<u8>),
    /// The leader's claim is gone without an outcome (abandoned, or its lease ran out), or
    /// another leader holds the flight now: the caller should claim again.
    Vacant,
    /// The timeout passed and the leader still holds its claim.
    Expired,
}

/// Told by a provider once a request has left the process: every byte of it was accepted by
/// the operating system (written to the socket), so the request reaches the server even if the
/// process exits at once, unless the connection itself fails. What it promises is about the
/// request only, not its reply: a request that left may still be refused, or fail.
///
/// Dropping it without [`SentNotice::notify`] tells the waiting side to stop waiting too: a
/// provider that cannot tell when its request left drops it once the reply is in (the default
/// of [`FlightStore::flight_finish_noting_sent`]), which is later than needed but never early.
#[derive(Debug)]
pub struct SentNotice(tokio::sync::oneshot::Sender<()>);

/// The waiting side of a [`SentNotice`]: resolves once the request left the process, or once
/// the notice was dropped (the request was answered or failed, or the provider gave it up).
#[derive(Debug)]
pub struct SentWait(tokio::sync::oneshot::Receiver<()>);

impl SentNotice {
    /// A notice and the future that waits for it.
    pub fn new() -> (SentNotice, SentWait) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (SentNotice(tx), SentWait(rx))
    }

    /// Says the request has left the process.
    pub fn notify(self) {
        let _ = self.0.send(());
    }
}

impl Future for SentWait {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

/// Leased flight claims and the hand-over of outcomes, for cluster-scope single-flight.
///
/// # Contract
/// * `flight_claim` is atomic: at most one owner holds a key's claim at a time. A claim whose
///   lease ran out is free. A claim by its current owner answers `Claimed` again (a resent
///   command).
/// * `flight_renew` extends the claim to `lease` from now only while `owner` holds it, and says
///   whether it did.
/// * `flight_finish` stores `outcome` for `hand_over` under the generation `owner`, removes the
///   claim and wakes every waiter of that generation, in one atomic step, only while `owner`
///   holds the claim; otherwise it changes nothing and answers `false`. A resend after it
///   succeeded answers `true` again while the outcome is kept.
/// * `flight_abandon` removes the claim only while `owner` holds it and wakes the waiters, so a
///   follower takes over at once; says whether it removed it.
/// * `flight_wait` answers `Finished` as soon as the outcome of generation `leader` is stored
///   (including when it was stored before the call), `Vacant` as soon as the claim is gone
///   without it or held by another owner, and `Expired` once `timeout` passed with `leader`'s
///   claim still there. It wakes on finish and abandon without polling; a backstop at the
///   timeout is allowed.
/// * Expiry is measured by the store's clock; the hand-over copy is gone after `hand_over`.
/// * Flights are separate from locks, idempotency records and cache entries: the same key in
///   each never collides.
///
/// Every method has a default that reports flights as not supported (a
/// [`BackendErrorKind::Config`] error). The runtime then treats the cluster flight like any
/// backend fault: under `fail_open` the call still coalesces within its process.
pub trait FlightStore: Send + Sync + 'static {
    /// Claims the flight of `key` for `owner` with `lease`, or reports its leader.
    fn flight_claim<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<FlightClaim, BackendError>> {
        let _ = (key, owner, lease);
        Box::pin(std::future::ready(Err(not_supported())))
    }

    /// Extends `owner`'s claim on `key` to `lease` from now; `false` when it is not `owner`'s.
    fn flight_renew<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let _ = (key, owner, lease);
        Box::pin(std::future::ready(Err(not_supported())))
    }

    /// Hands `outcome` over to the waiters of `owner`'s flight, keeping it for `hand_over`;
    /// `false` (nothing changed) when the claim is no longer `owner`'s.
    fn flight_finish<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        outcome: &'a [u8],
        hand_over: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let _ = (key, owner, outcome, hand_over);
        Box::pin(std::future::ready(Err(not_supported())))
    }

    /// [`FlightStore::flight_finish`], telling `sent` as soon as the request has left the
    /// process (see [`SentNotice`]). The leader answers its callers at that moment, before the
    /// reply: a provider that tells it early (before the request is really out) lets a process
    /// that exits right after its callers were answered lose its hand-over, and its followers
    /// wait out the lease; one that tells it late only delays the leader's answer.
    ///
    /// The default tells it when [`FlightStore::flight_finish`] has answered (the request has
    /// certainly left then): correct for every provider, one round trip later than needed for
    /// one that can see its writes. A provider whose finish does not leave the process (the
    /// in-process one) needs nothing more.
    fn flight_finish_noting_sent<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        outcome: &'a [u8],
        hand_over: Duration,
        sent: SentNotice,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let finished = self.flight_finish(key, owner, outcome, hand_over).await;
            drop(sent);
            finished
        })
    }

    /// Gives up `owner`'s claim on `key` without an outcome and wakes the waiters.
    fn flight_abandon<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let _ = (key, owner);
        Box::pin(std::future::ready(Err(not_supported())))
    }

    /// Waits for the outcome of the flight `leader` leads on `key`, at most `timeout`.
    fn flight_wait<'a>(
        &'a self,
        key: &'a CallKey,
        leader: OwnerToken,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<FlightWait, BackendError>> {
        let _ = (key, leader, timeout);
        Box::pin(std::future::ready(Err(not_supported())))
    }
}

fn not_supported() -> BackendError {
    BackendError::new(
        BackendErrorKind::Config,
        "this provider does not implement FlightStore (no cluster-scope single-flight)",
    )
}

impl<P: FlightStore> FlightStore for Arc<P> {
    fn flight_claim<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<FlightClaim, BackendError>> {
        (**self).flight_claim(key, owner, lease)
    }

    fn flight_renew<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        (**self).flight_renew(key, owner, lease)
    }

    fn flight_finish<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        outcome: &'a [u8],
        hand_over: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        (**self).flight_finish(key, owner, outcome, hand_over)
    }

    fn flight_finish_noting_sent<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        outcome: &'a [u8],
        hand_over: Duration,
        sent: SentNotice,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        (**self).flight_finish_noting_sent(key, owner, outcome, hand_over, sent)
    }

    fn flight_abandon<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        (**self).flight_abandon(key, owner)
    }

    fn flight_wait<'a>(
        &'a self,
        key: &'a CallKey,
        leader: OwnerToken,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<FlightWait, BackendError>> {
        (**self).flight_wait(key, leader, timeout)
    }
}
