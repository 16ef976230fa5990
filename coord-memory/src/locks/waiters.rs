//! The callers queued for a held lock: the queue's entries, the waiter a caller holds (which
//! leaves the queue if dropped, passing on a lock handed to it meanwhile), and the wait for
//! the hand-off, the holder's lease to end, or the deadline.

use std::sync::Arc;
use std::time::Duration;

use dashmap::mapref::entry::Entry;
use tokio::sync::oneshot;
use tokio::time::Instant;

use coord_contract::{LockGrant, OwnerToken};

use super::{LockEntry, LockTable, granted};
use crate::deadline_after;

pub(super) struct Queued {
    pub(super) id: u64,
    pub(super) owner: OwnerToken,
    pub(super) lease: Duration,
    pub(super) fenced: bool,
    pub(super) handoff: oneshot::Sender<LockGrant>,
}

/// Removes a waiter from its queue if its `acquire` future is dropped, and passes on a lock
/// that was handed to it in the meantime.
pub(super) struct WaiterGuard<'a> {
    pub(super) table: &'a LockTable,
    pub(super) key: &'a str,
    pub(super) id: u64,
    pub(super) owner: OwnerToken,
    pub(super) handoff: Option<oneshot::Receiver<LockGrant>>,
}

impl WaiterGuard<'_> {
    /// Leaves the queue now (idempotent).
    pub(super) fn leave(&mut self) {
        let Some(mut rx) = self.handoff.take() else {
            return;
        };
        if let Some(mut entry) = self.table.entries.get_mut(self.key) {
            entry.waiters.retain(|w| w.id != self.id);
        }
        rx.close();
        if rx.try_recv().is_ok() {
            // The lock was handed to us after our caller stopped waiting: pass it on.
            self.table.release(self.key, self.owner);
        }
    }
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}

/// The result of [`LockTable::attempt`].
pub enum Attempt<'a> {
    /// The lock is the caller's.
    Granted(LockGrant),
    /// Held by someone else, and the caller asked for one attempt only.
    Held,
    /// Held by someone else; the caller is queued.
    Queued(Waiter<'a>),
}

/// A caller queued for a held lock. Dropping it leaves the queue (passing on a lock handed to
/// it meanwhile).
pub struct Waiter<'a> {
    pub(super) guard: WaiterGuard<'a>,
    pub(super) holder_expires: Instant,
    pub(super) deadline: Instant,
    pub(super) lease: Duration,
    pub(super) fenced: bool,
}

impl Waiter<'_> {
    /// Waits for the hand-off, the holder's lease to end, or the deadline.
    pub async fn wait(self) -> Option<LockGrant> {
        let Waiter {
            mut guard,
            mut holder_expires,
            deadline,
            lease,
            fenced,
        } = self;
        let table = guard.table;
        let terms = WaitTerms {
            lease,
            fenced,
            deadline,
        };
        table
            .wait_queued(&mut guard, terms, &mut holder_expires)
            .await
    }
}

/// What a queued waiter asked for: the lease it wants, whether fenced, and until when it waits.
#[derive(Clone, Copy)]
struct WaitTerms {
    lease: Duration,
    fenced: bool,
    deadline: Instant,
}

impl LockTable {
    /// Waits in the queue `guard` stands in until the lock is handed over, the holder's lease
    /// (last seen ending at `holder_expires`) runs out, or the waiter's deadline passes.
    async fn wait_queued(
        &self,
        guard: &mut WaiterGuard<'_>,
        terms: WaitTerms,
        holder_expires: &mut Instant,
    ) -> Option<LockGrant> {
        let WaitTerms {
            lease,
            fenced,
            deadline,
        } = terms;
        let (id, key, owner) = (guard.id, guard.key, guard.owner);
        loop {
            let Some(rx) = guard.handoff.as_mut() else {
                // Not reachable (the receiver is only taken on the way out), but if it were,
                // one plain attempt is the honest answer.
                return self.try_take_after_wait(key, owner, lease, fenced);
            };
            let wake_at = (*holder_expires).min(deadline);
            tokio::select! {
                biased;
                handed = rx => {
                    guard.handoff = None;
                    // The sender is only dropped after sending, or with the entry, which is
                    // never removed while we are queued; if it were, one plain attempt is the
                    // honest answer.
                    if let Ok(grant) = handed {
                        return Some(grant);
                    }
                    return self.try_take_after_wait(key, owner, lease, fenced);
                }
                _ = tokio::time::sleep_until(wake_at) => {}
            }
            // Timer: the holder's lease may have ended, or our wait is over.
            let now = Instant::now();
            let lease_end = deadline_after(now, lease);
            let Some(mut lock) = self.entries.get_mut(key) else {
                guard.leave();
                return self.try_take_after_wait(key, owner, lease, fenced);
            };
            if let Some(Ok(grant)) = guard.handoff.as_mut().map(|rx| rx.try_recv()) {
                guard.handoff = None;
                return Some(grant);
            }
            if lock.expires_at <= now {
                lock.waiters.retain(|w| w.id != id);
                let fencing_token = self.mint(fenced);
                lock.grant(owner, lease_end, fencing_token);
                guard.handoff = None;
                return Some(granted(fencing_token, true, now));
            }
            if now >= deadline {
                lock.waiters.retain(|w| w.id != id);
                guard.handoff = None;
                return None;
            }
            *holder_expires = lock.expires_at;
        }
    }

    /// After leaving the queue because the entry vanished: one more plain attempt.
    fn try_take_after_wait(
        &self,
        key: &str,
        owner: OwnerToken,
        lease: Duration,
        fenced: bool,
    ) -> Option<LockGrant> {
        let now = Instant::now();
        let lease_end = deadline_after(now, lease);
        let fencing_token = match self.entries.entry(Arc::from(key)) {
            Entry::Vacant(slot) => {
                let fencing_token = self.mint(fenced);
                slot.insert(LockEntry::new(owner, lease_end, fencing_token));
                fencing_token
            }
            Entry::Occupied(mut slot) => {
                let lock = slot.get_mut();
                if lock.expires_at > now {
                    return None;
                }
                let fencing_token = self.mint(fenced);
                lock.grant(owner, lease_end, fencing_token);
                fencing_token
            }
        };
        Some(granted(fencing_token, true, now))
    }
}
