//! Multi-key locks taken in one atomic step: an optional capability
//! ([`Capability::MultiKeyLocks`](crate::Capability::MultiKeyLocks)).
//!
//! A multi-key lock is a set of plain locks (the same locks [`LockProvider`](crate::LockProvider)
//! keeps: the same values, the same per-key fencing counters, the same waiters), held by one
//! owner token and given back together. Every provider can hold one: the runtime takes the
//! keys one by one in a canonical order (sorted by the key's bytes, duplicates removed), so
//! two callers can never deadlock, and releases everything already taken when a later key
//! cannot be had. A provider with this capability can do better for a set of keys that it
//! keeps together (one Redis server or hash slot, one database, one process): take them all in
//! one step, all or nothing, which no other caller can observe half done where the store
//! makes it one atomic operation (a Redis script, a PostgreSQL transaction).
//!
//! Only the acquisition is special: once granted, each key is an ordinary lock of the owner,
//! renewed with [`LockProvider::renew`](crate::LockProvider::renew) and released with
//! [`LockProvider::release`](crate::LockProvider::release), key by key.

use std::sync::Arc;
use std::time::Duration;

use crate::BoxFuture;
use crate::call_key::CallKey;
use crate::error::{BackendError, BackendErrorKind};
use crate::tokens::{FencingToken, OwnerToken};

/// One request to take several locks at once.
#[derive(Debug, Clone)]
pub struct MultiLockRequest<'a> {
    /// The keys, at least one, distinct, in canonical order (ascending by
    /// [`CallKey::qualified`] bytes): the runtime sorts and de-duplicates them before asking.
    pub keys: &'a [CallKey],
    /// The token that will own every one of the locks.
    pub owner: OwnerToken,
    /// How long each lock is held if never released or renewed.
    pub lease: Duration,
    /// How long to keep trying while some key is held by another owner. Zero means one
    /// attempt.
    pub wait: Duration,
}

/// Several locks this process holds, as the provider granted them in one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiLockGrant {
    /// One fencing token per key, in the order of [`MultiLockRequest::keys`]: each minted
    /// from that key's own counter (the one a single fenced lock of the key uses), so it is
    /// greater than every token minted before it for that key by a lock of either kind.
    pub fencing_tokens: Vec<FencingToken>,
    /// True when the first attempt found some key held and the grant came after waiting.
    pub contended: bool,
    /// When the leases began on this process's clock, for a provider that knows it; `None`
    /// lets the runtime time them from when the successful attempt was sent.
    pub lease_began: Option<tokio::time::Instant>,
}

/// The error of a provider without the atomic path, from the defaults of [`MultiLockStore`].
fn unsupported() -> BackendError {
    BackendError::new(
        BackendErrorKind::Config,
        "this provider cannot take several locks in one atomic step",
    )
}

/// Taking several plain locks in one atomic step: an optional capability.
///
/// A provider without it opts out with `impl MultiLockStore for MyProvider {}`: multi-key
/// locks still work on it (the runtime takes the keys one by one in canonical order, with
/// rollback), but [`Capability::MultiKeyLocks`](crate::Capability::MultiKeyLocks) is not
/// claimed, and a coordinator builder that requires it fails.
///
/// # Contract
/// * **All or nothing.** `acquire_all` answers holding every key of `req.keys` or none of
///   them, and never waits while holding some. It grants only when every key is free (or
///   already `req.owner`'s); when some key is held by another owner it keeps none. A lock whose
///   lease ran out (by the store's clock) is free. Where the store can, the step is one atomic
///   operation no other caller can observe half done (Redis: one script; PostgreSQL: one
///   transaction); the in-process provider makes it one synchronous pass over its table,
///   during which a single-key attempt running on another thread can find a key taken that the
///   pass then gives back.
/// * **The same locks.** Each key is taken exactly as
///   [`LockProvider::acquire`](crate::LockProvider::acquire) with `fenced: true` would take
///   it: a single-key lock and a multi-key lock on an overlapping key exclude each other, and
///   each key's token comes from that key's own fencing counter.
/// * **Waiting.** `Ok(None)` when some key stayed held for all of `req.wait` (one attempt when
///   zero). A waiter waits on the first key it could not take: that key's release wakes it
///   (without polling, as for a single lock, with a bounded re-check as a backstop), and it then
///   tries the whole set again.
/// * **Which sets.** [`MultiLockStore::takes_together`] says whether a set of keys can be taken
///   in one step (Redis Cluster, for instance, only within one hash slot); the runtime asks it
///   first and never calls `acquire_all` for a set it refused.
/// * If the future of `acquire_all` is dropped before it completes, the runtime releases every
///   key of the request for `req.owner` with [`LockProvider::release`](crate::LockProvider::release).
pub trait MultiLockStore: Send + Sync + 'static {
    /// Whether this provider takes some sets of keys in one atomic step. `false` by default.
    fn supports_multi_locks(&self) -> bool {
        false
    }

    /// Whether these keys (distinct, in canonical order) can be taken together in one atomic
    /// step. By default, whenever the provider supports multi-key locks at all.
    fn takes_together(&self, keys: &[CallKey]) -> bool {
        let _ = keys;
        self.supports_multi_locks()
    }

    /// Takes every key of `req.keys` for `req.owner` in one atomic step, waiting up to
    /// `req.wait`.
    fn acquire_all<'a>(
        &'a self,
        req: MultiLockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<MultiLockGrant>, BackendError>> {
        let _ = req;
        Box::pin(std::future::ready(Err(unsupported())))
    }
}

/// A shared provider is a provider (see the same impl for [`LockProvider`](crate::LockProvider)).
impl<P: MultiLockStore> MultiLockStore for Arc<P> {
    fn supports_multi_locks(&self) -> bool {
        (**self).supports_multi_locks()
    }

    fn takes_together(&self, keys: &[CallKey]) -> bool {
        (**self).takes_together(keys)
    }

    fn acquire_all<'a>(
        &'a self,
        req: MultiLockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<MultiLockGrant>, BackendError>> {
        (**self).acquire_all(req)
    }
}
