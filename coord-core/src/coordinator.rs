//! The front door of a [`Coordinator`]: its builder, the process-wide default, keys, and
//! coordinators from configuration. (The coordinator's state, which the runtime reads, is in
//! `runtime/state.rs`.)

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use coord_memory::MemoryProvider;

use crate::codec::Codec;
use crate::config::{ConfigError, CoordConfig, Profile, ProviderConfig};
use crate::error::BuildError;
use crate::policy::OnBackendError;
use crate::provider::{
    CacheStore, CallKey, CallKeyBuilder, FlightStore, IdempotencyStore, LockProvider, Operations,
    Provider,
};
use crate::runtime::state::{Coordinator, Parts};

/// The provider a builder was given, seen through both traits.
struct ChosenProvider {
    locks: Arc<dyn LockProvider>,
    records: Arc<dyn IdempotencyStore>,
    operations: Arc<dyn Operations>,
    cache: Arc<dyn CacheStore>,
    flights: Arc<dyn FlightStore>,
    /// Set for the in-process provider: exclusion holds within this process only.
    in_process: bool,
}

/// Builds a [`Coordinator`].
#[must_use]
pub struct CoordinatorBuilder {
    namespace: Option<String>,
    provider: Option<ChosenProvider>,
    codec: Codec,
    on_backend_error: OnBackendError,
    defaults: Profile,
    profiles: BTreeMap<String, Profile>,
}

impl fmt::Debug for CoordinatorBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoordinatorBuilder")
            .field("namespace", &self.namespace)
            .field("codec", &self.codec)
            .field("on_backend_error", &self.on_backend_error)
            .finish_non_exhaustive()
    }
}

impl CoordinatorBuilder {
    /// The prefix that keeps this service's keys apart from others sharing the backend.
    /// Defaults to `COORD_NAMESPACE`, else the binary's name
    /// ([`default_namespace`](crate::config::default_namespace)).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Coordinates inside this process only (the in-process provider).
    pub fn memory(mut self) -> Self {
        let provider = Arc::new(MemoryProvider::new());
        self.provider = Some(ChosenProvider {
            locks: provider.clone(),
            records: provider.clone(),
            operations: provider.clone(),
            cache: provider.clone(),
            flights: provider.clone(),
            in_process: true,
        });
        self
    }

    /// Coordinates through `provider` (for instance a Redis provider).
    pub fn provider<P: Provider>(mut self, provider: P) -> Self {
        let provider = Arc::new(provider);
        self.provider = Some(ChosenProvider {
            locks: provider.clone(),
            records: provider.clone(),
            operations: provider.clone(),
            cache: provider.clone(),
            flights: provider,
            in_process: false,
        });
        self
    }

    /// How stored outcomes of `#[idempotent]` calls are encoded: [`Codec::Tagged`] (exact
    /// replays) by default, [`Codec::Json`] for records readable in the backend.
    pub fn codec(mut self, codec: Codec) -> Self {
        self.codec = codec;
        self
    }

    /// The backend-fault policy of attributes that do not set `on_backend_error` themselves.
    /// `FailClosed` by default.
    pub fn on_backend_error(mut self, policy: OnBackendError) -> Self {
        self.on_backend_error = policy;
        self
    }

    /// Finishes the coordinator. Fails on an invalid namespace, on a default or profile coord
    /// cannot honour ([`BuildError::InvalidSetting`]), or without a provider.
    pub fn build(self) -> Result<Coordinator, BuildError> {
        let namespace = self
            .namespace
            .unwrap_or_else(crate::config::default_namespace);
        validate_namespace(&namespace)?;
        let invalid = |(field, reason)| BuildError::InvalidSetting { field, reason };
        crate::config::check_profile("defaults", &self.defaults).map_err(invalid)?;
        for (name, profile) in &self.profiles {
            crate::config::check_profile_name(name).map_err(|reason| {
                BuildError::InvalidSetting {
                    field: format!("profiles.{name}"),
                    reason,
                }
            })?;
            crate::config::check_profile(&format!("profiles.{name}"), profile).map_err(invalid)?;
        }
        // The backend-fault policy of the defaults is the coordinator's own policy.
        let on_backend_error = self
            .defaults
            .on_backend_error
            .unwrap_or(self.on_backend_error);
        let defaults = Profile {
            on_backend_error: None,
            ..self.defaults
        };
        let ChosenProvider {
            locks,
            records,
            operations,
            cache,
            flights,
            in_process,
        } = self.provider.ok_or(BuildError::NoProvider)?;
        Ok(Coordinator::from_parts(Parts {
            namespace,
            locks,
            records,
            operations,
            cache,
            flights,
            codec: self.codec,
            on_backend_error,
            in_process,
            defaults: (!defaults.is_empty()).then_some(defaults),
            profiles: self.profiles,
        }))
    }

    /// Builds the coordinator and installs it as the process-wide default.
    pub fn install(self) -> Result<Coordinator, BuildError> {
        let coordinator = self.build()?;
        coordinator.clone().install()?;
        Ok(coordinator)
    }
}

fn validate_namespace(ns: &str) -> Result<(), BuildError> {
    let bad = ns.is_empty()
        || ns
            .chars()
            .any(|c| matches!(c, '{' | '}' | ':') || c.is_whitespace() || c.is_control());
    if bad {
        Err(BuildError::InvalidNamespace(ns.to_owned()))
    } else {
        Ok(())
    }
}

static DEFAULT: OnceLock<Coordinator> = OnceLock::new();
static FALLBACK_WARNED: AtomicBool = AtomicBool::new(false);

