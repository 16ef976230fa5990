//! Renewal that survives the runtime it started on, and what a lost hold tells the caller.
//!
//! A coordinator can outlive a tokio runtime: a `static` shared by several `#[tokio::test]`s,
//! or a runtime restarted inside a long-lived process. The shared renewal task lives on
//! whichever runtime first needed it; when that runtime goes away, the next call that needs
//! renewing (or a renewing call already running elsewhere) starts it again.

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Duration;

use coord_core::{
    CoordError, Coordinator, LossCause, distributed_lock, fencing_token, is_held, lock_lost,
};
use coord_tests::support::InstrumentedProvider;

#[distributed_lock(key_from = "id", coordinator = c, name = "rt.hold", lease = "300ms", renew = "100ms")]
async fn hold_for(c: &Coordinator, id: u64, body: Duration) -> Result<(), CoordError> {
    tokio::time::sleep(body).await;
    Ok(())
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

#[test]
fn one_coordinator_renews_on_runtimes_used_one_after_the_other() {
    let c = Coordinator::builder()
        .namespace("rt-seq")
        .memory()
        .build()
        .unwrap();
    for round in 0..3u64 {
        // A current-thread runtime dropped right after the call: the renewal task it hosted
        // never gets to see that nothing is left to renew, and is dropped with the runtime.
        let rt = current_thread();
        let out = rt.block_on(hold_for(&c, round, Duration::from_millis(1100)));
        drop(rt);
        assert!(
            out.is_ok(),
            "round {round}: a hold renewing past three leases was lost: {out:?}"
        );
        assert_eq!(c.active_renewals(), 0, "round {round}");
    }
}

#[test]
fn a_hold_keeps_renewing_when_the_runtime_of_the_renewal_task_is_dropped() {
    let c = Coordinator::builder()
        .namespace("rt-drop")
        .memory()
        .build()
        .unwrap();
    let (first_holding, first_held) = mpsc::channel();
    let (drop_first, first_may_drop) = mpsc::channel::<()>();
    // Runtime A takes the first renewing hold, so the renewal task starts there.
    let a = std::thread::spawn({
        let c = c.clone();
        move || {
            let rt = current_thread();
            rt.block_on(async {
                let job = tokio::spawn({
                    let c = c.clone();
                    async move { hold_for(&c, 1, Duration::from_secs(30)).await }
                });
                tokio::time::sleep(Duration::from_millis(50)).await;
                first_holding.send(()).unwrap();
                // Keep runtime A (and the renewal task on it) alive until told.
                tokio::task::spawn_blocking(move || first_may_drop.recv())
                    .await
                    .unwrap()
                    .unwrap();
                job.abort();
            });
            drop(rt);
        }
    });
    first_held.recv().unwrap();
    // Runtime B: a second hold registers with the task running on A.
    let b = std::thread::spawn({
        let c = c.clone();
        move || {
            let rt = current_thread();
            rt.block_on(async {
                let job = tokio::spawn({
                    let c = c.clone();
                    async move { hold_for(&c, 2, Duration::from_millis(1500)).await }
                });
                tokio::time::sleep(Duration::from_millis(100)).await;
                drop_first.send(()).unwrap();
                job.await.unwrap()
            })
        }
    });
    a.join().unwrap();
    let out = b.join().unwrap();
    assert!(
        out.is_ok(),
        "the hold on runtime B renews past five leases after runtime A died: {out:?}"
    );
}

#[distributed_lock(key_from = "id", coordinator = c, name = "rt.lost", lease = "300ms", renew = true)]
async fn long_hold(c: &Coordinator, id: u64) -> Result<(), CoordError> {
    tokio::time::sleep(Duration::from_secs(5)).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_taken_by_another_owner_says_so() {
    let (provider, c) = InstrumentedProvider::coordinator("rt-cause-taken");
    provider.lose_renewals.store(true, Ordering::SeqCst);
    match long_hold(&c, 1).await {
        Err(CoordError::LockLost {
            cause, held_for, ..
        }) => {
            assert_eq!(cause, LossCause::TakenByOther);
            assert!(held_for >= Duration::from_millis(50) && held_for < Duration::from_secs(2));
        }
        other => panic!("expected LockLost, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_the_backend_could_not_confirm_says_unreachable() {
    let (provider, c) = InstrumentedProvider::coordinator("rt-cause-down");
    provider.fail_renewals.store(true, Ordering::SeqCst);
    match long_hold(&c, 1).await {
        Err(err @ CoordError::LockLost { .. }) => {
            let CoordError::LockLost { cause, .. } = &err else {
                unreachable!()
            };
            assert_eq!(*cause, LossCause::BackendUnreachable);
            assert!(
                err.to_string().contains("unreachable"),
                "the message names the cause: {err}"
            );
        }
        other => panic!("expected LockLost, got {other:?}"),
    }
}

#[distributed_lock(key_from = "id", coordinator = c, name = "rt.signal", lease = "300ms", renew = true, on_lost = "signal", fenced = true)]
async fn fenced_watcher(c: &Coordinator, id: u64) -> Result<Seen, CoordError> {
    let before = fencing_token().map(|t| t.get());
    let cause = lock_lost().await;
    Ok(Seen {
        before,
        held_after: is_held(),
        after: fencing_token().map(|t| t.get()),
        cause,
    })
}

/// What the body saw before and after its hold was lost.
struct Seen {
    before: Option<u64>,
    held_after: bool,
    after: Option<u64>,
    cause: Option<LossCause>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_a_hold_is_lost_it_hands_out_no_token() {
    let (provider, c) = InstrumentedProvider::coordinator("rt-token");
    let job = tokio::spawn({
        let c = c.clone();
        async move { fenced_watcher(&c, 1).await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    provider.lose_renewals.store(true, Ordering::SeqCst);
    let Seen {
        before,
        held_after,
        after,
        cause,
    } = tokio::time::timeout(Duration::from_secs(5), job)
        .await
        .expect("the loss is signalled")
        .unwrap()
        .unwrap();
    assert!(before.is_some(), "a fenced hold has a token while held");
    assert!(!held_after, "is_held() is false once lost");
    assert_eq!(after, None, "fencing_token() is None once lost");
    assert_eq!(
        cause,
        Some(LossCause::TakenByOther),
        "the signal carries the cause"
    );
    assert_eq!(lock_lost().await, None, "outside a lock body: nothing held");
}
