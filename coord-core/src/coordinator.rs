//! The front door of a [`Coordinator`]: its builder, the process-wide default, keys, and
//! coordinators from configuration. (The coordinator's state, which the runtime reads, is in
//! `runtime/state.rs`.)

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use coord_memory::MemoryProvider;

use crate::codec::Codec;
use crate::config::{ConfigError, CoordConfig, Profile, ProviderConfig};
use crate::error::BuildError;
use crate::policy::OnBackendError;
use crate::provider::{
    CacheStore, CallKey, CallKeyBuilder, Capability, FlightStore, IdempotencyStore, LockProvider,
    MultiLockStore, Operations, Provider, RwLockStore, SemaphoreStore,
};
use crate::runtime::state::{Coordinator, Parts};

/// The provider a builder was given, seen through both traits.
struct ChosenProvider {
    locks: Arc<dyn LockProvider>,
    records: Arc<dyn IdempotencyStore>,
    operations: Arc<dyn Operations>,
    cache: Arc<dyn CacheStore>,
    flights: Arc<dyn FlightStore>,
    semaphores: Arc<dyn SemaphoreStore>,
    rw_locks: Arc<dyn RwLockStore>,
    multi_locks: Arc<dyn MultiLockStore>,
    /// Set for the in-process provider: exclusion holds within this process only.
    in_process: bool,
    /// The in-process provider as itself, when it is the provider: the lock layer takes and
    /// gives back its locks without the contract's boxed futures (see
    /// `Coordinator::in_process_locks`).
    memory: Option<Arc<MemoryProvider>>,
}

/// Builds a [`Coordinator`] in code: every setting is what the code says.
///
/// This is the route for tests and for applications that configure coord entirely in code.
/// It does not read the `COORD_*` variables (only `COORD_NAMESPACE`, when no namespace is
/// given): an application configured from its environment or a file builds its coordinator
/// with `coord_redis::coordinator_from_env()` / `coord_redis::coordinator_from_config`
/// (or [`Coordinator::from_env`] / [`Coordinator::from_config`] in process), which apply
/// `COORD_LEASE`, `COORD_WAIT`, `COORD_PROFILE_<NAME>_<FIELD>` and the rest. So that the two
/// are never confused, [`build`](CoordinatorBuilder::build) logs one warning per process when
/// such a variable is set to a value the coordinator it builds does not hold, naming the
/// variables and the route that applies them.
#[must_use]
pub struct CoordinatorBuilder {
    namespace: Option<String>,
    provider: Option<ChosenProvider>,
    codec: Codec,
    on_backend_error: OnBackendError,
    defaults: Profile,
    profiles: BTreeMap<String, Profile>,
    /// Set by [`CoordinatorBuilder::configure`]: the settings come from a configuration.
    configured: bool,
    /// Capabilities the provider must have ([`CoordinatorBuilder::require`]).
    required: Vec<Capability>,
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
            semaphores: provider.clone(),
            rw_locks: provider.clone(),
            multi_locks: provider.clone(),
            in_process: true,
            memory: Some(provider),
        });
        self
    }

    /// Coordinates through `provider` (for instance a Redis provider).
    pub fn provider<P: Provider>(mut self, provider: P) -> Self {
        let provider = Arc::new(provider);
        // The in-process provider given by hand is the same provider as `memory()`'s.
        let memory = (provider.clone() as Arc<dyn std::any::Any + Send + Sync>)
            .downcast::<MemoryProvider>()
            .ok();
        self.provider = Some(ChosenProvider {
            locks: provider.clone(),
            records: provider.clone(),
            operations: provider.clone(),
            cache: provider.clone(),
            flights: provider.clone(),
            semaphores: provider.clone(),
            rw_locks: provider.clone(),
            multi_locks: provider,
            in_process: false,
            memory,
        });
        self
    }

    /// Makes [`build`](CoordinatorBuilder::build) fail with [`BuildError::Unsupported`] unless
    /// the provider has `capability` (for instance [`Capability::Semaphores`], which
    /// `#[distributed_lock(permits = n)]` and [`Coordinator::semaphore`] need): an application
    /// that uses semaphores finds out at start-up, not at its first call, that its provider
    /// cannot keep them. Without it, such a call fails with
    /// [`CoordError::Unsupported`](crate::CoordError::Unsupported) and nothing runs.
    pub fn require(mut self, capability: Capability) -> Self {
        self.required.push(capability);
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
    ///
    /// Logs one warning per process when `COORD_*` variables of defaults or profiles
    /// (`COORD_WAIT`, `COORD_PROFILE_PAYMENTS_WAIT`, ...) are set to values this coordinator
    /// does not hold (see the type's docs): the variables are named, with what to do.
    pub fn build(self) -> Result<Coordinator, BuildError> {
        self.warn_unapplied_variables();
        self.build_inner()
    }

    /// [`build`](CoordinatorBuilder::build) without looking at the environment: for the
    /// in-process fallback, which is not something the user built.
    fn build_inner(self) -> Result<Coordinator, BuildError> {
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
            semaphores,
            rw_locks,
            multi_locks,
            in_process,
            memory,
        } = self.provider.ok_or(BuildError::NoProvider)?;

        let coordinator = Coordinator::from_parts(Parts {
            namespace,
            locks,
            records,
            operations,
            cache,
            flights,
            semaphores,
            rw_locks,
            multi_locks,
            codec: self.codec,
            on_backend_error,
            in_process,
            memory,
            defaults: (!defaults.is_empty()).then_some(defaults),
            profiles: self.profiles,
        });
        if let Some(&capability) = self.required.iter().find(|c| !coordinator.supports(**c)) {
            return Err(BuildError::Unsupported { capability });
        }
        Ok(coordinator)
    }

    /// Builds the coordinator and installs it as the process-wide default.
    pub fn install(self) -> Result<Coordinator, BuildError> {
        let coordinator = self.build()?;
        coordinator.clone().install()?;
        Ok(coordinator)
    }

    /// The one warning of [`build`](CoordinatorBuilder::build) about `COORD_*` variables the
    /// coordinator will not apply.
    fn warn_unapplied_variables(&self) {
        static WARNED: AtomicBool = AtomicBool::new(false);
        if WARNED.load(Ordering::Relaxed) {
            return;
        }
        let unapplied = crate::config::unapplied_variables(
            std::env::vars_os(),
            &self.defaults,
            &self.profiles,
            self.on_backend_error,
        );
        if unapplied.is_empty() || WARNED.swap(true, Ordering::Relaxed) {
            return;
        }
        let in_process = self.provider.as_ref().is_none_or(|p| p.in_process);
        tracing::warn!(
            "coord: {}",
            unapplied_message(&unapplied, self.configured, in_process, &self.profiles)
        );
    }
}

