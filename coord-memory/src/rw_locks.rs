//! Read-write locks whose holds are leases, for this process.

use std::sync::Arc;
use std::time::Duration;

use dashmap::mapref::entry::Entry;
use tokio::time::Instant;

use coord_contract::{
    HoldInfo, LossCause, OwnerToken, ReleaseOutcome, RenewOutcome, RwGrant, RwMode, WriterClaim,
};

use crate::counted_leases::{self, CountedEntry, CountedLeases, Lease, Look, Try, Waiters};
use crate::deadline_after;

/// A waiting writer's claim: it keeps new readers out until it ends.
#[derive(Debug, Clone, Copy)]
struct Claim {
    owner: OwnerToken,
    ends_at: Instant,
}

/// The holds of one key, its waiting writer's claim, and its waiters (woken by released holds
/// and withdrawn claims).
#[derive(Default)]
struct RwEntry {
    readers: Vec<Lease>,
    writer: Option<Lease>,
    claim: Option<Claim>,
    waiters: Waiters,
}

impl RwEntry {
    /// Forgets every hold and claim that ended by `now`; true if any did.
    fn drop_expired(&mut self, now: Instant) -> bool {
        let before = self.readers.len();
        self.readers.retain(|r| r.is_live(now));
        let mut dropped = self.readers.len() < before;
        if self.writer.is_some_and(|w| !w.is_live(now)) {
            self.writer = None;
            dropped = true;
        }
        if self.claim.is_some_and(|c| c.ends_at <= now) {
            self.claim = None;
            dropped = true;
        }
        dropped
    }
}

impl CountedEntry for RwEntry {
    fn waiters(&mut self) -> &mut Waiters {
        &mut self.waiters
    }

    fn is_unused(&self) -> bool {
        self.readers.is_empty()
            && self.writer.is_none()
            && self.claim.is_none()
            && self.waiters.waiting == 0
    }

    /// A waiter that leaves withdraws its claim, waking the readers it held back.
    fn waiter_left(&mut self, owner: OwnerToken) {
        if self.claim.is_some_and(|c| c.owner == owner) {
            self.claim = None;
            self.waiters.freed.notify_waiters();
        }
    }
}

/// A read-write lock as [`RwLockTable::inspect`] found it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RwView {
    /// The live read holds, soonest-ending first.
    pub readers: Vec<HoldInfo>,
    /// The live write hold.
    pub writer: Option<HoldInfo>,
    /// The waiting writer's live claim.
    pub claim: Option<WriterClaim>,
    /// Callers waiting on the key, in either mode.
    pub waiting: usize,
}

/// Read-write locks keyed on the exact key.
///
/// * A read hold is granted while no live writer holds the key and no live claim of a waiting
///   writer exists; a write hold while nobody holds the key and no other writer's claim is
///   live. Both checks, and the removal of ended holds, happen under the key's shard lock.
/// * A writer that waits leaves a claim ending `claim` after its last look, and looks again at
///   least twice per claim; a waiter that gives up (or is dropped) withdraws its claim at
///   once, and one that vanished without dropping lets it end.
/// * Releases and withdrawn claims wake the key's waiters at once; a waiter also looks again
///   when the soonest-ending hold or claim in its way ends.
/// * Fencing tokens come from one counter per table, so they increase strictly per key,
///   across readers and writers.
/// * An entry exists only while the key has live holds, a claim, or waiters.
///
/// Time is tokio's clock, so tests can pause and advance it.
#[derive(Default)]
pub struct RwLockTable {
    leases: CountedLeases<RwEntry>,
}

impl std::fmt::Debug for RwLockTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RwLockTable")
            .field("keys", &self.leases.entries().len())
            .finish()
    }
}

impl RwLockTable {
    /// An empty table.
    pub fn new() -> RwLockTable {
        RwLockTable::default()
    }

    /// How many keys have holds, a claim or waiters (ended ones not yet removed count).
    pub fn len(&self) -> usize {
        self.leases.entries().len()
    }

    /// True when no key has holds, claims or waiters.
    pub fn is_empty(&self) -> bool {
        self.leases.entries().is_empty()
    }

    /// The live read holds and whether a live write hold exists, for `key` now.
    pub fn held(&self, key: &str) -> (usize, bool) {
        let now = Instant::now();
        self.leases.entries().get(key).map_or((0, false), |e| {
            (
                e.readers.iter().filter(|r| r.is_live(now)).count(),
                e.writer.is_some_and(|w| w.is_live(now)),
            )
        })
    }

