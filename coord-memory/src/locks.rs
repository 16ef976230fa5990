//! Lease locks with FIFO hand-off: the lock table, its acquisition, release and renewal.
//!
//! The table's other parts are files of their own: `locks/waiters.rs` (the queue of callers
//! waiting for a held lock and the hand-off to them) and `locks/forced.rs` (holds an operator
//! forced free, remembered for their former holders). Fencing tokens come from the table's
//! [`Fence`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use tokio::sync::oneshot;
use tokio::time::Instant;

use coord_contract::{
    FencingToken, LockGrant, LossCause, OwnerToken, ReleaseOutcome, RenewOutcome,
};

use crate::deadline_after;
use crate::fence::Fence;

mod forced;
#[cfg(test)]
mod tests;
mod waiters;

use forced::ForcedMarker;
pub use waiters::{Attempt, Waiter};
use waiters::{Queued, WaiterGuard};

/// The grant of a lease that began at `now` (the table's clock, tokio's `Instant`): the engine
/// always knows when, so `lease_began` is always given.
fn granted(fencing_token: Option<FencingToken>, contended: bool, now: Instant) -> LockGrant {
    LockGrant {
        fencing_token,
        contended,
        lease_began: Some(now),
    }
}

struct LockEntry {
    owner: OwnerToken,
    expires_at: Instant,
    waiters: VecDeque<Queued>,
    /// The newest fencing token minted for this entry (a later unfenced grant keeps it), for
    /// [`LockTable::inspect`].
    fence: Option<FencingToken>,
}

impl LockEntry {
    fn new(owner: OwnerToken, expires_at: Instant, fence: Option<FencingToken>) -> LockEntry {
        LockEntry {
            owner,
            expires_at,
            waiters: VecDeque::new(),
            fence,
        }
    }

    /// Gives the lock to `owner` until `expires_at`, minted `token` when fenced.
    fn grant(&mut self, owner: OwnerToken, expires_at: Instant, token: Option<FencingToken>) {
        self.owner = owner;
        self.expires_at = expires_at;
        if token.is_some() {
            self.fence = token;
        }
    }
}

/// Lease locks keyed on the exact key.
///
/// * A lock whose lease ran out is free: the next caller takes it.
/// * `release` hands the lock straight to the longest-waiting caller (one wake-up per
///   release, no thundering herd); waiters also wake when the holder's lease ends.
/// * An entry exists only while the key is held or waited for: after every holder released,
///   no per-key state remains.
/// * Fencing tokens come from one counter per table, so they increase strictly per key (and
///   across keys).
///
/// Time is tokio's clock, so tests can pause and advance it.
///
/// Any lease or wait is accepted: zero, sub-millisecond, [`Duration::MAX`] (deadlines
/// saturate, see [`deadline_after`]). A zero lease grants a lock that is already free for the
/// next caller; a wait of `Duration::MAX` waits until the lock is granted or the future is
/// dropped. Deadlines are computed while no map shard is locked, and nothing that can panic
/// runs while one is.
pub struct LockTable {
    /// Hashed with aHash, which resists flooding with colliding keys (key parts come from
    /// callers) at a fraction of SipHash's cost: every acquire and release hashes the key once.
    entries: DashMap<Arc<str>, LockEntry, ahash::RandomState>,
    /// Holds an operator forced free, remembered so that the former holder's release and
    /// renewal can say so (see [`LockTable::force_release`]). Empty unless an operator forced
    /// a lock free recently; nothing on the path of an ordinary acquire or release reads it.
    forced: DashMap<Arc<str>, ForcedMarker>,
    fence: Fence,
    waiter_ids: AtomicU64,
}

/// What freeing an entry took away.
struct Freed {
    owner: OwnerToken,
    /// When its lease would have ended.
    expires_at: Instant,
    /// Whether the lease had time left.
    live: bool,
}

