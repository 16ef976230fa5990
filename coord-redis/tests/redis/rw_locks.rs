//! Read-write locks against a real redis-server, for every client: what the conformance kit
//! cannot reach through the contract (the stored layout and its hash tag, a waiting writer
//! that gives up withdrawing its claim, a release message that never comes, values coord did
//! not write).

use crate::support;

use std::time::{Duration, Instant};

use coord_core::provider::{
    BackendErrorKind, OwnerToken, ReleaseOutcome, RwLockRequest, RwLockStore, RwMode,
};
use coord_core::{CallKey, Coordinator};
use coord_redis::Client;
use coord_redis_testing::{RedisServer, Resp};
use support::*;

per_client!(
    a_rw_lock_lives_under_one_hash_tag_and_leaves_nothing_held,
    a_writer_giving_up_withdraws_its_claim_at_once,
    a_missed_release_message_is_recovered_by_recheck,
    a_rw_lock_key_holding_a_foreign_value_is_corrupt,
    builder_requiring_rw_locks_builds,
);

fn req(
    key: &CallKey,
    owner: OwnerToken,
    mode: RwMode,
    wait: Duration,
    claim: Duration,
) -> RwLockRequest<'_> {
    RwLockRequest {
        key,
        owner,
        mode,
        lease: LONG,
        wait,
        claim,
    }
}

/// The state hash of `key`, as the provider names it.
fn state_name(key: &CallKey) -> String {
    format!("{}:rw:{{{}}}", key.namespace(), key.op_key())
}

/// The readers' sorted set of `key`.
fn readers_name(key: &CallKey) -> String {
    format!("{}:rw-r:{{{}}}", key.namespace(), key.op_key())
}

/// Both keys of one read-write lock share one hash tag (one Cluster slot), and after the last
/// release nothing is held: the readers' set is gone and the state hash keeps only the fencing
/// counter, with an expiry.
async fn a_rw_lock_lives_under_one_hash_tag_and_leaves_nothing_held(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("rw-layout");
    let readers: Vec<_> = (0..2).map(|_| OwnerToken::new()).collect();
    for owner in &readers {
        p.acquire_rw(req(&k, *owner, RwMode::Read, Duration::ZERO, LONG))
            .await
            .unwrap()
            .unwrap();
    }
    let Resp::Array(keys) = server.command(&["KEYS", &format!("{}:*", k.namespace())]) else {
        panic!("KEYS answers an array");
    };
    let tag = format!("{{{}}}", k.op_key());
    assert_eq!(keys.len(), 2, "a read-write lock is two keys: {keys:?}");
    for name in &keys {
        let name = name.text().unwrap();
        assert!(
            name.ends_with(&tag),
            "{name} is outside the lock's hash tag"
        );
    }
    for owner in readers {
        assert_eq!(
            p.release_rw(&k, owner, RwMode::Read).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    let writer = OwnerToken::new();
    p.acquire_rw(req(&k, writer, RwMode::Write, Duration::ZERO, LONG))
        .await
        .unwrap()
        .unwrap();
    p.release_rw(&k, writer, RwMode::Write).await.unwrap();
    assert_eq!(server.command(&["EXISTS", &readers_name(&k)]), Resp::Int(0));
    assert_eq!(
        server.command(&["HKEYS", &state_name(&k)]),
        Resp::Array(vec![Resp::Bulk(b"f".to_vec())]),
        "only the counter is left"
    );
    let pttl = server.command(&["PTTL", &state_name(&k)]).int().unwrap();
    assert!(pttl > 0, "the counter expires on its own (PTTL {pttl})");
}

/// A writer whose wait ends withdraws its claim (and wakes the readers it held back) at once,
/// rather than holding new readers out until the claim ends.
async fn a_writer_giving_up_withdraws_its_claim_at_once(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("rw-give-up");
    let reader = OwnerToken::new();
    p.acquire_rw(req(&k, reader, RwMode::Read, Duration::ZERO, LONG))
        .await
        .unwrap()
        .unwrap();
    let writer = p
        .acquire_rw(req(
            &k,
            OwnerToken::new(),
            RwMode::Write,
            Duration::from_millis(300),
            LONG,
        ))
        .await
        .unwrap();
    assert!(
        writer.is_none(),
        "the writer waited behind the reader in vain"
    );
    let started = Instant::now();
    let late = p
        .acquire_rw(req(
            &k,
            OwnerToken::new(),
            RwMode::Read,
            Duration::ZERO,
            LONG,
        ))
        .await
        .unwrap();
    assert!(
        late.is_some(),
        "a writer that gave up still kept readers out (its claim of {LONG:?} was left)"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// A hold freed without its release message (removed by hand, as a lost `PUBLISH` would look
/// to the waiter) is found by the waiter's bounded re-check, not after the holder's lease.
async fn a_missed_release_message_is_recovered_by_recheck(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("rw-missed");
    let reader = OwnerToken::new();
    p.acquire_rw(req(&k, reader, RwMode::Read, Duration::ZERO, LONG))
        .await
        .unwrap()
        .unwrap();
    let wait = tokio::spawn({
        let (p, k) = (p.clone(), k.clone());
        async move {
            let grant = p
                .acquire_rw(req(&k, OwnerToken::new(), RwMode::Write, LONG, LONG))
                .await;
            (grant, Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let token = format!("{:032x}", reader.as_u128());
    assert_eq!(
        server.command(&["ZREM", &readers_name(&k), &token]),
        Resp::Int(1),
        "the reader's hold is removed by hand"
    );
    let freed_at = Instant::now();
    let (grant, at) = wait.await.unwrap();
    assert!(grant.unwrap().is_some(), "the writer gets the freed key");
    let took = at.saturating_duration_since(freed_at);
    assert!(
        took < Duration::from_secs(3),
        "with no release message the writer took {took:?}: the re-check is not bounded"
    );
}

/// A value of the wrong type, or a counter coord did not write, under a read-write lock's
/// keys is a `Corrupt` error, never a grant.
async fn a_rw_lock_key_holding_a_foreign_value_is_corrupt(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("rw-foreign");
    server.command(&["SET", &state_name(&k), "not a hash"]);
    let err = p
        .acquire_rw(req(
            &k,
            OwnerToken::new(),
            RwMode::Read,
            Duration::ZERO,
            LONG,
        ))
        .await
        .expect_err("a foreign value is not a read-write lock");
    assert_eq!(err.kind(), BackendErrorKind::Corrupt, "{err}");
    let k = key("rw-foreign-counter");
    server.command(&["HSET", &state_name(&k), "f", "1e400"]);
    let err = p
        .acquire_rw(req(
            &k,
            OwnerToken::new(),
            RwMode::Write,
            Duration::ZERO,
            LONG,
        ))
        .await
        .expect_err("a foreign counter mints nothing");
    assert_eq!(err.kind(), BackendErrorKind::Corrupt, "{err}");
}

/// The Redis provider has read-write locks: a builder that requires them builds.
async fn builder_requiring_rw_locks_builds(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    assert!(p.supports_rw_locks());
    let capability = coord_core::provider::Capability::ReadWriteLocks;
    let c = Coordinator::builder()
        .namespace("req")
        .provider(p)
        .require(capability)
        .build()
        .expect("the Redis provider keeps read-write locks");
    assert!(c.supports(capability));
}
