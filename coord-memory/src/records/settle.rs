//! Waiting for a marker to settle (completed, abandoned, purged or lapsed), and waking its
//! waiters once it has.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use coord_contract::OwnerToken;

use super::RecordStore;
use super::record::Record;
use crate::deadline_after;

/// Wakes the waiters of a marker that was replaced or removed, once the key's step is over.
pub(super) fn wake(settled: Option<Arc<Notify>>) {
    if let Some(settled) = settled {
        settled.notify_waiters();
    }
}

impl RecordStore {
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
