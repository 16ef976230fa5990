//! Configuration read at run time: [`CoordConfig`], from any serde source or the `COORD_*`
//! environment variables.
//!
//! ```
//! use coord_core::config::CoordConfig;
//!
//! // Any serde format works (TOML, YAML, JSON, figment, config-rs); JSON keeps this example
//! // free of extra dependencies.
//! let config: CoordConfig = serde_json::from_str(r#"{
//!     "namespace": "payflow",
//!     "provider": { "kind": "redis", "url": "rediss://redis.internal:6380",
//!                   "tls": { "ca_file": "/etc/coord/redis-ca.pem" } },
//!     "command_timeout": "500ms",
//!     "defaults": { "lease": "30s", "on_backend_error": "fail_closed" },
//!     "profiles": { "payments": { "wait": "2s", "retention": "7d" } }
//! }"#).unwrap();
//! config.validate().unwrap();
//! assert_eq!(config.profiles["payments"].wait, Some(std::time::Duration::from_secs(2)));
//! ```
//!
//! # Precedence of durations and policies
//!
//! For one call, each of `lease`, `wait`, `retention`, `in_flight_lease`, `renew` and
//! `on_backend_error` comes from the first of these that sets it:
//!
//! | the call names a profile (`profile = "p"`, `.profile("p")`) | it does not |
//! |---|---|
//! | 1. the profile's field (`profiles.p.lease`) | |
//! | 2. the literal in the attribute (or the handle's setter) | 1. the literal in the attribute (or the handle's setter) |
//! | 3. the configuration's `defaults` | 2. the configuration's `defaults` |
//! | 4. the built-in default (`lease = "30s"`, ...) | 3. the built-in default |
//!
//! A profile the coordinator does not have is [`CoordError::UnknownProfile`] at the call,
//! before anything runs: never a silent default. `renew = true` renews every third of the
//! lease in force, whichever level set it; a `renew` interval not shorter than the lease in
//! force (a profile's lease under a literal `renew`) is replaced by a third of the lease, with
//! a warning.
//!
//! [`CoordError::UnknownProfile`]: crate::CoordError::UnknownProfile

mod duration;
mod env;
mod optional_duration;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::BuildError;
use crate::policy::OnBackendError;
use crate::provider::BackendError;

pub use env::ENV_VARIABLES;

pub(crate) use env::{Unapplied, unapplied_variables};

pub(crate) use duration::parse_duration;

/// The namespace used when neither the configuration, the builder, `COORD_NAMESPACE` nor the
/// binary's file name gives one (the name of the running executable could not be read, or holds
/// nothing usable as a namespace).
pub const FALLBACK_NAMESPACE: &str = "coord";

/// A coordinator's whole configuration: which provider, which namespace, the defaults of
/// every attribute and the named profiles attributes can refer to.
///
/// Deserialise it from whatever configuration the application already has (every field is
/// optional; an unknown field is an error, so a typo is not silently ignored), or read it from
/// the `COORD_*` variables with [`CoordConfig::from_env`]. Durations are written as the
/// attributes write them: `"250ms"`, `"30s"`, `"5m"`, `"24h"`, `"1m30s"`.
///
/// Turn it into a coordinator with [`Coordinator::from_config`](crate::Coordinator::from_config)
/// (in-process provider only) or `coord_redis::coordinator_from_config` (any provider), or
/// apply it to a builder with
/// [`CoordinatorBuilder::configure`](crate::CoordinatorBuilder::configure).
///
/// Promised: [`validate`](CoordConfig::validate) refuses every value the coordinator could not
/// honour, naming the field. Not promised: that a Redis URL is reachable or that a TLS file
/// exists; connecting finds that out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CoordConfig {
    /// Where state lives. `None` (nothing configured): the in-process provider, with one
    /// warning per process naming the fix.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderConfig>,
    /// The prefix of every key. `None`: `COORD_NAMESPACE`, else the binary's name (see
    /// [`default_namespace`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Bound on every round trip to a remote backend (Redis, PostgreSQL). `None`: the
    /// provider's default.
    /// The in-process provider has no round trips and ignores it.
    #[serde(with = "optional_duration", skip_serializing_if = "Option::is_none")]
    pub command_timeout: Option<Duration>,
    /// Values for calls that neither name a profile setting a field nor write it themselves.
    pub defaults: Profile,
    /// Named sets of values an attribute picks with `profile = "name"`. Names are lowercase
    /// ASCII letters, digits and `_`, starting with a letter (so `COORD_PROFILE_<NAME>_*` can
    /// set them).
    pub profiles: BTreeMap<String, Profile>,
}