/// The text of the warning about `unapplied` variables (name, configuration field): what the
/// user did (how the coordinator was built) and the one thing to do.
pub(crate) fn unapplied_message(
    unapplied: &[crate::config::Unapplied],
    configured: bool,
    in_process: bool,
    profiles: &BTreeMap<String, Profile>,
) -> String {
    let names: Vec<&str> = unapplied.iter().map(|u| u.variable.as_str()).collect();
    let (are, they_have, their) = if names.len() == 1 {
        ("is", "it has", "its value")
    } else {
        ("are", "they have", "their values")
    };
    let missing_profiles: Vec<&str> = unapplied
        .iter()
        .filter_map(|u| u.profile.as_deref())
        .filter(|p| !profiles.contains_key(*p))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let consequence = match missing_profiles.as_slice() {
        [] => String::new(),
        [one] => format!(" (a call naming profile `{one}` fails with `UnknownProfile`)"),
        many => format!(
            " (a call naming profile {} fails with `UnknownProfile`)",
            many.iter()
                .map(|p| format!("`{p}`"))
                .collect::<Vec<_>>()
                .join(" or ")
        ),
    };
    if configured {
        let fields: Vec<&str> = unapplied.iter().map(|u| u.field.as_str()).collect();
        format!(
            "{} {are} set, but the configuration this coordinator was built from does not hold \
             {their}, so {they_have} no effect{consequence}: a configuration read from a file or \
             with figment does not read the flat COORD_* variables. Set {} in that configuration \
             instead (or read it with `CoordConfig::from_env()`)",
            names.join(", "),
            fields
                .iter()
                .map(|f| format!("`{f}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else {
        let route = if in_process {
            "`Coordinator::from_env()?`"
        } else {
            "`coord_redis::coordinator_from_env().await?`"
        };
        format!(
            "{} {are} set, but this coordinator was built with `Coordinator::builder()`, which \
             does not read COORD_* variables, so {they_have} no effect{consequence}. Build it with \
             {route} instead, which applies them",
            names.join(", ")
        )
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
/// Set when an intercepted call took the in-process fallback as the default.
static FALLBACK_TAKEN: AtomicBool = AtomicBool::new(false);

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
            configured: false,
            required: Vec::new(),
        }
    }

    /// Makes this the coordinator every attribute without `coordinator = ..` uses.
    ///
    /// Succeeds once per process. It fails with [`BuildError::AlreadyInstalled`] when a
    /// coordinator was installed before, and with [`BuildError::FallbackInUse`] when an
    /// intercepted call already ran on the in-process fallback (switching providers under
    /// running code would split its locks).
    pub fn install(self) -> Result<(), BuildError> {
        DEFAULT.set(self).map_err(|_| {
            if FALLBACK_TAKEN.load(Ordering::Acquire) {
                BuildError::FallbackInUse
            } else {
                BuildError::AlreadyInstalled
            }
        })
    }

    /// The installed coordinator, or the in-process fallback when none is installed. The first
    /// use of the fallback logs one warning for the whole process.
    pub fn current() -> &'static Coordinator {
        DEFAULT.get_or_init(|| {
            FALLBACK_TAKEN.store(true, Ordering::Release);
            warn_in_process_once(
                InProcessRoute::Fallback,
                "no coordinator is installed, so this call and every later one use the \
                 in-process provider: locks, single-flight and idempotency hold within this \
                 process only. Install one at start-up, before the first call: \
                 `coord_redis::coordinator_from_env().await?.install()?` with COORD_REDIS_URL set",
            );
            Coordinator::builder()
                .memory()
                .build_inner()
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
        self.configured = true;
        self
    }
}

impl Coordinator {
    /// The in-process coordinator a configuration describes: validated, with its namespace,
    /// defaults and profiles. A configuration with no provider logs one warning per process
    /// saying the coordination is local and naming the crate that connects a provider; one
    /// naming Redis, Sentinel, Cluster or PostgreSQL is
    /// [`ConfigError::ProviderNeedsBackendCrate`], never a
    /// silent fall back to memory. `kind = "memory"` chooses the in-process provider without
    /// the warning.
    pub fn from_config(config: &CoordConfig) -> Result<Coordinator, ConfigError> {
        in_process_from(config, InProcessRoute::CoreFromConfig)
    }

    /// [`Coordinator::from_config`] over [`CoordConfig::from_env`]: the in-process coordinator
    /// with every `COORD_*` variable applied (`COORD_NAMESPACE`, `COORD_LEASE`, `COORD_WAIT`,
    /// `COORD_PROFILE_<NAME>_<FIELD>`, ...). With `COORD_REDIS_URL` (or a Sentinel or Cluster
    /// variable) set, this is [`ConfigError::ProviderNeedsBackendCrate`]: the same route with
    /// Redis is `coord_redis::coordinator_from_env()`.
    pub fn from_env() -> Result<Coordinator, ConfigError> {
        in_process_from(&CoordConfig::from_env()?, InProcessRoute::CoreFromEnv)
    }
}

/// [`Coordinator::from_config`] and [`Coordinator::from_env`]: `route` says which, for the
/// warning and the error.
fn in_process_from(
    config: &CoordConfig,
    route: InProcessRoute,
) -> Result<Coordinator, ConfigError> {
    config.validate()?;
    let from_env = route == InProcessRoute::CoreFromEnv;
    let kind = match &config.provider {
        None => {
            warn_in_process_once(route, route.message());
            None
        }
        Some(ProviderConfig::Memory) => None,
        Some(ProviderConfig::Redis { .. }) => Some("redis"),
        Some(ProviderConfig::Sentinel { .. }) => Some("sentinel"),
        Some(ProviderConfig::Cluster { .. }) => Some("cluster"),
        Some(ProviderConfig::Postgres { .. }) => Some("postgres"),
    };
    if let Some(kind) = kind {
        return Err(ConfigError::ProviderNeedsBackendCrate { kind, from_env });
    }
    Ok(Coordinator::builder().configure(config).memory().build()?)
}

/// How an in-process coordinator came about, for its warning (one per route and process: a
/// process learns once per mistake that its coordination is local).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum InProcessRoute {
    /// No coordinator installed: an intercepted call took the in-process fallback.
    Fallback,
    /// `Coordinator::from_config` with no provider configured.
    CoreFromConfig,
    /// `Coordinator::from_env` with no provider variable set.
    CoreFromEnv,
    /// A provider crate's `coordinator_from_config` with no provider configured.
    ProviderFromConfig,
    /// A provider crate's `coordinator_from_env` with no provider variable set.
    ProviderFromEnv,
}

impl InProcessRoute {
    /// The warning of coord-core's own routes; provider crates word theirs (they know their
    /// variables).
    fn message(self) -> &'static str {
        match self {
            InProcessRoute::CoreFromConfig => {
                "`Coordinator::from_config` built the in-process coordinator (the configuration \
                 names no provider), so locks, single-flight and idempotency hold within this \
                 process only. To coordinate across processes, add `[provider]` (`kind = \
                 \"redis\"`, `url = ..`) to the configuration and build with \
                 `coord_redis::coordinator_from_config(&config)`"
            }
            InProcessRoute::CoreFromEnv => {
                "`Coordinator::from_env` built the in-process coordinator (no COORD_REDIS_URL is \
                 set, and coord-core alone connects no provider), so locks, single-flight and \
                 idempotency hold within this process only. To coordinate across processes, \
                 build with `coord_redis::coordinator_from_env()` and set COORD_REDIS_URL"
            }
            _ => {
                "the in-process coordinator was built: coordination holds within this process only"
            }
        }
    }
}

/// Logs `message` at warn, once per process for each `route`.
///
/// Not a public API: coord's provider crates call it (through `coord_core::__private`) to
/// word the warning of their own route when a configuration names no provider.
#[doc(hidden)]
pub fn warn_in_process_once(route: InProcessRoute, message: &str) {
    static WARNED: Mutex<Vec<InProcessRoute>> = Mutex::new(Vec::new());
    let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if warned.contains(&route) {
        return;
    }
    warned.push(route);
    drop(warned);
    tracing::warn!("coord: {message}");
}
