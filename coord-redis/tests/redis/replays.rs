//! A replay is a read on Redis too: a replay of a completed record, a duplicate of a call in
//! flight and the operator's reads run no write command, so nothing reaches the AOF (or a
//! replica: scripts replicate their effects, and a script that calls no write command has
//! none).
//!
//! The claim is one `EVALSHA` of the claim script whatever it finds; on a live record that is
//! not the caller's own marker the script only reads (`TIME`, `HMGET`, `PTTL`) and answers. A
//! plain `HMGET` first would save nothing on a replay (one round trip either way) and cost a
//! first call a second round trip, so the script stays the only command.
//!
//! Measured on a server with `appendonly yes`: the commands the server ran (`INFO
//! commandstats`, which counts the commands a script calls too) hold no write command, and the
//! AOF's size (`aof_current_size`) does not move, over 100 replays through the attribute, 100
//! through the handle, 100 in-flight duplicates and 100 operator reads. The first call, which
//! claims and completes, is counted the same way and does show its writes, so the check can
//! fail.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use coord_core::{CoordError, Coordinator, idempotent};
use coord_redis::Client;
use coord_redis_testing::RedisServer;
use support::*;

per_client!(replays_and_observers_run_no_write_command);

/// Every write command a coord script or operation calls.
const WRITES: &[&str] = &[
    "set", "del", "unlink", "hset", "hdel", "pexpire", "expire", "publish", "zadd", "zrem", "lpop",
    "rpush", "lpush", "incr", "hincrby", "getdel", "setex",
];

#[idempotent(key_from = "request", coordinator = coord, name = "billing.charge")]
async fn charge(
    coord: &Coordinator,
    request: u32,
    runs: Arc<AtomicU64>,
) -> Result<u64, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(u64::from(request) * 100)
}

fn aof_size(server: &RedisServer) -> u64 {
    let info = server
        .command(&["INFO", "persistence"])
        .text()
        .unwrap_or_default();
    info.lines()
        .find_map(|line| line.strip_prefix("aof_current_size:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("aof_current_size in INFO persistence")
}

/// The write commands the server ran since the last `CONFIG RESETSTAT`, with their counts.
fn writes_run(server: &RedisServer) -> BTreeMap<String, u64> {
    server
        .command_calls()
        .into_iter()
        .filter(|(name, _)| WRITES.contains(&name.as_str()))
        .collect()
}

fn reset_stats(server: &RedisServer) {
    assert_eq!(
        server.command(&["CONFIG", "RESETSTAT"]).text().as_deref(),
        Some("OK")
    );
}

async fn replays_and_observers_run_no_write_command(client: Client) {
    let server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "no"]);
    let coord = Arc::new(
        Coordinator::builder()
            .namespace("billing")
            .provider(provider(&server, client).await)
            .build()
            .unwrap(),
    );
    let runs = Arc::new(AtomicU64::new(0));

    // The first call claims and completes: its writes are seen, and reach the AOF.
    reset_stats(&server);
    let aof = aof_size(&server);
    assert_eq!(charge(&coord, 7, runs.clone()).await.unwrap(), 700);
    let first = writes_run(&server);
    assert!(
        first.contains_key("hset"),
        "the first call wrote: {first:?}"
    );
    assert!(
        aof_size(&server) > aof,
        "the first call's writes reach the AOF"
    );

    let handle_key = || coord.key("billing.refund").part("r-1").finish();
    let handle_call = || {
        let runs = runs.clone();
        coord.idempotent(handle_key()).run(move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, CoordError>(42_u64)
        })
    };
    assert_eq!(handle_call().await.unwrap(), 42);

    // A call in flight, for its duplicates (a lease far longer than the test: no renewal).
    let (started_tx, started) = tokio::sync::oneshot::channel::<()>();
    let (finish, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let slow_key = || coord.key("billing.slow").part("s-1").finish();
    let slow = {
        let coord = coord.clone();
        let key = slow_key();
        tokio::spawn(async move {
            coord
                .idempotent(key)
                .in_flight_lease(Duration::from_secs(600))
                .run(move || async move {
                    started_tx.send(()).unwrap();
                    finish_rx.await.unwrap();
                    Ok::<_, CoordError>(1_u64)
                })
                .await
        })
    };
    started.await.unwrap();

    reset_stats(&server);
    let aof = aof_size(&server);
    for _ in 0..100 {
        assert_eq!(charge(&coord, 7, runs.clone()).await.unwrap(), 700);
        assert_eq!(handle_call().await.unwrap(), 42);
        let duplicate = coord
            .idempotent(slow_key())
            .run(|| async { Ok::<_, CoordError>(0_u64) })
            .await;
        assert!(matches!(duplicate, Err(CoordError::InFlight { .. })));
        let operator = coord.operator();
        assert!(operator.record(&handle_key()).await.unwrap().is_some());
        operator.lock(&handle_key()).await.unwrap();
    }
    let calls = server.command_calls();
    assert!(
        calls.get("evalsha").copied().unwrap_or(0) >= 300,
        "the calls reached the server: {calls:?}"
    );
    assert_eq!(
        writes_run(&server),
        BTreeMap::new(),
        "replays, duplicates and operator reads ran write commands: {calls:?}"
    );
    assert_eq!(aof_size(&server), aof, "nothing reached the AOF");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "each body ran once");

    finish.send(()).unwrap();
    assert_eq!(slow.await.unwrap().unwrap(), 1);
}