impl Freed {
    fn of(lock: &LockEntry, now: Instant) -> Freed {
        Freed {
            owner: lock.owner,
            expires_at: lock.expires_at,
            live: lock.expires_at > now,
        }
    }
}

impl Default for LockTable {
    fn default() -> Self {
        LockTable::new()
    }
}

impl std::fmt::Debug for LockTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockTable")
            .field("keys", &self.entries.len())
            .finish()
    }
}

impl LockTable {
    /// An empty table.
    pub fn new() -> LockTable {
        LockTable {
            entries: DashMap::with_hasher(ahash::RandomState::new()),
            forced: DashMap::new(),
            fence: Fence::default(),
            waiter_ids: AtomicU64::new(0),
        }
    }

    /// How many keys are held or waited for.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no key is held or waited for.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn mint(&self, fenced: bool) -> Option<FencingToken> {
        fenced.then(|| self.fence.mint())
    }

    /// Takes `key` for `owner` for `lease`, waiting up to `wait` (zero: one attempt).
    /// Returns `None` when the key stayed held by others throughout.
    pub async fn acquire(
        &self,
        key: &str,
        owner: OwnerToken,
        lease: Duration,
        wait: Duration,
        fenced: bool,
    ) -> Option<LockGrant> {
        match self.attempt(key, owner, lease, wait, fenced) {
            Attempt::Granted(grant) => Some(grant),
            Attempt::Held => None,
            Attempt::Queued(waiter) => waiter.wait().await,
        }
    }

    /// One immediate attempt, without awaiting: grants a free (or lapsed) lock at once; for a
    /// held one, queues the caller when `wait` is non-zero. The returned [`Waiter`] then waits
    /// for the hand-off, and leaves the queue if dropped.
    pub fn attempt<'a>(
        &'a self,
        key: &'a str,
        owner: OwnerToken,
        lease: Duration,
        wait: Duration,
        fenced: bool,
    ) -> Attempt<'a> {
        let now = Instant::now();
        self.attempt_keyed(
            key,
            || Arc::from(key),
            AttemptTerms {
                owner,
                lease,
                wait,
                fenced,
                now,
            },
        )
    }

    /// [`LockTable::attempt`] with the key already in a shared allocation, which a new entry
    /// then shares instead of copying.
    pub fn attempt_shared<'a>(
        &'a self,
        key: &'a Arc<str>,
        owner: OwnerToken,
        lease: Duration,
        wait: Duration,
        fenced: bool,
    ) -> Attempt<'a> {
        self.attempt_shared_at(key, owner, lease, wait, fenced, Instant::now())
    }

    /// [`LockTable::attempt_shared`] made at `now`, a reading of tokio's clock the caller took
    /// just before (no await in between): the lease runs from `now`, a lease ending at or
    /// before `now` is over, and a queued caller's wait ends `wait` after `now`. For a caller
    /// that reads the clock before the attempt anyway (the runtime times the lease from
    /// there): the table then reads no clock of its own. A reading from earlier than the
    /// attempt only shortens the lease granted.
    pub fn attempt_shared_at<'a>(
        &'a self,
        key: &'a Arc<str>,
        owner: OwnerToken,
        lease: Duration,
        wait: Duration,
        fenced: bool,
        now: Instant,
    ) -> Attempt<'a> {
        self.attempt_keyed(
            key,
            || key.clone(),
            AttemptTerms {
                owner,
                lease,
                wait,
                fenced,
                now,
            },
        )
    }

    /// The attempt of [`LockTable::attempt`] and [`LockTable::attempt_shared_at`]; `owned`
    /// makes the key a new entry keeps.
    fn attempt_keyed<'a>(
        &'a self,
        key: &'a str,
        owned: impl FnOnce() -> Arc<str>,
        terms: AttemptTerms,
    ) -> Attempt<'a> {
        let AttemptTerms {
            owner,
            lease,
            wait,
            fenced,
            now,
        } = terms;
        // Deadlines are computed outside the shard lock (`deadline_after` saturates and cannot
        // panic, but nothing beyond the table's own bookkeeping runs under the lock): the
        // lease's end before it, the wait's end after it, and only for a caller that queues.
        let lease_end = deadline_after(now, lease);
        let entry_key = owned();
        let (id, handoff, holder_expires) = match self.entries.entry(entry_key) {
            Entry::Vacant(slot) => {
                let fencing_token = self.mint(fenced);
                slot.insert(LockEntry::new(owner, lease_end, fencing_token));
                return Attempt::Granted(granted(fencing_token, false, now));
            }
            Entry::Occupied(mut slot) => {
                let lock = slot.get_mut();
                if lock.expires_at <= now {
                    let fencing_token = self.mint(fenced);
                    lock.grant(owner, lease_end, fencing_token);
                    return Attempt::Granted(granted(fencing_token, false, now));
                }
                if wait.is_zero() {
                    return Attempt::Held;
                }
                let (tx, rx) = oneshot::channel();
                let id = self.waiter_ids.fetch_add(1, Ordering::Relaxed);
                lock.waiters.push_back(Queued {
                    id,
                    owner,
                    lease,
                    fenced,
                    handoff: tx,
                });
                (id, rx, lock.expires_at)
            }
        };
        // The shard is unlocked again before the guard exists, so the guard's clean-up can
        // never run while this thread holds the shard.
        let deadline = deadline_after(now, wait);
        Attempt::Queued(Waiter {
            guard: WaiterGuard {
                table: self,
                key,
                id,
                owner,
                handoff: Some(handoff),
            },
            holder_expires,
            deadline,
            lease,
            fenced,
        })
    }
}

