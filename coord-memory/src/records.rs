//! Idempotency records: in-flight markers with a lease, then completed outcomes. This file
//! holds the store and its writes (claim, complete, renew, abandon, purge) with the sweep of
//! lapsed records; `records/record.rs` what one record means by the clock,
//! `records/inspect.rs` the reads, `records/settle.rs` waiting for a marker to settle.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use tokio::sync::Notify;
use tokio::time::Instant;

use coord_contract::{
    ClaimOutcome, CompleteOutcome, Fingerprint, LossCause, OwnerToken, RenewOutcome,
};

use crate::deadline_after;

mod inspect;
mod record;
mod settle;
#[cfg(test)]
mod tests;

pub use inspect::RecordView;
use record::{Held, Record, Step, claim_answer};
use settle::wake;

/// Lapsed records are swept once at least this many new keys were written since the last sweep
/// (and at least as many as the store then held), so a sweep's cost is paid for by the writes
/// that made it due.
const SWEEP_AFTER_AT_LEAST: u64 = 1024;

/// Idempotency records in a concurrent map keyed by the call key: an in-flight marker lives for
/// its lease (plus its keep period, when kept), a completed outcome for its retention. Every
/// operation on a key is atomic (one step under the key's shard lock); a claim that finds a
/// completed outcome, or a marker it only reports, takes the shard's read lock alone. Waiters
/// for a marker are woken when it is completed, abandoned, purged or claimed over after it
/// lapsed.
///
/// The store is not bounded by count: evicting a record early would silently break
/// at-most-once, so records leave only by expiry, completion, abandonment or purge. A lapsed
/// record counts as absent at once; its memory is reclaimed by a sweep that runs as new keys
/// are written (after at least 1024 new keys, and at least as many as the store held at the
/// previous sweep), or when its key is written again.
///
/// Any duration is accepted (zero, sub-millisecond, [`Duration::MAX`]; see
/// [`deadline_after`]): a zero lease makes a marker that has already lapsed, a zero retention
/// a record that has already expired. Deadlines are computed before a key's step, and waiters
/// are woken after it, so nothing that can panic or run foreign code runs while a shard is
/// locked.
pub struct RecordStore {
    /// Hashed with aHash, as the lock table is (see `LockTable`).
    records: DashMap<Arc<str>, Record, ahash::RandomState>,
    /// New keys written so far.
    written: AtomicU64,
    /// The value of `written` at which the next sweep of lapsed records is due.
    sweep_at: AtomicU64,
}

impl Default for RecordStore {
    fn default() -> Self {
        RecordStore::new()
    }
}

impl std::fmt::Debug for RecordStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordStore")
            .field("records", &self.records.len())
            .finish()
    }
}

impl RecordStore {
    /// An empty store.
    pub fn new() -> RecordStore {
        RecordStore {
            records: DashMap::with_hasher(ahash::RandomState::new()),
            written: AtomicU64::new(0),
            sweep_at: AtomicU64::new(SWEEP_AFTER_AT_LEAST),
        }
    }

    /// Records currently stored that have not lapsed.
    pub fn len(&self) -> u64 {
        let now = Instant::now();
        self.records
            .iter()
            .filter(|entry| entry.value().held(now).is_some())
            .count() as u64
    }

    /// True when no records are stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `step` on the record at `key` (`None`: none there) under the key's shard lock, and
    /// returns the record it replaced.
    fn step(
        &self,
        key: Arc<str>,
        now: Instant,
        step: impl FnOnce(Option<&Record>) -> Step,
    ) -> Option<Record> {
        let written = match self.records.entry(key) {
            Entry::Occupied(mut slot) => {
                return match step(Some(slot.get())) {
                    Step::Keep => None,
                    Step::Put(record) => Some(slot.insert(record)),
                };
            }
            Entry::Vacant(slot) => match step(None) {
                Step::Put(record) => {
                    slot.insert(record);
                    true
                }
                Step::Keep => false,
            },
        };
        // The shard is unlocked here: a sweep locks every shard in turn.
        if written {
            self.note_written(now);
        }
        None
    }

