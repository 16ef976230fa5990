//! Semaphores while redis-server fails under held permits, for every client: its connections
//! killed (`CLIENT KILL`), the server frozen (SIGSTOP) and restarted without its data. Each
//! case checks what the holders and a waiter get, that the limit stays exact (a caller beyond
//! it is refused or waits, never granted), and that nothing is left held at the end.

use crate::support;

use std::time::{Duration, Instant};

use coord_core::handle::PermitGuard;
use coord_core::{CallKey, Coordinator};
use coord_redis::Client;
use coord_redis_testing::RedisServer;
use support::*;

per_client!(
    connections_killed_while_permits_are_held,
    server_paused_while_permits_are_held,
    server_restarted_while_permits_are_held,
);

const PERMITS: u32 = 3;

async fn coordinator(server: &RedisServer, client: Client) -> Coordinator {
    Coordinator::builder()
        .namespace("semfault")
        .provider(provider(server, client).await)
        .build()
        .expect("coordinator")
}

/// Every permit of `key`, renewed every 200 ms (lease 2 s).
async fn hold_all(c: &Coordinator, key: &CallKey) -> Vec<PermitGuard> {
    let mut held = Vec::new();
    for _ in 0..PERMITS {
        let permit = c
            .semaphore(key.clone(), PERMITS)
            .lease(Duration::from_secs(2))
            .renew(Duration::from_millis(200))
            .try_acquire()
            .await
            .expect("acquire")
            .expect("a free permit");
        held.push(permit);
    }
    held
}

/// A single attempt at one more permit: must not be granted while every permit is held.
async fn assert_full(c: &Coordinator, key: &CallKey, when: &str) {
    let extra = c
        .semaphore(key.clone(), PERMITS)
        .lease(LONG)
        .try_acquire()
        .await
        .expect("try_acquire");
    assert!(
        extra.is_none(),
        "{when}: a fourth permit was granted on a 3-permit semaphore"
    );
}

/// How many permits of `key` the server holds (lapsed ones included, until removed).
fn permits_stored(server: &RedisServer, key: &CallKey) -> i64 {
    server
        .command(&["ZCARD", &permits_name(key)])
        .int()
        .unwrap_or(-1)
}

/// How many permits of `key` the server holds whose lease has not ended.
fn permits_live(server: &RedisServer, key: &CallKey) -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis()
        .to_string();
    server
        .command(&["ZCOUNT", &permits_name(key), &format!("({now}"), "+inf"])
        .int()
        .unwrap_or(-1)
}

fn permits_name(key: &CallKey) -> String {
    format!("{}:sem:{{{}}}", key.namespace(), key.op_key())
}

async fn release_all(held: Vec<PermitGuard>) -> usize {
    let mut released = 0;
    for permit in held {
        if permit.release().await.expect("release") {
            released += 1;
        }
    }
    released
}

/// Connections killed under three renewed permits and a waiter: the permits stay held (their
/// renewals go on over new connections), the semaphore stays full, and a release after the
/// kill still wakes the waiter (its subscription was remade), well before the waiter's wait.
async fn connections_killed_while_permits_are_held(client: Client) {
    let server = RedisServer::start();
    let c = coordinator(&server, client).await;
    let k = key("sem-kill");
    let mut held = hold_all(&c, &k).await;
    let waiter = {
        let (c, k) = (c.clone(), k.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let permit = c
                .semaphore(k, PERMITS)
                .lease(LONG)
                .wait(Duration::from_secs(20))
                .acquire()
                .await;
            (permit, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    for kind in ["normal", "pubsub"] {
        server.command(&["CLIENT", "KILL", "TYPE", kind]);
    }
    // Past the lease: only renewals over new connections keep the permits.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        held.iter().all(PermitGuard::is_held),
        "a permit was lost to killed connections"
    );
    assert_full(&c, &k, "after CLIENT KILL").await;
    assert_eq!(permits_stored(&server, &k), 3);
    let released_at = Instant::now();
    assert!(held.pop().unwrap().release().await.expect("release"));
    let (permit, _) = waiter.await.expect("waiter task");
    let permit = permit.expect("the waiter gets the freed permit");
    let woke_after = released_at.elapsed();
    assert!(
        woke_after < Duration::from_secs(3),
        "the waiter took {woke_after:?} after the release"
    );
    held.push(permit);
    assert_eq!(release_all(held).await, 3);
    assert_eq!(permits_stored(&server, &k), 0, "permits left held");
}

/// The server frozen for 1.5 s under three renewed permits (lease 2 s): a call meanwhile fails
/// or is refused, never granted a fourth permit; after the thaw, while the three guards still
/// hold, the semaphore is still full; releasing leaves no live permit (a permit whose guard
/// gave up on it lapses within its lease).
async fn server_paused_while_permits_are_held(client: Client) {
    let server = RedisServer::start();
    let c = coordinator(&server, client).await;
    let k = key("sem-pause");
    let held = hold_all(&c, &k).await;
    server.pause();
    let during = {
        let (c, k) = (c.clone(), k.clone());
        tokio::spawn(async move {
            c.semaphore(k, PERMITS)
                .lease(LONG)
                .try_acquire()
                .await
                .map(|permit| permit.is_some())
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.resume();
    if let Ok(granted) = during.await.expect("task") {
        assert!(!granted, "a fourth permit was granted across the pause");
    }
    // One renewal round after the thaw.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let still = held.iter().filter(|p| p.is_held()).count();
    if still == PERMITS as usize {
        assert_full(&c, &k, "after the pause").await;
    }
    release_all(held).await;
    // A permit whose holder stopped counting on it lapses within its lease at the latest.
    until(
        "every permit released or lapsed",
        Duration::from_secs(5),
        || permits_live(&server, &k) == 0,
    )
    .await;
}

/// The server restarted without its data under three renewed permits: the holders learn their
/// permits are gone (their renewal finds nothing), three new callers take the three permits and
/// a fourth is refused, and the old holders' late releases free nobody's permit.
async fn server_restarted_while_permits_are_held(client: Client) {
    let mut server = RedisServer::start();
    let c = coordinator(&server, client).await;
    let k = key("sem-restart");
    let old = hold_all(&c, &k).await;
    server.restart();
    until("the old holders see their permits gone", LONG, || {
        old.iter().all(|p| !p.is_held())
    })
    .await;
    let mut new = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while new.len() < PERMITS as usize {
        assert!(Instant::now() < deadline, "no permits after the restart");
        match c
            .semaphore(k.clone(), PERMITS)
            .lease(LONG)
            .try_acquire()
            .await
        {
            Ok(Some(permit)) => new.push(permit),
            Ok(None) => panic!("the restarted server kept a permit it lost"),
            // Reconnecting.
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert_full(&c, &k, "after the restart").await;
    for permit in old {
        assert!(
            !permit.release().await.unwrap_or(false),
            "a permit lost in the restart was released as if held"
        );
    }
    assert_full(&c, &k, "after the old holders' late releases").await;
    assert_eq!(release_all(new).await, 3);
    assert_eq!(permits_stored(&server, &k), 0, "permits left held");
}