    /// What `key` holds now, leaving out whatever ended: its readers (soonest-ending first),
    /// its writer, its waiting writer's claim, and how many callers wait in either mode. Reads
    /// only.
    pub fn inspect(&self, key: &str) -> RwView {
        let now = Instant::now();
        let Some(entry) = self.leases.entries().get(key) else {
            return RwView::default();
        };
        RwView {
            readers: counted_leases::live_infos(entry.readers.iter(), now),
            writer: entry.writer.filter(|w| w.is_live(now)).map(|w| w.info(now)),
            claim: entry
                .claim
                .filter(|c| c.ends_at > now)
                .map(|c| WriterClaim::new(c.owner, c.ends_at.saturating_duration_since(now))),
            waiting: entry.waiters.waiting,
        }
    }

    /// One attempt, as [`CountedLeases::attempt`] runs it. A refused caller that waits (see
    /// `look`) leaves or re-asserts its claim when it wants to write.
    fn attempt(&self, key: &str, owner: OwnerToken, mode: RwMode, terms: Terms, look: Look) -> Try {
        let now = Instant::now();
        let lease_end = deadline_after(now, terms.lease);
        self.leases.attempt(key, look, |entry, fence| {
            if entry.drop_expired(now) {
                entry.waiters.freed.notify_waiters();
            }
            let granted = match mode {
                RwMode::Read => {
                    if let Some(mine) = entry.readers.iter_mut().find(|r| r.owner == owner) {
                        // A resent acquire by the holder: the same hold, its lease renewed.
                        mine.expires_at = lease_end;
                        Some(mine.token)
                    } else if entry.writer.is_none() && entry.claim.is_none() {
                        let token = fence.mint();
                        entry.readers.push(Lease {
                            owner,
                            expires_at: lease_end,
                            token,
                        });
                        Some(token)
                    } else {
                        None
                    }
                }
                RwMode::Write => match &mut entry.writer {
                    Some(mine) if mine.owner == owner => {
                        mine.expires_at = lease_end;
                        Some(mine.token)
                    }
                    Some(_) => None,
                    None if entry.readers.is_empty()
                        && entry.claim.is_none_or(|c| c.owner == owner) =>
                    {
                        let token = fence.mint();
                        entry.claim = None;
                        entry.writer = Some(Lease {
                            owner,
                            expires_at: lease_end,
                            token,
                        });
                        Some(token)
                    }
                    None => None,
                },
            };
            if let Some(token) = granted {
                return Ok(token);
            }
            if mode == RwMode::Write && look.waits() && entry.claim.is_none_or(|c| c.owner == owner)
            {
                entry.claim = Some(Claim {
                    owner,
                    ends_at: deadline_after(now, terms.claim),
                });
            }
            // Look again when the first thing in the way ends, and, for a writer holding the
            // claim, before its claim ends.
            let mut next = entry
                .readers
                .iter()
                .map(|r| r.expires_at)
                .chain(entry.writer.map(|w| w.expires_at))
                .chain(entry.claim.map(|c| c.ends_at))
                .min()
                .unwrap_or(now);
            if entry.claim.is_some_and(|c| c.owner == owner) {
                next = next.min(deadline_after(now, terms.claim / 2));
            }
            Err(next)
        })
    }

    /// Takes a hold of `key` in `mode` for `owner`, waiting up to `wait` (zero: one attempt,
    /// which leaves no claim). `None` when it could not be granted throughout.
    pub async fn acquire(
        &self,
        key: &str,
        owner: OwnerToken,
        mode: RwMode,
        lease: Duration,
        wait: Duration,
        claim: Duration,
    ) -> Option<RwGrant> {
        let terms = Terms { lease, claim };
        let granted = self
            .leases
            .acquire(key, owner, wait, |look| {
                self.attempt(key, owner, mode, terms, look)
            })
            .await?;
        Some(RwGrant {
            fencing_token: granted.token,
            contended: granted.contended,
            lease_began: Some(granted.lease_began),
        })
    }