    /// Counts a new key, and sweeps lapsed records once enough new keys were written.
    fn note_written(&self, now: Instant) {
        let written = self.written.fetch_add(1, Ordering::Relaxed) + 1;
        let due = self.sweep_at.load(Ordering::Relaxed);
        if written < due {
            return;
        }
        // One writer sweeps; the others go on.
        let next = written.saturating_add(SWEEP_AFTER_AT_LEAST);
        if self
            .sweep_at
            .compare_exchange(due, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        // Lapsed records have no waiter left to wake: a waiter sleeps until the marker's lease
        // ends at the latest, which is what made it lapse.
        self.records.retain(|_, record| record.held(now).is_some());
        let kept = self.records.len() as u64;
        self.sweep_at.store(
            written.saturating_add(kept.max(SWEEP_AFTER_AT_LEAST)),
            Ordering::Relaxed,
        );
    }

    /// Claims `key` for `owner` with an in-flight marker, or reports the record there. With
    /// `keep_abandoned_for`, a marker that lapses without completion is kept that long and
    /// reported as [`ClaimOutcome::Abandoned`].
    ///
    /// A claim by the owner of the live marker (a resent claim) answers [`ClaimOutcome::Claimed`]
    /// and refreshes the lease to `lease` from now: whichever send the caller timed its lease
    /// from, the marker then lives at least that long. The marker's fingerprint and waiters
    /// are kept. A marker of `owner` that has lapsed is not revived: kept, it is reported as
    /// abandoned; not kept, it is gone and a new marker is made.
    pub fn claim(
        &self,
        key: &str,
        owner: OwnerToken,
        lease: Duration,
        fingerprint: Option<Fingerprint>,
        keep_abandoned_for: Option<Duration>,
    ) -> ClaimOutcome {
        self.claim_keyed(
            key,
            || Arc::from(key),
            owner,
            lease,
            fingerprint,
            keep_abandoned_for,
        )
    }

    /// [`RecordStore::claim`] with the key already in a shared allocation, which a new record
    /// then shares instead of copying.
    pub fn claim_shared(
        &self,
        key: &Arc<str>,
        owner: OwnerToken,
        lease: Duration,
        fingerprint: Option<Fingerprint>,
        keep_abandoned_for: Option<Duration>,
    ) -> ClaimOutcome {
        self.claim_keyed(
            key,
            || Arc::clone(key),
            owner,
            lease,
            fingerprint,
            keep_abandoned_for,
        )
    }

    fn claim_keyed(
        &self,
        key: &str,
        shared: impl FnOnce() -> Arc<str>,
        owner: OwnerToken,
        lease: Duration,
        fingerprint: Option<Fingerprint>,
        keep_abandoned_for: Option<Duration>,
    ) -> ClaimOutcome {
        let now = Instant::now();
        // A replay, or a duplicate of a call in flight, only reads: under the read lock.
        if let Some(answer) = self
            .records
            .get(key)
            .and_then(|record| claim_answer(&record, owner, now))
        {
            return answer;
        }
        let expires_at = deadline_after(now, lease);
        let kept_until = keep_abandoned_for.map(|keep| deadline_after(expires_at, keep));
        let fresh = |fingerprint, settled, since| Record::InFlight {
            owner,
            fingerprint,
            lease,
            expires_at,
            keep_abandoned_for,
            kept_until,
            settled,
            since,
        };
        let mut found = ClaimOutcome::Claimed;
        let replaced = self.step(shared(), now, |existing| {
            let Some(record) = existing else {
                return Step::Put(fresh(fingerprint, Arc::new(Notify::new()), now));
            };
            if let Some(answer) = claim_answer(record, owner, now) {
                found = answer;
                return Step::Keep;
            }
            match record {
                // A resend by the live marker's owner: the marker is refreshed.
                Record::InFlight {
                    fingerprint: stored,
                    settled,
                    since,
                    ..
                } if record.held(now).is_some() => {
                    Step::Put(fresh(*stored, Arc::clone(settled), *since))
                }
                // A lapsed record: its owner crashed or stalled. Anyone still waiting on a
                // lapsed marker is woken below.
                _ => Step::Put(fresh(fingerprint, Arc::new(Notify::new()), now)),
            }
        });
        // The marker refreshed by a resend keeps its waiters: only a lapsed one's are woken.
        if let Some(Record::InFlight { settled, .. }) = &replaced {
            if replaced.as_ref().and_then(|r| r.held(now)).is_none() {
                settled.notify_waiters();
            }
        }
        found
    }

    /// Stores `payload` as the outcome of `key` for `retention`, per coord's contract:
    ///
    /// * `owner`'s marker, live or lapsed and kept, becomes the completed record, with the
    ///   fingerprint given at claim time: [`CompleteOutcome::Stored`].
    /// * `owner`'s own completed record (a resent completion): [`CompleteOutcome::Stored`], and the
    ///   record is left as the first completion stored it (retention is not extended).
    /// * No record, or only a lapsed one (whoever's it was): the completed record is created
    ///   with `fingerprint`: [`CompleteOutcome::StoredWithoutMarker`].
    /// * Another owner's live or kept marker, or completed record:
    ///   [`CompleteOutcome::Superseded`], and nothing changes.
    ///
    /// Waiters on the replaced marker are woken.
    pub fn complete(
        &self,
        key: &str,
        owner: OwnerToken,
        payload: Arc<[u8]>,
        retention: Duration,
        fingerprint: Option<Fingerprint>,
    ) -> CompleteOutcome {
        self.complete_shared(&Arc::from(key), owner, payload, retention, fingerprint)
    }

    /// [`RecordStore::complete`] with the key already in a shared allocation, which a new
    /// record then shares instead of copying.
    pub fn complete_shared(
        &self,
        key: &Arc<str>,
        owner: OwnerToken,
        payload: Arc<[u8]>,
        retention: Duration,
        fingerprint: Option<Fingerprint>,
    ) -> CompleteOutcome {
        let now = Instant::now();
        let expires_at = deadline_after(now, retention);
        let completed = |payload, fingerprint| Record::Completed {
            owner,
            payload,
            fingerprint,
            expires_at,
            since: now,
        };
        let mut outcome = CompleteOutcome::StoredWithoutMarker;
        let replaced = self.step(Arc::clone(key), now, |existing| {
            match (existing, existing.and_then(|r| r.held(now))) {
                (
                    Some(Record::InFlight {
                        fingerprint: stored,
                        ..
                    }),
                    Some((holder, Held::Live | Held::Kept)),
                ) if holder == owner => {
                    outcome = CompleteOutcome::Stored;
                    Step::Put(completed(payload, *stored))
                }
                (_, Some((holder, Held::Completed))) if holder == owner => {
                    outcome = CompleteOutcome::Stored;
                    Step::Keep
                }
                (_, Some((other, held))) => {
                    outcome = CompleteOutcome::Superseded {
                        other: Some(other),
                        completed: held == Held::Completed,
                    };
                    Step::Keep
                }
                (_, None) => Step::Put(completed(payload, fingerprint)),
            }
        });
        wake(replaced.and_then(Record::into_settled));
        outcome
    }

    /// Extends `owner`'s live marker at `key` to `lease` from now (and its keep period, if
    /// kept, from the new end of lease).
    ///
    /// [`RenewOutcome::Renewed`] while `owner`'s marker is live. Lost to
    /// [`LossCause::TakenByOther`] when another owner's live or kept marker, or completed
    /// record, is there; to [`LossCause::Expired`] when `owner`'s marker lapsed (kept or not),
    /// was completed, abandoned or purged, or the key holds nothing live. A lapsed marker is
    /// never revived.
    pub fn renew(&self, key: &str, owner: OwnerToken, lease: Duration) -> RenewOutcome {
        let now = Instant::now();
        let expires_at = deadline_after(now, lease);
        let Some(mut record) = self.records.get_mut(key) else {
            return RenewOutcome::Lost(LossCause::Expired);
        };
        match (record.held(now), &mut *record) {
            (
                Some((holder, Held::Live)),
                Record::InFlight {
                    lease: held_lease,
                    expires_at: held_until,
                    keep_abandoned_for,
                    kept_until,
                    ..
                },
            ) if holder == owner => {
                *held_lease = lease;
                *held_until = expires_at;
                // Saturating, so nothing here can panic under the shard lock.
                *kept_until = keep_abandoned_for.map(|keep| deadline_after(expires_at, keep));
                RenewOutcome::Renewed
            }
            (Some((holder, _)), _) if holder != owner => {
                RenewOutcome::Lost(LossCause::TakenByOther)
            }
            _ => RenewOutcome::Lost(LossCause::Expired),
        }
    }

    /// Ends `owner`'s live marker at `key` now, as if its lease had lapsed this instant: kept
    /// (claimed with a keep period), it is the abandoned record from now on, kept for that
    /// period from now; not kept, it counts as absent. Its waiters are woken.
    ///
    /// `true` when `owner`'s marker, live or lapsed and kept, was there (a kept one is left
    /// as it is); `false`, changing nothing, for anything else.
    pub fn end_lease(&self, key: &str, owner: OwnerToken) -> bool {
        let now = Instant::now();
        let Some(mut record) = self.records.get_mut(key) else {
            return false;
        };
        let woken = match (record.held(now), &mut *record) {
            (
                Some((holder, Held::Live)),
                Record::InFlight {
                    expires_at,
                    keep_abandoned_for,
                    kept_until,
                    settled,
                    ..
                },
            ) if holder == owner => {
                *expires_at = now;
                // Saturating, so nothing here can panic under the shard lock.
                *kept_until = keep_abandoned_for.map(|keep| deadline_after(now, keep));
                Some(Arc::clone(settled))
            }
            (Some((holder, Held::Kept)), Record::InFlight { .. }) if holder == owner => None,
            _ => return false,
        };
        // Woken once the shard lock is released: a woken waiter reads the key at once.
        drop(record);
        wake(woken);
        true
    }

    /// Removes the marker at `key` if `owner` holds it (live, or lapsed and kept).
    pub fn abandon(&self, key: &str, owner: OwnerToken) -> bool {
        let now = Instant::now();
        let removed = self.records.remove_if(key, |_, record| {
            matches!(
                (record, record.held(now)),
                (Record::InFlight { .. }, Some((holder, Held::Live | Held::Kept))) if holder == owner
            )
        });
        let settled = removed.and_then(|(_, record)| record.into_settled());
        let done = settled.is_some();
        wake(settled);
        done
    }

    /// Removes any record at `key`. Returns whether a record that had not yet lapsed was
    /// there. Waiters on a removed marker are woken.
    pub fn purge(&self, key: &str) -> bool {
        let now = Instant::now();
        let Some((_, removed)) = self.records.remove(key) else {
            return false;
        };
        let was_held = removed.held(now).is_some();
        wake(removed.into_settled());
        was_held
    }
}
