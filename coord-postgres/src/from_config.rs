//! A coordinator from a [`CoordConfig`]: PostgreSQL when the configuration names it, the
//! in-process provider when it names none.

use coord_core::__private::{InProcessRoute, warn_in_process_once};
use coord_core::config::{ProviderConfig, TlsFiles};
use coord_core::{ConfigError, CoordConfig, Coordinator};

use crate::provider::{PostgresProvider, PostgresProviderBuilder};

/// Builds the coordinator `config` describes, connecting to PostgreSQL when it names
/// `provider = { kind = "postgres", url = "..", schema = "..", tls = { ca_file = ".." } }`,
/// with the configuration's command timeout. Its namespace, defaults and profiles are applied
/// as [`CoordinatorBuilder::configure`](coord_core::CoordinatorBuilder::configure) does.
///
/// With no provider configured, this is the in-process coordinator and one warning per
/// process says so and names the fix (set `COORD_POSTGRES_URL`, or `provider` in the
/// configuration), exactly as `coord_redis::coordinator_from_config` does: coordination then
/// holds within this process only. `kind = "memory"` chooses the in-process provider without
/// the warning. A Redis kind is refused, naming `coord_redis::coordinator_from_config`.
///
/// The configuration is validated first ([`ConfigError::Invalid`]); a connection failure, or
/// coord's tables missing or at another version (run `coord migrate`), is
/// [`ConfigError::Backend`] (kind `Config` for the tables, with what to run). The coordinator
/// is returned, not installed.
///
/// ```no_run
/// # async fn start() -> Result<(), Box<dyn std::error::Error>> {
/// let config = coord_core::CoordConfig::from_env()?; // COORD_POSTGRES_URL=postgres://..
/// let coordinator = coord_postgres::coordinator_from_config(&config).await?;
/// coordinator.install()?;
/// # Ok(()) }
/// ```
pub async fn coordinator_from_config(config: &CoordConfig) -> Result<Coordinator, ConfigError> {
    build(config, InProcessRoute::ProviderFromConfig).await
}

/// The warning of an in-process coordinator built by `route`.
fn in_process_message(route: InProcessRoute) -> &'static str {
    if route == InProcessRoute::ProviderFromEnv {
        "`coord_postgres::coordinator_from_env()` found no COORD_POSTGRES_URL set, so it built \
         the in-process coordinator: locks, single-flight and idempotency hold within this \
         process only. Set COORD_POSTGRES_URL (postgres://user@host/db) in this process's \
         environment"
    } else {
        "the configuration given to `coord_postgres::coordinator_from_config` names no provider, \
         so it built the in-process coordinator: locks, single-flight and idempotency hold \
         within this process only. Add `[provider]` with `kind = \"postgres\"` and its `url` to \
         the configuration (or `kind = \"memory\"` to choose the in-process provider without \
         this warning)"
    }
}

async fn build(config: &CoordConfig, route: InProcessRoute) -> Result<Coordinator, ConfigError> {
    config.validate()?;
    let builder = match &config.provider {
        None => {
            warn_in_process_once(route, in_process_message(route));
            return Ok(Coordinator::builder().configure(config).memory().build()?);
        }
        Some(ProviderConfig::Memory) => {
            return Ok(Coordinator::builder().configure(config).memory().build()?);
        }
        Some(ProviderConfig::Postgres { url, schema, tls }) => {
            let builder = PostgresProvider::builder(url.clone());
            let builder = match schema {
                Some(schema) => builder.schema(schema.clone()),
                None => builder,
            };
            with_tls(builder, tls)?
        }
        Some(other) => {
            let kind = match other {
                ProviderConfig::Redis { .. } => "redis",
                ProviderConfig::Sentinel { .. } => "sentinel",
                ProviderConfig::Cluster { .. } => "cluster",
                _ => "this",
            };
            return Err(ConfigError::Invalid {
                field: "provider.kind".to_owned(),
                reason: format!(
                    "coord_postgres::coordinator_from_config builds PostgreSQL and the in-process \
                     provider; for the `{kind}` provider use `coord_redis::coordinator_from_config`"
                ),
            });
        }
    };
    let builder = match config.command_timeout {
        Some(timeout) => builder.command_timeout(timeout),
        None => builder,
    };
    let provider = builder
        .connect()
        .await
        .map_err(|err| ConfigError::Backend(err.into()))?;
    Ok(Coordinator::builder()
        .configure(config)
        .provider(provider)
        .build()?)
}

/// [`coordinator_from_config`] over [`CoordConfig::from_env`]: the `COORD_*` variables
/// (`COORD_POSTGRES_URL` chooses PostgreSQL, with `COORD_POSTGRES_SCHEMA` and
/// `COORD_POSTGRES_TLS_CA_FILE`; none of the provider variables, the in-process provider with
/// its warning).
pub async fn coordinator_from_env() -> Result<Coordinator, ConfigError> {
    build(&CoordConfig::from_env()?, InProcessRoute::ProviderFromEnv).await
}

/// Applies the TLS files; a client certificate without its key (or the reverse) is refused.
#[cfg(feature = "tls")]
fn with_tls(
    builder: PostgresProviderBuilder,
    tls: &Option<TlsFiles>,
) -> Result<PostgresProviderBuilder, ConfigError> {
    let Some(tls) = tls else { return Ok(builder) };
    let mut builder = builder;
    if let Some(ca) = &tls.ca_file {
        builder = builder.tls_ca_file(ca.clone());
    }
    match (&tls.client_cert_file, &tls.client_key_file) {
        (Some(cert), Some(key)) => {
            builder = builder.tls_client_cert_files(cert.clone(), key.clone());
        }
        (None, None) => {}
        _ => {
            return Err(ConfigError::Invalid {
                field: "provider.tls".to_owned(),
                reason: "give both `client_cert_file` and `client_key_file`, or neither".to_owned(),
            });
        }
    }
    Ok(builder)
}

/// Without the `tls` feature, TLS files are refused rather than ignored.
#[cfg(not(feature = "tls"))]
fn with_tls(
    builder: PostgresProviderBuilder,
    tls: &Option<TlsFiles>,
) -> Result<PostgresProviderBuilder, ConfigError> {
    match tls {
        None => Ok(builder),
        Some(_) => Err(ConfigError::Invalid {
            field: "provider.tls".to_owned(),
            reason: "coord-postgres was built without its `tls` feature".to_owned(),
        }),
    }
}
