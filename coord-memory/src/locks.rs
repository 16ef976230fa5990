//! Lease locks with FIFO hand-off.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use tokio::sync::oneshot;
use tokio::time::Instant;

use coord_contract::{
    FORCED_RELEASE_MEMORY, FencingToken, ForcedRelease, LockGrant, LossCause, OwnerToken,
    ReleaseOutcome, RenewOutcome,
};

use crate::deadline_after;

/// The grant of a lease that began at `now` (the table's clock, tokio's `Instant`): the engine
/// always knows when, so `lease_began` is always given.
fn granted(fencing_token: Option<FencingToken>, contended: bool, now: Instant) -> LockGrant {
    LockGrant {
        fencing_token,
        contended,
        lease_began: Some(now),
    }
}

struct Queued {
    id: u64,
    owner: OwnerToken,
    lease: Duration,
    fenced: bool,
    handoff: oneshot::Sender<LockGrant>,
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
    fence: AtomicU64,
    waiter_ids: AtomicU64,
}

/// The owner whose live hold an operator forced free, and until when that is remembered.
struct ForcedMarker {
    owner: OwnerToken,
    until: Instant,
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

/// Removes a waiter from its queue if its `acquire` future is dropped, and passes on a lock
/// that was handed to it in the meantime.
struct WaiterGuard<'a> {
    table: &'a LockTable,
    key: &'a str,
    id: u64,
    owner: OwnerToken,
    handoff: Option<oneshot::Receiver<LockGrant>>,
}

