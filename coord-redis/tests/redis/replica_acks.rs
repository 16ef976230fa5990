//! `replica_acks`: granting writes wait for replicas (`WAIT`), and fewer acknowledgements
//! than asked count as a failed write. A replica is cut off by pausing it (SIGSTOP): the
//! primary keeps it listed but it stops acknowledging, as a partitioned replica does.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::provider::{BackendErrorKind, ReplicaShortfall};
use coord_core::{CoordError, Coordinator, distributed_lock, idempotent};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::RedisServer;

/// A primary and one replica in step with it (both without persistence: the test is about
/// replication, not disks).
pub(super) fn primary_and_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start();
    let port = primary.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    await_online(&primary);
    (primary, replica)
}

/// Waits until the primary lists an online replica that acknowledged recently.
pub(super) fn await_online(primary: &RedisServer) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info = primary
            .command(&["INFO", "replication"])
            .text()
            .unwrap_or_default();
        if info.contains("state=online") && info.contains("lag=0") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the replica never came online: {info}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How long a granting write waits for the replica: long enough that a replica in step on a
/// loaded machine acknowledges within it (a test about a cut-off replica must not fail
/// because a healthy one was slow).
pub(super) const ACK_WAIT: Duration = Duration::from_secs(1);

pub(super) async fn coordinator(
    primary: &RedisServer,
    client: Client,
    acks: bool,
    ns: &str,
) -> Coordinator {
    let mut builder = RedisProvider::builder(primary.url())
        .client(client)
        .command_timeout(Duration::from_secs(3));
    if acks {
        builder = builder.replica_acks(1, ACK_WAIT);
    }
    let provider = builder
        .connect()
        .await
        .expect("connect to the test primary");
    Coordinator::builder()
        .namespace(ns)
        .provider(provider)
        .build()
        .expect("coordinator")
}

/// How many keys match `pattern` on `server`.
fn matching(server: &RedisServer, pattern: &str) -> usize {
    match server.command(&["KEYS", pattern]) {
        coord_redis_testing::Resp::Array(items) => items.len(),
        other => panic!("KEYS {pattern}: {other:?}"),
    }
}

/// Polls until no key matches `pattern` on `server`, for up to 10 s.
pub(super) async fn eventually_absent(server: &RedisServer, pattern: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while matching(server, pattern) > 0 {
        assert!(
            Instant::now() < deadline,
            "`{pattern}` was never removed by its owner"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[distributed_lock(key_from = "id", coordinator = c, name = "acks.job", lease = "5s", fenced = true)]
async fn job(c: &Coordinator, id: u32, runs: Arc<AtomicUsize>) -> Result<u32, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(id)
}

#[idempotent(key_from = "order", coordinator = c, name = "acks.charge")]
async fn charge(c: &Coordinator, order: u32, runs: Arc<AtomicUsize>) -> Result<u32, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(order * 10)
}

pub(super) fn not_replicated(err: &CoordError) -> ReplicaShortfall {
    match err {
        CoordError::Backend(b) if b.kind() == BackendErrorKind::NotReplicated => b
            .replica_shortfall()
            .expect("a NotReplicated error names the shortfall"),
        other => panic!("expected a NotReplicated backend error, got {other:?}"),
    }
}

/// With a replica in step, grants and claims succeed and cost one `WAIT` each; with the
/// replica cut off, a lock grant and an idempotency claim fail with `NotReplicated` (0 of 1),
/// the body does not run, and the written key is removed by its owner; back in step, the
/// calls succeed again and the idempotent body runs once.
async fn grants_fail_without_the_replica(client: Client) {
    let (primary, replica) = primary_and_replica();
    let c = coordinator(&primary, client, true, "acks").await;
    let runs = Arc::new(AtomicUsize::new(0));

    assert_eq!(job(&c, 1, runs.clone()).await.unwrap(), 1);
    assert_eq!(charge(&c, 1, runs.clone()).await.unwrap(), 10);
    assert_eq!(charge(&c, 1, runs.clone()).await.unwrap(), 10, "a replay");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let waits = primary
        .command(&["INFO", "commandstats"])
        .text()
        .unwrap_or_default();
    assert!(
        waits.contains("cmdstat_wait:calls="),
        "the grants sent WAIT: {waits}"
    );

    replica.pause();
    let started = Instant::now();
    let err = job(&c, 2, runs.clone()).await.unwrap_err();
    assert_eq!(
        not_replicated(&err),
        ReplicaShortfall {
            acknowledged: 0,
            asked: 1
        }
    );
    assert!(
        err.to_string().contains("0 of 1 replica"),
        "the message names the count: {err}"
    );
    assert!(
        started.elapsed() < ACK_WAIT + Duration::from_secs(2),
        "bounded by the WAIT timeout, not the lease: {:?}",
        started.elapsed()
    );
    eventually_absent(&primary, "acks:lock:*acks.job*2*").await;

    let err = charge(&c, 2, runs.clone()).await.unwrap_err();
    not_replicated(&err);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "no body ran without its grant"
    );
    eventually_absent(&primary, "acks:idem:*acks.charge*2*").await;

    replica.resume();
    await_online(&primary);
    assert_eq!(job(&c, 2, runs.clone()).await.unwrap(), 2);
    assert_eq!(charge(&c, 2, runs.clone()).await.unwrap(), 20);
    assert_eq!(charge(&c, 2, runs.clone()).await.unwrap(), 20);
    assert_eq!(runs.load(Ordering::SeqCst), 4, "each body ran once");
}

