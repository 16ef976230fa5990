//! Counting semaphores whose permits are leases, for this process.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use tokio::sync::Notify;
use tokio::time::Instant;

use coord_contract::LossCause;
use coord_contract::{
    FencingToken, HoldInfo, OwnerToken, PermitGrant, ReleaseOutcome, RenewOutcome,
};

use crate::deadline_after;

/// One permit: its owner, when its lease ends, and its fencing token.
#[derive(Debug, Clone, Copy)]
struct Permit {
    owner: OwnerToken,
    expires_at: Instant,
    token: FencingToken,
}

/// The permits of one key and what its waiters listen on.
struct SemEntry {
    permits: Vec<Permit>,
    /// Callers waiting for a permit of this key; the entry stays while there are any.
    waiting: usize,
    /// Released permits are announced here (every waiter looks again; one of them wins).
    freed: Arc<Notify>,
}

/// Semaphores keyed on the exact key.
///
/// * The limit is checked and the permit taken under the key's shard lock, after removing
///   the permits whose lease ran out: the limit is exact, and a crashed holder's permit counts
///   until its lease ends, not later.
/// * A release wakes the key's waiters at once; a waiter also looks again when the
///   soonest-ending permit's lease ends. Each acquisition takes one permit.
/// * An entry exists only while the key has live permits or waiters.
/// * Fencing tokens come from one counter per table, so they increase strictly per key.
///
/// Time is tokio's clock, so tests can pause and advance it. Every duration is accepted
/// (deadlines saturate).
#[derive(Default)]
pub struct SemaphoreTable {
    entries: DashMap<Arc<str>, SemEntry>,
    fence: AtomicU64,
}

impl std::fmt::Debug for SemaphoreTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SemaphoreTable")
            .field("keys", &self.entries.len())
            .finish()
    }
}

/// What one attempt found.
enum Try {
    Granted(FencingToken),
    /// Full; the soonest lease ends at this instant, and this is the key's wake-up.
    Full(Instant, Arc<Notify>),
}

/// Counts a waiter in its entry while it waits, and removes an entry nobody needs any more
/// when it leaves.
struct Waiting<'a> {
    table: &'a SemaphoreTable,
    key: &'a str,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Entry::Occupied(mut slot) = self.table.entries.entry(Arc::from(self.key)) {
            let entry = slot.get_mut();
            entry.waiting = entry.waiting.saturating_sub(1);
            if entry.waiting == 0 && entry.permits.is_empty() {
                slot.remove();
            }
        }
    }
}

impl SemaphoreTable {
    /// An empty table.
    pub fn new() -> SemaphoreTable {
        SemaphoreTable::default()
    }

    /// How many keys have live permits or waiters (expired permits not yet removed count).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no key has permits or waiters.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The live permits of `key` now.
    pub fn held(&self, key: &str) -> usize {
        let now = Instant::now();
        self.entries.get(key).map_or(0, |e| {
            e.permits.iter().filter(|p| p.expires_at > now).count()
        })
    }

    /// The live permits of `key` (soonest-ending first, with their lease left and token) and
    /// how many callers wait for one, now. Reads only.
    pub fn inspect(&self, key: &str) -> (Vec<HoldInfo>, usize) {
        let now = Instant::now();
        let Some(entry) = self.entries.get(key) else {
            return (Vec::new(), 0);
        };
        let mut live: Vec<&Permit> = entry
            .permits
            .iter()
            .filter(|p| p.expires_at > now)
            .collect();
        live.sort_by_key(|p| p.expires_at);
        let permits = live
            .into_iter()
            .map(|p| {
                HoldInfo::new(
                    p.owner,
                    p.expires_at.saturating_duration_since(now),
                    Some(p.token),
                )
            })
            .collect();
        (permits, entry.waiting)
    }

    fn mint(&self) -> FencingToken {
        FencingToken::new(self.fence.fetch_add(1, Ordering::Relaxed).saturating_add(1))
    }

    /// One attempt; `waiter` counts the caller as waiting when the key is full.
    fn attempt(
        &self,
        key: &str,
        owner: OwnerToken,
        limit: u32,
        lease: Duration,
        waiter: bool,
    ) -> Try {
        let now = Instant::now();
        let lease_end = deadline_after(now, lease);
        let mut slot = self
            .entries
            .entry(Arc::from(key))
            .or_insert_with(|| SemEntry {
                permits: Vec::new(),
                waiting: 0,
                freed: Arc::new(Notify::new()),
            });
        let entry = slot.value_mut();
        entry.permits.retain(|p| p.expires_at > now);
        if let Some(mine) = entry.permits.iter_mut().find(|p| p.owner == owner) {
            // A resent acquire by the holder: the same permit, its lease renewed.
            mine.expires_at = lease_end;
            return Try::Granted(mine.token);
        }
        if entry.permits.len() < limit as usize {
            let token = self.mint();
            entry.permits.push(Permit {
                owner,
                expires_at: lease_end,
                token,
            });
            return Try::Granted(token);
        }
        let soonest = entry
            .permits
            .iter()
            .map(|p| p.expires_at)
            .min()
            .unwrap_or(now);
        if waiter {
            entry.waiting += 1;
        }
        let freed = entry.freed.clone();
        let empty = entry.permits.is_empty() && entry.waiting == 0;
        drop(slot);
        if empty {
            // A limit of zero leaves nothing behind (the runtime never asks for one).
            self.entries
                .remove_if(key, |_, e| e.permits.is_empty() && e.waiting == 0);
        }
        Try::Full(soonest, freed)
    }

