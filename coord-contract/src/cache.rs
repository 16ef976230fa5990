//! The shared tier of `#[cached]`: byte values with a time to live.

use std::sync::Arc;
use std::time::Duration;

use crate::BoxFuture;
use crate::call_key::CallKey;
use crate::error::{BackendError, BackendErrorKind};

/// An entry read from a [`CacheStore`]: the bytes `cache_set` stored, and how long the entry
/// has left, when the store can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEntry {
    /// The bytes as stored.
    pub value: Vec<u8>,
    /// The entry's remaining time to live by the store's clock; `None` when the store does not
    /// report it (the runtime then keeps a copy in a local tier for at most its own local TTL).
    pub ttl_left: Option<Duration>,
}

/// The shared tier of `#[cached(scope = "shared" | "two_tier")]`: byte values with a time to
/// live, seen by every process sharing the provider.
///
/// # Contract
/// * `cache_set` stores `value` at `key`, replacing whatever was there, for `ttl` measured by
///   the store's clock (for Redis, the server's). `cache_get` never returns an entry whose
///   `ttl` has passed.
/// * `cache_delete` removes the entry and says whether one was there.
/// * The cache is separate from locks and idempotency records: the same `key` in both never
///   collide.
///
/// Every method has a default that reports the cache as not supported (a
/// [`BackendErrorKind::Config`] error; `cache_delete`
/// answers `Ok(false)`, as a store that keeps no cache has nothing to delete). The runtime
/// treats a failed read as a miss and a failed write as a lost write, so a provider without a
/// cache still runs every call, only without the shared tier.
pub trait CacheStore: Send + Sync + 'static {
    /// The entry at `key`, unless there is none or it expired.
    fn cache_get<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<Option<CacheEntry>, BackendError>> {
        let _ = key;
        Box::pin(std::future::ready(Err(not_supported())))
    }

    /// Stores `value` at `key` for `ttl`.
    fn cache_set<'a>(
        &'a self,
        key: &'a CallKey,
        value: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        let _ = (key, value, ttl);
        Box::pin(std::future::ready(Err(not_supported())))
    }

    /// Removes the entry at `key`; `true` if there was one.
    fn cache_delete<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        let _ = key;
        Box::pin(std::future::ready(Ok(false)))
    }
}

fn not_supported() -> BackendError {
    BackendError::new(
        BackendErrorKind::Config,
        "this provider does not implement CacheStore (no shared cache)",
    )
}

impl<P: CacheStore> CacheStore for Arc<P> {
    fn cache_get<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<Option<CacheEntry>, BackendError>> {
        (**self).cache_get(key)
    }

    fn cache_set<'a>(
        &'a self,
        key: &'a CallKey,
        value: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        (**self).cache_set(key, value, ttl)
    }

    fn cache_delete<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        (**self).cache_delete(key)
    }
}
