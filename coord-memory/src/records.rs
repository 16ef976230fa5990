//! Idempotency records: in-flight markers with a lease, then completed outcomes.

use std::sync::Arc;
use std::time::Duration;

use moka::Expiry;
use moka::ops::compute::Op;
use moka::sync::Cache;
use tokio::sync::Notify;
use tokio::time::Instant;

#[derive(Clone)]
enum Record {
    InFlight {
        owner: u128,
        fingerprint: Option<[u8; 16]>,
        lease: Duration,
        expires_at: Instant,
        /// Keep the marker this long past its lease if it is never completed.
        keep_abandoned_for: Option<Duration>,
        settled: Arc<Notify>,
    },
    Completed {
        payload: Arc<[u8]>,
        fingerprint: Option<[u8; 16]>,
        retention: Duration,
    },
}

impl Record {
    fn ttl(&self) -> Duration {
        match self {
            Record::InFlight {
                lease,
                keep_abandoned_for,
                ..
            } => *lease + keep_abandoned_for.unwrap_or_default(),
            Record::Completed { retention, .. } => *retention,
        }
    }

    /// Expiry as this store judges it. moka also expires entries, but on its own clock; this
    /// check keeps the store exact (and testable with tokio's paused clock).
    fn is_live(&self) -> bool {
        match self {
            Record::InFlight { expires_at, .. } => *expires_at > Instant::now(),
            Record::Completed { .. } => true,
        }
    }

    /// True for a lapsed marker that is kept as an abandoned record.
    fn is_kept_abandoned(&self) -> bool {
        matches!(
            self,
            Record::InFlight {
                keep_abandoned_for: Some(_),
                ..
            }
        ) && !self.is_live()
    }

    /// True when `owner`'s marker is still here: live, or lapsed but kept.
    fn is_marker_of(&self, owner: u128) -> bool {
        matches!(self, Record::InFlight { owner: holder, .. } if *holder == owner)
            && (self.is_live() || self.is_kept_abandoned())
    }
}

struct RecordExpiry;

impl Expiry<Box<str>, Record> for RecordExpiry {
    fn expire_after_create(
        &self,
        _key: &Box<str>,
        value: &Record,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        Some(value.ttl())
    }

    fn expire_after_update(
        &self,
        _key: &Box<str>,
        value: &Record,
        _updated_at: std::time::Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        Some(value.ttl())
    }
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The caller now owns an in-flight marker.
    Claimed,
    /// An earlier marker lapsed without completion and was kept: the outcome is unknown.
    Abandoned {
        /// The fingerprint stored with the marker.
        fingerprint: Option<[u8; 16]>,
    },
    /// Someone else's marker is in flight.
    InFlight {
        /// The fingerprint stored with the marker.
        fingerprint: Option<[u8; 16]>,
        /// Time left on its lease.
        remaining: Duration,
    },
    /// A completed outcome is stored.
    Completed {
        /// The stored outcome.
        payload: Arc<[u8]>,
        /// The fingerprint stored with it.
        fingerprint: Option<[u8; 16]>,
    },
}

/// Idempotency records in a moka cache with per-entry expiry: an in-flight marker lives for
/// its lease, a completed outcome for its retention. Every operation on a key is atomic
/// (moka's per-key compute). Waiters for a marker are woken when it is completed or
/// abandoned.
///
/// The store is not bounded by count: evicting a record early would silently break
/// at-most-once, so records leave only by expiry, completion or abandonment.
pub struct RecordStore {
    cache: Cache<Box<str>, Record>,
}

impl Default for RecordStore {
    fn default() -> Self {
        RecordStore::new()
    }
}

impl std::fmt::Debug for RecordStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordStore")
            .field("records", &self.cache.entry_count())
            .finish()
    }
}

impl RecordStore {
    /// An empty store.
    pub fn new() -> RecordStore {
        RecordStore {
            cache: Cache::builder().expire_after(RecordExpiry).build(),
        }
    }

    /// Records currently stored (moka's estimate; expired entries may linger until its next
    /// maintenance run).
    pub fn len(&self) -> u64 {
        self.cache.run_pending_tasks();
        self.cache.entry_count()
    }