/// What one attempt asks for: the lock for `owner` for `lease`, waiting up to `wait`, fenced
/// or not, made at `now` (a reading of tokio's clock).
#[derive(Clone, Copy)]
struct AttemptTerms {
    owner: OwnerToken,
    lease: Duration,
    wait: Duration,
    fenced: bool,
    now: Instant,
}

/// A held lock as [`LockTable::inspect`] found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockView {
    /// The holder.
    pub owner: OwnerToken,
    /// Time left on its lease.
    pub lease_left: Duration,
    /// Callers queued for the lock.
    pub waiters: usize,
    /// The newest fencing token minted for the key since it was last free (the holder's own
    /// when its acquisition was fenced), if any.
    pub fencing_token: Option<FencingToken>,
}

impl LockTable {
    /// Frees `key` if `owner` holds it, handing it to the longest-waiting caller.
    ///
    /// [`ReleaseOutcome::Released`] when `owner` held it with time left;
    /// [`ReleaseOutcome::ForceReleased`] when an operator forced `owner`'s hold free (and that
    /// is still remembered, see [`LockTable::force_release`]); [`ReleaseOutcome::NotHeld`]
    /// when it was not `owner`'s, or its lease had already lapsed (in which case the stale
    /// entry is cleaned up all the same). Idempotent.
    pub fn release(&self, key: &str, owner: OwnerToken) -> ReleaseOutcome {
        self.release_at(key, owner, Instant::now())
    }

    /// [`LockTable::release`] made at `now`, a reading of tokio's clock the caller took just
    /// before (no await in between): the lease counts as live when it ends after `now`, and a
    /// waiter handed the lock has its lease timed from `now`. A reading from earlier than the
    /// release only shortens the lease handed on; ownership is checked on the table as it is.
    pub fn release_at(&self, key: &str, owner: OwnerToken, now: Instant) -> ReleaseOutcome {
        match self.free(key, Some(owner), now) {
            Some(Freed { live: true, .. }) => ReleaseOutcome::Released,
            _ if self.was_forced(key, owner) => ReleaseOutcome::ForceReleased,
            _ => ReleaseOutcome::NotHeld,
        }
    }

