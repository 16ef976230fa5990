//! Cancellation safety at every await: a call dropped after N polls, for every N until it
//! completes on its own, leaves its key free, no renewal registered, and nothing in the
//! provider but what the docs allow (see [`cancellation`](crate::cancellation)).
//!
//! Each case sweeps its layers twice on the coordinator it is given: first as it comes (the
//! provider's first calls, its pooled connections not yet used), then warm, after calls that
//! completed. A provider's tests sweep cold processes too, with a new provider per drop point,
//! through [`crate::cancellation::sweep`] directly.

use coord_core::{Coordinator, OnAbandoned};

use crate::cancellation::{Layer, sweep};

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

/// `#[idempotent]`, under both `on_abandoned` settings, with and without marker renewal: a
/// call dropped before its body started leaves no marker; one dropped in its body leaves the
/// key free under `"rerun"` and the documented in-flight, then abandoned, record under
/// `"fail"`.
pub async fn cancellation_idempotent_leaves_no_marker(c: Coordinator) {
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
