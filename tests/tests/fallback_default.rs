//! With no coordinator installed, the attributes run on the in-process provider and say so
//! once per process. (Its own test binary: the default coordinator is process-wide.)

use coord_core::{BuildError, CoordError, Coordinator, distributed_lock, idempotent};
use coord_tests::support::SpanRecorder;
use tracing_subscriber::layer::SubscriberExt;

#[distributed_lock(key_from = "id")]
async fn locked(id: u64) -> Result<u64, CoordError> {
    Ok(id)
}

#[idempotent(key_from = "id")]
async fn once(id: u64) -> Result<u64, CoordError> {
    Ok(id)
}

#[tokio::test]
async fn the_fallback_warns_once_and_names_the_fix() {
    let recorder = SpanRecorder::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(recorder.clone()));
    for i in 0..3 {
        assert_eq!(locked(i).await.unwrap(), i);
        assert_eq!(once(i).await.unwrap(), i);
    }
    assert_eq!(
        recorder.warnings(),
        [
            "coord: no coordinator is installed, so this call and every later one use the \
          in-process provider: locks, single-flight and idempotency hold within this process \
          only. Install one at start-up, before the first call: \
          `coord_redis::coordinator_from_env().await?.install()?` with COORD_REDIS_URL set"
        ],
        "exactly one warning per process, naming what happened and the fix"
    );
    assert!(Coordinator::current().is_in_process_only());

    let late = Coordinator::builder().memory().build().unwrap().install();
    assert_eq!(
        late,
        Err(BuildError::FallbackInUse),
        "installing after use must fail loudly"
    );
    assert_eq!(
        late.unwrap_err().to_string(),
        "an intercepted call already ran on the in-process fallback before this install, and \
         switching providers under running code would split its locks: install the \
         coordinator at start-up, before the first intercepted call"
    );
}
