//! Hand-off latency: from the holder's release to the waiter holding the lock, over loopback.
//! Printed (run with `--nocapture`, ideally `--release`); asserted only loosely, since debug
//! builds on a shared machine are slow.

use crate::support;

use std::time::{Duration, Instant};

use coord_core::provider::{LockProvider, OwnerToken};
use coord_redis::Client;
use coord_redis_testing::RedisServer;
use support::*;

per_client!(handoff_latency);

const ROUNDS: usize = 200;

async fn handoff_latency(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("handoff");
    let channel = redis_key(&k, "lock");
    let mut samples = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let holder = OwnerToken::new();
        p.acquire(lock(&k, holder, LONG, Duration::ZERO))
            .await
            .unwrap()
            .unwrap();
        let sets = calls(&server, "set");
        let waiter = tokio::spawn({
            let (p, k) = (p.clone(), k.clone());
            async move {
                let me = OwnerToken::new();
                let grant = p.acquire(lock(&k, me, LONG, LONG)).await.unwrap();
                let at = Instant::now();
                assert!(grant.is_some());
                p.release(&k, me).await.unwrap();
                at
            }
        });
        // Queued: its first attempt and its retry after subscribing were both refused.
        until("the waiter to queue", Duration::from_secs(5), || {
            calls(&server, "set") >= sets + 2
        })
        .await;
        let released_at = Instant::now();
        p.release(&k, holder).await.unwrap();
        let granted_at = waiter.await.unwrap();
        samples.push(granted_at.saturating_duration_since(released_at));
        until("the waiter to unsubscribe", Duration::from_secs(5), || {
            subscribers(&server, &channel) == 0
        })
        .await;
    }
    samples.sort();
    let p50 = samples[ROUNDS / 2];
    let p99 = samples[ROUNDS * 99 / 100];
    eprintln!("{client:?}: hand-off over loopback, p50 {p50:?}, p99 {p99:?}");
    assert!(p50 < Duration::from_millis(5), "{client:?}: p50 {p50:?}");
}
