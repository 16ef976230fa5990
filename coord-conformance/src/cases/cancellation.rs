//! Cancellation safety at every await: a call dropped after N polls, for every N until it
//! completes on its own, leaves its key free, no renewal registered, and nothing in the
//! provider but what the docs allow (see [`cancellation`](crate::cancellation)).
//!
//! Each case sweeps its layers twice on the coordinator it is given: first as it comes (the
//! provider's first calls, its pooled connections not yet used), then warm, after calls that
//! completed. A provider's tests sweep cold processes too, with a new provider per drop point,
//! through [`crate::cancellation::sweep`] directly.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::provider::RecordStatus;
use coord_core::{CoordError, Coordinator, OnAbandoned, distributed_lock, idempotent};

use crate::cancellation::{LEASE, Layer, SETTLE_LIMIT, sweep};

/// Sweeps `layers` on `c`, as given and then warm.
async fn sweep_twice(c: &Coordinator, layers: &[Layer]) {
    for tag in ["first", "warm"] {
        for &layer in layers {
            let s = sweep(layer, tag, |_| std::future::ready(c.clone())).await;
            // The body suspends once, so every call has at least one drop point: a sweep that
            // dropped nothing would prove nothing.
            assert!(
                s.drop_points > 0,
                "{layer:?}: the call completed at its first poll; no drop point was swept"
            );
        }
    }
}

#[idempotent(key_from = "order", name = "cancellation.charge", in_flight_lease = "30s", on_abandoned = "fail", coordinator = c)]
#[distributed_lock(key_from = "order", lease = "30s", wait = "30s", coordinator = c)]
async fn charge_under_lock(
    c: &Coordinator,
    order: u32,
    runs: Arc<AtomicUsize>,
) -> Result<u32, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(order)
}

/// `#[idempotent(on_abandoned = "fail")]` over `#[distributed_lock]`: a call dropped while it
/// waits for the lock (its marker claimed, its body not started) leaves no marker, so once the
/// lock is free the next call runs, instead of `OutcomeUnknown` for a body that never ran.
async fn dropped_while_waiting_for_the_lock_leaves_no_marker(c: &Coordinator) {
    let order = 7;
    let lock_key = c.key("cancellation.charge").part(&order).finish();
    let held = c
        .lock(lock_key.clone())
        .lease(LEASE)
        .acquire()
        .await
        .expect("the lock is free at first");
    let runs = Arc::new(AtomicUsize::new(0));
    // The call is dropped only once its marker is claimed (the state under test: marker
    // there, body not started), however long that takes; a drop before the claim would pass
    // without testing anything.
    {
        let mut waiting = std::pin::pin!(charge_under_lock(c, order, runs.clone()));
        let marker_claimed = async {
            loop {
                let record = c.operations().inspect_record(&lock_key).await;
                if let Ok(Some(info)) = record
                    && info.status == RecordStatus::InFlight
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::select! {
            answer = &mut waiting => {
                panic!("the call answered {answer:?} while its lock was held by another")
            }
            () = marker_claimed => {}
            () = tokio::time::sleep(SETTLE_LIMIT) => {
                panic!("the call never claimed its marker within {SETTLE_LIMIT:?}")
            }
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the body ran while the lock was held by another"
    );
    held.release().await.expect("releasing the lock");
    let until = std::time::Instant::now() + SETTLE_LIMIT;
    loop {
        match charge_under_lock(c, order, runs.clone()).await {
            Ok(got) => {
                assert_eq!(got, order);
                break;
            }
            Err(CoordError::InFlight { .. }) if std::time::Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(err) => panic!(
                "a call dropped while waiting for its lock, before its body ran, left the key answering {err:?}"
            ),
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "only the second call ran its body"
    );
}

/// `#[idempotent]`, under both `on_abandoned` settings, with and without marker renewal: a
/// call dropped before its body started leaves no marker (also when it was waiting for a lock
/// inside the idempotent layer); one dropped in its body leaves the key free under `"rerun"`
/// and the documented in-flight, then abandoned, record under `"fail"`.
pub async fn cancellation_idempotent_leaves_no_marker(c: Coordinator) {
    dropped_while_waiting_for_the_lock_leaves_no_marker(&c).await;
    let layers = [
        (OnAbandoned::Rerun, false),
        (OnAbandoned::Fail, false),
        (OnAbandoned::Rerun, true),
        (OnAbandoned::Fail, true),
    ]
    .map(|(on_abandoned, renewing)| Layer::Idempotent {
        on_abandoned,
        renewing,
    });
    sweep_twice(&c, &layers).await;
}

/// `#[distributed_lock]`, with and without renewal: a dropped call leaves the lock free and no
/// renewal registered.
pub async fn cancellation_lock_leaves_no_holder(c: Coordinator) {
    sweep_twice(
        &c,
        &[
            Layer::Lock { renewing: false },
            Layer::Lock { renewing: true },
        ],
    )
    .await;
}

/// `#[single_flight]`, process and cluster scope: a dropped leader leaves no flight behind;
/// the next call runs at once, and the cluster claim can be taken by another owner.
pub async fn cancellation_flights_leave_nothing_registered(c: Coordinator) {
    sweep_twice(&c, &[Layer::ProcessFlight, Layer::ClusterFlight]).await;
}

/// `#[cached(scope = "shared")]`: a dropped call leaves nothing that holds up the next one.
pub async fn cancellation_cached_shared_leaves_nothing(c: Coordinator) {
    sweep_twice(&c, &[Layer::CachedShared]).await;
}
