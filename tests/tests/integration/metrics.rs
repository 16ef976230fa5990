//! coord's metrics reach whatever `metrics` recorder is installed, with the documented names
//! and labels (layer, op, outcome; never the key).

use std::time::Duration;

use coord_core::{CoordError, Coordinator, distributed_lock, idempotent, single_flight, telemetry};
use coord_tests::metric_series::{counter, histogram_len, series};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

#[distributed_lock(name = "m.lock", key_from = "id", coordinator = c)]
async fn locked(c: &Coordinator, id: u32) -> Result<u32, CoordError> {
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(id)
}

#[idempotent(name = "m.charge", key_from = "key", coordinator = c)]
async fn charge(c: &Coordinator, key: &str) -> Result<String, CoordError> {
    Ok(format!("receipt for {key}"))
}

#[single_flight(name = "m.quote", key_from = "symbol")]
async fn quote(symbol: &str) -> Result<u32, std::sync::Arc<CoordError>> {
    Ok(symbol.len() as u32)
}

#[test]
fn calls_waits_holds_bodies_and_records_are_measured() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        telemetry::describe_metrics();
        let c = Coordinator::builder()
            .namespace("m")
            .memory()
            .build()
            .unwrap();
        assert_eq!(locked(&c, 1).await.unwrap(), 1);
        let held = c
            .lock(c.key("m.lock").part(&2u32).finish())
            .acquire()
            .await
            .unwrap();
        assert!(matches!(
            locked(&c, 2).await,
            Err(CoordError::LockNotAcquired { .. })
        ));
        drop(held);
        charge(&c, "secret-customer-key").await.unwrap();
        charge(&c, "secret-customer-key").await.unwrap();
        quote("ACME").await.unwrap();
    });
    let all = series(&snapshotter);
    assert_eq!(
        counter(
            &all,
            "coord_calls_total{layer=lock,op=m.lock,outcome=acquired}"
        ),
        1
    );
    assert_eq!(
        counter(
            &all,
            "coord_calls_total{layer=lock,op=m.lock,outcome=not_acquired}"
        ),
        1
    );
    assert_eq!(
        counter(
            &all,
            "coord_calls_total{layer=idempotency,op=m.charge,outcome=executed}"
        ),
        1
    );
    assert_eq!(
        counter(
            &all,
            "coord_calls_total{layer=idempotency,op=m.charge,outcome=replayed}"
        ),
        1
    );
    assert_eq!(
        counter(
            &all,
            "coord_calls_total{layer=single_flight,op=m.quote,outcome=led}"
        ),
        1
    );
    // Two attribute waits: one granted, one given up (the handle API does not count here).
    assert_eq!(histogram_len(&all, "coord_lock_wait_seconds{op=m.lock}"), 2);
    match all.get("coord_lock_hold_seconds{op=m.lock}") {
        Some(DebugValue::Histogram(values)) => {
            assert_eq!(values.len(), 1);
            assert!(values[0].0 >= 0.015, "the body held it ~20 ms: {values:?}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        histogram_len(&all, "coord_record_size_bytes{op=m.charge}"),
        1
    );
    // The body ran for the first lock call, the first charge and the quote; not for the
    // refused lock call nor the replay.
    assert_eq!(
        histogram_len(&all, "coord_body_duration_seconds{op=m.lock}"),
        1
    );
    assert_eq!(
        histogram_len(&all, "coord_body_duration_seconds{op=m.charge}"),
        1
    );
    match all.get("coord_locks_held{}") {
        Some(DebugValue::Gauge(held)) => assert_eq!(held.0, 0.0, "every lock was released"),
        other => panic!("{other:?}"),
    }
    for name in all.keys() {
        assert!(
            !name.contains("secret-customer-key"),
            "a key leaked into {name}"
        );
    }
}
