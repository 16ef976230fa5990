//! Read-write locks whose holds are leases, for this process.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use tokio::sync::Notify;
use tokio::time::Instant;

use coord_contract::{
    FencingToken, HoldInfo, LossCause, OwnerToken, ReleaseOutcome, RenewOutcome, RwGrant, RwMode,
    WriterClaim,
};

use crate::deadline_after;

/// One hold: its owner, when its lease ends, and its fencing token.
#[derive(Debug, Clone, Copy)]
struct Held {
    owner: OwnerToken,
    expires_at: Instant,
    token: FencingToken,
}

/// A waiting writer's claim: it keeps new readers out until it ends.
#[derive(Debug, Clone, Copy)]
struct Claim {
    owner: OwnerToken,
    ends_at: Instant,
}

/// The holds of one key, its waiting writer's claim, and what its waiters listen on.
struct RwEntry {
    readers: Vec<Held>,
    writer: Option<Held>,
    claim: Option<Claim>,
    /// Callers waiting on this key; the entry stays while there are any.
    waiting: usize,
    /// Released holds and withdrawn claims are announced here (every waiter looks again).
    freed: Arc<Notify>,
}

impl RwEntry {
    /// Forgets every hold and claim that ended by `now`; true if any did.
    fn drop_expired(&mut self, now: Instant) -> bool {
        let before = self.readers.len();
        self.readers.retain(|r| r.expires_at > now);
        let mut dropped = self.readers.len() < before;
        if self.writer.is_some_and(|w| w.expires_at <= now) {
            self.writer = None;
            dropped = true;
        }
        if self.claim.is_some_and(|c| c.ends_at <= now) {
            self.claim = None;
            dropped = true;
        }
        dropped
    }

    fn is_unused(&self) -> bool {
        self.readers.is_empty()
            && self.writer.is_none()
            && self.claim.is_none()
            && self.waiting == 0
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
    entries: DashMap<Arc<str>, RwEntry>,
    fence: AtomicU64,
}

impl std::fmt::Debug for RwLockTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RwLockTable")
            .field("keys", &self.entries.len())
            .finish()
    }
}

/// What one attempt found.
enum Try {
    Granted(FencingToken),
    /// Not now: look again at this instant at the latest, or when this wakes.
    Blocked(Instant, Arc<Notify>),
}

/// Counts a waiter in its entry while it waits; when it leaves, withdraws its claim (waking
/// the readers it held back) and removes an entry nobody needs any more.
struct Waiting<'a> {
    table: &'a RwLockTable,
    key: &'a str,
    owner: OwnerToken,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Entry::Occupied(mut slot) = self.table.entries.entry(Arc::from(self.key)) {
            let entry = slot.get_mut();
            entry.waiting = entry.waiting.saturating_sub(1);
            if entry.claim.is_some_and(|c| c.owner == self.owner) {
                entry.claim = None;
                entry.freed.notify_waiters();
            }
            if entry.is_unused() {
                slot.remove();
            }
        }
    }
}

impl RwLockTable {
    /// An empty table.
    pub fn new() -> RwLockTable {
        RwLockTable::default()
    }

    /// How many keys have holds, a claim or waiters (ended ones not yet removed count).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no key has holds, claims or waiters.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The live read holds and whether a live write hold exists, for `key` now.
    pub fn held(&self, key: &str) -> (usize, bool) {
        let now = Instant::now();
        self.entries.get(key).map_or((0, false), |e| {
            (
                e.readers.iter().filter(|r| r.expires_at > now).count(),
                e.writer.is_some_and(|w| w.expires_at > now),
            )
        })
    }

    /// What `key` holds now, leaving out whatever ended: its readers (soonest-ending first),
    /// its writer, its waiting writer's claim, and how many callers wait in either mode. Reads
    /// only.
    pub fn inspect(&self, key: &str) -> RwView {
        let now = Instant::now();
        let Some(entry) = self.entries.get(key) else {
            return RwView::default();
        };
        let hold = |h: &Held| {
            HoldInfo::new(
                h.owner,
                h.expires_at.saturating_duration_since(now),
                Some(h.token),
            )
        };
        let mut readers: Vec<&Held> = entry
            .readers
            .iter()
            .filter(|r| r.expires_at > now)
            .collect();
        readers.sort_by_key(|r| r.expires_at);
        RwView {
            readers: readers.into_iter().map(hold).collect(),
            writer: entry
                .writer
                .filter(|w| w.expires_at > now)
                .as_ref()
                .map(hold),
            claim: entry
                .claim
                .filter(|c| c.ends_at > now)
                .map(|c| WriterClaim::new(c.owner, c.ends_at.saturating_duration_since(now))),
            waiting: entry.waiting,
        }
    }

    fn mint(&self) -> FencingToken {
        FencingToken::new(self.fence.fetch_add(1, Ordering::Relaxed).saturating_add(1))
    }

