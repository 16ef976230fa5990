//! `replica_acks` per operation on the in-process provider, which has no replicas: an
//! operation that asks for replicas is refused with `CoordError::Unsupported` before anything
//! is taken or run (never a silent no-op), one that turns waiting off runs, and
//! `require(Capability::ReplicaAcks)` fails the build. Cluster single-flight included. The
//! operations are `coord_history::replica_acks`, the ones the Redis tests use.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::provider::{Capability, ReplicaAcks, replicas};
use coord_core::{
    BuildError, CoordError, Coordinator, OnBackendError, distributed_lock, idempotent,
};
use coord_history::replica_acks::{
    Runs, charge_on, flight_off, flight_on, lock_on, many_on, permit_on, ran, write_on,
};
use coord_tests::support::InstrumentedProvider;

fn coordinator(ns: &str) -> Coordinator {
    Coordinator::builder()
        .namespace(ns)
        .memory()
        .build()
        .unwrap()
}

fn refused(err: &CoordError) {
    match err {
        CoordError::Unsupported {
            capability: Capability::ReplicaAcks,
            ..
        } => {
            let text = err.to_string();
            assert!(
                text.contains("replica_acks") && text.contains("nothing ran"),
                "the message names the option and says nothing ran: {text}"
            );
        }
        other => panic!("expected Unsupported(ReplicaAcks), got {other:?}"),
    }
}

#[idempotent(key_from = "order", coordinator = c, name = "mem.charge_off", replica_acks = 0)]
#[distributed_lock(key_from = "order", coordinator = c, name = "mem.charge_off", replica_acks = 0, renew = true)]
async fn charge_and_lock_off(c: &Coordinator, order: u32, runs: Runs) -> Result<u32, CoordError> {
    ran(&runs, order)
}

/// A cluster flight asking for a replica is refused before it claims or runs anything, on
/// the attribute and the handle alike, and whatever the backend-fault policy: `fail_open`
/// must not turn the refusal into an unguarded run (it is not a fault of the backend).
#[tokio::test]
async fn a_cluster_flight_asking_for_replicas_is_refused_before_anything_runs() {
    for policy in [OnBackendError::FailClosed, OnBackendError::FailOpen] {
        let c = Coordinator::builder()
            .namespace("mem-acks-flight")
            .on_backend_error(policy)
            .memory()
            .build()
            .unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        refused(&flight_on(&c, 1, runs.clone()).await.unwrap_err());
        let flight = |id: u32| {
            c.single_flight(c.key("mem.h.flight").part(&id).finish())
                .cluster()
        };
        // A body that counts its run and answers `n`.
        let counted = |n: u32| {
            let runs = runs.clone();
            move || async move { ran(&runs, n) }
        };
        let wait = Duration::from_millis(500);
        let asked = flight(1).replica_acks(2, wait).run(counted(1)).await;
        refused(&asked.unwrap_err());
        assert_eq!(runs.load(Ordering::SeqCst), 0, "no body ran ({policy:?})");

        // Turned off, on the same keys: the flight runs (nothing was left claimed).
        assert_eq!(flight_off(&c, 1, runs.clone()).await.unwrap(), 1);
        let led = flight(1).without_replica_acks().run(counted(2)).await;
        assert_eq!(led.unwrap(), 2);
        let zero = flight(2).replica_acks(0, wait).run(counted(3)).await;
        assert_eq!(zero.unwrap(), 3, "zero replicas is the same as off");
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }
}

/// The flight's override is in scope for the leader's claim, each renewal and the hand-over
/// write, which a spawned task sends after the caller was answered (a task-local does not
/// follow a spawn by itself), and not in the body's. Checked with `Off`, the override every
/// provider accepts; without an override none is in scope.
#[tokio::test]
async fn a_cluster_flights_override_reaches_its_claim_renewals_and_hand_over_but_not_its_body() {
    for (acks, ns) in [
        (Some(ReplicaAcks::Off), "mem-acks-scope"),
        (None, "mem-acks-scope-none"),
    ] {
        let (provider, c) = InstrumentedProvider::coordinator(ns);
        let flight = c
            .single_flight(c.key("mem.scope").part(&1u32).finish())
            .cluster()
            // Renewed every 100 ms: the body below outlasts a few renewals.
            .lease(Duration::from_millis(300));
        let flight = match acks {
            Some(_) => flight.without_replica_acks(),
            None => flight,
        };
        let in_body = flight
            .run(|| async {
                tokio::time::sleep(Duration::from_millis(600)).await;
                // The outcome is handed over, so it must be serialisable: a flag.
                Ok::<_, CoordError>(replicas::in_scope().is_some())
            })
            .await
            .unwrap();
        assert!(!in_body, "the body is not in the flight's scope");
        // Shutdown waits for the hand-over write still under way in the background.
        c.shutdown(Duration::from_secs(10)).await;
        let seen = provider.flight_acks_seen.lock().unwrap().clone();
        for what in ["claim", "renew", "finish"] {
            assert!(
                seen.iter().any(|(w, _)| *w == what),
                "no {what} was sent: {seen:?}"
            );
        }
        assert!(
            seen.iter().all(|(_, found)| *found == acks),
            "each write carries {acks:?}: {seen:?}"
        );
    }
}