    /// True when no records are stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Claims `key` for `owner` with an in-flight marker, or reports the record there. With
    /// `keep_abandoned_for`, a marker that lapses without completion is kept that long and
    /// reported as [`Claim::Abandoned`].
    pub fn claim(
        &self,
        key: &str,
        owner: u128,
        lease: Duration,
        fingerprint: Option<[u8; 16]>,
        keep_abandoned_for: Option<Duration>,
    ) -> Claim {
        let mut found = Claim::Claimed;
        self.cache.entry(key.into()).and_compute_with(|existing| {
            if let Some(existing) = existing {
                let record = existing.into_value();
                if record.is_kept_abandoned() {
                    if let Record::InFlight { fingerprint, .. } = record {
                        found = Claim::Abandoned { fingerprint };
                    }
                    return Op::Nop;
                }
                if record.is_live() {
                    found = match record {
                        Record::InFlight {
                            fingerprint,
                            expires_at,
                            ..
                        } => Claim::InFlight {
                            fingerprint,
                            remaining: expires_at.saturating_duration_since(Instant::now()),
                        },
                        Record::Completed {
                            payload,
                            fingerprint,
                            ..
                        } => Claim::Completed {
                            payload,
                            fingerprint,
                        },
                    };
                    return Op::Nop;
                }
                // A lapsed marker: its owner crashed or stalled. Wake anyone waiting on it.
                if let Record::InFlight { settled, .. } = record {
                    settled.notify_waiters();
                }
            }
            Op::Put(Record::InFlight {
                owner,
                fingerprint,
                lease,
                expires_at: Instant::now() + lease,
                keep_abandoned_for,
                settled: Arc::new(Notify::new()),
            })
        });
        found
    }

    /// Stores `payload` for `retention` if `owner` holds the marker at `key`. The fingerprint
    /// given at claim time stays with the record.
    pub fn complete(
        &self,
        key: &str,
        owner: u128,
        payload: Arc<[u8]>,
        retention: Duration,
    ) -> bool {
        let mut done = false;
        self.cache.entry(key.into()).and_compute_with(|existing| {
            let record = existing.map(|e| e.into_value());
            match record {
                Some(Record::InFlight {
                    fingerprint,
                    ref settled,
                    ..
                }) if record.as_ref().is_some_and(|r| r.is_marker_of(owner)) => {
                    done = true;
                    settled.notify_waiters();
                    Op::Put(Record::Completed {
                        payload,
                        fingerprint,
                        retention,
                    })
                }
                _ => Op::Nop,
            }
        });
        done
    }

    /// Extends `owner`'s live marker at `key` to `lease` from now. `false` when the marker is
    /// gone, lapsed, completed or someone else's.
    pub fn renew(&self, key: &str, owner: u128, lease: Duration) -> bool {
        let mut done = false;
        self.cache.entry(key.into()).and_compute_with(|existing| {
            match existing.map(|e| e.into_value()) {
                Some(Record::InFlight {
                    owner: holder,
                    fingerprint,
                    expires_at,
                    keep_abandoned_for,
                    settled,
                    ..
                }) if holder == owner && expires_at > Instant::now() => {
                    done = true;
                    Op::Put(Record::InFlight {
                        owner,
                        fingerprint,
                        lease,
                        expires_at: Instant::now() + lease,
                        keep_abandoned_for,
                        settled,
                    })
                }
                _ => Op::Nop,
            }
        });
        done
    }

    /// Removes the marker at `key` if `owner` holds it.
    pub fn abandon(&self, key: &str, owner: u128) -> bool {
        let mut done = false;
        self.cache.entry(key.into()).and_compute_with(|existing| {
            let record = existing.map(|e| e.into_value());
            match &record {
                Some(r @ Record::InFlight { settled, .. }) if r.is_marker_of(owner) => {
                    done = true;
                    settled.notify_waiters();
                    Op::Remove
                }
                _ => Op::Nop,
            }
        });
        done
    }

