//! `#[cached]` against a real redis-server, for every client: the shared tier is one string
//! at `ns:cache:{op:parts}` with a server-side TTL; two-tier reads go to Redis only past the
//! local TTL; a value coord cannot decode is a miss, never an error.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::provider::CacheStore;
use coord_core::report::CacheOutcome;
use coord_core::{CallKey, Coordinator, cached, observe};
use coord_redis::Client;
use coord_redis_testing::{RedisServer, Resp};
use support::*;

per_client!(
    shared_entries_hit_expire_and_invalidate,
    two_tier_reads_redis_only_past_the_local_ttl,
    a_poisoned_entry_is_a_miss_and_is_replaced,
    the_store_reads_writes_and_deletes_with_a_server_ttl,
);

type Runs = Arc<AtomicUsize>;

#[cached(name = "rc.shared", key_from = "id", coordinator = c, ttl = "2s", scope = "shared")]
async fn shared(c: &Coordinator, id: u64, runs: Runs) -> Result<String, String> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(format!("answer {id}"))
}

#[cached(
    name = "rc.two_tier",
    key_from = "id",
    coordinator = c,
    ttl = "1m",
    scope = "two_tier",
    local_ttl = "1s"
)]
async fn two_tier(c: &Coordinator, id: u64, runs: Runs) -> Result<String, String> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(format!("answer {id}"))
}

/// A coordinator over `server` in a namespace of its own (local tiers are per process, so
/// tests and clients must not share keys).
async fn coordinator(server: &RedisServer, client: Client) -> Coordinator {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ns = format!("rc{}", NEXT.fetch_add(1, Ordering::Relaxed));
    Coordinator::builder()
        .namespace(ns)
        .provider(provider(server, client).await)
        .build()
        .expect("test coordinator")
}

fn call_key(c: &Coordinator, op: &str, id: u64) -> CallKey {
    c.key(op).part(&id).finish()
}

async fn outcome<F: Future>(call: F) -> (F::Output, Option<CacheOutcome>) {
    let (out, report) = observe(call).await;
    (out, report.cache())
}

fn pttl(server: &RedisServer, name: &str) -> i64 {
    server
        .command(&["PTTL", name])
        .int()
        .expect("PTTL answers an integer")
}

async fn shared_entries_hit_expire_and_invalidate(client: Client) {
    let server = RedisServer::start();
    let c = coordinator(&server, client).await;
    let runs = Runs::default();
    let name = redis_key(&call_key(&c, "rc.shared", 1), "cache");

    assert_eq!(
        outcome(shared(&c, 1, runs.clone())).await,
        (Ok("answer 1".to_owned()), Some(CacheOutcome::Miss))
    );
    let left = pttl(&server, &name);
    assert!(left > 0 && left <= 2_000, "PTTL {left}");
    assert_eq!(
        outcome(shared(&c, 1, runs.clone())).await,
        (Ok("answer 1".to_owned()), Some(CacheOutcome::Hit))
    );
    // Another instance (another provider and coordinator on the same namespace) sees it.
    let other = Coordinator::builder()
        .namespace(c.namespace())
        .provider(provider(&server, client).await)
        .build()
        .unwrap();
    assert_eq!(
        outcome(shared(&other, 1, runs.clone())).await.1,
        Some(CacheOutcome::Hit)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    assert!(c.invalidate(&call_key(&c, "rc.shared", 1)).await.unwrap());
    assert_eq!(server.command(&["EXISTS", &name]).int(), Some(0));
    assert_eq!(
        outcome(shared(&other, 1, runs.clone())).await.1,
        Some(CacheOutcome::Miss)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // Redis expires it: never served after the TTL.
    tokio::time::sleep(Duration::from_millis(2_600)).await;
    assert_eq!(server.command(&["EXISTS", &name]).int(), Some(0));
    assert_eq!(
        outcome(shared(&c, 1, runs.clone())).await.1,
        Some(CacheOutcome::Miss)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

async fn two_tier_reads_redis_only_past_the_local_ttl(client: Client) {
    let server = RedisServer::start();
    let c = coordinator(&server, client).await;
    let runs = Runs::default();
    assert_eq!(
        outcome(two_tier(&c, 1, runs.clone())).await.1,
        Some(CacheOutcome::Miss)
    );
    let gets = calls(&server, "get");
    for _ in 0..5 {
        assert_eq!(
            outcome(two_tier(&c, 1, runs.clone())).await.1,
            Some(CacheOutcome::Hit)
        );
    }
    assert_eq!(calls(&server, "get"), gets, "local hits send nothing");

    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        outcome(two_tier(&c, 1, runs.clone())).await.1,
        Some(CacheOutcome::Hit)
    );
    assert_eq!(
        calls(&server, "get"),
        gets + 1,
        "one read of the shared entry"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    assert!(c.invalidate(&call_key(&c, "rc.two_tier", 1)).await.unwrap());
    assert_eq!(
        outcome(two_tier(&c, 1, runs.clone())).await.1,
        Some(CacheOutcome::Miss)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

async fn a_poisoned_entry_is_a_miss_and_is_replaced(client: Client) {
    let server = RedisServer::start();
    let c = coordinator(&server, client).await;
    let runs = Runs::default();
    let name = redis_key(&call_key(&c, "rc.shared", 7), "cache");
    assert!(matches!(
        server.command(&["SET", &name, "{\"not\": \"coord's\"}", "PX", "60000"]),
        Resp::Simple(_)
    ));
    assert_eq!(
        outcome(shared(&c, 7, runs.clone())).await,
        (Ok("answer 7".to_owned()), Some(CacheOutcome::Stale))
    );
    assert_eq!(
        outcome(shared(&c, 7, runs.clone())).await,
        (Ok("answer 7".to_owned()), Some(CacheOutcome::Hit))
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // A value of another Redis type is a failed read: a miss too, not an error.
    server.command(&["DEL", &name]);
    server.command(&["LPUSH", &name, "x"]);
    assert_eq!(
        outcome(shared(&c, 7, runs.clone())).await,
        (Ok("answer 7".to_owned()), Some(CacheOutcome::Error))
    );
}

async fn the_store_reads_writes_and_deletes_with_a_server_ttl(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("store");
    assert_eq!(p.cache_get(&k).await.unwrap(), None);
    p.cache_set(&k, b"\x00\xffbytes", Duration::from_secs(30))
        .await
        .unwrap();
    let entry = p.cache_get(&k).await.unwrap().expect("stored");
    assert_eq!(entry.value, b"\x00\xffbytes");
    let left = entry.ttl_left.expect("a TTL");
    assert!(left > Duration::from_secs(25) && left <= Duration::from_secs(30));
    assert!(pttl(&server, &redis_key(&k, "cache")) > 25_000);
    // The cache never touches the other names of the key.
    assert_eq!(
        server.command(&["EXISTS", &redis_key(&k, "idem")]).int(),
        Some(0)
    );
    assert!(p.cache_delete(&k).await.unwrap());
    assert!(!p.cache_delete(&k).await.unwrap());
    assert_eq!(p.cache_get(&k).await.unwrap(), None);
    // A short TTL lapses on the server's clock.
    p.cache_set(&k, b"v", Duration::from_millis(200))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(p.cache_get(&k).await.unwrap(), None);
}
