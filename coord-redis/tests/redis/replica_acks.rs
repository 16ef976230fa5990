//! `replica_acks`: granting writes wait for replicas (`WAIT`), and fewer acknowledgements
//! than asked count as a failed write. A replica is cut off by pausing it (SIGSTOP): the
//! primary keeps it listed but it stops acknowledging, as a partitioned replica does.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use coord_core::provider::BackendErrorKind;
use coord_core::{CoordError, Coordinator, distributed_lock, idempotent};
use coord_history::replica_acks::{Runs, ran};
use coord_redis::{Client, RedisProvider};
use tokio::sync::Notify;

use super::replicated::{
    ACK_WAIT, await_online, cut_off_under_a_renewing_hold, enter_and_wait, eventually_absent,
    not_replicated, refused_within_the_wait, replicated,
};

#[distributed_lock(key_from = "id", coordinator = c, name = "acks.job", lease = "5s", fenced = true)]
async fn job(c: &Coordinator, id: u32, runs: Runs) -> Result<u32, CoordError> {
    ran(&runs, id)
}

#[idempotent(key_from = "order", coordinator = c, name = "acks.charge")]
async fn charge(c: &Coordinator, order: u32, runs: Runs) -> Result<u32, CoordError> {
    ran(&runs, order * 10)
}