/// The provider a configuration names. Tagged by `kind`: `{ kind = "redis", url = ".." }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum ProviderConfig {
    /// The in-process provider: exclusion holds within this process only (tests, one
    /// replica).
    Memory,
    /// One Redis server: `redis://`, `rediss://` (TLS) or `unix://` URL.
    Redis {
        /// The server's URL, credentials included.
        url: String,
        /// Certificates for a `rediss://` URL; `None`: the system's CA store.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tls: Option<TlsFiles>,
    },
    /// A master found through Redis Sentinel.
    Sentinel {
        /// The Sentinels' URLs (`host:port` is enough; `rediss://` for TLS Sentinels).
        urls: Vec<String>,
        /// The master's name as Sentinel knows it (`mymaster`).
        service_name: String,
        /// The data nodes' ACL user, if not the default user.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        username: Option<String>,
        /// The data nodes' password.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        password: Option<String>,
        /// Certificates for TLS connections.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tls: Option<TlsFiles>,
    },
    /// Redis Cluster, discovered from seed nodes.
    Cluster {
        /// Seed nodes' URLs; any reachable one is enough.
        urls: Vec<String>,
        /// Certificates for `rediss://` seeds.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tls: Option<TlsFiles>,
    },
    /// PostgreSQL (built by `coord_postgres::coordinator_from_config`).
    Postgres {
        /// The server's URL (`postgres://user:password@host:port/database?sslmode=..`, a Unix
        /// socket with `?host=/path/to/dir`, or the `key=value` form), credentials included.
        url: String,
        /// The schema holding coord's tables; `None`: `coord`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        schema: Option<String>,
        /// Certificates for TLS connections; `None`: the system's CA store.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tls: Option<TlsFiles>,
    },
}

/// PEM files for TLS connections to Redis or PostgreSQL.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsFiles {
    /// Trust only the CAs in this file instead of the system's store.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// A client certificate, for servers that require one (with `client_key_file`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_cert_file: Option<PathBuf>,
    /// The client certificate's private key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_key_file: Option<PathBuf>,
}

/// Durations and policies for calls: the configuration's `defaults`, or one named profile.
/// Every field is optional; a field left `None` falls through to the next level of the
/// precedence table in the [module docs](self).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Profile {
    /// `#[distributed_lock]`'s lease.
    #[serde(with = "optional_duration", skip_serializing_if = "Option::is_none")]
    pub lease: Option<Duration>,
    /// How long a lock, or a duplicate of an in-flight `#[idempotent]` call, waits.
    #[serde(with = "optional_duration", skip_serializing_if = "Option::is_none")]
    pub wait: Option<Duration>,
    /// How long `#[idempotent]` keeps and replays a successful outcome.
    #[serde(with = "optional_duration", skip_serializing_if = "Option::is_none")]
    pub retention: Option<Duration>,
    /// The lease of `#[idempotent]`'s in-flight marker.
    #[serde(with = "optional_duration", skip_serializing_if = "Option::is_none")]
    pub in_flight_lease: Option<Duration>,
    /// Renew the lease (lock or marker) this often while the body runs; with it, a lost lease
    /// cancels the body unless the attribute says `on_lost = "signal"`.
    #[serde(with = "optional_duration", skip_serializing_if = "Option::is_none")]
    pub renew: Option<Duration>,
    /// What a call does when the backend fails.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_backend_error: Option<OnBackendError>,
}

