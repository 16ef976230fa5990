//! The shared tier of `#[cached]`: plain string values with a server-side TTL.
//!
//! An entry is one Redis string at `ns:cache:{op:parts}`, written by a script with `SET .. PX`
//! (the server owns the expiry) and read with `GET` and `PTTL` in one round trip. The write
//! carries the moment it was sent in the server's clock (as this provider estimates it, like a
//! claim's not-after time): a write that executes late, because this process or the server
//! stalled in between, gets only what is left of its ttl, and none at all once that is spent,
//! so an entry never outlives the ttl it was given. The value is the outcome as the coordinator's codec encoded it; coord-redis
//! never looks inside it, and the runtime treats bytes it cannot decode as a miss.

use std::time::Duration;

use coord_core::provider::{BoxFuture, CacheEntry, CacheStore};
use coord_core::{BackendError, CallKey};

use super::commands::millis;
use super::{RedisProvider, server_time};
use crate::encode::Decimal;
use crate::keys::Names;
use crate::scripts;
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
            let sent = std::time::Instant::now();
            let ttl_ms = Decimal::new(millis(ttl));
            let mut remeasured = false;
            loop {
                let sent_ms = Decimal::new(inner.clock.now_ms().max(0) as u64);
                let reply = inner
                    .eval(
                        &scripts::CACHE_SET,
                        &[&name],
                        &[value, ttl_ms.as_ref(), sent_ms.as_ref()],
                        key,
                    )
                    .await?;
                match reply {
                    Reply::Int(1) => return Ok(()),
                    // Refused as late although the whole ttl has not passed here since the
                    // write was sent: the estimate of the server's clock is off (its clock was
                    // stepped). Measure it again and send once more.
                    Reply::Int(0) if !remeasured && sent.elapsed() < ttl => {
                        remeasured = true;
                        let (at, server_ms) =
                            server_time(&*inner.transport).await.map_err(|fault| {
                                fault.into_backend("cache set: reading the server's clock")
                            })?;
                        tracing::warn!(
                            key = %key,
                            "coord-redis: a cache write came back refused as late although it was answered in time: the server's clock moved; measured it again"
                        );
                        inner.clock.set(at, server_ms);
                    }
                    // Too late: the answer would be older than its ttl when read. Not an error:
                    // the outcome was returned, it is just not kept.
                    Reply::Int(0) => {
                        tracing::debug!(key = %key, "coord-redis: a cache write executed after its ttl had passed; nothing was written");
                        return Ok(());
                    }
                    _ => return Err(inner.protocol("cache set", key, "unexpected script reply")),
                }
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
