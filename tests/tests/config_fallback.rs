//! A configuration without a provider gives the in-process coordinator and says so once per
//! process, naming the fix; `kind = "memory"` chooses it without a warning. (Its own test
//! binary: the warning is once per process.)

use coord_core::config::ProviderConfig;
use coord_core::{CoordConfig, Coordinator};
use coord_tests::support::SpanRecorder;
use tracing_subscriber::layer::SubscriberExt;

#[test]
fn no_provider_warns_once_and_names_the_fix() {
    let recorder = SpanRecorder::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(recorder.clone()));

    let explicit = CoordConfig {
        provider: Some(ProviderConfig::Memory),
        ..CoordConfig::default()
    };
    assert!(
        Coordinator::from_config(&explicit)
            .unwrap()
            .is_in_process_only()
    );
    assert!(recorder.warnings().is_empty(), "{:?}", recorder.warnings());

    for _ in 0..3 {
        let c = Coordinator::from_config(&CoordConfig::default()).unwrap();
        assert!(c.is_in_process_only());
    }
    let warnings = recorder.warnings();
    assert_eq!(
        warnings.len(),
        1,
        "exactly one warning per process: {warnings:?}"
    );
    assert!(
        warnings[0].contains("within this process only"),
        "{}",
        warnings[0]
    );
    assert!(
        warnings[0].contains("COORD_REDIS_URL"),
        "names the fix: {}",
        warnings[0]
    );
}
