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
    let warnings: Vec<String> = recorder
        .warnings()
        .into_iter()
        .filter(|w| w.contains("no coordinator installed"))
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "exactly one warning per process: {warnings:?}"
    );
    assert!(
        warnings[0].contains("within this process only"),
        "names the degradation"
    );
    assert!(warnings[0].contains("install"), "names the fix");
    assert!(Coordinator::current().is_in_process_only());

    let late = Coordinator::builder().memory().build().unwrap().install();
    assert_eq!(
        late,
        Err(BuildError::AlreadyInstalled),
        "installing after use must fail loudly"
    );
}
