//! One record and what it means by the clock: an in-flight marker (live, kept as abandoned,
//! or lapsed) or a completed outcome (within its retention or expired), what a step on its key
//! does with it, and how a claim finds it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use coord_contract::{ClaimOutcome, Fingerprint, OwnerToken};

/// One key's record: an in-flight marker or a completed outcome.
#[derive(Clone)]
pub(super) enum Record {
    InFlight {
        owner: OwnerToken,
        fingerprint: Option<Fingerprint>,
        lease: Duration,
        expires_at: Instant,
        /// Keep the marker this long past its lease if it is never completed.
        keep_abandoned_for: Option<Duration>,
        /// `expires_at + keep_abandoned_for`, when the marker is kept.
        kept_until: Option<Instant>,
        settled: Arc<Notify>,
        /// When the claim that made the marker was granted (a resent claim or a renewal keeps
        /// it).
        since: Instant,
    },
    Completed {
        /// The owner whose completion stored this record: a resent completion of the same
        /// owner is recognised, and a late one of another owner is told who won.
        owner: OwnerToken,
        payload: Arc<[u8]>,
        fingerprint: Option<Fingerprint>,
        expires_at: Instant,
        /// When the outcome was stored.
        since: Instant,
    },
}

/// What a record means at a given instant, by this store's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    /// An in-flight marker within its lease.
    Live,
    /// A marker past its lease, kept as abandoned.
    Kept,
    /// A completed outcome within its retention.
    Completed,
}

impl Record {
    /// The owner and state of this record at `now`, or `None` when it has lapsed and counts
    /// as absent (a marker past its lease and not kept, a kept marker past its keep period, a
    /// completed record past its retention). Every operation checks it, so the store is exact
    /// (and testable with tokio's paused clock) however late a lapsed record's memory is
    /// reclaimed.
    pub(super) fn held(&self, now: Instant) -> Option<(OwnerToken, Held)> {
        match self {
            Record::InFlight {
                owner,
                expires_at,
                kept_until,
                ..
            } => {
                if *expires_at > now {
                    Some((*owner, Held::Live))
                } else if kept_until.is_some_and(|until| until > now) {
                    Some((*owner, Held::Kept))
                } else {
                    None
                }
            }
            Record::Completed {
                owner, expires_at, ..
            } => (*expires_at > now).then_some((*owner, Held::Completed)),
        }
    }

    /// The waiters of a marker, to wake once the compute step is over.
    pub(super) fn into_settled(self) -> Option<Arc<Notify>> {
        match self {
            Record::InFlight { settled, .. } => Some(settled),
            Record::Completed { .. } => None,
        }
    }
}

/// What one step on a key does with the record there.
pub(super) enum Step {
    /// Leave it as it is (or leave the key empty).
    Keep,
    /// Store this record at the key, replacing any there.
    Put(Record),
}

/// How a claim finds the record at its key when the claim changes nothing: a completed outcome,
/// another owner's live marker, or a marker kept as abandoned. `None` when the claim writes a
/// marker: the key is free (or its record lapsed), or the claim is a resend by the live
/// marker's owner.
pub(super) fn claim_answer(
    record: &Record,
    owner: OwnerToken,
    now: Instant,
) -> Option<ClaimOutcome> {
    match (record.held(now)?, record) {
        ((holder, Held::Live), Record::InFlight { .. }) if holder == owner => None,
        ((_, Held::Kept), Record::InFlight { fingerprint, .. }) => Some(ClaimOutcome::Abandoned {
            fingerprint: *fingerprint,
        }),
        (
            _,
            Record::InFlight {
                fingerprint,
                expires_at,
                ..
            },
        ) => Some(ClaimOutcome::InFlight {
            fingerprint: *fingerprint,
            remaining: expires_at.saturating_duration_since(now),
        }),
        (
            _,
            Record::Completed {
                payload,
                fingerprint,
                since,
                ..
            },
        ) => Some(ClaimOutcome::Completed {
            payload: payload.clone(),
            fingerprint: *fingerprint,
            age: Some(now.saturating_duration_since(*since)),
        }),
    }
}
