//! A coordinator from a [`CoordConfig`]: Redis, Sentinel or Cluster when the configuration
//! names one, the in-process provider when it names none.

use coord_core::config::ProviderConfig;
use coord_core::config::TlsFiles;
use coord_core::{ConfigError, CoordConfig, Coordinator};

use crate::provider::{RedisProvider, RedisProviderBuilder};

/// Builds the coordinator `config` describes, connecting to Redis when it names a provider:
/// `redis` (one server), `sentinel` or `cluster`, with the configuration's command timeout and
/// TLS files. Its namespace, defaults and profiles are applied as
/// [`CoordinatorBuilder::configure`](coord_core::CoordinatorBuilder::configure) does.
///
/// With no provider configured, this is the in-process coordinator and one warning per
/// process says so and names the fix (set `COORD_REDIS_URL`, or `provider` in the
/// configuration): coordination then holds within this process only. `kind = "memory"`
/// chooses the in-process provider without the warning. `kind = "postgres"` is refused
/// ([`ConfigError::ProviderNeedsBackendCrate`], naming `coord_postgres::coordinator_from_config`).
///
/// The configuration is validated first ([`ConfigError::Invalid`]); a connection failure is
/// [`ConfigError::Backend`]. The coordinator is returned, not installed.
///
/// ```no_run
/// # async fn start() -> Result<(), Box<dyn std::error::Error>> {
/// // Or deserialise it from the application's own configuration (TOML, YAML, figment, ...).
/// let config = coord_core::CoordConfig::from_env()?;
/// let coordinator = coord_redis::coordinator_from_config(&config).await?;
/// coordinator.install()?;
/// # Ok(()) }
/// ```
pub async fn coordinator_from_config(config: &CoordConfig) -> Result<Coordinator, ConfigError> {
    config.validate()?;
    let builder = match &config.provider {
        None | Some(ProviderConfig::Memory) => return Coordinator::from_config(config),
        Some(ProviderConfig::Redis { url, tls }) => with_tls(RedisProvider::builder(url), tls)?,
        Some(ProviderConfig::Sentinel {
            urls,
            service_name,
            username,
            password,
            tls,
        }) => {
            let mut builder = RedisProvider::sentinel(service_name, urls.iter().cloned());
            if let Some(password) = password {
                builder = builder.data_node_credentials(username.as_deref(), password.clone());
            }
            with_tls(builder, tls)?
        }
        Some(ProviderConfig::Cluster { urls, tls }) => {
            with_tls(RedisProvider::cluster(urls.iter().cloned()), tls)?
        }
        Some(ProviderConfig::Postgres { .. }) => {
            return Err(ConfigError::ProviderNeedsBackendCrate { kind: "postgres" });
        }
        Some(_) => {
            return Err(ConfigError::Invalid {
                field: "provider".to_owned(),
                reason: "this version of coord-redis does not build this provider".to_owned(),
            });
        }
    };
    let builder = match config.command_timeout {
        Some(timeout) => builder.command_timeout(timeout),
        None => builder,
    };
    let provider = builder.connect().await.map_err(ConfigError::Backend)?;
    Ok(Coordinator::builder()
        .configure(config)
        .provider(provider)
        .build()?)
}

/// [`coordinator_from_config`] over [`CoordConfig::from_env`]: the `COORD_*` variables
/// (`COORD_REDIS_URL` chooses Redis; none of the provider variables, the in-process provider
/// with its warning).
pub async fn coordinator_from_env() -> Result<Coordinator, ConfigError> {
    coordinator_from_config(&CoordConfig::from_env()?).await
}

/// Applies the TLS files; a client certificate without its key (or the reverse) is refused.
#[cfg(feature = "tls")]
fn with_tls(
    builder: RedisProviderBuilder,
    tls: &Option<TlsFiles>,
) -> Result<RedisProviderBuilder, ConfigError> {
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
        (Some(_), None) | (None, Some(_)) => {
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
    builder: RedisProviderBuilder,
    tls: &Option<TlsFiles>,
) -> Result<RedisProviderBuilder, ConfigError> {
    match tls {
        None => Ok(builder),
        Some(_) => Err(ConfigError::Invalid {
            field: "provider.tls".to_owned(),
            reason: "coord-redis was built without its `tls` feature".to_owned(),
        }),
    }
}