    /// Removes any record at `key`. Returns whether one was there.
    pub fn purge(&self, key: &str) -> bool {
        let removed = self.cache.remove(key);
        if let Some(Record::InFlight { settled, .. }) = &removed {
            settled.notify_waiters();
        }
        removed.is_some()
    }

    /// Waits until the marker at `key` is completed, abandoned or lapsed, at most `timeout`.
    /// Returns at once when no live marker is there.
    pub async fn wait_settled(&self, key: &str, timeout: Duration) {
        let Some(Record::InFlight {
            owner,
            settled,
            expires_at,
            ..
        }) = self.cache.get(key)
        else {
            return;
        };
        let notified = settled.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // Re-check after registering, so a settle between the read and the registration is
        // not missed.
        match self.cache.get(key) {
            Some(Record::InFlight {
                owner: now_owner, ..
            }) if now_owner == owner => {}
            _ => return,
        }
        let until = expires_at.min(Instant::now() + timeout);
        let _ = tokio::time::timeout_at(until, notified).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(30);
    const DAY: Duration = Duration::from_secs(86_400);

    #[tokio::test]
    async fn claim_complete_replay() {
        let store = RecordStore::new();
        assert_eq!(
            store.claim("k", 1, LEASE, Some([7; 16]), None),
            Claim::Claimed
        );
        match store.claim("k", 2, LEASE, None, None) {
            Claim::InFlight { fingerprint, .. } => assert_eq!(fingerprint, Some([7; 16])),
            other => panic!("expected the marker in flight, got {other:?}"),
        }
        assert!(
            !store.complete("k", 2, Arc::from(&b"x"[..]), DAY),
            "only the owner completes"
        );
        assert!(store.complete("k", 1, Arc::from(&b"ok"[..]), DAY));
        match store.claim("k", 3, LEASE, None, None) {
            Claim::Completed {
                payload,
                fingerprint,
            } => {
                assert_eq!(&*payload, b"ok");
                assert_eq!(
                    fingerprint,
                    Some([7; 16]),
                    "the fingerprint survives completion"
                );
            }
            other => panic!("expected a completed record, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn abandon_frees_the_key_for_the_owner_only() {
        let store = RecordStore::new();
        store.claim("k", 1, LEASE, None, None);
        assert!(!store.abandon("k", 2));
        assert!(store.abandon("k", 1));
        assert_eq!(store.claim("k", 2, LEASE, None, None), Claim::Claimed);
    }

    #[tokio::test(start_paused = true)]
    async fn lapsed_marker_can_be_claimed_again_and_its_owner_cannot_complete() {
        let store = RecordStore::new();
        store.claim("k", 1, Duration::from_secs(1), None, None);
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(store.claim("k", 2, LEASE, None, None), Claim::Claimed);
        assert!(!store.complete("k", 1, Arc::from(&b"late"[..]), DAY));
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_abandoned_marker_blocks_claims_until_purged() {
        let store = RecordStore::new();
        let keep = Some(DAY);
        store.claim("k", 1, Duration::from_secs(1), Some([3; 16]), keep);
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(
            store.claim("k", 2, LEASE, None, keep),
            Claim::Abandoned {
                fingerprint: Some([3; 16])
            }
        );
        assert!(
            store.complete("k", 1, Arc::from(&b"late"[..]), DAY),
            "a late owner still records"
        );
        assert!(matches!(
            store.claim("k", 2, LEASE, None, keep),
            Claim::Completed { .. }
        ));
        assert!(store.purge("k"));
        assert_eq!(store.claim("k", 2, LEASE, None, keep), Claim::Claimed);
    }

    #[tokio::test]
    async fn waiters_wake_on_completion() {
        let store = Arc::new(RecordStore::new());
        store.claim("k", 1, LEASE, None, None);
        let waiter = tokio::spawn({
            let s = store.clone();
            async move {
                let started = std::time::Instant::now();
                s.wait_settled("k", Duration::from_secs(20)).await;
                started.elapsed()
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        store.complete("k", 1, Arc::from(&b"v"[..]), DAY);
        let waited = waiter.await.unwrap();
        assert!(
            waited < Duration::from_secs(10),
            "woken by completion, not by timeout: {waited:?}"
        );
    }
}
