//! The handle API of cluster-scope single-flight: `coord.single_flight(key).cluster()`.

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::CoordError;
use crate::handle::SingleFlight;
use crate::provider::{CallKey, ReplicaAcks};
use crate::runtime::call::Call;
use crate::runtime::cluster_flight::{
    ClusterFlightSpec, DEFAULT_LEASE, cluster_single_flight, opaque_errors, shared_errors,
};
use crate::runtime::spec::KeyPrefixCache;
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
    replica_acks: Option<ReplicaAcks>,
}

impl<'c> SingleFlight<'c> {
    /// Coalesces across every instance sharing the provider, not only in this process (see
    /// [`ClusterFlight`]).
    pub fn cluster(self) -> ClusterFlight<'c> {
        ClusterFlight {
            coordinator: self.coordinator,
            key: self.key,
            lease: DEFAULT_LEASE,
            replica_acks: None,
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

    /// Waits for `replicas` replicas to acknowledge the leader's claim and each renewal of it,
    /// for at most `timeout`, whatever the provider's own setting (for
    /// Redis, `RedisProviderBuilder::replica_acks`). A claim too few replicas acknowledged
    /// counts as failed: it is given up, and the call gets a
    /// [`BackendErrorKind::NotReplicated`](crate::provider::BackendErrorKind::NotReplicated)
    /// backend error under `fail_closed` (the body does not run) or runs its body for this
    /// instance's callers only under `fail_open`, as for any fault of the claim. A renewal too
    /// few replicas acknowledged is retried at the next renewal, as a failed one is. `replicas`
    /// of zero is [`without_replica_acks`](Self::without_replica_acks). Default: the provider's
    /// setting. The body itself is not in this setting's scope: a lock it takes follows its
    /// own.
    ///
    /// A provider that does not replicate (the in-process one, PostgreSQL) cannot honour it:
    /// the call is refused with [`CoordError::Unsupported`] naming
    /// [`Capability::ReplicaAcks`](crate::provider::Capability::ReplicaAcks) before anything is
    /// claimed. The timeout must be above zero and below the provider's command timeout (Redis
    /// answers a `Config` error otherwise).
    ///
    /// Not promised: that the hand-over is replicated. The setting is in scope for the
    /// hand-over write too, but the Redis provider does not wait for replicas after it (with
    /// its own setting or this one): a hand-over lost in a failover makes the followers take
    /// over and run the body again once the leader's claim lapses, which a flight allows
    /// anyway, and a `WAIT` would not prevent it.
    pub fn replica_acks(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replica_acks = Some(ReplicaAcks::wait(replicas, timeout));
        self
    }

    /// Does not wait for replicas after this flight's claim and renewals, even when the
    /// provider does by default: a flight only saves duplicate work, so a failover that lets
    /// two instances lead costs one extra run, and the flight stays fast and available while a
    /// replica is away. Accepted by every provider.
    pub fn without_replica_acks(mut self) -> Self {
        self.replica_acks = Some(ReplicaAcks::Off);
        self
    }

    fn spec(&self) -> ClusterFlightSpec {
        ClusterFlightSpec {
            lease: self.lease,
            replica_acks: self.replica_acks,
        }
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
        let flight = self.spec();
        let call = Call::with_key(&spec, self.coordinator, self.key);
        call.run(cluster_single_flight(
            &call,
            flight,
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
        let flight = self.spec();
        let call = Call::with_key(&spec, self.coordinator, self.key);
        call.run(cluster_single_flight(
            &call,
            flight,
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
        key_prefix: KeyPrefixCache::new(),
        record_key: false,
        profile: None,
    }
}
