//! Lease behaviour under Redis faults: a renewed hold whose Redis stops, and an idempotent
//! completion whose caller goes away while the write is pending.
#![cfg(feature = "redis-client")]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::{CoordError, Coordinator, distributed_lock, idempotent, observe};
use coord_redis::RedisProvider;
use coord_redis_testing::RedisServer;

async fn coordinator(server: &RedisServer, ns: &str) -> Coordinator {
    let provider = RedisProvider::builder(server.url())
        .command_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect");
    Coordinator::builder()
        .namespace(ns)
        .provider(provider)
        .build()
        .expect("coordinator")
}

#[distributed_lock(key_from = "id", coordinator = c, name = "faults.hold", lease = "1500ms", renew = true)]
async fn long_hold(
    c: &Coordinator,
    id: u32,
    entered: Arc<tokio::sync::Notify>,
) -> Result<(), CoordError> {
    entered.notify_one();
    tokio::time::sleep(Duration::from_secs(30)).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopping_during_a_renewed_hold_is_a_loss_within_one_lease() {
    let server = RedisServer::start();
    let c = coordinator(&server, "faults-stop").await;
    let entered = Arc::new(tokio::sync::Notify::new());
    let hold = tokio::spawn({
        let (c, entered) = (c.clone(), entered.clone());
        async move { long_hold(&c, 1, entered).await }
    });
    entered.notified().await;
    // Let one renewal succeed, then freeze Redis: renewals now time out.
    tokio::time::sleep(Duration::from_millis(600)).await;
    server.pause();
    let paused_at = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(10), hold)
        .await
        .expect("the body must be cancelled, not left running")
        .unwrap();
    let detected_after = paused_at.elapsed();
    server.resume();
    assert!(
        matches!(outcome, Err(CoordError::LockLost { .. })),
        "got {outcome:?}"
    );
    assert!(
        // The last confirmed renewal was at most one interval before the pause; the margin
        // absorbs timer lateness on a loaded machine.
        detected_after <= Duration::from_millis(1500) + Duration::from_secs(1),
        "lost signal within one lease of the last confirmed renewal: {detected_after:?}"
    );
    assert_eq!(c.active_renewals(), 0);
}

#[idempotent(key_from = "order", coordinator = c, name = "faults.charge")]
async fn charge(
    c: &Coordinator,
    order: u32,
    runs: Arc<AtomicUsize>,
    server_port: u16,
    returned: Arc<tokio::sync::Notify>,
) -> Result<u32, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    // Freeze Redis just before returning, so the completion write is still pending when the
    // caller stops waiting.
    pause_port(server_port);
    returned.notify_one();
    Ok(order * 10)
}

fn pause_port(port: u16) {
    let pid = PAUSED_PID.load(Ordering::SeqCst);
    assert!(pid != 0, "server pid for port {port} not registered");
    // The server is this test's own child process, alive while the test runs.
    let rc = unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
    assert_eq!(rc, 0);
}

static PAUSED_PID: AtomicUsize = AtomicUsize::new(0);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_write_survives_the_caller_going_away() {
    let server = RedisServer::start();
    PAUSED_PID.store(server.pid().unwrap() as usize, Ordering::SeqCst);
    let c = coordinator(&server, "faults-complete").await;
    let runs = Arc::new(AtomicUsize::new(0));
    let returned = Arc::new(tokio::sync::Notify::new());
    tokio::select! {
        _ = charge(&c, 4, runs.clone(), server.port(), returned.clone()) => {
            panic!("the completion cannot finish while Redis is frozen");
        }
        _ = returned.notified() => {
            // Give the call a moment to start its completion write, then drop it.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    server.resume();
    // The detached completion lands: the next call replays instead of charging again.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (out, report) = observe(charge(&c, 4, runs.clone(), 0, Arc::default())).await;
        if report.replayed() {
            assert_eq!(out.unwrap(), 40);
            break;
        }
        assert!(
            matches!(out, Err(CoordError::InFlight { .. })),
            "until it lands the first call is in flight, got {out:?}"
        );
        assert!(Instant::now() < deadline, "the completion write was lost");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
}
