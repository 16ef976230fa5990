//! Semaphores against a real redis-server, for every client: what the conformance kit cannot
//! reach through the contract (a release message that never comes, the stored layout, values
//! coord did not write).

use crate::support;

use std::time::{Duration, Instant};

use coord_core::provider::{
    BackendErrorKind, OwnerToken, PermitRequest, ReleaseOutcome, SemaphoreStore,
};
use coord_core::{CallKey, Coordinator};
use coord_redis::Client;
use coord_redis_testing::{RedisServer, Resp};
use support::*;

per_client!(
    missed_release_notification_is_recovered_by_recheck,
    a_semaphore_lives_under_one_hash_tag_and_leaves_nothing_held,
    a_semaphore_key_holding_a_foreign_value_is_corrupt,
    builder_requiring_semaphores_builds,
);

fn req(
    key: &CallKey,
    owner: OwnerToken,
    limit: u32,
    lease: Duration,
    wait: Duration,
) -> PermitRequest<'_> {
    PermitRequest {
        key,
        owner,
        limit,
        lease,
        wait,
    }
}

/// The permits' sorted set of `key`, as the provider names it.
fn permits_name(key: &CallKey) -> String {
    format!("{}:sem:{{{}}}", key.namespace(), key.op_key())
}

/// Regression (a peer's bug): a permit freed without its release message (removed by hand,
/// as a lost `PUBLISH` or a subscriber that missed it would look to the waiter) is found by
/// the waiter's bounded re-check, about a second later at most, not after the holder's
/// 30-second lease.
async fn missed_release_notification_is_recovered_by_recheck(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("sem-missed");
    let (holder, waiter) = (OwnerToken::new(), OwnerToken::new());
    p.acquire_permit(req(&k, holder, 1, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let wait = tokio::spawn({
        let p = p.clone();
        let k = k.clone();
        async move {
            let grant = p.acquire_permit(req(&k, waiter, 1, LONG, LONG)).await;
            (grant, Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let token = format!("{:032x}", holder.as_u128());
    let removed = server.command(&["ZREM", &permits_name(&k), &token]);
    assert_eq!(
        removed,
        Resp::Int(1),
        "the holder's permit is removed by hand"
    );
    let freed_at = Instant::now();
    let (grant, at) = wait.await.unwrap();
    assert!(grant.unwrap().is_some(), "the waiter gets the freed permit");
    let took = at.saturating_duration_since(freed_at);
    assert!(
        took < Duration::from_secs(3),
        "with no release message the waiter took {took:?}: the re-check is not bounded"
    );
    p.release_permit(&k, waiter).await.unwrap();
}

/// Every key of one semaphore shares one hash tag (one Cluster slot), and after the last
/// release no permit is held: the sorted set is gone and the token hash keeps only the fencing
/// counter, with an expiry.
async fn a_semaphore_lives_under_one_hash_tag_and_leaves_nothing_held(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("sem-layout");
    let owners: Vec<_> = (0..3).map(|_| OwnerToken::new()).collect();
    for owner in &owners {
        p.acquire_permit(req(&k, *owner, 3, LONG, Duration::ZERO))
            .await
            .unwrap()
            .unwrap();
    }
    let Resp::Array(keys) = server.command(&["KEYS", &format!("{}:*", k.namespace())]) else {
        panic!("KEYS answers an array");
    };
    let tag = format!("{{{}}}", k.op_key());
    assert_eq!(keys.len(), 2, "a semaphore is two keys: {keys:?}");
    for name in &keys {
        let name = name.text().unwrap();
        assert!(
            name.ends_with(&tag),
            "{name} is outside the semaphore's hash tag"
        );
    }
    for owner in owners {
        assert_eq!(
            p.release_permit(&k, owner).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    assert_eq!(server.command(&["EXISTS", &permits_name(&k)]), Resp::Int(0));
    let tokens = format!("{}:sem-tok:{{{}}}", k.namespace(), k.op_key());
    assert_eq!(
        server.command(&["HLEN", &tokens]),
        Resp::Int(1),
        "only the counter is left"
    );
    let pttl = server.command(&["PTTL", &tokens]).int().unwrap();
    assert!(pttl > 0, "the counter expires on its own (PTTL {pttl})");
}

/// A value of the wrong type, or a counter coord did not write, under a semaphore's keys is a
/// `Corrupt` error, never a grant.
async fn a_semaphore_key_holding_a_foreign_value_is_corrupt(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("sem-foreign");
    server.command(&["SET", &permits_name(&k), "not a sorted set"]);
    let err = p
        .acquire_permit(req(&k, OwnerToken::new(), 2, LONG, Duration::ZERO))
        .await
        .expect_err("a foreign value is not a semaphore");
    assert_eq!(err.kind(), BackendErrorKind::Corrupt, "{err}");
    let k = key("sem-foreign-counter");
    let tokens = format!("{}:sem-tok:{{{}}}", k.namespace(), k.op_key());
    server.command(&["HSET", &tokens, "f", "1e400"]);
    let err = p
        .acquire_permit(req(&k, OwnerToken::new(), 2, LONG, Duration::ZERO))
        .await
        .expect_err("a foreign counter mints nothing");
    assert_eq!(err.kind(), BackendErrorKind::Corrupt, "{err}");
}

/// The Redis provider has semaphores: a builder that requires them builds.
async fn builder_requiring_semaphores_builds(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    assert!(p.supports_semaphores());
    let c = Coordinator::builder()
        .namespace("req")
        .provider(p)
        .require(coord_core::provider::Capability::Semaphores)
        .build()
        .expect("the Redis provider keeps semaphores");
    assert!(c.supports(coord_core::provider::Capability::Semaphores));
}
