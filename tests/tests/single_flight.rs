//! `#[single_flight]`: coalescing, sharing, takeover, panics and clean-up.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::handle::open_flights;
use coord_core::report::FlightOutcome;
use coord_core::{observe, single_flight};
use tokio::sync::{Mutex, Notify};

/// `open_flights()` counts the whole process: tests that assert on it run one at a time.
static SERIAL: Mutex<()> = Mutex::const_new(());

#[single_flight(key_from = "symbol")]
async fn quote(
    symbol: &str,
    runs: Arc<AtomicUsize>,
    gate: Arc<Notify>,
) -> Result<u64, Arc<String>> {
    runs.fetch_add(1, Ordering::SeqCst);
    gate.notified().await;
    Ok(symbol.len() as u64 * 100)
}

async fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousand_concurrent_callers_run_the_body_once() {
    let _serial = SERIAL.lock().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Notify::new());
    let joined = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..1000 {
        let (runs, gate, joined) = (runs.clone(), gate.clone(), joined.clone());
        tasks.push(tokio::spawn(async move {
            let (out, report) = observe(quote("ACME", runs, gate)).await;
            if report.flight() == Some(FlightOutcome::Joined) {
                joined.fetch_add(1, Ordering::SeqCst);
            }
            out
        }));
    }
    // Let every caller arrive and queue behind the leader before it finishes.
    wait_for("the leader to start", || runs.load(Ordering::SeqCst) == 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    gate.notify_waiters();
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), 400);
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "one body run for 1000 callers"
    );
    assert_eq!(joined.load(Ordering::SeqCst), 999);
    assert_eq!(
        open_flights(),
        0,
        "the flight entry is removed when the flight ends"
    );
}

#[single_flight(key_from = "n")]
async fn failing(n: u32, runs: Arc<AtomicUsize>) -> Result<u32, Arc<String>> {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(100)).await;
    Err(Arc::new(format!("boom {n}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_shared_and_nothing_is_remembered() {
    let _serial = SERIAL.lock().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let (a, b) = tokio::join!(failing(1, runs.clone()), failing(1, runs.clone()));
    assert_eq!(a.unwrap_err().as_str(), "boom 1");
    assert_eq!(b.unwrap_err().as_str(), "boom 1");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the error was shared");
    let _ = failing(1, runs.clone()).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "a later call runs again: nothing is cached"
    );
}

#[single_flight(key_from = "k")]
async fn slow(k: u32, runs: Arc<AtomicUsize>, started: Arc<AtomicUsize>) -> u32 {
    started.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    runs.fetch_add(1, Ordering::SeqCst);
    k * 2
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dropped_leader_is_replaced_by_exactly_one_follower() {
    let _serial = SERIAL.lock().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(AtomicUsize::new(0));
    let leader = tokio::spawn(slow(5, runs.clone(), started.clone()));
    wait_for("the leader to start", || {
        started.load(Ordering::SeqCst) == 1
    })
    .await;
    let mut followers = Vec::new();
    for _ in 0..20 {
        followers.push(tokio::spawn(observe(slow(
            5,
            runs.clone(),
            started.clone(),
        ))));
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    leader.abort();
    assert!(leader.await.unwrap_err().is_cancelled());
    let mut took_over = 0;
    for f in followers {
        let (value, report) = f.await.unwrap();
        assert_eq!(value, 10, "no follower is stranded");
        if report.flight() == Some(FlightOutcome::TookOver) {
            took_over += 1;
        }
    }
    assert_eq!(took_over, 1, "exactly one follower takes over");
    assert_eq!(
        started.load(Ordering::SeqCst),
        2,
        "the leader and one successor started"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "only the successor finished"
    );
    assert_eq!(open_flights(), 0);
}

#[single_flight(key_from = "k")]
async fn explode(k: u32, runs: Arc<AtomicUsize>) -> u32 {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(150)).await;
    panic!("leader bug {k}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_panicking_leader_makes_followers_panic_without_a_stampede() {
    let _serial = SERIAL.lock().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let leader = tokio::spawn(explode(1, runs.clone()));
    wait_for("the leader to start", || runs.load(Ordering::SeqCst) == 1).await;
    let followers: Vec<_> = (0..10)
        .map(|_| tokio::spawn(explode(1, runs.clone())))
        .collect();
    assert!(leader.await.unwrap_err().is_panic());
    for f in followers {
        let err = tokio::time::timeout(Duration::from_secs(10), f)
            .await
            .expect("a follower hung after the leader panicked")
            .unwrap_err();
        assert!(err.is_panic(), "followers get the panic");
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "no follower re-ran the panicking body"
    );
    assert_eq!(open_flights(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_followers_leave_no_entry_behind() {
    let _serial = SERIAL.lock().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(AtomicUsize::new(0));
    let leader = tokio::spawn(slow(9, runs.clone(), started.clone()));
    wait_for("the leader to start", || {
        started.load(Ordering::SeqCst) == 1
    })
    .await;
    let follower = tokio::spawn(slow(9, runs.clone(), started.clone()));
    tokio::time::sleep(Duration::from_millis(20)).await;
    follower.abort();
    leader.abort();
    let _ = (follower.await, leader.await);
    wait_for("the flight entry to go", || open_flights() == 0).await;
}
