//! What fred is told: a target as fred's configuration, the builder every client of the
//! transport comes from, the options every command is sent with, and fred's node names.

use std::time::Duration;

use fred::prelude::{Builder, Config, ReconnectPolicy, Server, ServerConfig};
use fred::types::config::Options as FredOptions;

use crate::config::{Address, Place, Target, TlsMaterial, display_parts, display_socket};
use crate::transport::Fault;

/// What every command is sent with, whatever the client's own configuration says (a shared
/// client is the application's): one write attempt, no redirection followed (see
/// [`make_builder`]), and the command timeout.
pub(super) fn command_options(timeout: Duration) -> FredOptions {
    FredOptions {
        max_attempts: Some(1),
        max_redirections: Some(0),
        timeout: Some(timeout),
        ..FredOptions::default()
    }
}

/// The builder every client of the transport comes from. Its clients' own configuration is
/// [`command_options`]: their commands go out as
/// [`Sender::Own`](super::command::Sender::Own), without per-command options.
pub(super) fn make_builder(config: Config, timeout: Duration) -> Builder {
    let mut builder = Builder::from_config(config);
    builder
        .with_performance_config(|perf| {
            perf.default_command_timeout = timeout;
            // Messages are tiny; a deep buffer keeps a burst of releases from being dropped.
            perf.broadcast_channel_capacity = 4096;
        })
        .with_connection_config(|conn| {
            conn.connection_timeout = timeout;
            conn.internal_command_timeout = timeout;
            // One write per command. fred would otherwise write a command again after a
            // reconnect when its connection closed with the command in flight, though the
            // first write may have been executed: the caller could not tell, and the retry
            // could outlive the command timeout.
            conn.max_command_attempts = 1;
            // fred counts following a redirect as another write attempt, so it cannot follow
            // one here (and it would follow `MOVED` and `ASK` alike, reading the `ASKING`
            // reply off a connection other commands may be in flight on). It still refreshes
            // its slot map on `MOVED`, then fails the command with "too many redirections",
            // for an `ASK` as for a `MOVED`: the command was not executed. `Fred::resend`
            // finds out whether the slot is migrating, and if so sends the command to the
            // node it migrates to after `ASKING`; else sends it again, within the command
            // timeout.
            conn.max_redirections = 0;
            conn.reconnect_errors = vec![
                fred::types::config::ReconnectError::ClusterDown,
                fred::types::config::ReconnectError::Loading,
                fred::types::config::ReconnectError::ReadOnly,
            ];
        })
        .set_policy(ReconnectPolicy::new_exponential(0, 10, 250, 2));
    builder
}
pub(super) fn config(target: &Target, #[allow(unused)] tls: &TlsMaterial) -> Result<Config, Fault> {
    let server = |a: &Address| match &a.place {
        Place::Tcp { host, port, .. } => Ok(Server::new(host.as_str(), *port)),
        Place::Unix(_) => Err(Fault::Config(
            "a Unix socket serves one server, not a Cluster or Sentinel".to_owned(),
        )),
    };
    let mut config = Config {
        fail_fast: true,
        ..Config::default()
    };
    let uses_tls = match target {
        Target::Standalone(a) => {
            config.server = match &a.place {
                Place::Tcp { .. } => ServerConfig::Centralized { server: server(a)? },
                Place::Unix(path) => ServerConfig::Unix { path: path.clone() },
            };
            config.username = a.username.clone();
            config.password = a.password.clone();
            config.database = a.database;
            a.tls()
        }
        Target::Cluster(seeds) => {
            config.username = seeds[0].username.clone();
            config.password = seeds[0].password.clone();
            config.server = ServerConfig::Clustered {
                hosts: seeds.iter().map(server).collect::<Result<_, _>>()?,
                policy: Default::default(),
            };
            seeds[0].tls()
        }
        Target::Sentinel {
            master,
            sentinels,
            data,
        } => {
            if sentinels[0].tls() != data.tls {
                return Err(Fault::Config(
                    "with the fred client, the Sentinels and the data nodes must both use TLS \
                     or both not: fred has one TLS setting for both"
                        .to_owned(),
                ));
            }
            config.server = ServerConfig::Sentinel {
                hosts: sentinels.iter().map(server).collect::<Result<_, _>>()?,
                service_name: master.clone(),
                username: sentinels[0].username.clone(),
                password: sentinels[0].password.clone(),
            };
            config.username = data.username.clone();
            config.password = data.password.clone();
            config.database = data.database;
            data.tls
        }
        #[cfg(feature = "redis-client")]
        Target::RedisClient(_) => {
            return Err(Fault::Config(
                "a redis-rs client cannot be used with the fred transport".to_owned(),
            ));
        }
        Target::FredClients(_) => unreachable!("shared clients are handled before"),
    };
    #[cfg(feature = "tls")]
    if uses_tls {
        let rustls = tls
            .rustls_config()
            .map_err(|e| Fault::Config(e.message().to_owned()))?;
        config.tls = Some(fred::types::config::TlsConfig {
            connector: fred::types::config::TlsConnector::from(rustls),
            hostnames: fred::types::config::TlsHostMapping::None,
        });
    }
    #[cfg(not(feature = "tls"))]
    let _ = uses_tls;
    Ok(config)
}

/// `host:port` of a node, or `unix:/path` for a socket (which fred names by its path).
pub(super) fn server_name(server: &Server) -> String {
    if server.host.starts_with('/') {
        display_socket(std::path::Path::new(&*server.host))
    } else {
        display_parts(&server.host, server.port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client coord builds sends its commands without per-command options: its own
    /// configuration must say what the options would.
    #[test]
    fn own_clients_are_configured_as_the_command_options_say() {
        let timeout = Duration::from_millis(1234);
        let options = command_options(timeout);
        let builder = make_builder(Config::default(), timeout);
        let connection = builder.get_connection_config();
        assert_eq!(Some(connection.max_command_attempts), options.max_attempts);
        assert_eq!(Some(connection.max_redirections), options.max_redirections);
        assert_eq!(
            Some(builder.get_performance_config().default_command_timeout),
            options.timeout
        );
        assert!(options.cluster_node.is_none() && options.cluster_hash.is_none());
        assert!(!options.fail_fast);
    }
}
