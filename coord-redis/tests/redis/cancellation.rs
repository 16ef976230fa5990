//! The cancellation harness (`coord_conformance::cancellation`) on cold processes: for every
//! layer and both clients, a call on a provider that has just connected is dropped after N
//! polls, for every N until it completes on its own, each N on a new provider, so every await
//! of a process's first call (a pooled connection's first use, a dial, a script load) is a drop
//! point. The conformance run (`conformance.rs`) sweeps the same layers on one provider, as it
//! comes and warm.

use std::sync::atomic::{AtomicUsize, Ordering};

use coord_conformance::cancellation::{Layer, Sweep, sweep};
use coord_core::Coordinator;
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::RedisServer;

/// A coordinator over a provider that has just connected, in a namespace of its own.
async fn cold(client: Client) -> Coordinator {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let ns = format!("cancel{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let provider = RedisProvider::builder(RedisServer::shared().url())
        .client(client)
        .connect()
        .await
        .expect("connect to the test redis-server");
    Coordinator::builder()
        .namespace(ns)
        .provider(provider)
        .build()
        .expect("coordinator")
}

/// How many times each layer is swept: where a call suspends depends on timing (a reply can be
/// in before the claim is polled again), so repeated sweeps meet more of its awaits.
const ROUNDS: usize = 20;

async fn sweep_cold(client: Client) {
    for layer in Layer::ALL {
        let (mut calls, mut in_body) = (0, 0);
        for round in 0..ROUNDS {
            let tag = format!("cold{round}");
            let s: Sweep = sweep(layer, &tag, |_| cold(client)).await;
            assert!(s.drop_points > 0, "{layer:?}: no drop point was swept");
            calls += s.drop_points;
            in_body += s.dropped_in_body;
        }
        eprintln!(
            "{client:?} {layer:?}: {calls} calls dropped ({in_body} in the body) over {ROUNDS} sweeps, 0 keys left blocked"
        );
    }
}

#[cfg(feature = "redis-client")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cold_calls_dropped_at_every_await_leave_nothing_redis_rs() {
    sweep_cold(Client::RedisRs).await;
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cold_calls_dropped_at_every_await_leave_nothing_fred() {
    sweep_cold(Client::Fred).await;
}