    /// Frees `owner`'s hold of `key` in `mode`; the other mode's holds are never touched (a
    /// read release cannot free a write hold). A hold whose lease ran out is removed and
    /// answers `NotHeld`.
    pub fn release(&self, key: &str, owner: OwnerToken, mode: RwMode) -> ReleaseOutcome {
        let now = Instant::now();
        let Entry::Occupied(mut slot) = self.leases.entries().entry(Arc::from(key)) else {
            return ReleaseOutcome::NotHeld;
        };
        let entry = slot.get_mut();
        let mine = match mode {
            RwMode::Read => entry
                .readers
                .iter()
                .position(|r| r.owner == owner)
                .map(|at| entry.readers.swap_remove(at)),
            RwMode::Write => match entry.writer {
                Some(w) if w.owner == owner => entry.writer.take(),
                _ => None,
            },
        };
        let outcome = match mine {
            Some(hold) if hold.is_live(now) => ReleaseOutcome::Released,
            _ => ReleaseOutcome::NotHeld,
        };
        if entry.drop_expired(now) || mine.is_some() {
            entry.waiters.freed.notify_waiters();
        }
        if entry.is_unused() {
            slot.remove();
        }
        outcome
    }

    /// Extends `owner`'s hold of `key` in `mode` to `lease` from now, if it is still live.
    pub fn renew(
        &self,
        key: &str,
        owner: OwnerToken,
        mode: RwMode,
        lease: Duration,
    ) -> RenewOutcome {
        let now = Instant::now();
        let lease_end = deadline_after(now, lease);
        let Some(mut entry) = self.leases.entries().get_mut(key) else {
            return RenewOutcome::Lost(LossCause::Expired);
        };
        let mine = match mode {
            RwMode::Read => entry.readers.iter_mut().find(|r| r.owner == owner),
            RwMode::Write => entry.writer.as_mut().filter(|w| w.owner == owner),
        };
        counted_leases::renew(mine, now, lease_end)
    }
}

/// A request's durations.
#[derive(Debug, Clone, Copy)]
struct Terms {
    lease: Duration,
    claim: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(n: u128) -> OwnerToken {
        OwnerToken::from_u128(n)
    }

    const LEASE: Duration = Duration::from_secs(10);
    const CLAIM: Duration = Duration::from_secs(1);

    async fn take(t: &RwLockTable, who: u128, mode: RwMode, wait: Duration) -> Option<RwGrant> {
        t.acquire("k", owner(who), mode, LEASE, wait, CLAIM).await
    }

    #[tokio::test(start_paused = true)]
    async fn readers_share_and_a_writer_is_alone_with_one_counter() {
        let t = RwLockTable::new();
        let a = take(&t, 1, RwMode::Read, Duration::ZERO).await.unwrap();
        let b = take(&t, 2, RwMode::Read, Duration::ZERO).await.unwrap();
        assert!(b.fencing_token > a.fencing_token);
        assert!(take(&t, 3, RwMode::Write, Duration::ZERO).await.is_none());
        assert_eq!(t.held("k"), (2, false));
        assert_eq!(
            t.release("k", owner(1), RwMode::Read),
            ReleaseOutcome::Released
        );
        assert_eq!(
            t.release("k", owner(2), RwMode::Read),
            ReleaseOutcome::Released
        );
        let w = take(&t, 3, RwMode::Write, Duration::ZERO).await.unwrap();
        assert!(w.fencing_token > b.fencing_token);
        assert!(take(&t, 4, RwMode::Read, Duration::ZERO).await.is_none());
        // A read release by the writer's owner touches only read holds.
        assert_eq!(
            t.release("k", owner(3), RwMode::Read),
            ReleaseOutcome::NotHeld
        );
        assert_eq!(t.held("k"), (0, true));
        assert_eq!(
            t.release("k", owner(3), RwMode::Write),
            ReleaseOutcome::Released
        );
        assert!(t.is_empty(), "nothing left behind");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_writer_keeps_readers_out_and_a_vanished_one_only_for_its_claim() {
        let t = Arc::new(RwLockTable::new());
        take(&t, 1, RwMode::Read, Duration::ZERO).await.unwrap();
        let writer = Box::pin({
            let t = t.clone();
            async move { take(&t, 2, RwMode::Write, LEASE * 10).await }
        });
        // Poll the writer once so it leaves its claim, then make it vanish without dropping
        // (a crashed process never withdraws anything).
        let mut writer = writer;
        let pending = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(writer.as_mut().poll(cx).is_pending())
        })
        .await;
        assert!(pending, "the writer waits behind the reader");
        std::mem::forget(writer);
        assert!(take(&t, 3, RwMode::Read, Duration::ZERO).await.is_none());
        tokio::time::advance(CLAIM).await;
        assert!(take(&t, 3, RwMode::Read, Duration::ZERO).await.is_some());
    }
}
