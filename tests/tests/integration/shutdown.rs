//! `Coordinator::shutdown`: what the process holds is given back, in order, and reported.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::report::LockOutcome;
use coord_core::{
    CoordError, Coordinator, LossCause, distributed_lock, idempotent, lock_lost, observe,
};
use coord_tests::support::lock_is_free;
use tokio::sync::watch;

fn coordinator(ns: &str) -> Coordinator {
    Coordinator::builder()
        .namespace(ns)
        .memory()
        .build()
        .unwrap()
}

#[distributed_lock(name = "sd.job", key_from = "id", coordinator = c)]
async fn job(
    c: &Coordinator,
    id: u32,
    mut gate: watch::Receiver<bool>,
    seen: Arc<AtomicUsize>,
) -> Result<Option<LossCause>, CoordError> {
    tokio::select! {
        cause = lock_lost() => {
            seen.fetch_add(1, Ordering::SeqCst);
            Ok(cause)
        }
        _ = gate.wait_for(|open| *open) => Ok(None),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_held_by_running_bodies_are_released_and_the_bodies_told() {
    let c = coordinator("sd-locks");
    let (_open, gate) = watch::channel(false);
    let seen = Arc::new(AtomicUsize::new(0));
    let mut running = Vec::new();
    for id in 0..3 {
        let (c, gate, seen) = (c.clone(), gate.clone(), seen.clone());
        running.push(tokio::spawn(async move { job(&c, id, gate, seen).await }));
    }
    let handle_guard = c.lock(c.key("sd.manual").finish()).acquire().await.unwrap();
    while c.locks_held() < 4 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let report = c.shutdown(Duration::from_secs(5)).await;
    assert_eq!(report.released.len(), 4, "{report:?}");
    assert!(
        report.not_released.is_empty() && report.lapsed.is_empty(),
        "{report:?}"
    );
    for id in 0..3u32 {
        assert!(lock_is_free(&c, &c.key("sd.job").part(&id).finish()).await);
    }
    for body in running {
        let told = tokio::time::timeout(Duration::from_secs(5), body)
            .await
            .expect("each body hears of the loss")
            .unwrap();
        assert_eq!(told.unwrap(), Some(LossCause::ShutDown));
    }
    assert_eq!(seen.load(Ordering::SeqCst), 3);
    assert!(!handle_guard.is_held());
    assert_eq!(handle_guard.lost().await, LossCause::ShutDown);
    assert!(
        handle_guard.release().await.unwrap(),
        "already given back by shutdown"
    );
    assert_eq!(
        c.metrics().lapsed_releases(),
        0,
        "no release is mistaken for a lapse"
    );
    assert_eq!(c.locks_held(), 0);
    assert!(report.is_clean(), "{report:?}");
}

#[idempotent(name = "sd.charge", key_from = "key", coordinator = c)]
async fn charge(
    c: &Coordinator,
    key: &str,
    mut gate: watch::Receiver<bool>,
) -> Result<u32, CoordError> {
    let _ = gate.wait_for(|open| *open).await;
    Ok(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_shutdown_new_work_is_refused_and_running_markers_are_reported() {
    let c = coordinator("sd-refuse");
    let (open, gate) = watch::channel(false);
    let running = {
        let (c, gate) = (c.clone(), gate.clone());
        tokio::spawn(async move { charge(&c, "k-running", gate).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let report = c.shutdown(Duration::from_millis(200)).await;
    assert_eq!(
        report
            .markers_left
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        vec!["sd.charge:k-running".to_owned()]
    );
    assert!(!report.is_clean());
    assert!(c.is_shut_down());

    let (refused, call) = observe(charge(&c, "k-new", gate.clone())).await;
    assert!(
        matches!(refused, Err(CoordError::ShutDown { .. })),
        "{refused:?}"
    );
    assert!(
        refused.unwrap_err().is_retryable(),
        "another instance can take it"
    );
    assert!(call.idempotency().is_some());
    let (locked, call) = observe(job(&c, 9, gate, Arc::default())).await;
    assert!(
        matches!(locked, Err(CoordError::ShutDown { .. })),
        "{locked:?}"
    );
    assert_eq!(call.lock(), Some(LockOutcome::ShutDown));
    let manual = c.lock(c.key("sd.manual").finish()).try_acquire().await;
    assert!(
        matches!(manual, Err(CoordError::ShutDown { .. })),
        "{manual:?}"
    );

    // The running body still finishes and its outcome is stored.
    open.send(true).unwrap();
    assert_eq!(running.await.unwrap().unwrap(), 1);
}
