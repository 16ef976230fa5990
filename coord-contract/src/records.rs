//! Idempotency records: an in-flight marker with its own lease, then the completed outcome.

use std::sync::Arc;
use std::time::Duration;

use crate::BoxFuture;
use crate::call_key::CallKey;
use crate::error::{BackendError, BackendErrorKind};
use crate::locks::RenewOutcome;
use crate::tokens::OwnerToken;

/// A 128-bit digest of the parameters an idempotency key was first used with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 16]);

/// What a claim found at an idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// No record existed (or the last one expired): the caller now owns an in-flight marker and
    /// must complete or abandon it.
    Claimed,
    /// Another caller's in-flight marker holds the key.
    InFlight {
        /// The fingerprint stored with that marker.
        fingerprint: Option<Fingerprint>,
        /// How long until that marker's lease ends, as the backend sees it.
        remaining: Duration,
    },
    /// A completed outcome is stored.
    Completed {
        /// The encoded outcome.
        payload: Arc<[u8]>,
        /// The fingerprint stored with it.
        fingerprint: Option<Fingerprint>,
        /// How long ago the outcome was stored, by the backend's clock (Redis: the server's;
        /// in-process: this process's monotonic clock). `None` when the backend does not know,
        /// as for records written by a version of coord that did not store write times.
        age: Option<Duration>,
    },
    /// An earlier caller's marker lapsed without completion, and was kept (the claim that made
    /// it asked for `keep_abandoned_for`): the outcome of that call is unknown. Nothing was
    /// claimed.
    Abandoned {
        /// The fingerprint stored with the marker.
        fingerprint: Option<Fingerprint>,
    },
}

/// One request to claim an idempotency key.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// The call key.
    pub key: &'a CallKey,
    /// The token that owns the in-flight marker if the claim succeeds.
    pub owner: OwnerToken,
    /// How long the in-flight marker lives if never completed, abandoned or renewed.
    pub in_flight_lease: Duration,
    /// The fingerprint to store with the marker (and, later, with the completed record).
    pub fingerprint: Option<Fingerprint>,
    /// `None`: a marker whose lease lapses disappears, and the next claim succeeds
    /// (at-least-once). `Some(d)`: the marker is kept for `d` after it lapses without
    /// completion, and claims report [`ClaimOutcome::Abandoned`] (at-most-once); only
    /// [`IdempotencyStore::purge`] or expiry removes it.
    pub keep_abandoned_for: Option<Duration>,
    /// The outcome will be written inside the application's own database transaction
    /// (through an [`OutcomeTransaction`](crate::OutcomeTransaction)), not by
    /// [`IdempotencyStore::complete`]. The runtime sends it only to a store whose
    /// [`IdempotencyStore::transactional_claims`] is true.
    ///
    /// A transactional marker whose lease lapsed counts as **absent**, even under
    /// `keep_abandoned_for`: the next claim succeeds and no claim ever reports
    /// [`ClaimOutcome::Abandoned`] for it. Its outcome is known, not unknown: the body's
    /// effects commit only together with the completed record, and a holder whose marker was
    /// taken over can no longer commit (the completion's owner check fails inside its
    /// transaction), so nothing of the lapsed run is in the database.
    pub transactional: bool,
}

/// One request to store the outcome of a claimed call.
#[derive(Debug, Clone)]
pub struct CompleteRequest<'a> {
    /// The call key.
    pub key: &'a CallKey,
    /// The token that claimed the key.
    pub owner: OwnerToken,
    /// The encoded outcome.
    pub payload: Arc<[u8]>,
    /// How long the completed record is kept.
    pub retention: Duration,
    /// The fingerprint given at claim time. Stored only when completion has to create the
    /// record because the marker is gone (see [`CompleteOutcome::StoredWithoutMarker`]).
    pub fingerprint: Option<Fingerprint>,
}

