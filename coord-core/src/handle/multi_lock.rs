//! `coord.multi_lock(keys)`: `#[distributed_lock(key_from_each = "..")]` configured at run
//! time.

use std::future::Future;

use crate::error::CoordError;
use crate::provider::CallKey;
use crate::runtime::call::Call;
use crate::runtime::multi_lock::{MultiAcquired, MultiLockGuard, acquire_multi};

use super::lock_options::{LockOptions, none_when_not_acquired};
use crate::runtime::state::Coordinator;

/// A lock of several keys at once, configured at run time: from [`Coordinator::multi_lock`].
///
/// What it promises:
/// * **No deadlock by order.** The keys are de-duplicated and taken in one canonical order
///   (sorted by the key's bytes), whatever order the caller lists them in, so two callers
///   taking `{a, b}` and `{b, a}` never each hold one key while waiting for the other.
/// * **All or nothing.** On a provider with [`Capability::MultiKeyLocks`](crate::provider::Capability::MultiKeyLocks)
///   (in-process; Redis when the keys are on one server or one Cluster hash slot), the keys are
///   taken in one step that keeps all or none, never waiting while holding some (on Redis one
///   script, which no other client can observe half done).
///   Otherwise they are taken one by one in canonical order, and when one cannot be had within
///   the wait (or the backend fails, or the acquiring future is dropped), every key already
///   taken is released: a refused caller holds nothing.
/// * **The same locks.** Each key is an ordinary lock with its own fencing token from that
///   key's own counter: a single-key lock ([`Coordinator::lock`]) and a multi-key lock on an
///   overlapping key exclude each other, and tokens of either kind increase together per key.
/// * Renewal (when asked for) renews every key; the loss of any key is the loss of the whole
///   ([`MultiLockGuard::lost`]; with [`MultiLock::run`], the body is cancelled and answers
///   [`CoordError::LockLost`] naming the key and its cause).
///
/// What it does not: the keys are separate leases, not one, and taken one by one they are not
/// all-or-nothing to an observer (a caller may briefly see the first keys taken by a
/// multi-key lock that then gives them back). Every key is always fenced (the defaults are
/// otherwise the single lock's: lease 30 s, no wait, no renewal).
///
/// ```
/// # async fn demo() -> Result<(), coord_core::CoordError> {
/// use std::time::Duration;
/// let coord = coord_core::Coordinator::builder().memory().build().unwrap();
/// let from = coord.key("accounts").part(&"acc-2").finish();
/// let to = coord.key("accounts").part(&"acc-1").finish();
/// let guard = coord
///     .multi_lock([from.clone(), to.clone()])
///     .wait(Duration::from_secs(5))
///     .acquire()
///     .await?;
/// let (from_token, to_token) = (guard.fencing_token(&from), guard.fencing_token(&to));
/// # let _ = (from_token, to_token);
/// assert!(guard.release().await?);
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a multi-key lock does nothing until `acquire`, `try_acquire` or `run` is awaited"]
pub struct MultiLock<'c> {
    coordinator: &'c Coordinator,
    keys: Vec<CallKey>,
    options: LockOptions,
}

impl Coordinator {
    /// A lock of every key of `keys` at once, configured at run time (see [`MultiLock`]).
    /// An empty list is refused at `acquire` with a `Config` error.
    pub fn multi_lock(&self, keys: impl IntoIterator<Item = CallKey>) -> MultiLock<'_> {
        MultiLock {
            coordinator: self,
            keys: keys.into_iter().collect(),
            options: LockOptions::new(true, 0),
        }
    }
}

impl MultiLock<'_> {
    lock_kind_setters! {
        /// How long each key is held if its holder dies (never released, never renewed).
        /// Default 30 s.
        lease;
        /// How long to wait, in all, for keys held by others. Default zero (one attempt per
        /// key).
        wait;
        /// Renews every key this often while they are held; a renewal that finds a key gone,
        /// or a whole lease without a confirmed renewal of it, marks the guard lost
        /// ([`MultiLockGuard::lost`]; with [`MultiLock::run`], the body is cancelled). Renewal
        /// stops when the keys are released.
        renew;
        replica_acks: "each grant (of every key) and renewal of this lock";
        /// Takes durations and the backend-fault policy from the coordinator's profile `name`,
        /// as [`Lock::profile`](crate::handle::Lock::profile) does.
        profile;
        /// What to do when the backend fails. Default: the coordinator's policy. As for locks,
        /// `acquire` and `try_acquire` always report a fault; [`MultiLock::run`] under
        /// `FailOpen` runs the body without the locks (whatever was taken is released first).
        on_backend_error;
    }

    /// Takes every key, waiting up to `wait` in all: [`CoordError::LockNotAcquired`] if some
    /// key stayed held (nothing is held then), [`CoordError::Reentrant`] if this task already
    /// holds one of the keys inside a `#[distributed_lock]` body, [`CoordError::Backend`] on a
    /// backend fault or an empty list of keys.
    pub async fn acquire(self) -> Result<MultiLockGuard, CoordError> {
        // A guard stands for held locks: a fault is always reported here.
        let spec = self.options.guard_spec(self.coordinator, || {
            self.keys.first().cloned().unwrap_or_else(|| {
                CallKey::builder(self.coordinator.namespace(), "multi_lock").finish()
            })
        })?;
        match acquire_multi(
            self.coordinator,
            self.keys,
            &spec,
            tokio::runtime::Handle::try_current().ok(),
        )
        .await
        {
            MultiAcquired::Granted(guard) => Ok(guard),
            MultiAcquired::Refused(err) => Err(err),
            MultiAcquired::Unguarded => unreachable!("fail_closed never runs unguarded"),
        }
    }

    /// Like [`MultiLock::acquire`], but keys that stayed held are `Ok(None)` rather than an
    /// error.
    pub async fn try_acquire(self) -> Result<Option<MultiLockGuard>, CoordError> {
        none_when_not_acquired(self.acquire().await)
    }

    /// Runs `body` while holding every key, exactly as
    /// `#[distributed_lock(key_from_each = ..)]` does; inside it,
    /// [`fencing_token_of`](crate::fencing_token_of) reads each key's token.
    pub async fn run<T, E, F, Fut>(self, body: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<CoordError>,
    {
        let Some(first) = self.keys.first() else {
            return Err(E::from(CoordError::Backend(
                crate::provider::BackendError::new(
                    crate::provider::BackendErrorKind::Config,
                    "a multi-key lock needs at least one key (the list was empty)",
                ),
            )));
        };
        let op = first.operation().unwrap_or("").to_owned();
        let spec = self.options.op_spec(&op);
        let call = Call::with_key(&spec, self.coordinator, first.clone());
        call.run(crate::runtime::multi_lock::distributed_multi_lock(
            &call,
            self.keys,
            call.body(async move { body().await }),
        ))
        .await
    }
}