/// Without `replica_acks`, the same cut-off replica changes nothing for the caller: the
/// control showing that the failures above come from the option.
async fn without_acks_a_cut_off_replica_is_not_noticed(client: Client) {
    let (primary, replica) = primary_and_replica();
    let c = coordinator(&primary, client, false, "noacks").await;
    let runs = Arc::new(AtomicUsize::new(0));
    replica.pause();
    assert_eq!(job(&c, 1, runs.clone()).await.unwrap(), 1);
    assert_eq!(charge(&c, 1, runs.clone()).await.unwrap(), 10);
    replica.resume();
    let stats = primary
        .command(&["INFO", "commandstats"])
        .text()
        .unwrap_or_default();
    assert!(
        !stats.contains("cmdstat_wait:"),
        "no WAIT was sent: {stats}"
    );
}

#[distributed_lock(key_from = "id", coordinator = c, name = "acks.hold", lease = "3s", renew = true)]
async fn long_hold(
    c: &Coordinator,
    id: u32,
    entered: Arc<tokio::sync::Notify>,
) -> Result<(), CoordError> {
    entered.notify_one();
    tokio::time::sleep(Duration::from_secs(30)).await;
    Ok(())
}

/// A renewing holder whose renewals the replica stops acknowledging loses its hold within
/// the lease: the renewals landed on the primary only, which a failover would forget.
async fn unreplicated_renewals_lose_the_hold(client: Client) {
    let (primary, replica) = primary_and_replica();
    let c = coordinator(&primary, client, true, "acks-renew").await;
    let entered = Arc::new(tokio::sync::Notify::new());
    let mut hold = tokio::spawn({
        let (c, entered) = (c.clone(), entered.clone());
        async move { long_hold(&c, 1, entered).await }
    });
    tokio::select! {
        _ = entered.notified() => {}
        ended = &mut hold => panic!("the hold ended before its body ran: {ended:?}"),
        _ = tokio::time::sleep(Duration::from_secs(10)) => panic!("the body never ran"),
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    replica.pause();
    let cut_at = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(15), hold)
        .await
        .expect("the body must be cancelled, not left running")
        .unwrap();
    let after = cut_at.elapsed();
    replica.resume();
    assert!(
        matches!(outcome, Err(CoordError::LockLost { .. })),
        "got {outcome:?}"
    );
    assert!(
        // One lease from the last replicated renewal, with a margin for a loaded machine.
        after <= Duration::from_secs(3) + Duration::from_secs(2),
        "lost within the lease: {after:?}"
    );
}

