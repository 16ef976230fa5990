//! Every intercepted call gets a `coord` span carrying the op name and each layer's outcome.

use std::sync::Arc;
use std::time::Duration;

use coord_core::{CoordError, Coordinator, distributed_lock, idempotent, single_flight};
use coord_tests::support::{InstrumentedProvider, SpanRecorder};
use tracing_subscriber::layer::SubscriberExt;

#[idempotent(key_from = "id", coordinator = c, name = "obs.charge")]
#[distributed_lock(key_from = "id", fenced = true)]
async fn charge(c: &Coordinator, id: u64) -> Result<u64, CoordError> {
    Ok(id)
}

#[single_flight(key_from = "id")]
async fn shared(id: u64) -> u64 {
    tokio::time::sleep(Duration::from_millis(100)).await;
    id
}

#[distributed_lock(key_from = "id", coordinator = c, name = "obs.lock", wait = "0s")]
async fn hold(c: &Coordinator, id: u64, gate: Arc<tokio::sync::Notify>) -> Result<(), CoordError> {
    gate.notified().await;
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn spans_carry_the_op_and_each_outcome() {
    let recorder = SpanRecorder::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(recorder.clone()));
    let (_, c) = InstrumentedProvider::coordinator("obs");

    charge(&c, 1).await.unwrap();
    charge(&c, 1).await.unwrap();
    let (a, b) = tokio::join!(shared(5), shared(5));
    assert_eq!((a, b), (5, 5));
    let gate = Arc::new(tokio::sync::Notify::new());
    let holder = hold(&c, 9, gate.clone());
    let contender = async {
        tokio::task::yield_now().await;
        let refused = hold(&c, 9, gate.clone()).await;
        gate.notify_one();
        refused
    };
    let (held, refused) = tokio::join!(holder, contender);
    assert!(held.is_ok());
    assert!(refused.is_err());

    let spans = recorder.spans();
    let field = |i: usize, f: &str| spans[i].fields.get(f).cloned().unwrap_or_default();
    assert_eq!(spans.len(), 6, "one span per intercepted call: {spans:?}");
    assert_eq!(field(0, "op"), "obs.charge");
    assert_eq!(field(0, "idempotency"), "executed");
    assert_eq!(field(0, "lock"), "acquired");
    assert!(
        !field(0, "fencing_token").is_empty(),
        "fenced locks record their token"
    );
    assert_eq!(field(1, "idempotency"), "replayed");
    assert_eq!(field(1, "lock"), "", "a replay never reaches the lock");
    assert_eq!(
        field(0, "coord.replay.age_ms"),
        "",
        "a call that ran replays nothing"
    );
    let age: f64 = field(1, "coord.replay.age_ms")
        .parse()
        .unwrap_or_else(|_| panic!("a replay records its record's age: {:?}", spans[1].fields));
    assert!(
        (0.0..60_000.0).contains(&age),
        "the record was stored moments ago, not {age} ms"
    );
    let flights: Vec<String> = (2..4).map(|i| field(i, "single_flight")).collect();
    assert!(
        flights.contains(&"led".to_owned()) && flights.contains(&"joined".to_owned()),
        "{flights:?}"
    );
    assert!(
        field(2, "op").ends_with("::shared"),
        "default name is module path + fn: {}",
        field(2, "op")
    );
    assert_eq!(field(4, "lock"), "acquired");
    assert_eq!(field(5, "lock"), "not_acquired");
}

#[distributed_lock(key_from = "user", coordinator = c, name = "obs.private", record_key = true)]
async fn with_key_recorded(c: &Coordinator, user: &str) -> Result<(), CoordError> {
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn spans_carry_wait_error_type_and_the_key_only_when_asked() {
    let recorder = SpanRecorder::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(recorder.clone()));
    let (_, c) = InstrumentedProvider::coordinator("obs-fields");

    charge(&c, 7).await.unwrap();
    with_key_recorded(&c, "alice").await.unwrap();
    let gate = Arc::new(tokio::sync::Notify::new());
    let holder = hold(&c, 3, gate.clone());
    let contender = async {
        tokio::task::yield_now().await;
        let refused = hold(&c, 3, gate.clone()).await;
        gate.notify_one();
        refused
    };
    let (_, refused) = tokio::join!(holder, contender);
    assert!(refused.is_err());

    let spans = recorder.spans();
    let field = |i: usize, f: &str| spans[i].fields.get(f).cloned().unwrap_or_default();
    assert_eq!(spans.len(), 4, "{spans:?}");
    assert_eq!(
        field(0, "coord.key"),
        "",
        "keys stay off spans unless asked for"
    );
    assert!(
        field(0, "coord.lock.wait_ms").parse::<f64>().is_ok(),
        "the lock's wait is recorded: {:?}",
        spans[0].fields
    );
    assert_eq!(field(1, "coord.key"), "obs.private:alice");
    assert_eq!(field(3, "lock"), "not_acquired");
    assert_eq!(field(3, "error.type"), "lock_not_acquired");
    assert_eq!(
        field(2, "error.type"),
        "",
        "no error on a call that succeeded"
    );
}
