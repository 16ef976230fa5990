//! Which client library talks to Redis, and what coord reads from an application's own
//! client of either library (where it points, which passwords it holds) without connecting.

use super::address::{display_parts, display_socket};

/// Which Redis client library talks to the server.
///
/// Both pass the same conformance suite; the choice is about which library the rest of the
/// application already uses. Each variant exists only when its cargo feature is enabled
/// (`redis-client`, the default, and `fred`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Client {
    /// The `redis` crate (redis-rs): a multiplexed connection per pooled slot, redialled
    /// when it closes or a call on it fails or times out, its cluster client (with its own
    /// retries off), and its Sentinel client for master discovery.
    #[cfg(feature = "redis-client")]
    RedisRs,
    /// The `fred` crate: one fred client per pooled slot, with fred's own reconnection,
    /// Sentinel and Cluster support, one write attempt per command, and a new client in
    /// place of one whose command timed out.
    #[cfg(feature = "fred")]
    Fred,
}

#[allow(clippy::derivable_impls)] // the default depends on the enabled features
impl Default for Client {
    fn default() -> Self {
        #[cfg(feature = "redis-client")]
        {
            Client::RedisRs
        }
        #[cfg(not(feature = "redis-client"))]
        {
            Client::Fred
        }
    }
}

/// Where the application's redis-rs `client` connects, without credentials.
#[cfg(feature = "redis-client")]
pub(crate) fn describe_redis_client(client: &redis::Client) -> String {
    use redis::ConnectionAddr;
    match client.get_connection_info().addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            display_parts(host, *port)
        }
        ConnectionAddr::Unix(path) => display_socket(path),
        _ => "<redis-rs client>".to_owned(),
    }
}

/// The password the application's redis-rs `client` was configured with.
#[cfg(feature = "redis-client")]
pub(crate) fn redis_client_secrets(client: &redis::Client) -> Option<String> {
    client
        .get_connection_info()
        .redis_settings()
        .password()
        .map(str::to_owned)
}

/// Where the application's fred `client` connects, without credentials.
#[cfg(feature = "fred")]
pub(crate) fn describe_fred_client(client: &fred::clients::Client) -> String {
    use fred::prelude::{ClientLike, Server, ServerConfig};
    let list = |hosts: &[Server]| {
        hosts
            .iter()
            .map(|s| display_parts(&s.host, s.port))
            .collect::<Vec<_>>()
            .join(",")
    };
    match &client.client_config().server {
        ServerConfig::Centralized { server } => display_parts(&server.host, server.port),
        ServerConfig::Clustered { hosts, .. } => format!("cluster seeds {}", list(hosts)),
        ServerConfig::Sentinel {
            hosts,
            service_name,
            ..
        } => format!("master `{service_name}` via sentinels {}", list(hosts)),
        ServerConfig::Unix { path } => display_socket(path),
    }
}

/// The passwords the application's fred `client` was configured with (the data nodes', and
/// the Sentinels').
#[cfg(feature = "fred")]
pub(crate) fn fred_client_secrets(client: &fred::clients::Client) -> Vec<String> {
    use fred::prelude::{ClientLike, ServerConfig};
    let config = client.client_config();
    let mut out: Vec<String> = config.password.into_iter().collect();
    if let ServerConfig::Sentinel {
        password: Some(p), ..
    } = config.server
    {
        out.push(p);
    }
    out
}