/// With a replica in step, grants and claims succeed and cost one `WAIT` each; with the
/// replica cut off, a lock grant and an idempotency claim fail with `NotReplicated` (0 of 1),
/// the body does not run, and the written key is removed by its owner; back in step, the
/// calls succeed again and the idempotent body runs once.
async fn grants_fail_without_the_replica(client: Client) {
    let (primary, replica, c) = replicated(client, true, "acks").await;
    let runs = Runs::default();

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
    let err = refused_within_the_wait(job(&c, 2, runs.clone())).await;
    assert!(
        err.to_string().contains("0 of 1 replica"),
        "the message names the count: {err}"
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
    let (primary, replica, c) = replicated(client, false, "noacks").await;
    let runs = Runs::default();
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
async fn long_hold(c: &Coordinator, id: u32, entered: Arc<Notify>) -> Result<(), CoordError> {
    enter_and_wait(entered).await
}

/// A renewing holder whose renewals the replica stops acknowledging loses its hold within
/// the lease: the renewals landed on the primary only, which a failover would forget.
async fn unreplicated_renewals_lose_the_hold(client: Client) {
    let (_primary, replica, c) = replicated(client, true, "acks-renew").await;
    cut_off_under_a_renewing_hold(
        // A few renewals in step first.
        Duration::from_millis(1200),
        // One lease from the last replicated renewal, with a margin for a loaded machine.
        Duration::from_secs(3) + Duration::from_secs(2),
        &replica,
        move |entered| async move { long_hold(&c, 1, entered).await },
    )
    .await;
}

#[idempotent(key_from = "order", coordinator = c, name = "acks.late", in_flight_lease = "3s")]
async fn charge_then_cut(
    c: &Coordinator,
    order: u32,
    runs: Runs,
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
    let (_primary, replica, c) = replicated(client, true, "acks-complete").await;
    let runs = Runs::default();
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
async fn charge_once(c: &Coordinator, order: u32, runs: Runs) -> Result<u32, CoordError> {
    ran(&runs, order + 1)
}

/// Through Sentinel: a record whose completion the replica acknowledged is still there after
/// the primary crashes right after the call and the replica is promoted, so the duplicate
/// replays it instead of running the body again. Its control,
/// [`without_acks_a_record_is_lost_with_the_crashed_primary`], shows the same crash losing an
/// unacknowledged record.
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
    let runs = Runs::default();
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

/// One field of the server's `INFO replication`, when it answers.
fn replication_field(server: &coord_redis_testing::RedisServer, field: &str) -> Option<String> {
    let info = server.command(&["INFO", "replication"]).text()?;
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
}

/// Waits (up to 30 s) until `done` holds of `server`'s `INFO replication`.
fn await_replication(
    server: &coord_redis_testing::RedisServer,
    what: &str,
    done: impl Fn(&coord_redis_testing::RedisServer) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done(server) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The control of [`an_acknowledged_record_survives_the_primary_crashing`]: the same call and
/// crash without `replica_acks`, with the replica's applying of the replication stream held
/// back (`CLIENT PAUSE .. WRITE` on the replica: it reads the stream but does not apply it) so
/// the record is on the crashed primary only. The replica drops the stream it had not applied
/// when its link to the dead primary closes, is promoted without the record, and the
/// duplicate runs the body a second time. Asserting that second run makes the loss part of
/// what is tested: were the record kept anyway, this test would fail, and the survival above
/// would not be credited to the acknowledgement.
async fn without_acks_a_record_is_lost_with_the_crashed_primary(client: Client) {
    let mut setup = coord_redis_testing::SentinelSetup::start();
    let provider = RedisProvider::sentinel(
        coord_redis_testing::SentinelSetup::MASTER_NAME,
        setup.sentinel_urls(),
    )
    .client(client)
    .command_timeout(Duration::from_secs(3))
    .connect()
    .await
    .expect("connect through Sentinel");
    let c = Coordinator::builder()
        .namespace("noacks-failover")
        .provider(provider)
        .build()
        .expect("coordinator");
    let runs = Runs::default();
    let applied = |s: &coord_redis_testing::RedisServer| {
        replication_field(s, "slave_repl_offset").and_then(|v| v.parse::<u64>().ok())
    };
    let read = |s: &coord_redis_testing::RedisServer| {
        replication_field(s, "slave_read_repl_offset").and_then(|v| v.parse::<u64>().ok())
    };
    let paused = setup
        .replica()
        .command(&["CLIENT", "PAUSE", "60000", "WRITE"]);
    assert_eq!(paused.text().as_deref(), Some("OK"), "{paused:?}");
    let before = replication_field(setup.master(), "master_repl_offset")
        .and_then(|v| v.parse::<u64>().ok())
        .expect("the primary reports its offset");
    assert_eq!(charge_once(&c, 41, runs.clone()).await.unwrap(), 42);
    let written = replication_field(setup.master(), "master_repl_offset")
        .and_then(|v| v.parse::<u64>().ok())
        .expect("the primary reports its offset");
    assert!(written > before, "the record was written after the pause");
    // The record's writes reached the replica, which holds them unapplied.
    await_replication(setup.replica(), "the replica to read the record", |r| {
        read(r).is_some_and(|read| read >= written)
    });
    // A paused replica still applies what is not a write (the stream's `SELECT`), not the
    // record's scripts: its applied offset stays short of what the primary wrote.
    let held = applied(setup.replica()).expect("the replica reports its offset");
    assert!(
        held < written,
        "the paused replica applied the record ({held} of {written} bytes)"
    );
    setup.crash_master();
    await_replication(
        setup.replica(),
        "the replica to see its primary gone",
        |r| replication_field(r, "master_link_status").as_deref() == Some("down"),
    );
    let unpaused = setup.replica().command(&["CLIENT", "UNPAUSE"]);
    assert_eq!(unpaused.text().as_deref(), Some("OK"), "{unpaused:?}");
    setup.await_promotion();
    let deadline = Instant::now() + Duration::from_secs(30);
    let again = loop {
        match charge_once(&c, 41, runs.clone()).await {
            Ok(v) => break v,
            Err(CoordError::Backend(e)) if e.kind().is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(other) => panic!("after the failover: {other:?}"),
        }
    };
    assert_eq!(again, 42);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "without acknowledgement the record died with the primary: the duplicate ran the body again"
    );
}

per_client!(
    an_acknowledged_record_survives_the_primary_crashing,
    without_acks_a_record_is_lost_with_the_crashed_primary,
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
