//! The handle API of cluster-scope single-flight: `coord.single_flight(key).cluster()`.

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::CoordError;
use crate::handle::SingleFlight;
use crate::provider::CallKey;
use crate::runtime::call::Call;
use crate::runtime::cluster_flight::{
    ClusterFlightSpec, DEFAULT_LEASE, cluster_single_flight, opaque_errors, shared_errors,
};
use crate::runtime::spec::OpSpec;
use crate::runtime::state::Coordinator;
use crate::telemetry::OpTelemetry;

/// Single-flight across every instance sharing the provider, configured at run time: from
/// [`SingleFlight::cluster`].
///
/// The same layer as `#[single_flight(scope = "cluster")]`: the calls of this instance
/// coalesce first, then one leader across instances claims the flight for `lease` (renewed
/// while its body runs) and the others receive its outcome. Nothing is remembered after the
/// hand-over ([`CLUSTER_FLIGHT_HAND_OVER`](crate::handle::CLUSTER_FLIGHT_HAND_OVER)): a call that
/// starts after the flight ended runs again. A leader that is cancelled or crashes is replaced
/// by exactly one waiting instance, at once or after its lease. It is an optimisation, not a
/// promise that the body runs once: use [`Coordinator::idempotent`] for that.
///
/// [`run`](ClusterFlight::run) hands `Err` over as [`CoordError::LeaderFailed`];
/// [`run_sharing_errors`](ClusterFlight::run_sharing_errors) hands the error itself over when
/// its type is serde-serializable.
///
/// ```
/// # async fn demo() -> Result<(), coord_core::CoordError> {
/// let coord = coord_core::Coordinator::builder().memory().build().unwrap();
/// let key = coord.key("prices.refresh").part("EURUSD").finish();
/// let price: Result<u64, coord_core::CoordError> = coord
///     .single_flight(key)
///     .cluster()
///     .run(|| async { Ok(108) })
///     .await;
/// assert_eq!(price?, 108);
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "single-flight does nothing until `run` is awaited"]
pub struct ClusterFlight<'c> {
    coordinator: &'c Coordinator,
    key: CallKey,
    lease: Duration,
}

impl<'c> SingleFlight<'c> {
    /// Coalesces across every instance sharing the provider, not only in this process (see
    /// [`ClusterFlight`]).
    pub fn cluster(self) -> ClusterFlight<'c> {
        ClusterFlight {
            coordinator: self.coordinator,
            key: self.key,
            lease: DEFAULT_LEASE,
        }
    }
}

impl ClusterFlight<'_> {
    /// How long the leader's claim lasts if its instance dies: the longest a crashed leader
    /// holds up the others. Renewed every third of it while the body runs. Default 10 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Runs `body`, or receives the outcome of the concurrent run elsewhere. An `Err` of the
    /// leader reaches the other instances as [`CoordError::LeaderFailed`] (converted with
    /// `E: From<CoordError>`); the leader's own callers get it as it is.
    pub async fn run<T, E, F, Fut>(self, body: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned + Clone + Send + 'static,
        E: From<CoordError> + Clone + Send + 'static,
    {
        let op = self.key.operation().unwrap_or("").to_owned();
        let spec = bare_spec(&op);
        let call = Call::with_key(&spec, self.coordinator, self.key);
        call.run(cluster_single_flight(
            &call,
            ClusterFlightSpec { lease: self.lease },
            opaque_errors(),
            call.body(async move { body().await }),
        ))
        .await
    }

    /// Like [`run`](ClusterFlight::run), but an `Err` reaches the other instances as itself,
    /// encoded with the coordinator's codec.
    pub async fn run_sharing_errors<T, E, F, Fut>(self, body: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned + Clone + Send + 'static,
        E: From<CoordError> + Serialize + DeserializeOwned + Clone + Send + 'static,
    {
        let op = self.key.operation().unwrap_or("").to_owned();
        let spec = bare_spec(&op);
        let call = Call::with_key(&spec, self.coordinator, self.key);
        call.run(cluster_single_flight(
            &call,
            ClusterFlightSpec { lease: self.lease },
            shared_errors(),
            call.body(async move { body().await }),
        ))
        .await
    }
}

fn bare_spec(op: &str) -> OpSpec<'_> {
    OpSpec {
        name: op,
        idempotency: None,
        cache: None,
        lock: None,
        telemetry: OpTelemetry::new(),
        record_key: false,
        profile: None,
    }
}
