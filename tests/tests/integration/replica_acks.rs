//! `replica_acks` per operation on the in-process provider, which has no replicas: an
//! operation that asks for replicas is refused with `CoordError::Unsupported` before anything
//! is taken or run (never a silent no-op), one that turns waiting off runs, and
//! `require(Capability::ReplicaAcks)` fails the build.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::provider::{Capability, ReplicaAcks};
use coord_core::{BuildError, CoordError, Coordinator, distributed_lock, idempotent};

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

#[distributed_lock(key_from = "id", coordinator = c, name = "mem.lock", replica_acks = 1, replica_acks_timeout = "500ms")]
async fn lock_on(c: &Coordinator, id: u32, runs: Arc<AtomicUsize>) -> Result<u32, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(id)
}

#[distributed_lock(key_from = "id", coordinator = c, name = "mem.permit", permits = 2, replica_acks = 2, replica_acks_timeout = "500ms")]
async fn permit_on(c: &Coordinator, id: u32, runs: Arc<AtomicUsize>) -> Result<u32, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(id)
}

#[distributed_lock(key_from = "id", coordinator = c, name = "mem.rw", mode = "write", replica_acks = 1, replica_acks_timeout = "500ms")]
async fn write_on(c: &Coordinator, id: u32, runs: Arc<AtomicUsize>) -> Result<u32, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(id)
}

#[distributed_lock(key_from_each = "ids", coordinator = c, name = "mem.many", replica_acks = 1, replica_acks_timeout = "500ms")]
async fn many_on(
    c: &Coordinator,
    ids: Vec<u32>,
    runs: Arc<AtomicUsize>,
) -> Result<u32, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(ids.len() as u32)
}

#[idempotent(key_from = "order", coordinator = c, name = "mem.charge", replica_acks = 1, replica_acks_timeout = "500ms")]
async fn charge_on(c: &Coordinator, order: u32, runs: Arc<AtomicUsize>) -> Result<u32, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(order)
}

#[idempotent(key_from = "order", coordinator = c, name = "mem.charge_off", replica_acks = 0)]
#[distributed_lock(key_from = "order", coordinator = c, name = "mem.charge_off", replica_acks = 0, renew = true)]
async fn charge_off(
    c: &Coordinator,
    order: u32,
    runs: Arc<AtomicUsize>,
) -> Result<u32, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(order)
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
        c.lock(c.key("mem.lock").part(&1u32).finish())
            .try_acquire()
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn turning_waiting_off_runs_on_any_provider() {
    let c = coordinator("mem-acks-off");
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(charge_off(&c, 3, runs.clone()).await.unwrap(), 3);
    assert_eq!(
        charge_off(&c, 3, runs.clone()).await.unwrap(),
        3,
        "a replay"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let key = c.key("mem.h.off").part(&1u32).finish();
    let guard = c
        .lock(key.clone())
        .without_replica_acks()
        .acquire()
        .await
        .unwrap();
    assert!(guard.release().await.unwrap());
    // Zero replicas is the same as off.
    let guard = c
        .lock(key)
        .replica_acks(0, Duration::from_millis(500))
        .acquire()
        .await
        .unwrap();
    assert!(guard.release().await.unwrap());
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