    /// Takes one permit of `key` for `owner` while fewer than `limit` are held, waiting up to
    /// `wait` (zero: one attempt). `None` when the semaphore stayed full throughout.
    pub async fn acquire(
        &self,
        key: &str,
        owner: OwnerToken,
        limit: u32,
        lease: Duration,
        wait: Duration,
    ) -> Option<PermitGrant> {
        let started = Instant::now();
        let granted = |token, contended| PermitGrant {
            fencing_token: token,
            contended,
            lease_began: Some(Instant::now()),
        };
        let (soonest, freed) = match self.attempt(key, owner, limit, lease, !wait.is_zero()) {
            Try::Granted(token) => {
                return Some(PermitGrant {
                    fencing_token: token,
                    contended: false,
                    lease_began: Some(started),
                });
            }
            Try::Full(..) if wait.is_zero() => return None,
            Try::Full(soonest, freed) => (soonest, freed),
        };
        let _waiting = Waiting { table: self, key };
        let deadline = deadline_after(started, wait);
        let mut soonest = soonest;
        loop {
            let notified = freed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Look again now that the wake-up is armed: a release in between is not missed.
            match self.attempt(key, owner, limit, lease, false) {
                Try::Granted(token) => return Some(granted(token, true)),
                Try::Full(next, _) => soonest = next.min(soonest.max(Instant::now())),
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(soonest.min(deadline)) => {}
            }
            soonest = deadline;
        }
    }

    /// Frees `owner`'s permit of `key`. A permit whose lease ran out is removed and answers
    /// `NotHeld`: it was not counted any more, so removing it frees nobody's place twice.
    pub fn release(&self, key: &str, owner: OwnerToken) -> ReleaseOutcome {
        let now = Instant::now();
        let Entry::Occupied(mut slot) = self.entries.entry(Arc::from(key)) else {
            return ReleaseOutcome::NotHeld;
        };
        let entry = slot.get_mut();
        let before = entry.permits.len();
        let mine = entry.permits.iter().position(|p| p.owner == owner);
        let outcome = match mine {
            Some(at) if entry.permits[at].expires_at > now => {
                entry.permits.swap_remove(at);
                ReleaseOutcome::Released
            }
            Some(at) => {
                entry.permits.swap_remove(at);
                ReleaseOutcome::NotHeld
            }
            None => ReleaseOutcome::NotHeld,
        };
        entry.permits.retain(|p| p.expires_at > now);
        if entry.permits.len() < before {
            entry.freed.notify_waiters();
        }
        if entry.permits.is_empty() && entry.waiting == 0 {
            slot.remove();
        }
        outcome
    }

    /// Extends `owner`'s permit of `key` to `lease` from now, if it is still live.
    pub fn renew(&self, key: &str, owner: OwnerToken, lease: Duration) -> RenewOutcome {
        let now = Instant::now();
        let lease_end = deadline_after(now, lease);
        let Some(mut entry) = self.entries.get_mut(key) else {
            return RenewOutcome::Lost(LossCause::Expired);
        };
        match entry.permits.iter_mut().find(|p| p.owner == owner) {
            Some(permit) if permit.expires_at > now => {
                permit.expires_at = lease_end;
                RenewOutcome::Renewed
            }
            _ => RenewOutcome::Lost(LossCause::Expired),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(n: u128) -> OwnerToken {
        OwnerToken::from_u128(n)
    }

    const LEASE: Duration = Duration::from_secs(10);

    #[tokio::test(start_paused = true)]
    async fn the_limit_holds_and_an_expired_permit_comes_back_at_its_lease_end() {
        let table = SemaphoreTable::new();
        let a = table.acquire("k", owner(1), 2, LEASE, Duration::ZERO).await;
        let b = table.acquire("k", owner(2), 2, LEASE, Duration::ZERO).await;
        assert!(a.is_some() && b.is_some());
        assert!(b.unwrap().fencing_token > a.unwrap().fencing_token);
        assert!(
            table
                .acquire("k", owner(3), 2, LEASE, Duration::ZERO)
                .await
                .is_none()
        );
        tokio::time::advance(LEASE - Duration::from_millis(1)).await;
        assert!(
            table
                .acquire("k", owner(3), 2, LEASE, Duration::ZERO)
                .await
                .is_none()
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            table
                .acquire("k", owner(3), 2, LEASE, Duration::ZERO)
                .await
                .is_some()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_is_woken_by_a_release() {
        let table = Arc::new(SemaphoreTable::new());
        table
            .acquire("k", owner(1), 1, LEASE, Duration::ZERO)
            .await
            .unwrap();
        let waiter = tokio::spawn({
            let t = table.clone();
            async move { t.acquire("k", owner(2), 1, LEASE, LEASE * 100).await }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        let released_at = Instant::now();
        assert_eq!(table.release("k", owner(1)), ReleaseOutcome::Released);
        let grant = waiter.await.unwrap().expect("granted");
        assert!(grant.contended);
        assert_eq!(
            Instant::now(),
            released_at,
            "woken by the release, not a timer"
        );
        assert_eq!(table.release("k", owner(2)), ReleaseOutcome::Released);
        assert!(table.is_empty(), "nothing left behind");
    }
}
