//! `coord.single_flight(key)`: `#[single_flight]` (process scope) configured at run time.

use std::future::Future;

use crate::provider::CallKey;
use crate::runtime::call::Call;
use crate::runtime::spec::KeyPrefixCache;
use crate::runtime::spec::OpSpec;
use crate::runtime::state::Coordinator;
use crate::telemetry::OpTelemetry;

/// Single-flight configured at run time: from [`Coordinator::single_flight`].
///
/// Concurrent calls with the same key **in this process** share one run of the body, exactly
/// as `#[single_flight]` does; nothing is remembered after it. If the body panics, every
/// caller sharing it panics too.
#[derive(Debug)]
#[must_use = "single-flight does nothing until `run` is awaited"]
pub struct SingleFlight<'c> {
    pub(crate) coordinator: &'c Coordinator,
    pub(crate) key: CallKey,
}

impl Coordinator {
    /// Single-flight for `key`, configured at run time (see [`SingleFlight`]).
    pub fn single_flight(&self, key: CallKey) -> SingleFlight<'_> {
        SingleFlight {
            coordinator: self,
            key,
        }
    }
}

impl SingleFlight<'_> {
    /// Runs `body`, or joins the run of a concurrent call with the same key and output type.
    pub async fn run<R, F, Fut>(self, body: F) -> R
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = R>,
        R: Clone + Send + 'static,
    {
        let op = self.key.operation().unwrap_or("").to_owned();
        let spec = OpSpec {
            name: &op,
            idempotency: None,
            cache: None,
            lock: None,
            telemetry: OpTelemetry::new(),
            key_prefix: KeyPrefixCache::new(),
            record_key: false,
            profile: None,
        };
        let call = Call::with_key(&spec, self.coordinator, self.key);
        call.run(crate::runtime::flight::single_flight(
            &call,
            call.body(async move { body().await }),
        ))
        .await
    }
}
