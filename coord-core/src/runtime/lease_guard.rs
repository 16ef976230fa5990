//! The drop guard of a call's lease: a lock, or an idempotency in-flight marker, that this call
//! may hold is freed, owner-checked, if the call stops before settling it. Both the lock and
//! the idempotency layer use it. (The other guards of the runtime each guard something else:
//! `ClaimGuard` a cluster flight's claim, the process flight's leader and follower guards its
//! waiters, `DetachOnDrop` work that must finish past a drop, `LockGuard` a lock the caller
//! holds through the handle API.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::provider::CallKey;
use crate::provider::{
    IdempotencyStore, LockProvider, OwnerToken, RwLockStore, RwMode, SemaphoreStore,
};
use crate::runtime::renewal::Hold;

/// Where the lease lives, and so how it is freed.
pub(crate) enum LeaseStore<'a> {
    /// A lock: freed by `release_detached`.
    Lock(&'a Arc<dyn LockProvider>),
    /// A semaphore permit: freed by `release_permit_detached`.
    Permit(&'a Arc<dyn SemaphoreStore>),
    /// A read-write lock's hold of this mode: freed by `release_rw_detached`.
    Rw(&'a Arc<dyn RwLockStore>, RwMode),
    /// An in-flight marker: freed by `abandon_detached`.
    Marker(&'a Arc<dyn IdempotencyStore>),
}

/// Frees a lease if the call stops before settling it: when an acquire or claim is cancelled
/// (its write may already have landed), when the caller drops the future mid-body, or when
/// the body panics. Disarmed once the call settles the lease itself.
///
/// The clean-up is handed to the provider's detached path (retried in the background, on a
/// fresh command each time, until it answers or the lease is over): dropping never blocks.
pub(crate) struct LeaseGuard<'a> {
    store: LeaseStore<'a>,
    key: &'a CallKey,
    owner: OwnerToken,
    /// How long a clean-up can matter when no hold is known yet: an upper bound (a lease after
    /// the last attempt), so no clock is read on the path that never drops armed.
    bound: Duration,
    /// Once the lease is held: its local end, which bounds the clean-up more tightly.
    hold: Option<&'a Hold>,
    armed: bool,
    /// When set: the guard stands down once this flag is (the work it guards has started, and
    /// what is left of it is no longer this guard's to clear).
    stand_down: Option<&'a AtomicBool>,
}

impl<'a> LeaseGuard<'a> {
    /// An armed guard for `owner`'s lease on `key`; the clean-up is tried for at most `bound`.
    pub(crate) fn new(
        store: LeaseStore<'a>,
        key: &'a CallKey,
        owner: OwnerToken,
        bound: Duration,
    ) -> LeaseGuard<'a> {
        LeaseGuard {
            store,
            key,
            owner,
            bound,
            hold: None,
            armed: true,
            stand_down: None,
        }
    }

    /// Frees the lease only until `started` is set: for a lease whose holder must keep it once
    /// its work began (an in-flight marker under `on_abandoned = "fail"`), but that no work
    /// can have used before.
    pub(crate) fn until_set(mut self, started: &'a AtomicBool) -> LeaseGuard<'a> {
        self.stand_down = Some(started);
        self
    }

    /// Bounds the clean-up by `hold`'s remaining lease from now on.
    pub(crate) fn held_as(mut self, hold: &'a Hold) -> LeaseGuard<'a> {
        self.hold = Some(hold);
        self
    }

    /// The call settles the lease itself from here on.
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for LeaseGuard<'_> {
    fn drop(&mut self) {
        if !self.armed
            || self
                .stand_down
                .is_some_and(|started| started.load(Ordering::Acquire))
        {
            return;
        }
        let left = self.hold.map_or(self.bound, Hold::lease_left);
        let key = self.key.clone();
        match self.store {
            LeaseStore::Lock(provider) => provider.clone().release_detached(key, self.owner, left),
            LeaseStore::Permit(store) => {
                store.clone().release_permit_detached(key, self.owner, left)
            }
            LeaseStore::Rw(store, mode) => store
                .clone()
                .release_rw_detached(key, self.owner, mode, left),
            LeaseStore::Marker(store) => store.clone().abandon_detached(key, self.owner, left),
        }
    }
}