    /// Frees `key` when `owner` holds it (any owner when `None`), handing it to the first
    /// waiter still waiting. Returns the owner it was taken from, when its lease would have
    /// ended and whether it had time left; `None` when there was no entry, or it was another
    /// owner's.
    fn free(&self, key: &str, owner: Option<OwnerToken>, now: Instant) -> Option<Freed> {
        let ours = |lock: &LockEntry| owner.is_none_or(|owner| lock.owner == owner);
        loop {
            // The common case, nobody waiting: remove in one step, without allocating a key.
            if let Some((_, lock)) = self
                .entries
                .remove_if(key, |_, lock| ours(lock) && lock.waiters.is_empty())
            {
                return Some(Freed::of(&lock, now));
            }
            let mut lock = self.entries.get_mut(key)?;
            if !ours(&lock) {
                return None;
            }
            let was = Freed::of(&lock, now);
            while let Some(waiter) = lock.waiters.pop_front() {
                let fencing_token = self.mint(waiter.fenced);
                let grant = granted(fencing_token, true, now);
                if waiter.handoff.send(grant).is_ok() {
                    // Saturating, so it cannot panic under the shard lock.
                    lock.grant(
                        waiter.owner,
                        deadline_after(now, waiter.lease),
                        fencing_token,
                    );
                    return Some(was);
                }
                // That waiter stopped waiting; try the next.
            }
            // Every queued waiter had left: go round to remove the entry (or to hand off to
            // someone who queued in between). With no owner given, the holder named in the
            // answer is the one found on this last round.
        }
    }

    /// The lock at `key` while it is held (its lease has time left), or `None` when it is free.
    /// Reads only.
    pub fn inspect(&self, key: &str) -> Option<LockView> {
        let now = Instant::now();
        let lock = self.entries.get(key)?;
        (lock.expires_at > now).then(|| LockView {
            owner: lock.owner,
            lease_left: lock.expires_at.saturating_duration_since(now),
            waiters: lock.waiters.len(),
            fencing_token: lock.fence,
        })
    }

    /// The keys of every lock held right now (lease with time left), in no particular order. A
    /// snapshot: locks taken or released while it is taken may or may not be in it.
    pub fn held_keys(&self) -> Vec<Arc<str>> {
        let now = Instant::now();
        self.entries
            .iter()
            .filter(|entry| entry.expires_at > now)
            .map(|entry| entry.key().clone())
            .collect()
    }

    /// Extends `owner`'s lease on `key` to `lease` from now.
    ///
    /// [`RenewOutcome::Renewed`] when `owner` holds it; lost to [`LossCause::ForceReleased`]
    /// when an operator forced `owner`'s hold free (while that is remembered, see
    /// [`LockTable::force_release`]), whoever holds the key now; else to
    /// [`LossCause::TakenByOther`] when another owner holds the key now (its lease has time
    /// left), to [`LossCause::Expired`] when nobody does: `owner` released it, its lease lapsed
    /// (even if a lapsed entry of someone else is still in the table), or the key was never
    /// held. A lapsed lease is never revived, even for its own owner: a waiter may be about to
    /// take it.
    pub fn renew(&self, key: &str, owner: OwnerToken, lease: Duration) -> RenewOutcome {
        let now = Instant::now();
        let lease_end = deadline_after(now, lease);
        let cause = match self.entries.get_mut(key) {
            Some(mut lock) if lock.expires_at > now => {
                if lock.owner == owner {
                    lock.expires_at = lease_end;
                    return RenewOutcome::Renewed;
                }
                LossCause::TakenByOther
            }
            _ => LossCause::Expired,
        };
        // The entry's guard is gone: the markers are never read under a lock of the table.
        if self.was_forced(key, owner) {
            return RenewOutcome::Lost(LossCause::ForceReleased);
        }
        RenewOutcome::Lost(cause)
    }
}