#[idempotent(key_from = "order", coordinator = c, name = "acks.late", in_flight_lease = "3s")]
async fn charge_then_cut(
    c: &Coordinator,
    order: u32,
    runs: Arc<AtomicUsize>,
    replica_pid: u32,
) -> Result<u32, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    // The replica goes away between the claim (replicated) and the completion.
    let pid = replica_pid;
    // SAFETY: `kill` has no memory effects; the pid is this test's own child process, alive
    // until the test resumes and drops it.
    let rc = unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
    assert_eq!(rc, 0);
    Ok(order * 10)
}

/// A completion the replica does not acknowledge is reported as not stored, never `Ok`.
async fn an_unreplicated_completion_is_not_stored(client: Client) {
    let (primary, replica) = primary_and_replica();
    let c = coordinator(&primary, client, true, "acks-complete").await;
    let runs = Arc::new(AtomicUsize::new(0));
    let pid = replica.pid().expect("the replica runs");
    let outcome = charge_then_cut(&c, 7, runs.clone(), pid).await;
    replica.resume();
    assert!(
        matches!(outcome, Err(CoordError::OutcomeNotStored { .. })),
        "got {outcome:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[idempotent(key_from = "order", coordinator = c, name = "acks.failover")]
async fn charge_once(
    c: &Coordinator,
    order: u32,
    runs: Arc<AtomicUsize>,
) -> Result<u32, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(order + 1)
}

/// Through Sentinel: a record whose completion the replica acknowledged is still there after
/// the primary crashes right after the call and the replica is promoted, so the duplicate
/// replays it instead of running the body again.
async fn an_acknowledged_record_survives_the_primary_crashing(client: Client) {
    let mut setup = coord_redis_testing::SentinelSetup::start();
    let provider = RedisProvider::sentinel(
        coord_redis_testing::SentinelSetup::MASTER_NAME,
        setup.sentinel_urls(),
    )
    .client(client)
    .command_timeout(Duration::from_secs(3))
    .replica_acks(1, ACK_WAIT)
    .connect()
    .await
    .expect("connect through Sentinel");
    let c = Coordinator::builder()
        .namespace("acks-failover")
        .provider(provider)
        .build()
        .expect("coordinator");
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(charge_once(&c, 41, runs.clone()).await.unwrap(), 42);
    setup.crash_master();
    setup.await_promotion();
    let deadline = Instant::now() + Duration::from_secs(30);
    let replay = loop {
        match charge_once(&c, 41, runs.clone()).await {
            Ok(v) => break v,
            // The provider follows the promotion within a few command timeouts.
            Err(CoordError::Backend(e)) if e.kind().is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(other) => panic!("after the failover: {other:?}"),
        }
    };
    assert_eq!(replay, 42);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the acknowledged record survived the failover: no second run"
    );
}

per_client!(
    an_acknowledged_record_survives_the_primary_crashing,
    grants_fail_without_the_replica,
    without_acks_a_cut_off_replica_is_not_noticed,
    unreplicated_renewals_lose_the_hold,
    an_unreplicated_completion_is_not_stored,
);

/// `connect` refuses settings that cannot work, before touching the network.
#[tokio::test]
async fn replica_acks_settings_are_checked() {
    for (replicas, timeout, command) in [
        (0, Duration::from_millis(100), Duration::from_secs(1)),
        (1, Duration::ZERO, Duration::from_secs(1)),
        (1, Duration::from_secs(1), Duration::from_secs(1)),
        (1, Duration::from_secs(2), Duration::from_secs(1)),
    ] {
        let err = RedisProvider::builder("redis://127.0.0.1:1")
            .command_timeout(command)
            .replica_acks(replicas, timeout)
            .connect()
            .await
            .unwrap_err();
        assert_eq!(err.kind(), BackendErrorKind::Config, "{err}");
        assert!(err.message().contains("replica_acks"), "{err}");
    }
}