impl Profile {
    /// True when no field is set.
    pub fn is_empty(&self) -> bool {
        *self == Profile::default()
    }
}

/// Why a configuration was refused, or a coordinator could not be made from it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ConfigError {
    /// A value coord cannot honour. `field` is its path (`profiles.payments.lease`).
    Invalid {
        /// The field's path in the configuration.
        field: String,
        /// What is wrong and what is accepted.
        reason: String,
    },
    /// An environment variable could not be read: malformed, not UTF-8, or (for a `COORD_`
    /// variable coord does not know) probably misspelt.
    Variable {
        /// The variable's name.
        variable: String,
        /// What is wrong, and the fix.
        reason: String,
    },
    /// The configuration names a provider the function called cannot build: coord-core
    /// builds only the in-process one, and each provider crate builds only its own. Use
    /// `coord_redis::coordinator_from_config` / `coordinator_from_env` (Redis, Sentinel,
    /// Cluster) or `coord_postgres::coordinator_from_config` / `coordinator_from_env`
    /// (PostgreSQL).
    ProviderNeedsBackendCrate {
        /// `redis`, `sentinel`, `cluster` or `postgres`.
        kind: &'static str,
        /// True when the provider was named by a `COORD_*` variable
        /// ([`Coordinator::from_env`](crate::Coordinator::from_env)), false when by a
        /// configuration ([`Coordinator::from_config`](crate::Coordinator::from_config)).
        from_env: bool,
    },
    /// Connecting to the configured backend failed.
    Backend(BackendError),
    /// The coordinator could not be built or installed.
    Build(BuildError),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Invalid { field, reason } => {
                write!(f, "invalid coord configuration at `{field}`: {reason}")
            }
            ConfigError::Variable { variable, reason } => {
                write!(f, "invalid environment variable {variable}: {reason}")
            }
            ConfigError::ProviderNeedsBackendCrate {
                kind: "postgres",
                from_env,
            } => write!(
                f,
                "the {} names a `postgres` provider, which this function cannot build: call \
                 `coord_postgres::{}` from the coord-postgres crate instead",
                if *from_env {
                    "environment (COORD_POSTGRES_URL)"
                } else {
                    "configuration"
                },
                if *from_env {
                    "coordinator_from_env()"
                } else {
                    "coordinator_from_config(&config)"
                },
            ),
            ConfigError::ProviderNeedsBackendCrate {
                kind,
                from_env: true,
            } => write!(
                f,
                "{} is set, so the environment names a `{kind}` provider, and \
                 `Coordinator::from_env` (coord-core alone) builds only the in-process \
                 coordinator: call `{}::coordinator_from_env()` instead",
                env::provider_variable(kind),
                provider_crate(kind),
            ),
            ConfigError::ProviderNeedsBackendCrate {
                kind,
                from_env: false,
            } => write!(
                f,
                "the configuration names a `{kind}` provider, and `Coordinator::from_config` \
                 (coord-core alone) builds only the in-process coordinator: call \
                 `{}::coordinator_from_config(&config)` instead",
                provider_crate(kind),
            ),
            ConfigError::Backend(err) => {
                write!(f, "could not connect the configured provider: {err}")
            }
            ConfigError::Build(err) => write!(f, "{err}"),
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConfigError::Backend(err) => Some(err),
            ConfigError::Build(err) => Some(err),
            _ => None,
        }
    }
}

impl From<BuildError> for ConfigError {
    fn from(err: BuildError) -> Self {
        match err {
            BuildError::InvalidSetting { field, reason } => ConfigError::Invalid { field, reason },
            other => ConfigError::Build(other),
        }
    }
}

/// The crate that builds a coordinator for a provider `kind`.
fn provider_crate(kind: &str) -> &'static str {
    match kind {
        "redis" | "sentinel" | "cluster" => "coord_redis",
        "postgres" => "coord_postgres",
        _ => "the provider crate's",
    }
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

