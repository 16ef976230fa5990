//! `coord.rw_lock(key)`: `#[distributed_lock(mode = "read" | "write")]` configured at run time.

use std::future::Future;
use std::time::Duration;

use crate::error::CoordError;
use crate::provider::{CallKey, FencingToken, LossCause, RwMode};
use crate::runtime::lock::LockGuard;

use super::lock_options::{LockOptions, none_when_not_acquired};
use crate::runtime::state::Coordinator;

/// A read-write lock configured at run time: from [`Coordinator::rw_lock`].
///
/// Many readers or one writer of the key at once. Every hold, read or write, is a lease with
/// its own owner, an expiry on the backend's clock and its own fencing token; the tokens of
/// one key come from one counter shared by both modes, so a resource that remembers the
/// highest token it has seen refuses a stale writer (one whose lease ran out while a later
/// reader or writer got in). Renewal, loss and release work as for
/// [`Lock`](crate::handle::Lock).
///
/// What it promises, on one store (the in-process provider within one process, one Redis
/// server or cluster):
/// * **exclusion**: a writer holds the key alone; readers share it with readers only;
/// * **writer preference**: a writer that waits stops new readers from getting in (readers
///   already in keep their holds), so a steady stream of readers cannot starve it. Its claim
///   has a short expiry of its own (a third of the lease, 50 ms to 5 s), so a waiting writer
///   that crashed holds readers back for at most that long;
/// * **no upgrade**: a task that holds the key for reading and asks to write gets
///   [`CoordError::LockUpgrade`] at once (waiting would wait for itself); any other second
///   hold of the same key by the same task is [`CoordError::Reentrant`].
///
/// What it does not promise: an order among waiting readers or among waiting writers;
/// exclusion across several independent stores; and, as for every lease, a holder that
/// stalls past its lease can still be running while someone else holds the key: pass
/// [`RwLockGuard::fencing_token`] to the resource it protects.
///
/// A provider without read-write locks ([`Coordinator::supports`]) answers
/// [`CoordError::Unsupported`] before anything runs.
///
/// ```
/// # async fn demo() -> Result<(), coord_core::CoordError> {
/// use std::time::Duration;
/// let coord = coord_core::Coordinator::builder().memory().build().unwrap();
/// let key = coord.key("price-book").part(&"eu").finish();
/// let rw = coord.rw_lock(key).lease(Duration::from_secs(30));
/// let a = rw.clone().read().await?;
/// let b = rw.clone().read().await?; // readers share the key
/// assert!(rw.clone().try_write().await?.is_none()); // the writer is kept out
/// assert!(b.fencing_token() > a.fencing_token());
/// a.release().await?;
/// b.release().await?;
/// let w = rw.write().await?;
/// # let _ = w;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a read-write lock does nothing until `read`, `write` or a `run_*` is awaited"]
pub struct RwLock<'c> {
    coordinator: &'c Coordinator,
    key: CallKey,
    options: LockOptions,
}

impl Coordinator {
    /// The read-write lock of `key`, configured at run time (see [`RwLock`]). A read-write
    /// lock is apart from the lock and the semaphore of the same key.
    pub fn rw_lock(&self, key: CallKey) -> RwLock<'_> {
        RwLock {
            coordinator: self,
            key,
            options: LockOptions::new(true, 0),
        }
    }
}

