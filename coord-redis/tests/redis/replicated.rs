//! The server set-up of the `replica_acks` tests, written once: a primary with one replica in
//! step (both without persistence: the tests are about replication, not disks), a coordinator
//! over the primary with or without the provider's `replica_acks`, and the steps the tests take
//! once the replica is cut off. A replica is cut off by pausing it (SIGSTOP): the primary keeps
//! it listed but it stops acknowledging, as a partitioned replica does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_core::provider::{BackendErrorKind, ReplicaShortfall};
use coord_core::{CoordError, Coordinator};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::{RedisServer, Resp};
use tokio::sync::Notify;

/// How long a granting write waits for the replica: long enough that a replica in step on a
/// loaded machine acknowledges within it (a test about a cut-off replica must not fail
/// because a healthy one was slow).
pub(super) const ACK_WAIT: Duration = Duration::from_secs(1);

/// One replica out of one: what every write refused for want of the cut-off replica reports.
pub(super) const NONE_OF_ONE: ReplicaShortfall = ReplicaShortfall {
    acknowledged: 0,
    asked: 1,
};

/// A primary, one replica in step with it, and a [`coordinator`] over the primary in namespace
/// `ns`, with the provider's `replica_acks` when `acks`.
pub(super) async fn replicated(
    client: Client,
    acks: bool,
    ns: &str,
) -> (RedisServer, RedisServer, Coordinator) {
    let primary = RedisServer::start();
    let port = primary.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    await_online(&primary);
    let c = coordinator(&primary, client, acks, ns).await;
    (primary, replica, c)
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

/// A coordinator in namespace `ns` over `primary`, with a 3 s command timeout, and with the
/// provider's `replica_acks` (one replica, [`ACK_WAIT`]) when `acks`.
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
        Resp::Array(items) => items.len(),
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

/// The shortfall a `NotReplicated` backend error names; panics on any other error.
pub(super) fn not_replicated(err: &CoordError) -> ReplicaShortfall {
    match err {
        CoordError::Backend(b) if b.kind() == BackendErrorKind::NotReplicated => b
            .replica_shortfall()
            .expect("a NotReplicated error names the shortfall"),
        other => panic!("expected a NotReplicated backend error, got {other:?}"),
    }
}

/// Checks that `outcome` is a refusal for want of the cut-off replica: `NotReplicated`, 0 of 1.
pub(super) fn short_of_the_replica<T>(outcome: Result<T, CoordError>) {
    match outcome {
        Ok(_) => panic!("granted although the replica was cut off"),
        Err(err) => assert_eq!(not_replicated(&err), NONE_OF_ONE, "{err}"),
    }
}

/// Runs `call`, made while the replica is cut off, and checks that it is refused with
/// `NotReplicated` (0 of 1) within [`ACK_WAIT`] and a margin for a loaded machine: bounded by
/// the wait for the replica, not by a lease. Returns the error.
pub(super) async fn refused_within_the_wait<T: std::fmt::Debug>(
    call: impl Future<Output = Result<T, CoordError>>,
) -> CoordError {
    let started = Instant::now();
    let err = call.await.unwrap_err();
    assert_eq!(not_replicated(&err), NONE_OF_ONE);
    assert!(
        started.elapsed() < ACK_WAIT + Duration::from_secs(2),
        "bounded by the wait for the replica: {:?}",
        started.elapsed()
    );
    err
}

/// Spawns `hold` (a renewing hold whose body signals the `Notify` it is given once it runs, then
/// waits far longer than the test), waits for its body and then `settle`, cuts `replica` off,
/// and checks that the hold ends in `LockLost` no later than `lost_within` after the cut: its
/// renewals landed on the primary only, which a failover would forget. Resumes the replica.
pub(super) async fn cut_off_under_a_renewing_hold<F>(
    settle: Duration,
    lost_within: Duration,
    replica: &RedisServer,
    hold: impl FnOnce(Arc<Notify>) -> F,
) where
    F: Future<Output = Result<(), CoordError>> + Send + 'static,
{
    let entered = Arc::new(Notify::new());
    let mut hold = tokio::spawn(hold(entered.clone()));
    tokio::select! {
        _ = entered.notified() => {}
        ended = &mut hold => panic!("the hold ended before its body ran: {ended:?}"),
        _ = tokio::time::sleep(Duration::from_secs(10)) => panic!("the body never ran"),
    }
    tokio::time::sleep(settle).await;
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
    assert!(after <= lost_within, "lost within the lease: {after:?}");
}

/// The body of the renewing holds above: says it runs, then waits 30 s, longer than any test
/// lets it.
pub(super) async fn enter_and_wait(entered: Arc<Notify>) -> Result<(), CoordError> {
    entered.notify_one();
    tokio::time::sleep(Duration::from_secs(30)).await;
    Ok(())
}