/// What storing an outcome found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompleteOutcome {
    /// The owner's marker (live, or lapsed and kept) became the completed record. Also the
    /// answer when this very completion was already stored (a resent command): completing is
    /// idempotent for its owner.
    Stored,
    /// The marker was gone (its lease lapsed, it was evicted, the server restarted without
    /// persistence) and no other caller had claimed the key: the completed record was created
    /// with the request's fingerprint, so a duplicate replays instead of running again.
    StoredWithoutMarker,
    /// Another caller claimed the key after this owner's marker was lost: nothing was stored,
    /// and the body has run (or is running) twice.
    Superseded {
        /// The owner found at the key, when the backend records it.
        other: Option<OwnerToken>,
        /// Whether that other caller has already completed.
        completed: bool,
    },
}

impl CompleteOutcome {
    /// True when the outcome is now stored at the key.
    pub fn is_stored(self) -> bool {
        matches!(
            self,
            CompleteOutcome::Stored | CompleteOutcome::StoredWithoutMarker
        )
    }
}

/// Storage for idempotency records: an in-flight marker with its own lease, then the completed
/// outcome for the retention period.
///
/// # Contract
/// * `claim` is atomic: it either creates the in-flight marker or returns the existing record,
///   with the fingerprint stored in it. It never compares fingerprints: the runtime does, in one
///   place. A claim by the owner that already holds the live marker (a resent command whose
///   first send landed) answers [`ClaimOutcome::Claimed`] again.
/// * `complete` stores the outcome while `owner` holds the in-flight marker (a lapsed marker
///   kept under `keep_abandoned_for` is still its owner's: a late completion resolves the
///   unknown outcome), keeping the fingerprint given at claim time, for `retention`. When no
///   record is there at all, it creates the completed record in the same atomic step
///   ([`CompleteOutcome::StoredWithoutMarker`]); when another owner's marker or record is
///   there, it changes nothing ([`CompleteOutcome::Superseded`]). Completing twice with the
///   same owner answers `Stored` both times.
/// * `abandon` removes the marker and succeeds (`true`) only while `owner` holds it.
/// * `end_marker_lease` ends `owner`'s marker's lease now, as if it had lapsed: a marker claimed
///   with `keep_abandoned_for` becomes the abandoned record at once, one claimed without it is
///   gone. Owner-checked like `abandon`; it never touches a completed record.
/// * `wait_settled` returns once the marker at `key` is gone or completed, or after `timeout`,
///   whichever is first; it returns at once when no marker is in flight. Completion and
///   abandonment wake waiters without polling.
/// * Expiry is measured by the backend's clock (for Redis, the server's), never by comparing
///   client timestamps.
pub trait IdempotencyStore: Send + Sync + 'static {
    /// Claims `req.key` or reads the record stored there.
    fn claim<'a>(
        &'a self,
        req: ClaimRequest<'a>,
    ) -> BoxFuture<'a, Result<ClaimOutcome, BackendError>>;

    /// Stores `req.payload` as the outcome of `req.key` (see the contract above).
    fn complete<'a>(
        &'a self,
        req: CompleteRequest<'a>,
    ) -> BoxFuture<'a, Result<CompleteOutcome, BackendError>>;

    /// Removes the in-flight marker of `key` if `owner` still holds it.
    fn abandon<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>>;

    /// Ends `owner`'s in-flight marker at `key` now, as if its lease had lapsed this instant:
    /// called when the owner's body was stopped half-way under `on_abandoned = "fail"` (its
    /// future dropped, or it panicked), so duplicates learn at once that its outcome is
    /// unknown instead of finding it in flight until its lease ends.
    ///
    /// * `owner`'s live marker claimed with [`ClaimRequest::keep_abandoned_for`] becomes the
    ///   abandoned record: claims report [`ClaimOutcome::Abandoned`] from now on, it is kept
    ///   for the keep period from now, its owner can still complete it, and waiters
    ///   (`wait_settled`) are woken. A transactional marker, or one claimed without a keep
    ///   period, lapses into nothing (as its lapse would have made it), and the key is free.
    /// * `owner`'s marker that has already lapsed and is kept: nothing changes (a resend).
    /// * Anything else (no record, another owner's marker, any completed record): nothing
    ///   changes, and `false` is returned.
    ///
    /// Returns `true` when `owner`'s marker (live, or lapsed and kept) was there. Sending it
    /// again is harmless, so a lost reply is retried.
    ///
    /// The default renews the marker to a zero lease through [`renew_marker`](Self::renew_marker),
    /// which ends it the same way in a store whose renewal moves the keep period with the
    /// lease, but wakes no waiter (they see the abandoned record when their own wait, or the
    /// marker's old lease, ends), and answers `false` for a marker already lapsed. A store
    /// whose `renew_marker` is not implemented answers with that error, and the marker then
    /// lapses at the end of its lease, as before this method existed.
    fn end_marker_lease<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let renewed = self.renew_marker(key, owner, Duration::ZERO).await?;
            Ok(renewed == RenewOutcome::Renewed)
        })
    }

    /// Waits until the in-flight marker at `key` settles, at most `timeout`.
    fn wait_settled<'a>(
        &'a self,
        key: &'a CallKey,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>>;

    /// Extends `owner`'s in-flight marker at `key` to `lease` from now (for `renew = ..` on
    /// `#[idempotent]`). Owner-checked like `complete`. The default reports that the store
    /// cannot renew, which makes a renewing call treat its marker as lost once its lease
    /// passes: implement it in any store used with renewal.
    fn renew_marker<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        let _ = (key, owner, lease);
        Box::pin(std::future::ready(Err(BackendError::new(
            BackendErrorKind::Config,
            "this idempotency store does not implement renew_marker",
        ))))
    }

    /// Removes whatever record is stored at `key` (an operator's tool, e.g. to resolve an
    /// abandoned record after reconciling by hand). Returns whether a record was there. The
    /// default reports that the store cannot purge.
    fn purge<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        let _ = key;
        Box::pin(std::future::ready(Err(BackendError::new(
            BackendErrorKind::Config,
            "this idempotency store does not implement purge",
        ))))
    }

    /// Whether this store takes transactional claims ([`ClaimRequest::transactional`]):
    /// it applies their lapse rule, and some [`OutcomeTransaction`](crate::OutcomeTransaction)
    /// writes completions into the database it keeps its records in. The runtime refuses a
    /// transactional call, before its body runs, on a store that answers `false` (the default),
    /// whatever the backend-fault policy: the outcome could not be written with the body's
    /// effects.
    fn transactional_claims(&self) -> bool {
        false
    }

    /// Abandons `owner`'s marker at `key` in the background: called when the owner of a marker
    /// was dropped (cancelled or panicked), when a claim failed in a way that may have landed
    /// (its reply was lost: the key must not stay blocked for a body that never ran), and when
    /// an abandon itself failed. The default spawns `abandon` on the current tokio runtime and
    /// retries it with backoff until it gets an answer or `lease_left` has passed.
    fn abandon_detached(self: Arc<Self>, key: CallKey, owner: OwnerToken, lease_left: Duration) {
        crate::background::spawn_retried(
            "clearing the in-flight marker",
            key,
            lease_left,
            move |key| {
                let this = self.clone();
                async move { this.abandon(&key, owner).await.map(|_| true) }
            },
        );
    }
}

impl<P: IdempotencyStore> IdempotencyStore for Arc<P> {
    fn claim<'a>(
        &'a self,
        req: ClaimRequest<'a>,
    ) -> BoxFuture<'a, Result<ClaimOutcome, BackendError>> {
        (**self).claim(req)
    }

    fn complete<'a>(
        &'a self,
        req: CompleteRequest<'a>,
    ) -> BoxFuture<'a, Result<CompleteOutcome, BackendError>> {
        (**self).complete(req)
    }

    fn abandon<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        (**self).abandon(key, owner)
    }

    fn end_marker_lease<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        (**self).end_marker_lease(key, owner)
    }

    fn wait_settled<'a>(
        &'a self,
        key: &'a CallKey,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        (**self).wait_settled(key, timeout)
    }

    fn renew_marker<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        (**self).renew_marker(key, owner, lease)
    }

    fn purge<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        (**self).purge(key)
    }

    fn transactional_claims(&self) -> bool {
        (**self).transactional_claims()
    }

    fn abandon_detached(self: Arc<Self>, key: CallKey, owner: OwnerToken, lease_left: Duration) {
        P::abandon_detached((*self).clone(), key, owner, lease_left)
    }
}