impl RwLock<'_> {
    lock_kind_setters! {
        /// How long a hold lasts if its holder dies (never released, never renewed).
        /// Default 30 s.
        lease;
        /// How long to wait while the hold cannot be granted. Default zero (one attempt; a
        /// writer's single attempt leaves no claim, so it never holds readers back).
        wait;
        /// Renews the hold this often while it is held; a renewal that finds it gone, or a
        /// whole lease without a confirmed renewal, marks it lost ([`RwLockGuard::lost`]; with
        /// the `run_*` methods, the body is cancelled). Renewal stops before the hold is
        /// released.
        renew;
        replica_acks: "each grant and renewal of this hold";
        /// Takes durations and the backend-fault policy from the coordinator's profile `name`,
        /// as [`Lock::profile`](crate::handle::Lock::profile) does.
        profile;
        /// What to do when the backend fails. Default: the coordinator's policy. `read`,
        /// `write` and their `try_` forms always report a fault; the `run_*` methods under
        /// `FailOpen` run the body without a hold.
        on_backend_error;
    }

    async fn acquire(mut self, mode: RwMode) -> Result<RwLockGuard, CoordError> {
        self.options.spec.rw = Some(mode);
        let guard = self
            .options
            .acquire_guard(self.coordinator, &self.key)
            .await?;
        Ok(RwLockGuard { guard, mode })
    }

    /// Takes a read hold, waiting up to `wait` while a writer holds the key or waits for it:
    /// [`CoordError::LockNotAcquired`] if it could not be granted in time,
    /// [`CoordError::Reentrant`] if this task already holds this read-write lock inside a
    /// `#[distributed_lock(mode = ..)]` body or a `run_*` body, [`CoordError::Unsupported`] on
    /// a provider without read-write locks, [`CoordError::Backend`] on a backend fault.
    pub async fn read(self) -> Result<RwLockGuard, CoordError> {
        self.acquire(RwMode::Read).await
    }

    /// Takes the write hold, waiting up to `wait` while anyone holds the key (and keeping new
    /// readers out meanwhile): the errors of [`RwLock::read`], and
    /// [`CoordError::LockUpgrade`] if this task holds the key for reading.
    pub async fn write(self) -> Result<RwLockGuard, CoordError> {
        self.acquire(RwMode::Write).await
    }

    /// Like [`RwLock::read`], but a hold that could not be granted is `Ok(None)`.
    pub async fn try_read(self) -> Result<Option<RwLockGuard>, CoordError> {
        none_when_not_acquired(self.read().await)
    }

    /// Like [`RwLock::write`], but a hold that could not be granted is `Ok(None)`.
    pub async fn try_write(self) -> Result<Option<RwLockGuard>, CoordError> {
        none_when_not_acquired(self.write().await)
    }

    /// Runs `body` holding the key for reading, exactly as
    /// `#[distributed_lock(mode = "read")]` does; inside it,
    /// [`fencing_token`](crate::fencing_token) is this hold's token.
    pub async fn run_read<T, E, F, Fut>(self, body: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<CoordError>,
    {
        self.run(RwMode::Read, body).await
    }

    /// Runs `body` holding the key for writing, exactly as
    /// `#[distributed_lock(mode = "write")]` does.
    pub async fn run_write<T, E, F, Fut>(self, body: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<CoordError>,
    {
        self.run(RwMode::Write, body).await
    }

    async fn run<T, E, F, Fut>(mut self, mode: RwMode, body: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<CoordError>,
    {
        self.options.spec.rw = Some(mode);
        self.options
            .run_locked(self.coordinator, self.key, body)
            .await
    }
}

/// A held read or write hold of a read-write lock: from [`RwLock::read`] or [`RwLock::write`].
///
/// The same guard as [`LockGuard`] (renewal, loss with its cause, release on drop or
/// explicitly), for one hold: dropping it releases the hold in the background (owner- and
/// mode-checked: a read release never frees a write hold), and renewal stops before the
/// release is sent, so no renewal outlives it.
#[must_use = "dropping the guard releases the hold"]
#[derive(Debug)]
pub struct RwLockGuard {
    guard: LockGuard,
    mode: RwMode,
}

impl RwLockGuard {
    /// The read-write lock's key.
    pub fn key(&self) -> &CallKey {
        self.guard.key()
    }

    /// Whether this is a read or the write hold.
    pub fn mode(&self) -> RwMode {
        self.mode
    }

    /// This hold's fencing token (from the key's one counter, shared by readers and writers),
    /// while the hold is not known lost and its lease has not run out on the local clock;
    /// `None` otherwise.
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.guard.fencing_token()
    }

    /// True while the hold is not known lost and its lease has not run out locally.
    pub fn is_held(&self) -> bool {
        self.guard.is_held()
    }

    /// Resolves, with its cause, once the hold is lost (see [`LockGuard::lost`]).
    pub async fn lost(&self) -> LossCause {
        self.guard.lost().await
    }

    /// How long the hold has been held.
    pub fn held_for(&self) -> Duration {
        self.guard.held_for()
    }

    /// Releases the hold. `Ok(true)`: it was ours and is free now; `Ok(false)`: it was not
    /// ours any more (its lease had lapsed: a writer may have got in meanwhile). A hold that
    /// expired before the release arrives frees nobody else's hold.
    pub async fn release(self) -> Result<bool, CoordError> {
        self.guard.release().await
    }
}