impl Coordinator {
    /// Starts a builder with the default namespace (`COORD_NAMESPACE`, else the binary's
    /// name: [`default_namespace`](crate::config::default_namespace)), the tagged codec,
    /// `fail_closed`, no configured defaults and no profiles.
    pub fn builder() -> CoordinatorBuilder {
        CoordinatorBuilder {
            namespace: None,
            provider: None,
            codec: Codec::Tagged,
            on_backend_error: OnBackendError::FailClosed,
            defaults: Profile::default(),
            profiles: BTreeMap::new(),
        }
    }

    /// Makes this the coordinator every attribute without `coordinator = ..` uses.
    ///
    /// Succeeds once per process. It fails with [`BuildError::AlreadyInstalled`] when a
    /// coordinator was installed before, or when an intercepted call already ran on the
    /// in-process fallback (switching providers under running code would split its locks).
    pub fn install(self) -> Result<(), BuildError> {
        DEFAULT.set(self).map_err(|_| BuildError::AlreadyInstalled)
    }

    /// The installed coordinator, or the in-process fallback when none is installed. The first
    /// use of the fallback logs one warning for the whole process.
    pub fn current() -> &'static Coordinator {
        DEFAULT.get_or_init(|| {
            if !FALLBACK_WARNED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "coord: no coordinator installed; using the in-process provider, so locks, \
                     single-flight and idempotency hold within this process only. Install one at \
                     start-up, e.g. `Coordinator::builder().namespace(\"svc\").provider(redis).install()`"
                );
            }
            Coordinator::builder()
                .memory()
                .build()
                .expect("the in-process fallback always builds")
        })
    }

    /// Starts the key of `operation` in this coordinator's namespace, for the handle API and
    /// operator tools. Parts render exactly as the attributes render `key_from` parameters, so
    /// `coord.key("payments.charge").part(&order_id).finish()` is the key of
    /// `#[idempotent(name = "payments.charge", key_from = "order_id")]`.
    pub fn key(&self, operation: &str) -> CallKeyBuilder {
        CallKey::builder(self.namespace(), operation)
    }
}

impl CoordinatorBuilder {
    /// Values for calls that neither name a profile setting a field nor write it themselves
    /// (see the precedence table in [`config`](crate::config)). Its `on_backend_error`, when
    /// set, is the coordinator's backend-fault policy, in place of whatever
    /// [`on_backend_error`](Self::on_backend_error) set.
    pub fn defaults(mut self, defaults: Profile) -> Self {
        self.defaults = defaults;
        self
    }

    /// Adds (or replaces) the profile `name`, which attributes pick with `profile = "name"` and
    /// handles with `.profile("name")`.
    pub fn profile(mut self, name: impl Into<String>, profile: Profile) -> Self {
        self.profiles.insert(name.into(), profile);
        self
    }

    /// Applies a configuration's namespace (when it sets one), defaults and profiles. The
    /// provider and command timeout are not applied here: they need a provider crate
    /// (`coord_redis::coordinator_from_config`), or [`Coordinator::from_config`] for the
    /// in-process one.
    pub fn configure(mut self, config: &CoordConfig) -> Self {
        if let Some(ns) = &config.namespace {
            self.namespace = Some(ns.clone());
        }
        self.defaults = config.defaults;
        self.profiles = config.profiles.clone();
        self
    }
}

impl Coordinator {
    /// The in-process coordinator a configuration describes: validated, with its namespace,
    /// defaults and profiles. A configuration with no provider logs the in-process warning
    /// once per process (naming the fix); one naming Redis, Sentinel, Cluster or PostgreSQL is
    /// [`ConfigError::ProviderNeedsBackendCrate`], never a silent fall back to memory.
    pub fn from_config(config: &CoordConfig) -> Result<Coordinator, ConfigError> {
        config.validate()?;
        match &config.provider {
            None => warn_in_process_once(
                "no provider configured; using the in-process provider, so locks, single-flight \
                 and idempotency hold within this process only. Set COORD_REDIS_URL or \
                 COORD_POSTGRES_URL (or `provider` in the configuration) and build with \
                 `coord_redis::coordinator_from_config` or \
                 `coord_postgres::coordinator_from_config`",
            ),
            Some(ProviderConfig::Memory) => {}
            Some(ProviderConfig::Redis { .. }) => {
                return Err(ConfigError::ProviderNeedsBackendCrate { kind: "redis" });
            }
            Some(ProviderConfig::Sentinel { .. }) => {
                return Err(ConfigError::ProviderNeedsBackendCrate { kind: "sentinel" });
            }
            Some(ProviderConfig::Cluster { .. }) => {
                return Err(ConfigError::ProviderNeedsBackendCrate { kind: "cluster" });
            }
            Some(ProviderConfig::Postgres { .. }) => {
                return Err(ConfigError::ProviderNeedsBackendCrate { kind: "postgres" });
            }
        }
        Ok(Coordinator::builder().configure(config).memory().build()?)
    }

    /// [`Coordinator::from_config`] over [`CoordConfig::from_env`]: the `COORD_*` variables.
    /// With `COORD_REDIS_URL` (or a Sentinel or Cluster variable) set, this is
    /// [`ConfigError::ProviderNeedsBackendCrate`]: use `coord_redis::coordinator_from_env`.
    pub fn from_env() -> Result<Coordinator, ConfigError> {
        Coordinator::from_config(&CoordConfig::from_env()?)
    }
}

/// Logs `message` at warn, once per process, shared with the warning of the in-process
/// fallback: a process learns once that its coordination is local.
fn warn_in_process_once(message: &str) {
    if !FALLBACK_WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!("coord: {message}");
    }
}