impl WaiterGuard<'_> {
    /// Leaves the queue now (idempotent).
    fn leave(&mut self) {
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

impl LockTable {
    /// An empty table.
    pub fn new() -> LockTable {
        LockTable {
            entries: DashMap::with_hasher(ahash::RandomState::new()),
            forced: DashMap::new(),
            fence: AtomicU64::new(0),
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
        // Saturating: the counter cannot reach `u64::MAX` in practice (centuries of mints),
        // but this runs under a shard lock, where even an unreachable panic is not allowed.
        fenced.then(|| {
            FencingToken::new(self.fence.fetch_add(1, Ordering::Relaxed).saturating_add(1))
        })
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
        self.attempt_keyed(key, || Arc::from(key), owner, lease, wait, fenced, now)
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
        self.attempt_keyed(key, || key.clone(), owner, lease, wait, fenced, now)
    }

    // The attempt's terms, each named at every call site.
    #[allow(clippy::too_many_arguments)]
    fn attempt_keyed<'a>(
        &'a self,
        key: &'a str,
        owned: impl FnOnce() -> Arc<str>,
        owner: OwnerToken,
        lease: Duration,
        wait: Duration,
        fenced: bool,
        now: Instant,
    ) -> Attempt<'a> {
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
    guard: WaiterGuard<'a>,
    holder_expires: Instant,
    deadline: Instant,
    lease: Duration,
    fenced: bool,
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

    /// Frees `key` whoever holds it, as its holder's release would: the longest-waiting caller
    /// gets the lock, and with no one waiting the entry goes. Answers
    /// [`ForcedRelease::Released`] with the owner whose live lease was ended, or
    /// [`ForcedRelease::NotHeld`] when nobody held the key (a lapsed entry is cleaned up all the
    /// same); never [`ForcedRelease::RemovedCorrupt`], as nothing but this table writes its
    /// entries. An operator's tool: the holder is not told, and finds out at its next renewal
    /// or its release, which answer [`LossCause::ForceReleased`] /
    /// [`ReleaseOutcome::ForceReleased`] for the rest of the released lease plus
    /// [`FORCED_RELEASE_MEMORY`] (the table keeps a marker naming the released owner that
    /// long). The fencing counter is left alone.
    pub fn force_release(&self, key: &str) -> ForcedRelease {
        match self.free(key, None, Instant::now()) {
            Some(Freed {
                owner,
                expires_at,
                live: true,
            }) => {
                self.remember_forced(key, owner, expires_at);
                ForcedRelease::Released { owner }
            }
            _ => ForcedRelease::NotHeld,
        }
    }

    /// Remembers that `owner`'s hold of `key`, whose lease would have ended at `expires_at`,
    /// was forced free; forgets every marker whose time is up (forced releases are rare, so
    /// this sweep is what keeps the markers bounded).
    fn remember_forced(&self, key: &str, owner: OwnerToken, expires_at: Instant) {
        let now = Instant::now();
        self.forced.retain(|_, marker| marker.until > now);
        let until = deadline_after(expires_at, FORCED_RELEASE_MEMORY);
        self.forced
            .insert(Arc::from(key), ForcedMarker { owner, until });
    }

    /// True when an operator forced `owner`'s hold of `key` free and that is still
    /// remembered. A marker whose time is up is removed on the way.
    fn was_forced(&self, key: &str, owner: OwnerToken) -> bool {
        if self.forced.is_empty() {
            return false;
        }
        let now = Instant::now();
        let found = self
            .forced
            .get(key)
            .map(|marker| (marker.owner == owner, marker.until > now));
        match found {
            Some((ours, true)) => ours,
            Some((_, false)) => {
                self.forced.remove_if(key, |_, marker| marker.until <= now);
                false
            }
            None => false,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The owner numbered `n`: tests name owners by small numbers.
    fn owner(n: u128) -> OwnerToken {
        OwnerToken::from_u128(n)
    }

    const LEASE: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn held_lock_refuses_a_single_attempt() {
        let table = LockTable::new();
        assert!(
            table
                .acquire("k", owner(1), LEASE, Duration::ZERO, false)
                .await
                .is_some()
        );
        assert!(
            table
                .acquire("k", owner(2), LEASE, Duration::ZERO, false)
                .await
                .is_none()
        );
        assert_eq!(table.release("k", owner(1)), ReleaseOutcome::Released);
        assert!(
            table
                .acquire("k", owner(2), LEASE, Duration::ZERO, false)
                .await
                .is_some()
        );
    }

    #[tokio::test]
    async fn release_is_owner_scoped_and_idempotent() {
        let table = LockTable::new();
        table
            .acquire("k", owner(1), LEASE, Duration::ZERO, false)
            .await
            .unwrap();
        assert_eq!(table.release("k", owner(2)), ReleaseOutcome::NotHeld);
        assert_eq!(table.release("k", owner(1)), ReleaseOutcome::Released);
        assert_eq!(table.release("k", owner(1)), ReleaseOutcome::NotHeld);
        assert!(table.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn expired_holder_loses_the_lock() {
        let table = LockTable::new();
        table
            .acquire("k", owner(1), Duration::from_secs(1), Duration::ZERO, false)
            .await
            .unwrap();
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert!(
            table
                .acquire("k", owner(2), LEASE, Duration::ZERO, false)
                .await
                .is_some()
        );
        assert_eq!(
            table.release("k", owner(1)),
            ReleaseOutcome::NotHeld,
            "the lapsed holder must not free the new one"
        );
        assert_eq!(
            table.renew("k", owner(1), LEASE),
            RenewOutcome::Lost(LossCause::TakenByOther)
        );
        assert_eq!(table.release("k", owner(2)), ReleaseOutcome::Released);
        assert_eq!(
            table.renew("k", owner(2), LEASE),
            RenewOutcome::Lost(LossCause::Expired)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn waiter_takes_over_when_holder_lease_ends() {
        let table = LockTable::new();
        table
            .acquire("k", owner(1), Duration::from_secs(2), Duration::ZERO, false)
            .await
            .unwrap();
        let started = Instant::now();
        let grant = table
            .acquire("k", owner(2), LEASE, Duration::from_secs(10), false)
            .await
            .unwrap();
        assert!(grant.contended);
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        assert_eq!(
            grant.lease_began,
            Some(started + Duration::from_secs(2)),
            "the engine reports when the lease began: when the holder's ended"
        );
    }

    #[tokio::test]
    async fn release_hands_off_to_the_first_waiter_only() {
        let table = Arc::new(LockTable::new());
        table
            .acquire("k", owner(1), LEASE, Duration::ZERO, false)
            .await
            .unwrap();
        let first = tokio::spawn({
            let t = table.clone();
            async move {
                t.acquire("k", owner(2), LEASE, Duration::from_secs(30), false)
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let second = tokio::spawn({
            let t = table.clone();
            async move {
                t.acquire("k", owner(3), LEASE, Duration::from_millis(300), false)
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        table.release("k", owner(1));
        assert!(first.await.unwrap().is_some());
        assert!(
            second.await.unwrap().is_none(),
            "one release wakes one waiter"
        );
        assert_eq!(table.release("k", owner(2)), ReleaseOutcome::Released);
        assert!(table.is_empty());
    }

    #[tokio::test]
    async fn cancelled_waiter_passes_a_handed_lock_on() {
        let table = Arc::new(LockTable::new());
        table
            .acquire("k", owner(1), LEASE, Duration::ZERO, false)
            .await
            .unwrap();
        let cancelled = tokio::spawn({
            let t = table.clone();
            async move {
                t.acquire("k", owner(2), LEASE, Duration::from_secs(30), false)
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let patient = tokio::spawn({
            let t = table.clone();
            async move {
                t.acquire("k", owner(3), LEASE, Duration::from_secs(30), false)
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        cancelled.abort();
        let _ = cancelled.await;
        table.release("k", owner(1));
        assert!(patient.await.unwrap().is_some());
        assert_eq!(table.release("k", owner(3)), ReleaseOutcome::Released);
        assert!(table.is_empty());
    }

    #[tokio::test]
    async fn fencing_tokens_increase_and_exist_only_when_fenced() {
        let table = LockTable::new();
        let a = table
            .acquire("k", owner(1), LEASE, Duration::ZERO, true)
            .await
            .unwrap();
        table.release("k", owner(1));
        let b = table
            .acquire("k", owner(2), LEASE, Duration::ZERO, true)
            .await
            .unwrap();
        table.release("k", owner(2));
        let c = table
            .acquire("k", owner(3), LEASE, Duration::ZERO, false)
            .await
            .unwrap();
        assert!(a.fencing_token.unwrap() < b.fencing_token.unwrap());
        assert_eq!(c.fencing_token, None);
    }
    #[tokio::test]
    async fn renew_tells_a_taken_lock_from_a_free_one() {
        let table = LockTable::new();
        assert_eq!(
            table.renew("k", owner(1), LEASE),
            RenewOutcome::Lost(LossCause::Expired),
            "never held"
        );
        table
            .acquire("k", owner(1), LEASE, Duration::ZERO, false)
            .await
            .unwrap();
        assert_eq!(
            table.renew("k", owner(2), LEASE),
            RenewOutcome::Lost(LossCause::TakenByOther)
        );
        assert_eq!(
            table.renew("k", owner(1), Duration::MAX),
            RenewOutcome::Renewed
        );
        assert_eq!(table.release("k", owner(1)), ReleaseOutcome::Released);
        assert_eq!(
            table.renew("k", owner(1), LEASE),
            RenewOutcome::Lost(LossCause::Expired),
            "released"
        );
    }

    #[tokio::test]
    async fn zero_and_huge_leases_neither_panic_nor_misbehave() {
        let table = LockTable::new();
        let zero = table
            .acquire("k", owner(1), Duration::ZERO, Duration::ZERO, true)
            .await;
        assert!(zero.is_some());
        assert!(
            table
                .acquire("k", owner(2), Duration::MAX, Duration::ZERO, true)
                .await
                .is_some(),
            "a zero lease leaves the lock free at once"
        );
        assert_eq!(
            table.renew("k", owner(1), LEASE),
            RenewOutcome::Lost(LossCause::TakenByOther)
        );
        assert!(
            table
                .acquire("k", owner(3), LEASE, Duration::from_micros(1), false)
                .await
                .is_none(),
            "a Duration::MAX lease holds"
        );
        assert_eq!(
            table.renew("k", owner(2), Duration::from_millis(u64::MAX)),
            RenewOutcome::Renewed
        );
        assert_eq!(table.release("k", owner(2)), ReleaseOutcome::Released);
        assert!(table.is_empty());
    }

    #[tokio::test]
    async fn a_forever_wait_waits_is_granted_and_leaves_no_deadlock_when_cancelled() {
        let table = Arc::new(LockTable::new());
        table
            .acquire("k", owner(1), LEASE, Duration::ZERO, false)
            .await
            .unwrap();
        // Cancelled: the queued waiter's clean-up must not lock up the key's shard.
        let cancelled = tokio::time::timeout(
            Duration::from_millis(200),
            table.acquire("k", owner(2), LEASE, Duration::MAX, false),
        )
        .await;
        assert!(
            cancelled.is_err(),
            "a Duration::MAX wait does not return early"
        );
        let patient = tokio::spawn({
            let t = table.clone();
            async move { t.acquire("k", owner(3), LEASE, Duration::MAX, true).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!patient.is_finished());
        assert_eq!(table.release("k", owner(1)), ReleaseOutcome::Released);
        let grant = tokio::time::timeout(Duration::from_secs(10), patient)
            .await
            .expect("the release hands the lock to the forever waiter")
            .unwrap()
            .expect("granted, not refused");
        assert!(grant.contended && grant.fencing_token.is_some());
        assert_eq!(table.release("k", owner(3)), ReleaseOutcome::Released);
        assert!(table.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_forever_waiter_takes_over_when_the_holder_lease_ends() {
        let table = LockTable::new();
        table
            .acquire("k", owner(1), Duration::from_secs(2), Duration::ZERO, false)
            .await
            .unwrap();
        let started = Instant::now();
        let grant = table
            .acquire("k", owner(2), Duration::MAX, Duration::MAX, false)
            .await;
        assert!(grant.is_some());
        assert_eq!(started.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn inspect_reports_the_holder_its_lease_waiters_and_fencing_token() {
        let table = Arc::new(LockTable::new());
        assert_eq!(table.inspect("k"), None, "never held");
        let grant = table
            .acquire("k", owner(1), Duration::from_secs(10), Duration::ZERO, true)
            .await
            .unwrap();
        tokio::time::advance(Duration::from_secs(4)).await;
        let waiter = tokio::spawn({
            let t = table.clone();
            async move { t.acquire("k", owner(2), LEASE, LEASE, false).await }
        });
        tokio::task::yield_now().await;
        let seen = table.inspect("k").expect("held");
        assert_eq!(seen.owner, owner(1));
        assert_eq!(seen.lease_left, Duration::from_secs(6));
        assert_eq!(seen.waiters, 1);
        assert_eq!(seen.fencing_token, grant.fencing_token);
        assert_eq!(table.held_keys(), vec![Arc::<str>::from("k")]);
        assert_eq!(table.release("k", owner(1)), ReleaseOutcome::Released);
        waiter.await.unwrap().expect("handed over");
        let seen = table.inspect("k").expect("held by the waiter");
        assert_eq!((seen.owner, seen.waiters), (owner(2), 0));
        assert_eq!(
            seen.fencing_token, grant.fencing_token,
            "an unfenced grant keeps the newest token minted for the key"
        );
        tokio::time::advance(LEASE).await;
        assert_eq!(table.inspect("k"), None, "a lapsed lease is free");
        assert!(table.held_keys().is_empty());
    }

    #[tokio::test]
    async fn force_release_frees_any_holder_and_hands_over_to_a_waiter() {
        let table = Arc::new(LockTable::new());
        assert_eq!(
            table.force_release("k"),
            ForcedRelease::NotHeld,
            "nothing held"
        );
        table
            .acquire("k", owner(1), LEASE, Duration::ZERO, false)
            .await
            .unwrap();
        let waiter = tokio::spawn({
            let t = table.clone();
            async move { t.acquire("k", owner(2), LEASE, LEASE, false).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            table.force_release("k"),
            ForcedRelease::Released { owner: owner(1) }
        );
        assert!(waiter.await.unwrap().is_some(), "the waiter got the lock");
        assert_eq!(
            table.renew("k", owner(1), LEASE),
            RenewOutcome::Lost(LossCause::ForceReleased),
            "the old holder's renewal is told why, though the waiter holds the key now"
        );
        assert_eq!(
            table.release("k", owner(1)),
            ReleaseOutcome::ForceReleased,
            "the old holder no longer holds it, and is told why"
        );
        assert_eq!(
            table.renew("k", owner(3), LEASE),
            RenewOutcome::Lost(LossCause::TakenByOther),
            "an owner that was never forced out is not told so"
        );
        assert_eq!(
            table.force_release("k"),
            ForcedRelease::Released { owner: owner(2) }
        );
        assert!(table.is_empty(), "no waiter: the entry goes");
        assert_eq!(
            table.renew("k", owner(2), LEASE),
            RenewOutcome::Lost(LossCause::ForceReleased)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_forced_release_is_remembered_for_the_lease_plus_a_minute_then_forgotten() {
        let table = LockTable::new();
        table
            .acquire("k", owner(1), LEASE, Duration::ZERO, false)
            .await
            .unwrap();
        assert_eq!(
            table.force_release("k"),
            ForcedRelease::Released { owner: owner(1) }
        );
        tokio::time::advance(LEASE + FORCED_RELEASE_MEMORY - Duration::from_millis(1)).await;
        assert_eq!(table.release("k", owner(1)), ReleaseOutcome::ForceReleased);
        assert_eq!(
            table.release("k", owner(1)),
            ReleaseOutcome::ForceReleased,
            "a resent release gets the same answer"
        );
        tokio::time::advance(Duration::from_millis(2)).await;
        assert_eq!(
            table.release("k", owner(1)),
            ReleaseOutcome::NotHeld,
            "past its time the marker is forgotten: the release cannot tell why"
        );
        assert!(table.forced.is_empty(), "and removed");
        // A lapsed lease forced "free" leaves no marker: nobody held it.
        table
            .acquire("j", owner(2), LEASE, Duration::ZERO, false)
            .await
            .unwrap();
        tokio::time::advance(LEASE).await;
        assert_eq!(table.force_release("j"), ForcedRelease::NotHeld);
        assert_eq!(table.release("j", owner(2)), ReleaseOutcome::NotHeld);
        assert!(table.forced.is_empty());
    }
}
