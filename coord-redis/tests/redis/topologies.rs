//! Redis Cluster and Sentinel, for every client.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_core::provider::{
    BackendErrorKind, ClaimOutcome, IdempotencyStore, LockProvider, OwnerToken, ReleaseOutcome,
};
use coord_redis::RedisProvider;
use coord_redis_testing::{RedisCluster, Resp, SentinelSetup};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_of_three_masters() {
    let cluster = RedisCluster::start(3);
    for client in clients() {
        let p = RedisProvider::cluster(cluster.urls())
            .client(client)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{client:?}: {e}"));

        // Keys spread over the nodes; every script touches one slot only (no CROSSSLOT).
        let mut owners = std::collections::BTreeSet::new();
        for i in 0..24 {
            let k = kk(&format!("ns{i}:op:{client:?}:{i}"));
            let a = OwnerToken::new();
            let grant = p
                .acquire(fenced(&k, a, LONG, Duration::ZERO))
                .await
                .unwrap()
                .unwrap();
            assert!(grant.fencing_token.is_some());
            let node = cluster.node_for(&redis_key(&k, "lock"));
            owners.insert(node.port());
            // The lock and its fencing counter live together, on the node owning the tag.
            assert_eq!(
                node.command(&["EXISTS", &redis_key(&k, "lock")]),
                Resp::Int(1)
            );
            assert_eq!(
                node.command(&["EXISTS", &redis_key(&k, "fence")]),
                Resp::Int(1)
            );
            assert_eq!(
                p.renew(&k, a, LONG).await.unwrap(),
                coord_core::provider::RenewOutcome::Renewed
            );
            assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::Released);

            assert_eq!(
                p.claim(claim(&k, a, LONG)).await.unwrap(),
                ClaimOutcome::Claimed
            );
            assert!(
                complete_stored(&p, &k, a, Arc::from(&b"ok"[..]), LONG)
                    .await
                    .unwrap()
            );
            assert!(matches!(
                p.claim(claim(&k, OwnerToken::new(), LONG)).await.unwrap(),
                ClaimOutcome::Completed { .. }
            ));
        }
        assert_eq!(owners.len(), 3, "{client:?}: keys landed on every node");

        // A release published on one node wakes a waiter subscribed through another.
        for i in 0..3 {
            let k = kk(&format!("wake{i}:op:{client:?}"));
            let a = OwnerToken::new();
            p.acquire(lock(&k, a, LONG, Duration::ZERO))
                .await
                .unwrap()
                .unwrap();
            let waiter = spawn_acquire(
                &p,
                lock(&k, OwnerToken::new(), LONG, Duration::from_secs(20)),
            );
            let channel = redis_key(&k, "lock");
            until("the waiter to subscribe", Duration::from_secs(10), || {
                cluster
                    .nodes()
                    .iter()
                    .map(|n| subscribers(n, &channel))
                    .sum::<i64>()
                    >= 1
            })
            .await;
            let released_at = Instant::now();
            p.release(&k, a).await.unwrap();
            let Acquired { grant, at, .. } = waiter.await.unwrap();
            assert!(grant.is_some());
            let handoff = at.saturating_duration_since(released_at);
            assert!(
                handoff < Duration::from_millis(700),
                "{client:?}: hand-off {handoff:?}"
            );
        }

        // A marker's lease ended by its owner, on keys spread over the nodes: the abandoned
        // record at once (one slot per script), and only by the owner.
        for i in 0..6 {
            let k = kk(&format!("end{i}:op:{client:?}:{i}"));
            let (a, b) = (OwnerToken::new(), OwnerToken::new());
            let kept = |owner| coord_core::provider::ClaimRequest {
                keep_abandoned_for: Some(LONG),
                ..claim(&k, owner, LONG)
            };
            assert_eq!(p.claim(kept(a)).await.unwrap(), ClaimOutcome::Claimed);
            assert!(!p.end_marker_lease(&k, b).await.unwrap(), "{client:?}");
            assert!(p.end_marker_lease(&k, a).await.unwrap(), "{client:?}");
            assert_eq!(
                p.claim(kept(b)).await.unwrap(),
                ClaimOutcome::Abandoned { fingerprint: None },
                "{client:?}"
            );
            assert!(p.purge(&k).await.unwrap());
        }

        // wait_settled across the cluster.
        let k = kk(&format!("settle:op:{client:?}"));
        let a = OwnerToken::new();
        p.claim(claim(&k, a, LONG)).await.unwrap();
        let waiter = tokio::spawn({
            let (p, k) = (p.clone(), k.clone());
            async move {
                p.wait_settled(&k, Duration::from_secs(20)).await.unwrap();
                Instant::now()
            }
        });
        let channel = redis_key(&k, "idem");
        until(
            "the settle waiter to subscribe",
            Duration::from_secs(10),
            || {
                cluster
                    .nodes()
                    .iter()
                    .map(|n| subscribers(n, &channel))
                    .sum::<i64>()
                    >= 1
            },
        )
        .await;
        let settled_at = Instant::now();
        assert!(p.abandon(&k, a).await.unwrap());
        let woke = waiter.await.unwrap();
        assert!(woke.saturating_duration_since(settled_at) < Duration::from_secs(2));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_is_followed() {
    let mut setup = SentinelSetup::start();
    let mut providers = Vec::new();
    for client in clients() {
        let p = RedisProvider::sentinel(SentinelSetup::MASTER_NAME, setup.sentinel_urls())
            .client(client)
            .command_timeout(Duration::from_millis(500))
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{client:?}: {e}"));
        let k = kk(&format!("before:op:{client:?}"));
        let a = OwnerToken::new();
        let grant = p
            .acquire(fenced(&k, a, LONG, Duration::ZERO))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            setup.master().command(&["EXISTS", &redis_key(&k, "lock")]),
            Resp::Int(1),
            "{client:?}: written to the master"
        );
        // Open the subscriber connection before the failover, so it has to follow too.
        let waited = p
            .acquire(lock(&k, OwnerToken::new(), LONG, Duration::from_millis(50)))
            .await
            .unwrap();
        assert_eq!(waited, None);
        providers.push((client, p, k, a, grant.fencing_token.unwrap()));
    }

    let new_master = setup.failover();
    assert_eq!(setup.master().port(), new_master);

    for (client, p, k, a, token_before) in providers {
        // Calls may fail while the provider finds the new master; then they work.
        let deadline = Instant::now() + Duration::from_secs(20);
        let k2 = kk(&format!("after:op:{client:?}"));
        let b = OwnerToken::new();
        let grant = loop {
            match p.acquire(fenced(&k2, b, LONG, Duration::ZERO)).await {
                Ok(grant) => break grant.expect("a fresh key is free"),
                Err(err) => {
                    assert!(
                        matches!(
                            err.kind(),
                            BackendErrorKind::Unavailable | BackendErrorKind::Timeout
                        ),
                        "{client:?}: {err:?}"
                    );
                    assert!(
                        Instant::now() < deadline,
                        "{client:?}: never recovered: {err}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        assert_eq!(
            setup.master().command(&["EXISTS", &redis_key(&k2, "lock")]),
            Resp::Int(1),
            "{client:?}: written to the new master"
        );
        assert!(
            grant.fencing_token.unwrap() > token_before,
            "{client:?}: tokens keep growing"
        );
        // The replicated lock is still held by its owner on the new master.
        assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::Released);

        // Waiting works on the new master.
        let waiter = spawn_acquire(
            &p,
            lock(&k2, OwnerToken::new(), LONG, Duration::from_secs(20)),
        );
        let channel = redis_key(&k2, "lock");
        until("the waiter to subscribe", Duration::from_secs(10), || {
            subscribers(setup.master(), &channel) >= 1
        })
        .await;
        let released_at = Instant::now();
        assert_eq!(p.release(&k2, b).await.unwrap(), ReleaseOutcome::Released);
        let Acquired { grant, at, .. } = waiter.await.unwrap();
        assert!(grant.is_some(), "{client:?}");
        let handoff = at.saturating_duration_since(released_at);
        assert!(
            handoff < Duration::from_millis(700),
            "{client:?}: hand-off {handoff:?}"
        );
    }
}