    /// One attempt. `waiter` says whether the caller waits if refused (then a writer leaves
    /// or re-asserts its claim) and whether it is counted among the key's waiters yet.
    fn attempt(
        &self,
        key: &str,
        owner: OwnerToken,
        mode: RwMode,
        terms: Terms,
        waiter: Waiter,
    ) -> Try {
        let now = Instant::now();
        let lease_end = deadline_after(now, terms.lease);
        let mut slot = self
            .entries
            .entry(Arc::from(key))
            .or_insert_with(|| RwEntry {
                readers: Vec::new(),
                writer: None,
                claim: None,
                waiting: 0,
                freed: Arc::new(Notify::new()),
            });
        let entry = slot.value_mut();
        if entry.drop_expired(now) {
            entry.freed.notify_waiters();
        }
        let granted = match mode {
            RwMode::Read => {
                if let Some(mine) = entry.readers.iter_mut().find(|r| r.owner == owner) {
                    // A resent acquire by the holder: the same hold, its lease renewed.
                    mine.expires_at = lease_end;
                    Some(mine.token)
                } else if entry.writer.is_none() && entry.claim.is_none() {
                    let token = self.mint();
                    entry.readers.push(Held {
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
                    let token = self.mint();
                    entry.claim = None;
                    entry.writer = Some(Held {
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
            return Try::Granted(token);
        }
        let waits = waiter != Waiter::No;
        if mode == RwMode::Write && waits && entry.claim.is_none_or(|c| c.owner == owner) {
            entry.claim = Some(Claim {
                owner,
                ends_at: deadline_after(now, terms.claim),
            });
        }
        if waiter == Waiter::First {
            entry.waiting += 1;
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
        let freed = entry.freed.clone();
        let unused = entry.is_unused();
        drop(slot);
        if unused {
            self.entries.remove_if(key, |_, e| e.is_unused());
        }
        Try::Blocked(next, freed)
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
        let started = Instant::now();
        let terms = Terms { lease, claim };
        let first = if wait.is_zero() {
            Waiter::No
        } else {
            Waiter::First
        };
        let (next, freed) = match self.attempt(key, owner, mode, terms, first) {
            Try::Granted(token) => {
                return Some(RwGrant {
                    fencing_token: token,
                    contended: false,
                    lease_began: Some(started),
                });
            }
            Try::Blocked(..) if wait.is_zero() => return None,
            Try::Blocked(next, freed) => (next, freed),
        };
        let _waiting = Waiting {
            table: self,
            key,
            owner,
        };
        let deadline = deadline_after(started, wait);
        let mut next = next;
        loop {
            let notified = freed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Look again now that the wake-up is armed: a release in between is not missed.
            match self.attempt(key, owner, mode, terms, Waiter::Counted) {
                Try::Granted(token) => {
                    return Some(RwGrant {
                        fencing_token: token,
                        contended: true,
                        lease_began: Some(Instant::now()),
                    });
                }
                Try::Blocked(again, _) => next = again.min(next.max(Instant::now())),
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(next.min(deadline)) => {}
            }
            next = deadline;
        }
    }

    /// Frees `owner`'s hold of `key` in `mode`; the other mode's holds are never touched (a
    /// read release cannot free a write hold). A hold whose lease ran out is removed and
    /// answers `NotHeld`.
    pub fn release(&self, key: &str, owner: OwnerToken, mode: RwMode) -> ReleaseOutcome {
        let now = Instant::now();
        let Entry::Occupied(mut slot) = self.entries.entry(Arc::from(key)) else {
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
            Some(hold) if hold.expires_at > now => ReleaseOutcome::Released,
            _ => ReleaseOutcome::NotHeld,
        };
        if entry.drop_expired(now) || mine.is_some() {
            entry.freed.notify_waiters();
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
        let Some(mut entry) = self.entries.get_mut(key) else {
            return RenewOutcome::Lost(LossCause::Expired);
        };
        let mine = match mode {
            RwMode::Read => entry.readers.iter_mut().find(|r| r.owner == owner),
            RwMode::Write => entry.writer.as_mut().filter(|w| w.owner == owner),
        };
        match mine {
            Some(hold) if hold.expires_at > now => {
                hold.expires_at = lease_end;
                RenewOutcome::Renewed
            }
            _ => RenewOutcome::Lost(LossCause::Expired),
        }
    }
}

/// A request's durations.
#[derive(Debug, Clone, Copy)]
struct Terms {
    lease: Duration,
    claim: Duration,
}

/// Whether an attempt's caller waits if refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waiter {
    /// One attempt only: no claim, not counted.
    No,
    /// The first attempt of a waiter: counted from now on.
    First,
    /// A later attempt of a waiter, counted already.
    Counted,
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