impl CoordConfig {
    /// Reads the configuration from the process's `COORD_*` environment variables (the table
    /// is [`ENV_VARIABLES`]; a profile's field is `COORD_PROFILE_<NAME>_<FIELD>`, as in
    /// `COORD_PROFILE_PAYMENTS_WAIT=2s`). A malformed value, or a `COORD_` variable that is
    /// not in the table (a typo), is an error naming the variable: nothing is ignored. The
    /// result is validated.
    pub fn from_env() -> Result<CoordConfig, ConfigError> {
        CoordConfig::from_vars(std::env::vars_os())
    }

    /// [`CoordConfig::from_env`] over the given variables instead of the process's, for tests
    /// and for applications that keep their environment elsewhere. Variables not starting
    /// with `COORD_` are skipped.
    pub fn from_vars<I, K, V>(vars: I) -> Result<CoordConfig, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<std::ffi::OsString>,
        V: Into<std::ffi::OsString>,
    {
        let config = env::read(vars)?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every value, naming the first bad one by its path: an invalid namespace or
    /// profile name, a zero lease, in-flight lease, retention, renew interval or command
    /// timeout, a `renew` not shorter than a lease set beside it, a provider without URLs.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(ns) = &self.namespace {
            if !namespace_is_valid(ns) {
                return Err(invalid(
                    "namespace",
                    format!(
                        "{ns:?} is not a namespace: use a non-empty name without `{{`, `}}`, `:`, whitespace or control characters"
                    ),
                ));
            }
        }
        if self.command_timeout == Some(Duration::ZERO) {
            return Err(invalid("command_timeout", "must be longer than zero"));
        }
        match &self.provider {
            Some(ProviderConfig::Redis { url, .. }) if url.trim().is_empty() => {
                return Err(invalid("provider.url", "is empty: give the Redis URL"));
            }
            Some(ProviderConfig::Sentinel {
                urls, service_name, ..
            }) => {
                if urls.iter().all(|u| u.trim().is_empty()) {
                    return Err(invalid("provider.urls", "lists no Sentinel"));
                }
                if service_name.trim().is_empty() {
                    return Err(invalid(
                        "provider.service_name",
                        "is empty: give the master's name as Sentinel knows it",
                    ));
                }
            }
            Some(ProviderConfig::Cluster { urls, .. })
                if urls.iter().all(|u| u.trim().is_empty()) =>
            {
                return Err(invalid("provider.urls", "lists no seed node"));
            }
            Some(ProviderConfig::Postgres { url, schema, .. }) => {
                if url.trim().is_empty() {
                    return Err(invalid("provider.url", "is empty: give the PostgreSQL URL"));
                }
                if let Some(schema) = schema.as_deref().filter(|s| !schema_is_valid(s)) {
                    return Err(invalid(
                        "provider.schema",
                        format!(
                            "{schema:?} is not a schema name coord uses: 1 to 63 lowercase ASCII \
                             letters, digits and `_`, starting with a letter or `_`, not starting \
                             with `pg_`"
                        ),
                    ));
                }
            }
            _ => {}
        }
        check_profile("defaults", &self.defaults)
            .map_err(|(field, reason)| invalid(field, reason))?;
        for (name, profile) in &self.profiles {
            check_profile_name(name)
                .map_err(|reason| invalid(format!("profiles.{name}"), reason))?;
            check_profile(&format!("profiles.{name}"), profile)
                .map_err(|(field, reason)| invalid(field, reason))?;
        }
        Ok(())
    }

    /// The namespace this configuration gives a coordinator: `namespace`, else
    /// [`default_namespace`].
    pub fn namespace_or_default(&self) -> String {
        self.namespace.clone().unwrap_or_else(default_namespace)
    }
}

