//! Reading the store without changing it: one record as the operations API shows it, and the
//! keys of every record that has not lapsed.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use coord_contract::{OwnerToken, RecordStatus};

use super::RecordStore;
use super::record::{Held, Record};

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

impl RecordStore {
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
}
