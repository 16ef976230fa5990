//! Multi-key locks on Redis: one script on one server, and on Redis Cluster one script for
//! keys of one hash slot and key by key in canonical order across slots, with the conformance
//! kit's multi-key cases run against the cluster too (the standalone server runs them with the
//! whole kit, in `conformance.rs`).

use std::sync::atomic::{AtomicUsize, Ordering};

use coord_core::{CallKey, Coordinator};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::{RedisCluster, RedisServer};

use crate::support::clients;

const LONG: std::time::Duration = std::time::Duration::from_secs(30);

async fn standalone(client: Client, ns: &str) -> Coordinator {
    let provider = RedisProvider::builder(RedisServer::shared().url())
        .client(client)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{client:?}: {e}"));
    Coordinator::builder()
        .namespace(ns)
        .provider(provider)
        .build()
        .unwrap()
}

async fn multi_lock_takes_every_key_in_one_script(client: Client) {
    let c = standalone(client, &format!("mk1-{client:?}").to_lowercase()).await;
    assert!(c.supports(coord_core::provider::Capability::MultiKeyLocks));
    let keys: Vec<CallKey> = (0..4)
        .map(|i| c.key("transfer").part(&format!("acc-{i}")).finish())
        .collect();
    let single = c
        .lock(keys[2].clone())
        .lease(LONG)
        .fenced()
        .acquire()
        .await
        .unwrap();
    let before = single.fencing_token().unwrap();
    assert!(single.release().await.unwrap());
    let guard = c
        .multi_lock(keys.clone())
        .lease(LONG)
        .acquire()
        .await
        .unwrap();
    assert!(
        guard.taken_together(),
        "on one server, every set goes through the one script"
    );
    assert!(guard.fencing_token(&keys[2]).unwrap() > before);
    for key in &keys {
        let other = c.lock(key.clone()).lease(LONG).try_acquire().await.unwrap();
        assert!(other.is_none(), "{key} must be held by the multi-key lock");
    }
    assert!(guard.release().await.unwrap());
    for key in &keys {
        let other = c.lock(key.clone()).lease(LONG).try_acquire().await.unwrap();
        assert!(other.unwrap().release().await.unwrap());
    }
}

per_client!(multi_lock_takes_every_key_in_one_script);

/// Two keys of `c`'s operation `op` whose hash tags share one Cluster slot, found by asking
/// the cluster (`CLUSTER KEYSLOT`), and one key of another slot.
fn same_slot_pair(cluster: &RedisCluster, c: &Coordinator) -> (CallKey, CallKey, CallKey) {
    let port = cluster.nodes()[0].port();
    let slot_of = |key: &CallKey| {
        coord_redis_testing::command_at(port, &["CLUSTER", "KEYSLOT", key.op_key()])
            .unwrap()
            .int()
            .unwrap()
    };
    let mut seen = std::collections::HashMap::new();
    for i in 0..20_000u32 {
        let key = c.key("slots").part(&i).finish();
        let slot = slot_of(&key);
        if let Some(first) = seen.insert(slot, key.clone()) {
            let other = (0..)
                .map(|j: u32| c.key("slots").part(&format!("o{j}")).finish())
                .find(|k| slot_of(k) != slot)
                .unwrap();
            return (first, key, other);
        }
    }
    panic!("no two keys in one slot among 20 000");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn multi_lock_on_redis_cluster() {
    let cluster = RedisCluster::start(3);
    for client in clients() {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let urls = cluster.urls();
        let fresh = move || {
            let urls = urls.clone();
            let ns =
                format!("mkc{}-{client:?}", NEXT.fetch_add(1, Ordering::Relaxed)).to_lowercase();
            async move {
                let provider = RedisProvider::cluster(urls)
                    .client(client)
                    .connect()
                    .await
                    .unwrap_or_else(|e| panic!("{client:?}: {e}"));
                Coordinator::builder()
                    .namespace(ns)
                    .provider(provider)
                    .build()
                    .unwrap()
            }
        };
        let c = fresh().await;
        let (a, b, other) = same_slot_pair(&cluster, &c);
        let together = c
            .multi_lock([a.clone(), b.clone()])
            .lease(LONG)
            .acquire()
            .await
            .unwrap();
        assert!(
            together.taken_together(),
            "{client:?}: keys of one slot go through the one script"
        );
        let across = c
            .multi_lock([other.clone(), c.key("slots").part(&"x").finish()])
            .lease(LONG)
            .acquire()
            .await
            .unwrap();
        assert!(
            !across.taken_together(),
            "{client:?}: keys of different slots are taken one by one"
        );
        // A multi-key lock across slots that overlaps the held pair is refused and keeps
        // nothing.
        let refused = c
            .multi_lock([other.clone(), b.clone()])
            .lease(LONG)
            .try_acquire()
            .await
            .unwrap();
        assert!(refused.is_none(), "{client:?}: `b` is held");
        assert!(together.release().await.unwrap());
        assert!(across.release().await.unwrap());

        let multi_cases = coord_conformance::cases().iter().filter(|case| {
            case.name().starts_with("multi_lock") || case.name().starts_with("partial_state")
        });
        let report = coord_conformance::run_cases(multi_cases, fresh).await;
        assert!(report.all_passed(), "{client:?} on Redis Cluster: {report}");
    }
}
