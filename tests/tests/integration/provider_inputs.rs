//! Hostile inputs to the in-process provider, beyond what the conformance suite can ask of
//! every provider: through the attributes (the runtime's fast path into the provider), and
//! the answers only this provider gives exactly (the winner named in `Superseded`).

use coord_core::CallKey;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::memory::MemoryProvider;
use coord_core::provider::{
    ClaimOutcome, ClaimRequest, CompleteOutcome, CompleteRequest, IdempotencyStore, LockProvider,
    LockRequest, OwnerToken,
};
use coord_core::{CoordError, Coordinator, distributed_lock};

fn coordinator(ns: &str) -> Coordinator {
    Coordinator::builder()
        .namespace(ns)
        .memory()
        .build()
        .expect("memory coordinator")
}

/// Holds the lock until `gate` is notified. Its wait is `i64::MAX` ms, the longest the macro
/// accepts: "wait until acquired or cancelled".
#[distributed_lock(key_from = "slot", wait = "9223372036854775807ms", coordinator = c)]
async fn forever_section(
    c: &Coordinator,
    slot: u32,
    entered: Arc<AtomicUsize>,
    gate: Arc<tokio::sync::Notify>,
) -> Result<(), CoordError> {
    entered.fetch_add(1, Ordering::SeqCst);
    gate.notified().await;
    Ok(())
}

/// An `i64::MAX` ms wait through the attribute waits for the holder, a cancelled one leaves
/// the key working, and the next is admitted when the holder leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attribute_with_an_endless_wait_waits_and_cancels_cleanly() {
    let c = coordinator("inputs-forever");
    let entered = Arc::new(AtomicUsize::new(0));
    let first_gate = Arc::new(tokio::sync::Notify::new());
    let holder = tokio::spawn({
        let (c, entered, gate) = (c.clone(), entered.clone(), first_gate.clone());
        async move { forever_section(&c, 1, entered, gate).await }
    });
    while entered.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let never = Arc::new(tokio::sync::Notify::new());
    let cancelled = tokio::time::timeout(
        Duration::from_millis(300),
        forever_section(&c, 1, entered.clone(), never),
    )
    .await;
    assert!(
        cancelled.is_err(),
        "the endless wait returned: {cancelled:?}"
    );
    assert_eq!(
        entered.load(Ordering::SeqCst),
        1,
        "only the holder is inside"
    );

    let second_gate = Arc::new(tokio::sync::Notify::new());
    let next = tokio::spawn({
        let (c, entered, gate) = (c.clone(), entered.clone(), second_gate.clone());
        async move { forever_section(&c, 1, entered, gate).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(entered.load(Ordering::SeqCst), 1, "the next caller waits");
    first_gate.notify_one();
    holder.await.unwrap().unwrap();
    let admitted = tokio::time::timeout(Duration::from_secs(10), async {
        while entered.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(
        admitted.is_ok(),
        "the waiter was not admitted after the release"
    );
    second_gate.notify_one();
    tokio::time::timeout(Duration::from_secs(10), next)
        .await
        .expect("the admitted caller finishes")
        .unwrap()
        .unwrap();
    assert_eq!(
        c.lock_provider()
            .acquire(LockRequest {
                key: &CallKey::builder("inputs-forever", "probe").finish(),
                owner: OwnerToken::new(),
                lease: Duration::MAX,
                wait: Duration::MAX,
                fenced: true,
            })
            .await
            .unwrap()
            .map(|g| g.contended),
        Some(false),
        "another key of the same table still answers"
    );
}

/// Many tasks cancel `Duration::MAX` waits on the same key at random moments, while the holder
/// changes hands: every shard stays usable, and the table ends empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_endless_waiters_never_wedge_the_table() {
    let provider = Arc::new(MemoryProvider::new());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let (p, stop) = (provider.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut granted = 0usize;
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let me = OwnerToken::new();
                let key = CallKey::builder("hot", "op").part(&(i % 3)).finish();
                let attempt = p.acquire(LockRequest {
                    key: &key,
                    owner: me,
                    lease: Duration::MAX,
                    wait: Duration::MAX,
                    fenced: true,
                });
                // Cancel after 0..=3 ms, a different moment for each task and round.
                let cut = Duration::from_millis((t + i) % 4);
                if let Ok(grant) = tokio::time::timeout(cut, attempt).await {
                    assert!(grant.unwrap().is_some(), "an endless wait is never refused");
                    granted += 1;
                    tokio::task::yield_now().await;
                }
                // The runtime's follow-up, granted or cancelled.
                p.release(&key, me).await.unwrap();
                i += 1;
            }
            granted
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    let mut granted = 0;
    for task in tasks {
        granted += tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("a task is stuck: a wedged key")
            .unwrap();
    }
    assert!(granted > 0, "nobody ever got the lock");
    assert_eq!(provider.lock_keys(), 0, "every key was released");
}

/// The in-process provider always knows who superseded a late completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn superseded_names_the_other_owner() {
    let provider = MemoryProvider::new();
    let (late, winner) = (OwnerToken::new(), OwnerToken::new());
    let k = CallKey::builder("ns", "op").part(&1).finish();
    let claim = |owner, lease| ClaimRequest {
        key: &k,
        owner,
        in_flight_lease: lease,
        fingerprint: None,
        keep_abandoned_for: None,
        transactional: false,
    };
    let complete = |owner| CompleteRequest {
        key: &k,
        owner,
        payload: Arc::from(&b"v"[..]),
        retention: Duration::MAX,
        fingerprint: None,
    };
    assert_eq!(
        provider
            .claim(claim(late, Duration::from_millis(50)))
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        provider.claim(claim(winner, Duration::MAX)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert_eq!(
        provider.complete(complete(late)).await.unwrap(),
        CompleteOutcome::Superseded {
            other: Some(winner),
            completed: false
        }
    );
    assert_eq!(
        provider.complete(complete(winner)).await.unwrap(),
        CompleteOutcome::Stored
    );
    assert_eq!(
        provider.complete(complete(late)).await.unwrap(),
        CompleteOutcome::Superseded {
            other: Some(winner),
            completed: true
        }
    );
}