/// The namespace of a coordinator that was given none: `COORD_NAMESPACE` when set, else the
/// running binary's file name without extension, with every character a namespace cannot
/// hold (`{`, `}`, `:`, whitespace, control characters) replaced by `_`, so that two
/// applications sharing one Redis do not share keys by accident. Only when the executable's
/// name cannot be read is it [`FALLBACK_NAMESPACE`].
///
/// A test binary built by cargo is named after its test target plus a hash
/// (`config_env-1a2b3c4d5e6f7a8b`), and so is its namespace.
pub fn default_namespace() -> String {
    if let Some(ns) = std::env::var_os(env::NAMESPACE) {
        // Handed over as is: an invalid value is refused by the builder, naming it.
        return ns.to_string_lossy().into_owned();
    }
    binary_namespace().unwrap_or_else(|| FALLBACK_NAMESPACE.to_owned())
}

/// The binary's file stem as a namespace, if there is a usable one.
pub(crate) fn binary_namespace() -> Option<String> {
    let exe = std::env::current_exe().ok()?;
    namespace_for_binary(&exe.to_string_lossy())
}

/// The namespace a coordinator that was given none takes in a binary named `binary` (a file
/// name or a path: `payflow`, `target/release/payflow`, `payflow.exe`), when `COORD_NAMESPACE`
/// is not set either: its file stem, with every character a namespace cannot hold replaced by
/// `_`, exactly as [`default_namespace`] does for the running binary. `None` when nothing
/// usable is left (then the coordinator's namespace is [`FALLBACK_NAMESPACE`]).
///
/// This is how an operator's tool finds an application's keys from its binary's name
/// (`coord --app payflow`).
pub fn namespace_for_binary(binary: &str) -> Option<String> {
    let stem = std::path::Path::new(binary).file_stem()?.to_string_lossy();
    sanitise_namespace(&stem)
}

/// `name` with every character a namespace cannot hold replaced by `_`; `None` when nothing
/// usable is left.
pub(crate) fn sanitise_namespace(name: &str) -> Option<String> {
    let cleaned: String = name
        .chars()
        .map(|c| {
            if matches!(c, '{' | '}' | ':') || c.is_whitespace() || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    (!cleaned.trim_matches('_').is_empty()).then_some(cleaned)
}

/// The schema names coord-postgres accepts (the same rule it checks when connecting).
fn schema_is_valid(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with("pg_")
}

pub(crate) fn namespace_is_valid(ns: &str) -> bool {
    !ns.is_empty()
        && !ns
            .chars()
            .any(|c| matches!(c, '{' | '}' | ':') || c.is_whitespace() || c.is_control())
}

/// Profile names: lowercase ASCII letters, digits and `_`, starting with a letter.
pub(crate) fn check_profile_name(name: &str) -> Result<(), String> {
    let ok = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a profile name: use lowercase ASCII letters, digits and `_`, starting with a letter (as `COORD_PROFILE_<NAME>_*` variables spell it)"
        ))
    }
}

/// Checks one profile (or the defaults). A `renew` is compared with the leases the same
/// profile sets: a profile for locks may renew more slowly than an in-flight lease set
/// elsewhere, and a mix that still ends up not shorter at a call is cut to a third of the
/// lease there (with a warning). Errors are `(field path, reason)`.
pub(crate) fn check_profile(path: &str, profile: &Profile) -> Result<(), (String, String)> {
    let nonzero = [
        ("lease", profile.lease),
        ("in_flight_lease", profile.in_flight_lease),
        ("retention", profile.retention),
        ("renew", profile.renew),
    ];
    for (field, value) in nonzero {
        if value == Some(Duration::ZERO) {
            return Err((
                format!("{path}.{field}"),
                "must be longer than zero".to_owned(),
            ));
        }
    }
    if let Some(renew) = profile.renew {
        let leases = [
            ("lease", profile.lease),
            ("in_flight_lease", profile.in_flight_lease),
        ];
        for (field, lease) in leases {
            if let Some(lease) = lease.filter(|lease| renew >= *lease) {
                return Err((
                    format!("{path}.renew"),
                    format!(
                        "renews every {renew:?}, not shorter than the {field} ({lease:?}): the lease would lapse between renewals"
                    ),
                ));
            }
        }
    }
    Ok(())
}
