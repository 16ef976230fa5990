//! What the macros emit for one annotated function (and the handle API builds at run time):
//! the operation's name and the options of each layer, resolved at compile time.

use std::sync::OnceLock;
use std::time::Duration;

use crate::policy::{OnAbandoned, OnBackendError, OnLost, OnMissingKey, OnStoreError};
use crate::provider::{CallKey, CallKeyBuilder, KeyPrefix, ReplicaAcks};
use crate::runtime::cache_tiers::CacheSpec;
use crate::telemetry::OpTelemetry;

/// The static description of one annotated function, emitted by the macros.
#[derive(Debug)]
pub struct OpSpec<'a> {
    /// The operation name: `name = ".."`, or the module path and fn name.
    pub name: &'a str,
    /// Present with `#[idempotent]`.
    pub idempotency: Option<IdempotencySpec>,
    /// Present with `#[cached]`.
    pub cache: Option<CacheSpec>,
    /// Present with `#[distributed_lock]`.
    pub lock: Option<LockSpec>,
    /// This operation's metric keys, built on first use.
    pub telemetry: OpTelemetry,
    /// The rendered `namespace:operation` start of this operation's keys, kept on first use
    /// (see [`KeyPrefixCache`]).
    pub key_prefix: KeyPrefixCache,
    /// `record_key = true`: the call's span carries its key.
    pub record_key: bool,
    /// `profile = ".."`: the configured profile whose values override the literals.
    pub profile: Option<&'a str>,
}

/// The rendered start (`namespace:operation`) of one operation's keys, kept with the
/// operation (the attributes keep it in their static spec) after the first call: later calls
/// copy it instead of escaping the namespace and the operation name again, and render only
/// their parts.
///
/// One namespace is kept, the first one seen; a call through a coordinator of another
/// namespace renders its key whole, as before (the key is the same either way).
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct KeyPrefixCache {
    prefix: OnceLock<KeyPrefix>,
}

impl KeyPrefixCache {
    /// Empty: the prefix is rendered on first use.
    pub const fn new() -> KeyPrefixCache {
        KeyPrefixCache {
            prefix: OnceLock::new(),
        }
    }

    /// Starts the key of a call of `operation` (the operation this cache belongs to) in
    /// `namespace`.
    #[inline]
    pub(crate) fn builder(&self, namespace: &str, operation: &str) -> CallKeyBuilder {
        let prefix = match self.prefix.get() {
            Some(prefix) => prefix,
            None => self
                .prefix
                .get_or_init(|| KeyPrefix::new(namespace, operation)),
        };
        if prefix.namespace() == namespace {
            prefix.builder()
        } else {
            CallKey::builder(namespace, operation)
        }
    }
}

/// `#[idempotent]` options, resolved at compile time.
#[derive(Debug, Clone, Copy)]
pub struct IdempotencySpec {
    /// How long a successful outcome is kept.
    pub retention: Duration,
    /// The lease of the in-flight marker.
    pub in_flight_lease: Duration,
    /// How long a duplicate waits for an in-flight call.
    pub wait: Duration,
    /// The attribute's backend-fault policy, if it set one.
    pub on_backend_error: Option<OnBackendError>,
    /// Renew the in-flight marker this often while the body runs.
    pub renew: Option<Duration>,
    /// What to do with the body if the marker's lease is lost.
    pub on_lost: Option<OnLost>,
    /// What a duplicate does with a marker whose lease lapsed without completion.
    pub on_abandoned: OnAbandoned,
    /// What the caller gets when the body's `Ok` outcome could not be stored.
    pub on_store_error: OnStoreError,
    /// What a call whose key has an absent (`None`) part does.
    pub on_missing_key: OnMissingKey,
    /// `replica_acks = ..`: the replica acknowledgement of this operation's claim, completion
    /// and marker renewals, overriding the provider's; `None` leaves the provider's.
    pub replica_acks: Option<ReplicaAcks>,
    /// Which of the durations above were written rather than defaulted.
    pub written: Written,
}

/// `#[distributed_lock]` options, resolved at compile time.
#[derive(Debug, Clone, Copy)]
pub struct LockSpec {
    /// The lease.
    pub lease: Duration,
    /// How long to wait for the lock.
    pub wait: Duration,
    /// Whether acquisitions mint fencing tokens.
    pub fenced: bool,
    /// `0`: a lock (one holder). `n` ≥ 1 (`permits = n`): one permit of a semaphore of `n`
    /// permits, which is always fenced.
    pub permits: u32,
    /// `Some(mode)` (`mode = "read" | "write"`): a hold of a read-write lock in that mode,
    /// which is always fenced. `None`: not a read-write lock.
    pub rw: Option<crate::provider::RwMode>,
    /// The attribute's backend-fault policy, if it set one.
    pub on_backend_error: Option<OnBackendError>,
    /// Renew the lease this often while the body runs.
    pub renew: Option<Duration>,
    /// What to do with the body if the lease is lost.
    pub on_lost: Option<OnLost>,
    /// `replica_acks = ..`: the replica acknowledgement of this operation's grants and
    /// renewals, overriding the provider's; `None` leaves the provider's.
    pub replica_acks: Option<ReplicaAcks>,
    /// Which of the durations above were written rather than defaulted.
    pub written: Written,
}

/// Which options the attribute (or the handle) wrote itself, as opposed to the built-in
/// defaults the macros fill in: a written value beats the configuration's `defaults`, a
/// default does not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Written(u8);

impl Written {
    /// Nothing written: every value is the built-in default.
    pub const NONE: Written = Written(0);
    /// `lease` (locks).
    pub const LEASE: Written = Written(1);
    /// `wait`.
    pub const WAIT: Written = Written(1 << 1);
    /// `retention`.
    pub const RETENTION: Written = Written(1 << 2);
    /// `in_flight_lease`.
    pub const IN_FLIGHT_LEASE: Written = Written(1 << 3);
    /// `renew` (any value, `false` included).
    pub const RENEW: Written = Written(1 << 4);
    /// `renew = true`: every third of the lease in force, recomputed when the lease comes from
    /// configuration.
    pub const RENEW_AUTO: Written = Written(1 << 5);

    /// Both sets.
    #[must_use]
    pub const fn with(self, other: Written) -> Written {
        Written(self.0 | other.0)
    }

    /// Whether every option of `other` is in this set.
    pub const fn has(self, other: Written) -> bool {
        self.0 & other.0 == other.0
    }
}
