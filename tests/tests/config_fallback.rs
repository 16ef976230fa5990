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
    assert_eq!(
        warnings[0],
        "coord: `Coordinator::from_config` built the in-process coordinator (the configuration \
         names no provider), so locks, single-flight and idempotency hold within this process \
         only. To coordinate across processes, add `[provider]` (`kind = \"redis\"`, `url = \
         ..`) to the configuration and build with \
         `coord_redis::coordinator_from_config(&config)`",
        "names what was called, what it means and what to do next"
    );
}
