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
use crate::provider::background::spawn_retried;
use crate::provider::{
    BackendErrorKind, IdempotencyStore, LockProvider, OwnerToken, RwLockStore, RwMode,
    SemaphoreStore,
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
    /// An in-flight marker: freed by `abandon_detached` (or, see
    /// [`LeaseGuard::ending_lease_once`], ended by `end_marker_lease`).
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
    /// When set: once this flag is (the work the marker guards has started, and may have had
    /// effects), the guard no longer clears the marker but ends its lease, so that it is kept
    /// as the abandoned record at once.
    end_lease_once: Option<&'a AtomicBool>,
    /// The guard covers a grant whose answer is not read yet (see [`LeaseGuard::unanswered`]):
    /// its clean-up keeps trying until a release removes the hold.
    unanswered: bool,
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
            end_lease_once: None,
            unanswered: false,
        }
    }

    /// The guard covers a lock, permit or read-write hold whose acquire's answer has not been
    /// read: dropped armed, the hold may have been granted, or may be granted after the
    /// release is sent (a commit still waiting for a synchronous standby, a command queued in
    /// a paused server), so a release that finds nothing proves nothing. The clean-up is the
    /// provider's `release_unanswered_*detached`, which keeps trying until a release removes
    /// the hold or `bound` has passed ([`unanswered_grant_bound`]). Not for markers: an
    /// unanswered claim has its own guard in the idempotency layer.
    pub(crate) fn unanswered(mut self) -> LeaseGuard<'a> {
        self.unanswered = true;
        self
    }

    /// Frees the lease only until `started` is set, and from then on ends it instead
    /// ([`IdempotencyStore::end_marker_lease`]): for an in-flight marker under
    /// `on_abandoned = "fail"`, which must not be cleared for a duplicate to run again once
    /// its body began (the body may have had effects), but which no work can have used before.
    /// Ended, the marker is the abandoned record at once, so duplicates learn that the outcome
    /// is unknown instead of finding the key in flight until the lease ends. Only for
    /// [`LeaseStore::Marker`]: other leases are freed as before.
    pub(crate) fn ending_lease_once(mut self, started: &'a AtomicBool) -> LeaseGuard<'a> {
        self.end_lease_once = Some(started);
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
        if !self.armed {
            return;
        }
        let left = self.hold.map_or(self.bound, Hold::lease_left);
        let key = self.key.clone();
        let started = self
            .end_lease_once
            .is_some_and(|started| started.load(Ordering::Acquire));
        match self.store {
            LeaseStore::Marker(store) if started => {
                end_lease_detached(store, key, self.owner, left)
            }
            LeaseStore::Lock(provider) if self.unanswered => provider
                .clone()
                .release_unanswered_detached(key, self.owner, left),
            LeaseStore::Permit(store) if self.unanswered => store
                .clone()
                .release_unanswered_permit_detached(key, self.owner, left),
            LeaseStore::Rw(store, mode) if self.unanswered => store
                .clone()
                .release_unanswered_rw_detached(key, self.owner, mode, left),
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

/// How long the clean-up of a grant whose answer was not read keeps trying, from when the
/// caller gave up on the answer: two leases. Every attempt was sent before that moment; a
/// grant that executes then or up to a lease later (a commit held back by a synchronous
/// standby, a command queued in a paused server) is removed, and one that executes later
/// still lapses with its own lease. Not the lease plus the wait: the wait's attempts are all
/// behind the caller, and a wait without end would keep a clean-up running without end.
pub(crate) fn unanswered_grant_bound(lease: Duration) -> Duration {
    lease.saturating_mul(2)
}

/// Ends `owner`'s marker's lease at `key` in the background (owner-checked, so sending it again
/// is harmless), retried with backoff, each try a new command, until the store answers or the
/// lease it ends is over anyway (`lease_left`). Any answer settles it: `false` means the marker
/// is no longer `owner`'s to end (completed, or lapsed and gone). A store that cannot end a
/// lease (the contract's default over a store without renewal) answers with a configuration
/// error, which no retry changes: the marker then lapses at the end of its lease.
pub(crate) fn end_lease_detached(
    store: &Arc<dyn IdempotencyStore>,
    key: CallKey,
    owner: OwnerToken,
    lease_left: Duration,
) {
    let store = Arc::clone(store);
    spawn_retried(
        "ending an abandoned marker's lease",
        key,
        lease_left,
        move |key| {
            let store = store.clone();
            async move {
                match store.end_marker_lease(&key, owner).await {
                    Ok(_) => Ok(true),
                    Err(err) if err.kind() == BackendErrorKind::Config => {
                        tracing::debug!(key = %key, error = %err, "coord: the store cannot end a marker's lease; it lapses at the end of its lease");
                        Ok(true)
                    }
                    Err(err) => Err(err),
                }
            }
        },
    );
}
