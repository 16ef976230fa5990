//! `coord.lock(key)`: `#[distributed_lock]` configured at run time.

use std::future::Future;

use crate::error::CoordError;
use crate::provider::CallKey;
use crate::runtime::lock::LockGuard;

use super::lock_options::{LockOptions, none_when_not_acquired};
use crate::runtime::state::Coordinator;

/// A lock configured at run time: from [`Coordinator::lock`].
///
/// The same lock as `#[distributed_lock]` (one acquisition path, one guard): a lease on the
/// key, owner-checked release and renewal, optional fencing. The defaults are the attribute's:
/// lease 30 s, no wait, unfenced, no renewal, the coordinator's backend-fault policy.
///
/// ```
/// # async fn demo() -> Result<(), coord_core::CoordError> {
/// use std::time::Duration;
/// let coord = coord_core::Coordinator::builder().memory().build().unwrap();
/// let key = coord.key("jobs.rebuild").part(&42u64).finish();
/// let guard = coord
///     .lock(key)
///     .lease(Duration::from_secs(60))
///     .fenced()
///     .acquire()
///     .await?;
/// let token = guard.fencing_token(); // pass it to the resource you write
/// # let _ = token;
/// assert!(guard.release().await?);
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a lock does nothing until `acquire`, `try_acquire` or `run` is awaited"]
pub struct Lock<'c> {
    coordinator: &'c Coordinator,
    key: CallKey,
    options: LockOptions,
}

impl Coordinator {
    /// A lock of `key`, configured at run time (see [`Lock`]).
    pub fn lock(&self, key: CallKey) -> Lock<'_> {
        Lock {
            coordinator: self,
            key,
            options: LockOptions::new(false, 0),
        }
    }
}

impl Lock<'_> {
    lock_kind_setters! {
        /// How long the lock is held if its holder dies (never released, never renewed).
        /// Default 30 s.
        lease;
        /// How long to wait for a held lock. Default zero (one attempt).
        wait;
        /// Renews the lease this often while the lock is held; a renewal that finds the lock
        /// gone, or a whole lease without a confirmed renewal, marks the hold lost
        /// ([`LockGuard::lost`]; with [`Lock::run`], the body is cancelled).
        renew;
        replica_acks: "each grant and renewal of this lock";
        /// Takes durations and the backend-fault policy from the coordinator's profile `name`:
        /// a field the profile sets beats this handle's setters, which beat the configured
        /// defaults (see [`config`](crate::config)). A profile the coordinator does not have is
        /// [`CoordError::UnknownProfile`] from `acquire`, `try_acquire` and `run`, before the
        /// lock is asked for.
        profile;
        /// What to do when the backend fails. Default: the coordinator's policy. Under
        /// `FailOpen`, [`Lock::acquire`] and [`Lock::try_acquire`] still report the fault (they
        /// cannot hand out a guard for a lock nobody holds); [`Lock::run`] runs the body
        /// unguarded.
        on_backend_error;
    }

    /// Mints a fencing token with the acquisition ([`LockGuard::fencing_token`]).
    pub fn fenced(mut self) -> Self {
        self.options.spec.fenced = true;
        self
    }

    /// Takes the lock, waiting up to `wait`: [`CoordError::LockNotAcquired`] if it stayed held,
    /// [`CoordError::Reentrant`] if this task already holds it inside a `#[distributed_lock]`
    /// body or [`Lock::run`], [`CoordError::Backend`] on a backend fault.
    pub async fn acquire(self) -> Result<LockGuard, CoordError> {
        // A guard stands for a held lock: a fault is always reported here.
        self.options
            .acquire_guard(self.coordinator, &self.key)
            .await
    }

    /// Like [`Lock::acquire`], but a lock that stayed held is `Ok(None)` rather than an error.
    pub async fn try_acquire(self) -> Result<Option<LockGuard>, CoordError> {
        none_when_not_acquired(self.acquire().await)
    }

    /// Runs `body` while holding the lock, exactly as `#[distributed_lock]` does: the lock is
    /// released when the body ends (or is cancelled, or panics); with renewal, a lost hold
    /// cancels the body and answers [`CoordError::LockLost`]; under `FailOpen`, a backend
    /// fault runs the body unguarded. Inside the body, [`fencing_token`](crate::fencing_token),
    /// [`is_held`](crate::is_held) and [`lock_lost`](crate::lock_lost) see this lock.
    pub async fn run<T, E, F, Fut>(self, body: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<CoordError>,
    {
        self.options
            .run_locked(self.coordinator, self.key, body)
            .await
    }
}
