//! [`CacheStore`]: the shared tier of `#[cached]`, in the provider's cache map.
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use coord_contract::{BackendError, BoxFuture, CacheEntry, CacheStore, CallKey};

use super::MemoryProvider;

/// Expired cache entries are swept once per this many sets, so keys never read again do not
/// accumulate (a read removes an expired entry at once).
const CACHE_SWEEP_EVERY: u64 = 1024;

impl CacheStore for MemoryProvider {
    fn cache_get<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<Option<CacheEntry>, BackendError>> {
        let now = Instant::now();
        let found = match self.cache.get(key) {
            Some(entry) if entry.1 > now => Some(CacheEntry {
                value: entry.0.to_vec(),
                ttl_left: Some(entry.1 - now),
            }),
            Some(entry) => {
                drop(entry);
                self.cache.remove_if(key, |_, (_, expires)| *expires <= now);
                None
            }
            None => None,
        };
        Box::pin(std::future::ready(Ok(found)))
    }

    fn cache_set<'a>(
        &'a self,
        key: &'a CallKey,
        value: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        let now = Instant::now();
        let expires = crate::deadline_after(now, ttl);
        self.cache.insert(key.clone(), (Arc::from(value), expires));
        if self.cache_sets.fetch_add(1, Ordering::Relaxed) + 1 >= CACHE_SWEEP_EVERY {
            self.cache_sets.store(0, Ordering::Relaxed);
            self.cache.retain(|_, (_, expires)| *expires > now);
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn cache_delete<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        let now = Instant::now();
        let removed = self.cache.remove(key);
        Box::pin(std::future::ready(Ok(
            removed.is_some_and(|(_, (_, expires))| expires > now)
        )))
    }
}
