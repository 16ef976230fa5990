//! Shared helpers of the coord-redis integration tests.
#![allow(dead_code)] // each test binary uses its own subset

use coord_core::CallKey;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use coord_core::provider::{ClaimRequest, LockGrant, LockProvider, LockRequest, OwnerToken};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::{RedisServer, Resp};

pub const LONG: Duration = Duration::from_secs(30);

/// Declares one multi-threaded tokio test per enabled client for each `async fn case(Client)`.
#[macro_export]
macro_rules! per_client {
    ($($case:ident),* $(,)?) => {
        #[cfg(feature = "redis-client")]
        mod redis_rs {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(coord_redis::Client::RedisRs).await;
                }
            )*
        }
        #[cfg(feature = "fred")]
        mod fred {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(coord_redis::Client::Fred).await;
                }
            )*
        }
    };
}

/// Every client compiled in.
pub fn clients() -> Vec<Client> {
    vec![
        #[cfg(feature = "redis-client")]
        Client::RedisRs,
        #[cfg(feature = "fred")]
        Client::Fred,
    ]
}

/// A provider for `server` using `client`.
pub async fn provider(server: &RedisServer, client: Client) -> RedisProvider {
    RedisProvider::builder(server.url())
        .client(client)
        .connect()
        .await
        .expect("connect to the test server")
}

/// A call key under a namespace of its own.
pub fn key(name: &str) -> CallKey {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ns = format!("t{}", NEXT.fetch_add(1, Ordering::Relaxed));
    CallKey::builder(&ns, name).part("part").finish()
}

/// A key from test text `namespace:operation[:parts]` (the namespace is what precedes the
/// first `:`), taken as a shown key of that namespace.
pub fn kk(text: &str) -> CallKey {
    let (ns, op_key) = text
        .split_once(':')
        .expect("test keys are `namespace:operation...`");
    CallKey::from_op_key(ns, op_key).expect("a valid test key")
}

/// The Redis name of `kind` for call key `key` (`lock`, `fence`, `idem`, ...), spelled out
/// here by hand so a change of the provider's layout shows up as a failing test.
pub fn redis_key(key: &CallKey, kind: &str) -> String {
    format!("{}:{kind}:{{{}}}", key.namespace(), key.op_key())
}

pub fn lock(key: &CallKey, owner: OwnerToken, lease: Duration, wait: Duration) -> LockRequest<'_> {
    LockRequest {
        key,
        owner,
        lease,
        wait,
        fenced: false,
    }
}

pub fn fenced(
    key: &CallKey,
    owner: OwnerToken,
    lease: Duration,
    wait: Duration,
) -> LockRequest<'_> {
    LockRequest {
        fenced: true,
        ..lock(key, owner, lease, wait)
    }
}

pub fn claim(key: &CallKey, owner: OwnerToken, lease: Duration) -> ClaimRequest<'_> {
    ClaimRequest {
        key,
        owner,
        in_flight_lease: lease,
        fingerprint: None,
        keep_abandoned_for: None,
        transactional: false,
    }
}

/// Waits (polling the server) until `check` holds, panicking after `timeout`.
pub async fn until(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How many subscribers `channel` has on `server`.
pub fn subscribers(server: &RedisServer, channel: &str) -> i64 {
    match server.command(&["PUBSUB", "NUMSUB", channel]) {
        Resp::Array(items) => items.get(1).and_then(Resp::int).unwrap_or(0),
        other => panic!("PUBSUB NUMSUB answered {other:?}"),
    }
}

/// Calls of `command` since start.
pub fn calls(server: &RedisServer, command: &str) -> u64 {
    server.command_calls().get(command).copied().unwrap_or(0)
}

/// What a spawned acquire reports: its grant, its owner and when the acquire returned.
pub struct Acquired {
    pub grant: Option<LockGrant>,
    pub owner: OwnerToken,
    pub at: Instant,
}

/// Runs `request` on its own task (typically a waiter, `wait > 0`).
pub fn spawn_acquire(
    p: &RedisProvider,
    request: LockRequest<'_>,
) -> tokio::task::JoinHandle<Acquired> {
    let (p, key) = (p.clone(), request.key.clone());
    let (owner, lease, wait, fenced) = (request.owner, request.lease, request.wait, request.fenced);
    tokio::spawn(async move {
        let grant = p
            .acquire(LockRequest {
                key: &key,
                owner,
                lease,
                wait,
                fenced,
            })
            .await
            .unwrap();
        Acquired {
            grant,
            owner,
            at: Instant::now(),
        }
    })
}

/// Completes `key` for `owner`, answering whether the outcome is now stored.
#[allow(dead_code)]
pub async fn complete_stored(
    store: &dyn coord_core::provider::IdempotencyStore,
    key: &CallKey,
    owner: OwnerToken,
    payload: std::sync::Arc<[u8]>,
    retention: Duration,
) -> Result<bool, coord_core::BackendError> {
    store
        .complete(coord_core::provider::CompleteRequest {
            key,
            owner,
            payload,
            retention,
            fingerprint: None,
        })
        .await
        .map(coord_core::provider::CompleteOutcome::is_stored)
}
