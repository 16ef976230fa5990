//! Idempotency records: in-flight markers with a lease, then completed outcomes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use tokio::sync::Notify;
use tokio::time::Instant;

use coord_contract::{
    ClaimOutcome, CompleteOutcome, Fingerprint, LossCause, OwnerToken, RecordStatus, RenewOutcome,
};

use crate::deadline_after;

#[derive(Clone)]
enum Record {
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
enum Held {
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
    fn held(&self, now: Instant) -> Option<(OwnerToken, Held)> {
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
    fn into_settled(self) -> Option<Arc<Notify>> {
        match self {
            Record::InFlight { settled, .. } => Some(settled),
            Record::Completed { .. } => None,
        }
    }
}

/// What one step on a key does with the record there.
enum Step {
    /// Leave it as it is (or leave the key empty).
    Keep,
    /// Store this record at the key, replacing any there.
    Put(Record),
}

/// How a claim finds the record at its key when the claim changes nothing: a completed outcome,
/// another owner's live marker, or a marker kept as abandoned. `None` when the claim writes a
/// marker: the key is free (or its record lapsed), or the claim is a resend by the live
/// marker's owner.
fn claim_answer(record: &Record, owner: OwnerToken, now: Instant) -> Option<ClaimOutcome> {
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

/// One record as [`RecordStore::inspect`] found it, measured by the store's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordView {
    /// What the record is.
    pub status: RecordStatus,
    /// The marker's owner, or the owner whose completion stored the outcome.
    pub owner: OwnerToken,
    /// Time since the claim that made the marker (in flight or abandoned), or since the
    /// outcome was stored (completed).
    pub age: Duration,
    /// Time left on the marker's lease (in flight only).
    pub lease_left: Option<Duration>,
    /// Time until the store drops the record: the end of the lease (plus the keep period, when
    /// kept) for a marker, the end of the retention for a completed outcome.
    pub expires_in: Duration,
    /// Size of the stored outcome in bytes (completed only).
    pub payload_len: Option<usize>,
    /// Whether a fingerprint is stored with the record.
    pub has_fingerprint: bool,
}

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

fn wake(settled: Option<Arc<Notify>>) {
    if let Some(settled) = settled {
        settled.notify_waiters();
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

    /// The record at `key`, or `None` when there is none (or it has lapsed: a marker past its
    /// lease and not kept, a kept marker past its keep period, an outcome past its retention).
    /// Reads only.
    pub fn inspect(&self, key: &str) -> Option<RecordView> {
        let now = Instant::now();
        let record = self.records.get(key)?;
        let (_, held) = record.held(now)?;
        let left = |at: Instant| at.saturating_duration_since(now);
        Some(match &*record {
            Record::InFlight {
                owner,
                fingerprint,
                expires_at,
                kept_until,
                since,
                ..
            } => RecordView {
                status: if held == Held::Kept {
                    RecordStatus::Abandoned
                } else {
                    RecordStatus::InFlight
                },
                owner: *owner,
                age: now.saturating_duration_since(*since),
                lease_left: (held == Held::Live).then(|| left(*expires_at)),
                expires_in: left(kept_until.unwrap_or(*expires_at).max(*expires_at)),
                payload_len: None,
                has_fingerprint: fingerprint.is_some(),
            },
            Record::Completed {
                owner,
                payload,
                fingerprint,
                expires_at,
                since,
                ..
            } => RecordView {
                status: RecordStatus::Completed,
                owner: *owner,
                age: now.saturating_duration_since(*since),
                lease_left: None,
                expires_in: left(*expires_at),
                payload_len: Some(payload.len()),
                has_fingerprint: fingerprint.is_some(),
            },
        })
    }

    /// The keys of every record that has not lapsed, in no particular order. A snapshot: records
    /// stored or removed while it is taken may or may not be in it.
    pub fn keys(&self) -> Vec<Arc<str>> {
        let now = Instant::now();
        self.records
            .iter()
            .filter(|entry| entry.value().held(now).is_some())
            .map(|entry| Arc::clone(entry.key()))
            .collect()
    }

    /// The owner and waiters of the marker at `key`, and when its lease ends, while one is
    /// live or kept (a completed or lapsed record, or none: `None`).
    fn marker(&self, key: &str) -> Option<(OwnerToken, Arc<Notify>, Instant)> {
        match &*self.records.get(key)? {
            Record::InFlight {
                owner,
                settled,
                expires_at,
                ..
            } => Some((*owner, Arc::clone(settled), *expires_at)),
            Record::Completed { .. } => None,
        }
    }

    /// Waits until the marker at `key` is completed, abandoned or lapsed, at most `timeout`
    /// (any duration; [`Duration::MAX`] waits until the marker settles). Returns at once when
    /// no live marker is there.
    pub async fn wait_settled(&self, key: &str, timeout: Duration) {
        let timeout_at = deadline_after(Instant::now(), timeout);
        let Some((owner, settled, _)) = self.marker(key) else {
            return;
        };
        let notified = settled.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // Re-read after registering, so a settle between the read and the registration is
        // not missed; the re-read also sees a lease extended by renewal meanwhile.
        let expires_at = match self.marker(key) {
            Some((now_owner, _, expires_at))
                if now_owner == owner && expires_at > Instant::now() =>
            {
                expires_at
            }
            _ => return,
        };
        let _ = tokio::time::timeout_at(expires_at.min(timeout_at), notified).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(30);
    const DAY: Duration = Duration::from_secs(86_400);

    /// The owner numbered `n`: tests name owners by small numbers.
    fn owner(n: u128) -> OwnerToken {
        OwnerToken::from_u128(n)
    }

    fn done(payload: &'static [u8]) -> Arc<[u8]> {
        Arc::from(payload)
    }

    #[tokio::test]
    async fn claim_complete_replay() {
        let store = RecordStore::new();
        assert_eq!(
            store.claim("k", owner(1), LEASE, Some(Fingerprint([7; 16])), None),
            ClaimOutcome::Claimed
        );
        match store.claim("k", owner(2), LEASE, None, None) {
            ClaimOutcome::InFlight { fingerprint, .. } => {
                assert_eq!(fingerprint, Some(Fingerprint([7; 16])))
            }
            other => panic!("expected the marker in flight, got {other:?}"),
        }
        assert_eq!(
            store.complete("k", owner(2), done(b"x"), DAY, None),
            CompleteOutcome::Superseded {
                other: Some(owner(1)),
                completed: false
            },
            "only the owner completes"
        );
        assert_eq!(
            store.complete("k", owner(1), done(b"ok"), DAY, Some(Fingerprint([1; 16]))),
            CompleteOutcome::Stored
        );
        assert_eq!(
            store.complete("k", owner(1), done(b"resent"), DAY, None),
            CompleteOutcome::Stored,
            "a resent completion is stored, once"
        );
        match store.claim("k", owner(3), LEASE, None, None) {
            ClaimOutcome::Completed {
                payload,
                fingerprint,
                ..
            } => {
                assert_eq!(&*payload, b"ok", "the first completion stays");
                assert_eq!(
                    fingerprint,
                    Some(Fingerprint([7; 16])),
                    "the claim's fingerprint survives completion"
                );
            }
            other => panic!("expected a completed record, got {other:?}"),
        }
        assert_eq!(
            store.complete("k", owner(2), done(b"x"), DAY, None),
            CompleteOutcome::Superseded {
                other: Some(owner(1)),
                completed: true
            }
        );
    }

    #[tokio::test]
    async fn abandon_frees_the_key_for_the_owner_only() {
        let store = RecordStore::new();
        store.claim("k", owner(1), LEASE, None, None);
        assert!(!store.abandon("k", owner(2)));
        assert!(store.abandon("k", owner(1)));
        assert!(!store.abandon("k", owner(1)));
        assert_eq!(
            store.claim("k", owner(2), LEASE, None, None),
            ClaimOutcome::Claimed
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_resent_claim_is_claimed_and_refreshes_the_lease() {
        let store = RecordStore::new();
        store.claim(
            "k",
            owner(1),
            Duration::from_secs(10),
            Some(Fingerprint([5; 16])),
            None,
        );
        tokio::time::advance(Duration::from_secs(8)).await;
        assert_eq!(
            store.claim("k", owner(1), Duration::from_secs(10), None, None),
            ClaimOutcome::Claimed
        );
        tokio::time::advance(Duration::from_secs(8)).await;
        match store.claim("k", owner(2), LEASE, None, None) {
            ClaimOutcome::InFlight {
                fingerprint,
                remaining,
            } => {
                assert_eq!(
                    fingerprint,
                    Some(Fingerprint([5; 16])),
                    "the first fingerprint stays"
                );
                assert_eq!(
                    remaining,
                    Duration::from_secs(2),
                    "lease runs from the resend"
                );
            }
            other => panic!("expected the refreshed marker, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lapsed_marker_is_claimed_over_and_its_late_owner_is_superseded() {
        let store = RecordStore::new();
        store.claim("k", owner(1), Duration::from_secs(1), None, None);
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(
            store.renew("k", owner(1), LEASE),
            RenewOutcome::Lost(LossCause::Expired)
        );
        assert_eq!(
            store.claim("k", owner(2), LEASE, None, None),
            ClaimOutcome::Claimed
        );
        assert_eq!(
            store.renew("k", owner(1), LEASE),
            RenewOutcome::Lost(LossCause::TakenByOther)
        );
        assert_eq!(
            store.complete("k", owner(1), done(b"late"), DAY, None),
            CompleteOutcome::Superseded {
                other: Some(owner(2)),
                completed: false
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lapsed_marker_nobody_claimed_is_completed_with_the_given_fingerprint() {
        let store = RecordStore::new();
        store.claim(
            "k",
            owner(1),
            Duration::from_secs(1),
            Some(Fingerprint([1; 16])),
            None,
        );
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(
            store.complete(
                "k",
                owner(1),
                done(b"late"),
                DAY,
                Some(Fingerprint([2; 16]))
            ),
            CompleteOutcome::StoredWithoutMarker
        );
        assert_eq!(
            store.claim("k", owner(2), LEASE, None, None),
            ClaimOutcome::Completed {
                payload: done(b"late"),
                fingerprint: Some(Fingerprint([2; 16])),
                age: Some(Duration::ZERO),
            }
        );
        tokio::time::advance(Duration::from_millis(250)).await;
        assert!(
            matches!(
                store.claim("k", owner(2), LEASE, None, None),
                ClaimOutcome::Completed { age, .. } if age == Some(Duration::from_millis(250))
            ),
            "the age counts from the completion"
        );
        assert_eq!(
            store.complete(
                "k",
                owner(1),
                done(b"late"),
                DAY,
                Some(Fingerprint([2; 16]))
            ),
            CompleteOutcome::Stored,
            "the owner's resend after creating the record"
        );
        assert_eq!(
            store.renew("k", owner(1), LEASE),
            RenewOutcome::Lost(LossCause::Expired)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_abandoned_marker_blocks_claims_until_purged() {
        let store = RecordStore::new();
        let keep = Some(DAY);
        store.claim(
            "k",
            owner(1),
            Duration::from_secs(1),
            Some(Fingerprint([3; 16])),
            keep,
        );
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(
            store.claim("k", owner(2), LEASE, None, keep),
            ClaimOutcome::Abandoned {
                fingerprint: Some(Fingerprint([3; 16]))
            }
        );
        assert_eq!(
            store.claim("k", owner(1), LEASE, None, keep),
            ClaimOutcome::Abandoned {
                fingerprint: Some(Fingerprint([3; 16]))
            },
            "a lapsed marker is not revived by its owner's claim"
        );
        assert_eq!(
            store.renew("k", owner(1), LEASE),
            RenewOutcome::Lost(LossCause::Expired)
        );
        assert_eq!(
            store.renew("k", owner(2), LEASE),
            RenewOutcome::Lost(LossCause::TakenByOther)
        );
        assert_eq!(
            store.complete("k", owner(1), done(b"late"), DAY, None),
            CompleteOutcome::Stored,
            "a late owner still records"
        );
        assert!(matches!(
            store.claim("k", owner(2), LEASE, None, keep),
            ClaimOutcome::Completed { .. }
        ));
        assert!(store.purge("k"));
        assert!(!store.purge("k"));
        assert_eq!(
            store.claim("k", owner(2), LEASE, None, keep),
            ClaimOutcome::Claimed
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_marker_is_gone_after_its_keep_period() {
        let store = RecordStore::new();
        store.claim(
            "k",
            owner(1),
            Duration::from_secs(1),
            None,
            Some(Duration::from_secs(5)),
        );
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(matches!(
            store.claim("k", owner(2), LEASE, None, None),
            ClaimOutcome::Abandoned { .. }
        ));
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(
            store.claim("k", owner(2), LEASE, None, None),
            ClaimOutcome::Claimed
        );
    }

    #[tokio::test(start_paused = true)]
    async fn completed_records_expire_after_their_retention() {
        let store = RecordStore::new();
        store.claim("k", owner(1), LEASE, None, None);
        store.complete("k", owner(1), done(b"v"), Duration::from_secs(5), None);
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(matches!(
            store.claim("k", owner(2), LEASE, None, None),
            ClaimOutcome::Completed { .. }
        ));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(
            store.claim("k", owner(2), LEASE, None, None),
            ClaimOutcome::Claimed
        );
    }

    #[tokio::test]
    async fn zero_durations_make_state_that_has_already_expired() {
        let store = RecordStore::new();
        let zero = Some(Duration::ZERO);
        assert_eq!(
            store.claim("k", owner(1), Duration::ZERO, None, zero),
            ClaimOutcome::Claimed
        );
        assert_eq!(
            store.claim("k", owner(2), Duration::ZERO, None, zero),
            ClaimOutcome::Claimed,
            "a zero lease (kept for zero) lapses at once"
        );
        assert_eq!(
            store.renew("k", owner(2), Duration::ZERO),
            RenewOutcome::Lost(LossCause::Expired)
        );
        assert_eq!(
            store.complete("k", owner(1), done(b"v"), Duration::ZERO, None),
            CompleteOutcome::StoredWithoutMarker
        );
        assert_eq!(
            store.claim("k", owner(3), LEASE, None, None),
            ClaimOutcome::Claimed,
            "a zero retention keeps nothing"
        );
        let started = std::time::Instant::now();
        store.wait_settled("k", Duration::ZERO).await;
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn sub_millisecond_durations_do_not_panic() {
        let store = RecordStore::new();
        let us = Duration::from_micros(1);
        store.claim("k", owner(1), us, None, Some(us));
        store.claim("k", owner(1), us, None, Some(us));
        store.renew("k", owner(1), us);
        store.complete("k", owner(1), done(b"v"), us, None);
        store.wait_settled("k", us).await;
        store.abandon("k", owner(1));
        store.purge("k");
        assert_eq!(
            store.claim("k", owner(2), LEASE, None, None),
            ClaimOutcome::Claimed
        );
    }

    #[tokio::test]
    async fn lapsed_records_are_swept_as_new_keys_are_written() {
        let store = RecordStore::new();
        store.complete("live", owner(1), done(b"kept"), DAY, None);
        for i in 0..3000 {
            store.complete(
                &format!("done{i}"),
                owner(1),
                done(b"v"),
                Duration::ZERO,
                None,
            );
            store.claim(&format!("marker{i}"), owner(2), Duration::ZERO, None, None);
        }
        assert!(
            store.records.len() < 2 * SWEEP_AFTER_AT_LEAST as usize,
            "6000 lapsed records written, {} still in memory",
            store.records.len()
        );
        assert_eq!(store.len(), 1, "only the live record counts");
        match store.claim("live", owner(3), LEASE, None, None) {
            ClaimOutcome::Completed { payload, .. } => assert_eq!(&*payload, b"kept"),
            other => panic!("a live record survives every sweep, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn huge_durations_saturate_instead_of_panicking() {
        for (i, huge) in [Duration::from_millis(u64::MAX), Duration::MAX]
            .into_iter()
            .enumerate()
        {
            let store = RecordStore::new();
            let key = format!("k{i}");
            assert_eq!(
                store.claim(&key, owner(1), huge, None, Some(huge)),
                ClaimOutcome::Claimed
            );
            assert_eq!(
                store.claim(&key, owner(1), huge, None, Some(huge)),
                ClaimOutcome::Claimed,
                "a resend with a huge lease"
            );
            assert_eq!(store.renew(&key, owner(1), huge), RenewOutcome::Renewed);
            match store.claim(&key, owner(2), LEASE, None, None) {
                ClaimOutcome::InFlight { remaining, .. } => assert!(remaining > 365 * DAY),
                other => panic!("expected the marker in flight, got {other:?}"),
            }
            // Times out immediately (zero), then for a long wait, settles on completion.
            store.wait_settled(&key, Duration::ZERO).await;
            assert_eq!(
                store.complete(&key, owner(1), done(b"v"), huge, None),
                CompleteOutcome::Stored
            );
            store.wait_settled(&key, huge).await;
            assert_eq!(store.len(), 1, "the record survives a sweep");
            assert!(matches!(
                store.claim(&key, owner(2), LEASE, None, None),
                ClaimOutcome::Completed { .. }
            ));
            assert!(store.purge(&key));
            assert_eq!(
                store.complete(&key, owner(1), done(b"again"), huge, None),
                CompleteOutcome::StoredWithoutMarker,
                "after a purge the record is created again"
            );
        }
    }

    #[tokio::test]
    async fn waiters_wake_on_completion() {
        let store = Arc::new(RecordStore::new());
        store.claim("k", owner(1), LEASE, None, None);
        let waiter = tokio::spawn({
            let s = store.clone();
            async move {
                let started = std::time::Instant::now();
                s.wait_settled("k", Duration::MAX).await;
                started.elapsed()
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        store.complete("k", owner(1), done(b"v"), DAY, None);
        let waited = waiter.await.unwrap();
        assert!(
            waited < Duration::from_secs(10),
            "woken by completion, not by timeout: {waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn inspect_reports_state_age_and_time_left() {
        let store = RecordStore::new();
        assert_eq!(store.inspect("k"), None);
        store.claim("k", owner(1), LEASE, Some(Fingerprint([1; 16])), Some(DAY));
        tokio::time::advance(Duration::from_secs(10)).await;
        let seen = store.inspect("k").expect("in flight");
        assert_eq!(seen.status, RecordStatus::InFlight);
        assert_eq!(seen.owner, owner(1));
        assert_eq!(seen.age, Duration::from_secs(10));
        assert_eq!(seen.lease_left, Some(Duration::from_secs(20)));
        assert_eq!(seen.expires_in, Duration::from_secs(20) + DAY);
        assert!(seen.has_fingerprint);
        assert_eq!(seen.payload_len, None);
        assert_eq!(
            store.claim("k", owner(1), LEASE, None, Some(DAY)),
            ClaimOutcome::Claimed,
            "a resent claim"
        );
        assert_eq!(
            store.inspect("k").unwrap().age,
            Duration::from_secs(10),
            "a resent claim keeps the marker's age"
        );
        tokio::time::advance(LEASE).await;
        let seen = store.inspect("k").expect("kept");
        assert_eq!(seen.status, RecordStatus::Abandoned);
        assert_eq!(seen.lease_left, None);
        assert_eq!(
            seen.expires_in, DAY,
            "kept for a day past the lease, which the resent claim restarted"
        );
        store.complete("k", owner(1), done(b"abc"), DAY, None);
        tokio::time::advance(Duration::from_secs(5)).await;
        let seen = store.inspect("k").expect("completed");
        assert_eq!(seen.status, RecordStatus::Completed);
        assert_eq!(
            seen.age,
            Duration::from_secs(5),
            "age counts from completion"
        );
        assert_eq!(seen.payload_len, Some(3));
        assert_eq!(seen.expires_in, DAY - Duration::from_secs(5));
        assert!(seen.has_fingerprint, "the claim's fingerprint is kept");
        assert_eq!(store.keys(), vec![Arc::<str>::from("k")]);
        store.claim("lapses", owner(2), Duration::from_secs(1), None, None);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(
            store.inspect("lapses"),
            None,
            "a lapsed marker is no record"
        );
        assert_eq!(store.keys(), vec![Arc::<str>::from("k")]);
    }
}
