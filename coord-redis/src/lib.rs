//! # coord-redis
//!
//! The Redis provider for coord: `#[distributed_lock]`, `#[idempotent]` and
//! `#[single_flight]` coordinating across every process that shares one Redis deployment
//! (a single server, a Sentinel-managed master, or Redis Cluster).
//!
//! ```no_run
//! use coord_core::Coordinator;
//! use coord_redis::RedisProvider;
//!
//! # async fn start() -> Result<(), Box<dyn std::error::Error>> {
//! let redis = RedisProvider::builder("redis://127.0.0.1:6379")
//!     .command_timeout(std::time::Duration::from_millis(500))
//!     .connect()
//!     .await?;
//! Coordinator::builder().namespace("billing").provider(redis).install()?;
//! # Ok(())
//! # }
//! ```
//!
//! ## A lock is a lease
//! A lock bounds how long a crashed holder blocks the others; it is not consensus. A holder
//! that stalls past its lease, or a Sentinel failover that loses the latest write (replication
//! is asynchronous), can let two callers into the same section. Fenced locks mint a fencing
//! token that only grows; the protected resource must refuse writes with an older token than
//! the newest it has seen. That, not the lock alone, makes the section safe.
//!
//! ## What goes to Redis
//! A call key `ns:op:parts` is stored under `ns:lock:{op:parts}` (the lock: the owner's
//! 128-bit token as 32 hex characters, with a `PX` lease), `ns:fence:{op:parts}` (the fencing
//! counter, only for fenced locks), `ns:idem:{op:parts}` (the idempotency record, a hash), and
//! the channels `ns:lock-released:{op:parts}` and `ns:idem-settled:{op:parts}`. The braces
//! are a Cluster hash tag: all of one key's data shares one slot. Call keys cannot contain
//! braces, so user values cannot pick the slot.
//!
//! Round trips: an uncontended unfenced acquire is one `SET .. NX PX .. GET`; a waiting one
//! sends `PTTL` in the same pipeline; a fenced acquire, a release, a renewal and every
//! idempotency step is one script (`EVALSHA`). Scripts are loaded on demand (`NOSCRIPT` →
//! `EVAL` once). Requires Redis 7.0 or newer (`SET` with both `NX` and `GET`).
//!
//! ## Fencing tokens
//! A token is `max(previous + 1, server time in microseconds)`, minted in the same script
//! that takes the lock. The counter key is kept for `max(10 × lease, 1 hour)` after each
//! mint, then expires: no state is left behind for keys that are no longer used, and because
//! the server clock has moved on by at least that long, the next token still exceeds every
//! earlier one. (A server clock set back by more than that window would break this.)
//!
//! ## Features
//! * `redis-client` (default): the `redis` crate as the client.
//! * `fred`: the `fred` crate as the client, chosen with
//!   [`RedisProviderBuilder::client`]`(`[`Client::Fred`]`)`.
//! * `testing`: [`testing`], which starts throwaway `redis-server` processes for tests.

#[cfg(not(any(feature = "redis-client", feature = "fred")))]
compile_error!("coord-redis needs a client: enable the `redis-client` or the `fred` feature");

mod config;
mod keys;
mod provider;
mod scripts;
mod transport;
mod waiters;

#[cfg(feature = "testing")]
pub mod testing;

pub use config::Client;
pub use provider::{RedisProvider, RedisProviderBuilder, URL_ENV};