#[tokio::test]
async fn an_operation_asking_for_replicas_is_refused_before_anything_runs() {
    let c = coordinator("mem-acks");
    assert!(!c.supports(Capability::ReplicaAcks));
    let runs = Arc::new(AtomicUsize::new(0));
    refused(&lock_on(&c, 1, runs.clone()).await.unwrap_err());
    refused(&permit_on(&c, 1, runs.clone()).await.unwrap_err());
    refused(&write_on(&c, 1, runs.clone()).await.unwrap_err());
    refused(&many_on(&c, vec![1, 2], runs.clone()).await.unwrap_err());
    refused(&charge_on(&c, 1, runs.clone()).await.unwrap_err());
    assert_eq!(runs.load(Ordering::SeqCst), 0, "no body ran");

    let wait = Duration::from_millis(500);
    let key = |op: &str| c.key(op).part(&1u32).finish();
    refused(
        &c.lock(key("mem.h.lock"))
            .replica_acks(1, wait)
            .acquire()
            .await
            .unwrap_err(),
    );
    refused(
        &c.semaphore(key("mem.h.permit"), 2)
            .replica_acks(1, wait)
            .acquire()
            .await
            .unwrap_err(),
    );
    refused(
        &c.rw_lock(key("mem.h.rw"))
            .replica_acks(1, wait)
            .run_read(|| async { Ok::<_, CoordError>(()) })
            .await
            .unwrap_err(),
    );
    refused(
        &c.multi_lock([key("mem.h.a"), key("mem.h.b")])
            .replica_acks(1, wait)
            .acquire()
            .await
            .unwrap_err(),
    );
    let ran = Arc::new(AtomicUsize::new(0));
    let counted = ran.clone();
    refused(
        &c.idempotent(key("mem.h.charge"))
            .replica_acks(1, wait)
            .run(|| async move {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok::<_, CoordError>(1u32)
            })
            .await
            .unwrap_err(),
    );
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "the handle's body did not run"
    );

    // Nothing was taken: the same keys are free for a call without the override.
    assert!(
        c.lock(key("mem.h.lock"))
            .try_acquire()
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        c.lock(c.key("op.lock").part(&1u32).finish())
            .try_acquire()
            .await
            .unwrap()
            .is_some()
    );
}

/// Takes `lock` and releases it; whether the release found the lock still held.
async fn taken_and_released(lock: coord_core::handle::Lock<'_>) -> bool {
    let guard = lock.acquire().await.unwrap();
    guard.release().await.unwrap()
}

#[tokio::test]
async fn turning_waiting_off_runs_on_any_provider() {
    let c = coordinator("mem-acks-off");
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(charge_and_lock_off(&c, 3, runs.clone()).await.unwrap(), 3);
    assert_eq!(
        charge_and_lock_off(&c, 3, runs.clone()).await.unwrap(),
        3,
        "a replay"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let key = c.key("mem.h.off").part(&1u32).finish();
    assert!(taken_and_released(c.lock(key.clone()).without_replica_acks()).await);
    // Zero replicas is the same as off.
    assert!(taken_and_released(c.lock(key).replica_acks(0, Duration::from_millis(500))).await);
    assert_eq!(
        ReplicaAcks::wait(0, Duration::from_secs(1)),
        ReplicaAcks::Off
    );
}

#[test]
fn requiring_replica_acks_fails_the_build_of_an_in_process_coordinator() {
    let err = Coordinator::builder()
        .memory()
        .require(Capability::ReplicaAcks)
        .build()
        .unwrap_err();
    assert!(
        matches!(
            err,
            BuildError::Unsupported {
                capability: Capability::ReplicaAcks
            }
        ),
        "{err:?}"
    );
}
