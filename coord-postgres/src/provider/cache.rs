//! The shared tier of `#[cached]`: byte values with an expiry in the server's clock.
//!
//! A write carries the moment it was sent, in the server's clock as this provider estimates
//! it (like a claim's not-after time): a write that executes late keeps only what is left of
//! its ttl, and none at all once that is spent, so an entry never outlives the ttl it was
//! given. The value is opaque to the provider.

use std::time::Duration;

use coord_core::provider::{BoxFuture, CacheEntry, CacheStore};
use coord_core::{BackendError, CallKey};

use super::{PostgresProvider, from_ms, millis};

impl CacheStore for PostgresProvider {
    fn cache_get<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<Option<CacheEntry>, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let rows = inner
                .query(&inner.sql.cache_get, &[&key.qualified()], "cache get", key)
                .await?;
            let Some(row) = rows.first() else {
                return Ok(None);
            };
            let value: Vec<u8> = inner.get(row, 0, "cache get", key)?;
            let left: i64 = inner.get(row, 1, "cache get", key)?;
            Ok(Some(CacheEntry {
                value,
                ttl_left: Some(from_ms(left)),
            }))
        })
    }

    fn cache_set<'a>(
        &'a self,
        key: &'a CallKey,
        value: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let sent = std::time::Instant::now();
            let ttl_ms = millis(ttl);
            let mut remeasured = false;
            loop {
                let sent_ms = inner.clock.now_ms();
                let rows = inner
                    .query(
                        &inner.sql.cache_set,
                        &[&key.qualified(), &value, &ttl_ms, &sent_ms],
                        "cache set",
                        key,
                    )
                    .await?;
                let row = inner.one(&rows, "cache set", key)?;
                let written: i64 = inner.get(row, 0, "cache set", key)?;
                if written == 1 {
                    return Ok(());
                }
                if !remeasured && sent.elapsed() < ttl {
                    // Refused as late although the ttl has not passed here: the estimate of
                    // the server's clock is off. Measure it again and send once more.
                    remeasured = true;
                    tracing::warn!(key = %key, "coord-postgres: a cache write came back refused as late although it was answered in time: the server's clock moved; measuring it again");
                    inner.remeasure_clock().await?;
                    continue;
                }
                // Too late: the answer would be older than its ttl when read. Not an error:
                // the outcome was returned, it is just not kept.
                tracing::debug!(key = %key, "coord-postgres: a cache write executed after its ttl had passed; nothing was written");
                return Ok(());
            }
        })
    }

    fn cache_delete<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let rows = inner
                .query(
                    &inner.sql.cache_delete,
                    &[&key.qualified()],
                    "cache delete",
                    key,
                )
                .await?;
            let row = inner.one(&rows, "cache delete", key)?;
            inner.get(row, 0, "cache delete", key)
        })
    }
}
