//! Counting semaphores whose permits are leases, for this process.

use std::sync::Arc;
use std::time::Duration;

use dashmap::mapref::entry::Entry;
use tokio::time::Instant;

use coord_contract::{HoldInfo, OwnerToken, PermitGrant, ReleaseOutcome, RenewOutcome};

use crate::counted_leases::{self, CountedEntry, CountedLeases, Lease, Look, Try, Waiters};
use crate::deadline_after;

/// The permits of one key and its waiters.
#[derive(Default)]
struct SemEntry {
    permits: Vec<Lease>,
    waiters: Waiters,
}

impl CountedEntry for SemEntry {
    fn waiters(&mut self) -> &mut Waiters {
        &mut self.waiters
    }

    fn is_unused(&self) -> bool {
        self.permits.is_empty() && self.waiters.waiting == 0
    }
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
    leases: CountedLeases<SemEntry>,
}

impl std::fmt::Debug for SemaphoreTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SemaphoreTable")
            .field("keys", &self.leases.entries().len())
            .finish()
    }
}

impl SemaphoreTable {
    /// An empty table.
    pub fn new() -> SemaphoreTable {
        SemaphoreTable::default()
    }

    /// How many keys have live permits or waiters (expired permits not yet removed count).
    pub fn len(&self) -> usize {
        self.leases.entries().len()
    }

    /// True when no key has permits or waiters.
    pub fn is_empty(&self) -> bool {
        self.leases.entries().is_empty()
    }

    /// The live permits of `key` now.
    pub fn held(&self, key: &str) -> usize {
        let now = Instant::now();
        self.leases
            .entries()
            .get(key)
            .map_or(0, |e| e.permits.iter().filter(|p| p.is_live(now)).count())
    }

    /// The live permits of `key` (soonest-ending first, with their lease left and token) and
    /// how many callers wait for one, now. Reads only.
    pub fn inspect(&self, key: &str) -> (Vec<HoldInfo>, usize) {
        let now = Instant::now();
        let Some(entry) = self.leases.entries().get(key) else {
            return (Vec::new(), 0);
        };
        (
            counted_leases::live_infos(entry.permits.iter(), now),
            entry.waiters.waiting,
        )
    }

    /// One attempt, as [`CountedLeases::attempt`] runs it.
    fn attempt(
        &self,
        key: &str,
        owner: OwnerToken,
        limit: u32,
        lease: Duration,
        look: Look,
    ) -> Try {
        let now = Instant::now();
        let lease_end = deadline_after(now, lease);
        self.leases.attempt(key, look, |entry, fence| {
            entry.permits.retain(|p| p.is_live(now));
            if let Some(mine) = entry.permits.iter_mut().find(|p| p.owner == owner) {
                // A resent acquire by the holder: the same permit, its lease renewed.
                mine.expires_at = lease_end;
                return Ok(mine.token);
            }
            if entry.permits.len() < limit as usize {
                let token = fence.mint();
                entry.permits.push(Lease {
                    owner,
                    expires_at: lease_end,
                    token,
                });
                return Ok(token);
            }
            Err(entry
                .permits
                .iter()
                .map(|p| p.expires_at)
                .min()
                .unwrap_or(now))
        })
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
        let granted = self
            .leases
            .acquire(key, owner, wait, |look| {
                self.attempt(key, owner, limit, lease, look)
            })
            .await?;
        Some(PermitGrant {
            fencing_token: granted.token,
            contended: granted.contended,
            lease_began: Some(granted.lease_began),
        })
    }

    /// Frees `owner`'s permit of `key`. A permit whose lease ran out is removed and answers
    /// `NotHeld`: it was not counted any more, so removing it frees nobody's place twice.
    pub fn release(&self, key: &str, owner: OwnerToken) -> ReleaseOutcome {
        let now = Instant::now();
        let Entry::Occupied(mut slot) = self.leases.entries().entry(Arc::from(key)) else {
            return ReleaseOutcome::NotHeld;
        };
        let entry = slot.get_mut();
        let before = entry.permits.len();
        let mine = entry.permits.iter().position(|p| p.owner == owner);
        let outcome = match mine {
            Some(at) if entry.permits[at].is_live(now) => {
                entry.permits.swap_remove(at);
                ReleaseOutcome::Released
            }
            Some(at) => {
                entry.permits.swap_remove(at);
                ReleaseOutcome::NotHeld
            }
            None => ReleaseOutcome::NotHeld,
        };
        entry.permits.retain(|p| p.is_live(now));
        if entry.permits.len() < before {
            entry.waiters.freed.notify_waiters();
        }
        if entry.is_unused() {
            slot.remove();
        }
        outcome
    }

    /// Extends `owner`'s permit of `key` to `lease` from now, if it is still live.
    pub fn renew(&self, key: &str, owner: OwnerToken, lease: Duration) -> RenewOutcome {
        let now = Instant::now();
        let lease_end = deadline_after(now, lease);
        let Some(mut entry) = self.leases.entries().get_mut(key) else {
            return RenewOutcome::Lost(coord_contract::LossCause::Expired);
        };
        let mine = entry.permits.iter_mut().find(|p| p.owner == owner);
        counted_leases::renew(mine, now, lease_end)
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
