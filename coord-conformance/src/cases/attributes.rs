//! The lock and idempotency promises through `#[distributed_lock]` and `#[idempotent]`:
//! contending tasks never overlap and see increasing fencing tokens, duplicates run once,
//! errors are not remembered, refused callers never run their body, cancelled holders release.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::provider::OwnerToken;
use coord_core::{CallKey, CoordError, Coordinator, distributed_lock, fencing_token, idempotent};

use super::durations::LONG;
use super::requests::lock_req;

#[distributed_lock(key_from = "slot", lease = "30s", wait = "30s", fenced = true, coordinator = coord)]
async fn exclusive_section(
    coord: &Coordinator,
    slot: u32,
    inside: Arc<AtomicUsize>,
    overlaps: Arc<AtomicUsize>,
    tokens: Arc<std::sync::Mutex<Vec<u64>>>,
) -> Result<(), CoordError> {
    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
        overlaps.fetch_add(1, Ordering::SeqCst);
    }
    let token = fencing_token().expect("fenced lock exposes its token");
    tokens.lock().unwrap().push(token.get());
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_micros(200)).await;
    inside.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

/// 64 tasks hammering one lock never overlap, and see strictly increasing fencing tokens in
/// the order they held it.
pub async fn attribute_lock_excludes_and_fences(c: Coordinator) {
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (c, inside, overlaps, tokens) =
            (c.clone(), inside.clone(), overlaps.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                exclusive_section(&c, 7, inside.clone(), overlaps.clone(), tokens.clone())
                    .await
                    .expect("every task gets the lock within its wait");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two holders were inside at once"
    );
    let tokens = tokens.lock().unwrap();
    assert_eq!(tokens.len(), 256);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens must increase in holder order"
    );
}

#[idempotent(key_from = "request", fingerprint = ["amount"], wait = "20s", coordinator = coord)]
async fn charge_once(
    coord: &Coordinator,
    request: &str,
    amount: u64,
    runs: Arc<AtomicU64>,
) -> Result<String, CoordError> {
    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(format!("receipt-{amount}-run-{n}"))
}

/// Sequential and concurrent duplicates run the body once and all get the same result; a
/// reuse of the key with another amount is refused.
pub async fn attribute_idempotent_duplicates_run_once(c: Coordinator) {
    let runs = Arc::new(AtomicU64::new(0));
    let first = charge_once(&c, "req-1", 100, runs.clone()).await.unwrap();
    let again = charge_once(&c, "req-1", 100, runs.clone()).await.unwrap();
    assert_eq!(first, again, "a sequential duplicate replays");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let concurrent = futures_join_all((0..16).map(|_| {
        let (c, runs) = (c.clone(), runs.clone());
        async move { charge_once(&c, "req-2", 5, runs).await }
    }))
    .await;
    let results: Vec<String> = concurrent.into_iter().map(|r| r.unwrap()).collect();
    assert!(
        results.windows(2).all(|w| w[0] == w[1]),
        "all duplicates share one result"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "16 concurrent duplicates ran once"
    );

    let reused = charge_once(&c, "req-1", 999, runs.clone()).await;
    assert!(
        matches!(reused, Err(CoordError::KeyReused { .. })),
        "a different amount under the same key is refused, got {reused:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[idempotent(key_from = "request", coordinator = coord)]
async fn flaky(
    coord: &Coordinator,
    request: u32,
    fail: bool,
    runs: Arc<AtomicU64>,
) -> Result<u32, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    if fail {
        Err(CoordError::InFlight {
            key: CallKey::builder("conformance", "a-user-error-standing-in").finish(),
        })
    } else {
        Ok(request)
    }
}

/// An `Err` leaves no trace: the next call runs.
pub async fn attribute_idempotent_errors_are_not_remembered(c: Coordinator) {
    let runs = Arc::new(AtomicU64::new(0));
    assert!(flaky(&c, 1, true, runs.clone()).await.is_err());
    assert_eq!(flaky(&c, 1, false, runs.clone()).await.unwrap(), 1);
    assert_eq!(
        flaky(&c, 1, true, runs.clone()).await.unwrap(),
        1,
        "now replayed"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[distributed_lock(key_from = "slot", wait = "0s", coordinator = coord)]
async fn hold_until(
    coord: &Coordinator,
    slot: u32,
    entered: Arc<AtomicBool>,
    release: Arc<tokio::sync::Notify>,
) -> Result<(), CoordError> {
    entered.store(true, Ordering::SeqCst);
    release.notified().await;
    Ok(())
}

/// A caller that cannot acquire within `wait` gets `LockNotAcquired` and its body never runs;
/// a cancelled holder's lock is released promptly.
pub async fn attribute_lock_refusal_and_cancellation(c: Coordinator) {
    let entered = Arc::new(AtomicBool::new(false));
    let gate = Arc::new(tokio::sync::Notify::new());
    let holder = tokio::spawn({
        let (c, entered, gate) = (c.clone(), entered.clone(), gate.clone());
        async move { hold_until(&c, 1, entered, gate).await }
    });
    while !entered.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let second_entered = Arc::new(AtomicBool::new(false));
    let refused = hold_until(&c, 1, second_entered.clone(), gate.clone()).await;
    assert!(
        matches!(refused, Err(CoordError::LockNotAcquired { .. })),
        "got {refused:?}"
    );
    assert!(
        !second_entered.load(Ordering::SeqCst),
        "the refused body must not run"
    );

    holder.abort();
    let _ = holder.await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let probe = OwnerToken::new();
        let k = key_of(&c, concat!(module_path!(), "::hold_until"), 1);
        let got = c
            .lock_provider()
            .acquire(lock_req(&k, probe, LONG, Duration::ZERO))
            .await
            .unwrap();
        if got.is_some() {
            c.lock_provider().release(&k, probe).await.unwrap();
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cancelled holder's lock was not released promptly (lease is 30 s)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn key_of(c: &Coordinator, op: &str, part: u32) -> CallKey {
    c.key(op).part(&part).finish()
}

async fn futures_join_all<F: Future + Send + 'static>(
    futs: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("task panicked"));
    }
    out
}
