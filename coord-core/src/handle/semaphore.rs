//! `coord.semaphore(key, permits)`: `#[distributed_lock(permits = n)]` configured at run
//! time.

use std::future::Future;
use std::time::Duration;

use crate::error::CoordError;
use crate::provider::{BackendError, BackendErrorKind, CallKey, FencingToken, LossCause};
use crate::runtime::lock::LockGuard;

use super::lock_options::{LockOptions, none_when_not_acquired};
use crate::runtime::state::Coordinator;

/// A counting semaphore configured at run time: from [`Coordinator::semaphore`].
///
/// At most `permits` holders of the key at once. Each holder holds one permit: a lease with
/// its own owner, an expiry on the backend's clock and its own fencing token, strictly greater
/// than every token minted before it for the key. Released permits wake a waiter without
/// polling; a crashed holder's permit comes back when its lease ends, not later. Renewal,
/// loss and release work as for [`Lock`](crate::handle::Lock); every acquisition takes exactly
/// one permit.
///
/// What it promises: the limit is exact on one store (the in-process provider within one
/// process, one Redis server or cluster). What it does not: a semaphore spread over several
/// independent stores (one per region, a majority of servers) is not a semaphore, since each
/// store would count its own holders; and, as for every lease, a holder that stalls past its
/// lease can still be running while its permit is someone else's: pass
/// [`PermitGuard::fencing_token`] to the resource it protects. Callers of one key should agree
/// on `permits`: the limit is the caller's, so a caller asking for fewer permits than are held
/// finds the semaphore full.
///
/// A provider without semaphores ([`Coordinator::supports`]) answers
/// [`CoordError::Unsupported`] before anything runs.
///
/// ```
/// # async fn demo() -> Result<(), coord_core::CoordError> {
/// use std::time::Duration;
/// let coord = coord_core::Coordinator::builder().memory().build().unwrap();
/// let key = coord.key("exports").part(&"tenant-7").finish();
/// let permit = coord
///     .semaphore(key, 5)
///     .lease(Duration::from_secs(60))
///     .wait(Duration::from_secs(10))
///     .acquire()
///     .await?;
/// let token = permit.fencing_token(); // this permit's own token
/// # let _ = token;
/// assert!(permit.release().await?);
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a semaphore does nothing until `acquire`, `try_acquire` or `run` is awaited"]
pub struct Semaphore<'c> {
    coordinator: &'c Coordinator,
    key: CallKey,
    options: LockOptions,
}

impl Coordinator {
    /// A semaphore of `permits` permits on `key`, configured at run time (see [`Semaphore`]).
    /// `permits` must be at least 1: zero is refused at `acquire` with a `Config` error.
    pub fn semaphore(&self, key: CallKey, permits: u32) -> Semaphore<'_> {
        Semaphore {
            coordinator: self,
            key,
            options: LockOptions::new(true, permits),
        }
    }
}

impl Semaphore<'_> {
    lock_kind_setters! {
        /// How long a permit is held if its holder dies (never released, never renewed).
        /// Default 30 s.
        lease;
        /// How long to wait while every permit is held. Default zero (one attempt).
        wait;
        /// Renews the permit this often while it is held; a renewal that finds it gone, or a
        /// whole lease without a confirmed renewal, marks it lost ([`PermitGuard::lost`]; with
        /// [`Semaphore::run`], the body is cancelled). Renewal stops when the permit is
        /// released.
        renew;
        replica_acks: "each grant and renewal of this permit";
        /// Takes durations and the backend-fault policy from the coordinator's profile `name`,
        /// as [`Lock::profile`](crate::handle::Lock::profile) does.
        profile;
        /// What to do when the backend fails. Default: the coordinator's policy. As for locks,
        /// `acquire` and `try_acquire` always report a fault; [`Semaphore::run`] under
        /// `FailOpen` runs the body without a permit.
        on_backend_error;
    }

    /// Zero permits is refused before anything runs.
    fn checked(&self) -> Result<(), CoordError> {
        if self.options.spec.permits == 0 {
            return Err(CoordError::Backend(
                BackendError::new(
                    BackendErrorKind::Config,
                    "a semaphore needs at least one permit (`permits` was 0)",
                )
                .with_key(&self.key),
            ));
        }
        Ok(())
    }

    /// Takes a permit, waiting up to `wait`: [`CoordError::LockNotAcquired`] if every permit
    /// stayed held, [`CoordError::Reentrant`] if this task already holds a permit of this
    /// semaphore inside a `#[distributed_lock(permits = ..)]` body or [`Semaphore::run`],
    /// [`CoordError::Unsupported`] on a provider without semaphores, [`CoordError::Backend`]
    /// on a backend fault.
    pub async fn acquire(self) -> Result<PermitGuard, CoordError> {
        self.checked()?;
        self.options
            .acquire_guard(self.coordinator, &self.key)
            .await
            .map(PermitGuard)
    }

    /// Like [`Semaphore::acquire`], but a full semaphore is `Ok(None)` rather than an error.
    pub async fn try_acquire(self) -> Result<Option<PermitGuard>, CoordError> {
        none_when_not_acquired(self.acquire().await)
    }

    /// Runs `body` while holding a permit, exactly as `#[distributed_lock(permits = n)]` does;
    /// inside it, [`fencing_token`](crate::fencing_token) is this permit's token.
    pub async fn run<T, E, F, Fut>(self, body: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<CoordError>,
    {
        if let Err(err) = self.checked() {
            return Err(E::from(err));
        }
        self.options
            .run_locked(self.coordinator, self.key, body)
            .await
    }
}

/// A held permit of a semaphore: from [`Semaphore::acquire`].
///
/// The same guard as [`LockGuard`] (renewal, loss with its cause, release on drop or
/// explicitly), for one permit: dropping it releases the permit in the background
/// (owner-checked), and renewal stops before the release is sent, so no renewal outlives it.
#[must_use = "dropping the guard releases the permit"]
#[derive(Debug)]
pub struct PermitGuard(LockGuard);

impl PermitGuard {
    /// The semaphore's key.
    pub fn key(&self) -> &CallKey {
        self.0.key()
    }

    /// This permit's fencing token, while the permit is not known lost and its lease has not
    /// run out on the local clock; `None` otherwise.
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.0.fencing_token()
    }

    /// True while the permit is not known lost and its lease has not run out locally.
    pub fn is_held(&self) -> bool {
        self.0.is_held()
    }

    /// Resolves, with its cause, once the permit is lost (see [`LockGuard::lost`]).
    pub async fn lost(&self) -> LossCause {
        self.0.lost().await
    }

    /// How long the permit has been held.
    pub fn held_for(&self) -> Duration {
        self.0.held_for()
    }

    /// Releases the permit. `Ok(true)`: it was ours and is free now; `Ok(false)`: it was not
    /// ours any more (its lease had lapsed: someone else may have taken its place, so the
    /// limit did not hold for this holder throughout). A permit that expired before the
    /// release arrives frees no other holder's permit.
    pub async fn release(self) -> Result<bool, CoordError> {
        self.0.release().await
    }
}
