//! The shared tier of `#[cached]`: plain string values with a server-side TTL.
//!
//! An entry is one Redis string at `ns:cache:{op:parts}`, written with `SET .. PX` (the
//! server owns the expiry, so no client clock is compared) and read with `GET` and `PTTL` in
//! one round trip. The value is the outcome as the coordinator's codec encoded it; coord-redis
//! never looks inside it, and the runtime treats bytes it cannot decode as a miss.

use std::time::Duration;

use coord_core::provider::{BoxFuture, CacheEntry, CacheStore};
use coord_core::{BackendError, CallKey};

use super::RedisProvider;
use super::commands::millis;
use crate::encode::Decimal;
use crate::keys::Names;
use crate::transport::{Command, Reply};

impl CacheStore for RedisProvider {
    fn cache_get<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<Option<CacheEntry>, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let name = Names::of(key).cache();
            let replies = inner
                .run(
                    &[
                        Command::new("GET").key(&name),
                        Command::new("PTTL").key(&name),
                    ],
                    key,
                )
                .await?;
            let value = match &replies[0] {
                Reply::Nil => return Ok(None),
                Reply::Data(value) => value.clone(),
                _ => return Err(inner.protocol("cache GET", key, "unexpected reply")),
            };
            let ttl_left = match replies[1] {
                // Expired between the two commands: a copy may not be kept.
                Reply::Int(-2) => Some(Duration::ZERO),
                // No expiry: not written by coord; kept locally for the local TTL at most.
                Reply::Int(ms) if ms < 0 => None,
                Reply::Int(ms) => Some(Duration::from_millis(ms as u64)),
                _ => return Err(inner.protocol("cache PTTL", key, "unexpected reply")),
            };
            Ok(Some(CacheEntry { value, ttl_left }))
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
            let name = Names::of(key).cache();
            let ttl = Decimal::new(millis(ttl));
            let set = Command::new("SET")
                .key(&name)
                .arg(value)
                .arg("PX")
                .arg(&ttl);
            match &inner.run(&[set], key).await?[0] {
                Reply::Data(_) => Ok(()),
                _ => Err(inner.protocol("cache SET", key, "unexpected reply")),
            }
        })
    }

    fn cache_delete<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let name = Names::of(key).cache();
            match inner.run(&[Command::new("DEL").key(&name)], key).await?[0] {
                Reply::Int(n) => Ok(n > 0),
                _ => Err(inner.protocol("cache DEL", key, "unexpected reply")),
            }
        })
    }
}
