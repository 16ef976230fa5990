//! `coord.cached(key)`: `#[cached]` configured at run time.

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::provider::{BackendError, CallKey};
use crate::runtime::cache_tiers::{CacheScope, CacheSpec, LocalSlot, invalidate_local};
use crate::runtime::call::Call;
use crate::runtime::spec::KeyPrefixCache;
use crate::runtime::spec::OpSpec;
use crate::runtime::state::Coordinator;
use crate::telemetry::OpTelemetry;

/// A cached call configured at run time: from [`Coordinator::cached`].
///
/// The same cache layer as `#[cached]`: a live entry for the key answers without running the
/// body; otherwise the body runs and an `Ok` outcome is kept for `ttl`. `Err` is never cached
/// here. The defaults: `ttl` 60 s, [`CacheScope::Local`], 10 000 local entries, `local_ttl`
/// a tenth of `ttl` (for [`CacheScope::TwoTier`]).
///
/// The local tier is shared by every handle and every `#[cached]` function with the same
/// operation name and output type in this process; the first one to run sets its
/// `max_capacity`. Since the scope is picked at run time, `run` asks the `Ok` type for serde
/// in every scope.
///
/// ```
/// # async fn demo() -> Result<(), coord_core::CoordError> {
/// use std::time::Duration;
/// let coord = coord_core::Coordinator::builder().memory().build().unwrap();
/// let key = || coord.key("prices.quote").part("EURUSD").finish();
/// let price: Result<u64, coord_core::CoordError> = coord
///     .cached(key())
///     .ttl(Duration::from_secs(5))
///     .run(|| async { Ok(108) })
///     .await;
/// assert_eq!(price?, 108);
/// coord.invalidate(&key()).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a cached call does nothing until `run` is awaited"]
pub struct Cached<'c> {
    coordinator: &'c Coordinator,
    key: CallKey,
    ttl: Duration,
    scope: CacheScope,
    local_ttl: Option<Duration>,
    max_capacity: u64,
}

impl Coordinator {
    /// A cached call of `key`, configured at run time (see [`Cached`]).
    pub fn cached(&self, key: CallKey) -> Cached<'_> {
        Cached {
            coordinator: self,
            key,
            ttl: Duration::from_secs(60),
            scope: CacheScope::Local,
            local_ttl: None,
            max_capacity: 10_000,
        }
    }
}

impl Cached<'_> {
    /// How long an entry is served. Default 60 s.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Where entries are kept. Default [`CacheScope::Local`].
    pub fn scope(mut self, scope: CacheScope) -> Self {
        self.scope = scope;
        self
    }

    /// How long [`CacheScope::TwoTier`] keeps an entry locally (capped at `ttl`). Default a
    /// tenth of `ttl`.
    pub fn local_ttl(mut self, local_ttl: Duration) -> Self {
        self.local_ttl = Some(local_ttl);
        self
    }

    /// How many entries the local tier holds, if this handle is the first to make it. Default
    /// 10 000.
    pub fn max_capacity(mut self, entries: u64) -> Self {
        self.max_capacity = entries;
        self
    }

    /// Answers from the cache, or runs `body` and caches its `Ok`.
    pub async fn run<T, E, F, Fut>(self, body: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Clone + Send + Sync + 'static + Serialize + DeserializeOwned,
        E: Clone + Send + Sync + 'static,
    {
        let op = self.key.operation().unwrap_or("").to_owned();
        let spec = OpSpec {
            name: &op,
            idempotency: None,
            cache: Some(CacheSpec {
                ttl: self.ttl,
                scope: self.scope,
                local_ttl: self.local_ttl.unwrap_or(self.ttl / 10),
                max_capacity: self.max_capacity,
                cache_err: false,
                local: LocalSlot::new(),
            }),
            lock: None,
            telemetry: OpTelemetry::new(),
            key_prefix: KeyPrefixCache::new(),
            record_key: false,
            profile: None,
        };
        let call = Call::with_key(&spec, self.coordinator, self.key);
        call.run(crate::runtime::cache::cached(
            &call,
            crate::runtime::cache_tiers::shared_form(),
            call.body(async move { body().await }),
        ))
        .await
    }
}

impl Coordinator {
    /// Removes the cached answer of one call: the entries of this process's local tiers (every
    /// `#[cached]` operation or `Coordinator::cached` handle with `key`'s operation name),
    /// and the shared entry in the provider. Returns whether an entry was found anywhere.
    ///
    /// `key` is the key the attribute uses: `coord.key(op).part(..).finish()` with the
    /// attribute's `name` and its `key_from` parameters in order. Local tiers of other
    /// processes are not reached: with `scope = "two_tier"` they keep serving their copy for
    /// at most `local_ttl`.
    ///
    /// Fails only when deleting the shared entry fails (the local entries are gone by then).
    pub async fn invalidate(&self, key: &CallKey) -> Result<bool, BackendError> {
        let local = invalidate_local(key);
        let shared = self.cache_store().cache_delete(key).await?;
        Ok(local || shared)
    }
}
