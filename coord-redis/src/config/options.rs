//! The options a provider is built with (the builder's settings, with their defaults), and
//! the checked [`Target`] a transport connects to.

use std::fmt;
use std::time::Duration;

use coord_core::BackendError;

use super::address::{Address, Place};
use super::client::{self, Client};
use super::config_error;
use super::tls::TlsOptions;

/// Where the provider's connections come from, as the builder was given it.
#[derive(Clone)]
pub(crate) enum Topology {
    /// One server (or one endpoint in front of a managed service), by URL.
    Standalone(String),
    /// A master found through Sentinel.
    Sentinel {
        master: String,
        sentinels: Vec<String>,
    },
    /// Redis Cluster, discovered from seed nodes.
    Cluster(Vec<String>),
    /// The application's own redis-rs client: its address, credentials, database and TLS
    /// settings.
    #[cfg(feature = "redis-client")]
    RedisClient(redis::Client),
    /// The application's own fred clients (one, or a pool's), shared.
    #[cfg(feature = "fred")]
    FredClients(Vec<fred::clients::Client>),
}

/// Everything a transport needs to connect.
#[derive(Clone)]
pub(crate) struct Options {
    pub(crate) topology: Topology,
    pub(crate) command_timeout: Duration,
    pub(crate) pool_size: usize,
    pub(crate) client: Client,
    /// Whether `client` was chosen explicitly (a shared client fixes the library).
    pub(crate) client_chosen: bool,
    /// Credentials for the data nodes behind Sentinel.
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    /// Logical database: the one server's (overriding its URL) or Sentinel's master's.
    pub(crate) database: Option<u8>,
    /// Whether the data nodes behind Sentinel speak TLS; by default as the Sentinels do.
    pub(crate) data_node_tls: Option<bool>,
    /// Certificates for TLS connections.
    pub(crate) tls: TlsOptions,
    /// Connect even to servers whose `maxmemory-policy` may evict coord's keys.
    pub(crate) allow_eviction: bool,
    /// Replicas that must acknowledge each granting write (`WAIT`), and for how long to wait.
    pub(crate) replica_acks: Option<(u32, Duration)>,
}

/// What a transport connects to, checked and parsed.
#[derive(Debug)]
pub(crate) enum Target {
    Standalone(Address),
    Sentinel {
        master: String,
        sentinels: Vec<Address>,
        /// Credentials, database and TLS of the data nodes.
        data: DataNodes,
    },
    Cluster(Vec<Address>),
    #[cfg(feature = "redis-client")]
    RedisClient(redis::Client),
    #[cfg(feature = "fred")]
    FredClients(Vec<fred::clients::Client>),
}

/// How to talk to the data nodes behind Sentinel.
#[derive(Clone)]
pub(crate) struct DataNodes {
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) database: Option<u8>,
    pub(crate) tls: bool,
}

impl fmt::Debug for DataNodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataNodes")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("database", &self.database)
            .field("tls", &self.tls)
            .finish()
    }
}

impl Options {
    /// The options of a builder for `topology`, before any builder method: the defaults,
    /// written here only.
    pub(crate) fn new(topology: Topology) -> Options {
        Options {
            topology,
            command_timeout: Duration::from_secs(1),
            pool_size: 1,
            client: Client::default(),
            client_chosen: false,
            username: None,
            password: None,
            database: None,
            data_node_tls: None,
            tls: TlsOptions::default(),
            allow_eviction: false,
            replica_acks: None,
        }
    }

    /// A description of where the provider connects, without any credentials.
    pub(crate) fn describe(&self) -> String {
        fn one(url: &str, default_port: u16) -> String {
            match Address::parse(url, default_port) {
                Ok(a) => a.display(),
                Err(_) => "<invalid address>".to_owned(),
            }
        }
        fn list(urls: &[String], default_port: u16) -> String {
            urls.iter()
                .map(|u| one(u, default_port))
                .collect::<Vec<_>>()
                .join(",")
        }
        match &self.topology {
            Topology::Standalone(url) => one(url, 6379),
            Topology::Sentinel { master, sentinels } => {
                format!("master `{master}` via sentinels {}", list(sentinels, 26379))
            }
            Topology::Cluster(seeds) => format!("cluster seeds {}", list(seeds, 6379)),
            #[cfg(feature = "redis-client")]
            Topology::RedisClient(client) => client::describe_redis_client(client),
            #[cfg(feature = "fred")]
            Topology::FredClients(clients) => match clients.first() {
                Some(client) => client::describe_fred_client(client),
                None => "<no fred client>".to_owned(),
            },
        }
    }

    /// Every password that might appear in a library's error text, to scrub it out: as
    /// decoded and as written in a URL.
    pub(crate) fn secrets(&self) -> Vec<String> {
        let mut out = Vec::new();
        let urls: Vec<&String> = match &self.topology {
            Topology::Standalone(url) => vec![url],
            Topology::Sentinel { sentinels, .. } => sentinels.iter().collect(),
            Topology::Cluster(seeds) => seeds.iter().collect(),
            #[cfg(feature = "redis-client")]
            Topology::RedisClient(client) => {
                out.extend(client::redis_client_secrets(client));
                Vec::new()
            }
            #[cfg(feature = "fred")]
            Topology::FredClients(clients) => {
                for client in clients {
                    out.extend(client::fred_client_secrets(client));
                }
                Vec::new()
            }
        };
        for url in urls {
            if let Ok(a) = Address::parse(url, 6379) {
                out.extend(a.secrets());
            }
        }
        out.extend(self.password.clone());
        out.retain(|s| !s.is_empty());
        out.sort();
        out.dedup();
        // Longest first, so a secret containing another is replaced whole.
        out.sort_by_key(|s| std::cmp::Reverse(s.len()));
        out
    }

    /// Parses and checks the addresses and how they fit together.
    pub(crate) fn target(&self) -> Result<Target, BackendError> {
        let same_access = |addresses: &[Address], what: &str| -> Result<(), BackendError> {
            let first = &addresses[0];
            for other in &addresses[1..] {
                if other.tls() != first.tls()
                    || other.username != first.username
                    || other.password != first.password
                {
                    return Err(config_error(format!(
                        "every {what} URL must use the same scheme (redis:// or rediss://) and \
                         the same credentials"
                    )));
                }
            }
            if addresses.iter().any(|a| matches!(a.place, Place::Unix(_))) {
                return Err(config_error(format!(
                    "{what} nodes are reached over TCP: a Unix socket cannot be a {what} address"
                )));
            }
            Ok(())
        };
        let target = match &self.topology {
            Topology::Standalone(url) => {
                let mut address = Address::parse(url, 6379)?;
                if self.database.is_some() {
                    address.database = self.database;
                }
                Target::Standalone(address)
            }
            Topology::Sentinel { master, sentinels } => {
                if master.is_empty() {
                    return Err(config_error("the Sentinel master name is empty".to_owned()));
                }
                if sentinels.is_empty() {
                    return Err(config_error("no Sentinel nodes given".to_owned()));
                }
                let sentinels = sentinels
                    .iter()
                    .map(|u| Address::parse(u, 26379))
                    .collect::<Result<Vec<_>, _>>()?;
                same_access(&sentinels, "Sentinel")?;
                if sentinels.iter().any(|s| s.database.is_some()) {
                    return Err(config_error(
                        "a Sentinel URL names no database: give the data nodes' database with \
                         `database(n)`"
                            .to_owned(),
                    ));
                }
                let tls = self.data_node_tls.unwrap_or(sentinels[0].tls());
                Target::Sentinel {
                    master: master.clone(),
                    data: DataNodes {
                        username: self.username.clone(),
                        password: self.password.clone(),
                        database: self.database,
                        tls,
                    },
                    sentinels,
                }
            }
            Topology::Cluster(seeds) => {
                if seeds.is_empty() {
                    return Err(config_error("no Cluster seed nodes given".to_owned()));
                }
                let seeds = seeds
                    .iter()
                    .map(|u| Address::parse(u, 6379))
                    .collect::<Result<Vec<_>, _>>()?;
                same_access(&seeds, "Cluster seed")?;
                if seeds.iter().any(|s| s.database.is_some_and(|db| db != 0))
                    || self.database.is_some_and(|db| db != 0)
                {
                    return Err(config_error("Redis Cluster has only database 0".to_owned()));
                }
                Target::Cluster(seeds)
            }
            #[cfg(feature = "redis-client")]
            Topology::RedisClient(client) => Target::RedisClient(client.clone()),
            #[cfg(feature = "fred")]
            Topology::FredClients(clients) => Target::FredClients(clients.clone()),
        };
        if self.data_node_tls.is_some() && !matches!(target, Target::Sentinel { .. }) {
            return Err(config_error(
                "`data_node_tls` is for the data nodes behind Sentinel; elsewhere the URL's \
                 scheme (rediss://) says whether TLS is used"
                    .to_owned(),
            ));
        }
        if (self.username.is_some() || self.password.is_some())
            && !matches!(target, Target::Sentinel { .. })
        {
            return Err(config_error(
                "`data_node_credentials` is for the data nodes behind Sentinel; put the \
                 credentials of one server or a cluster in its URL"
                    .to_owned(),
            ));
        }
        let uses_tls = match &target {
            Target::Standalone(a) => a.tls(),
            Target::Sentinel {
                sentinels, data, ..
            } => sentinels[0].tls() || data.tls,
            Target::Cluster(seeds) => seeds[0].tls(),
            #[cfg(feature = "redis-client")]
            Target::RedisClient(_) => false,
            #[cfg(feature = "fred")]
            Target::FredClients(_) => false,
        };
        if uses_tls && !cfg!(feature = "tls") {
            return Err(config_error(
                "TLS (rediss://) needs coord-redis's `tls` feature, which this build leaves out"
                    .to_owned(),
            ));
        }
        if !self.tls.is_empty() && !uses_tls {
            let own = match &target {
                #[cfg(feature = "redis-client")]
                Target::RedisClient(_) => true,
                #[cfg(feature = "fred")]
                Target::FredClients(_) => true,
                _ => false,
            };
            return Err(config_error(if own {
                "TLS certificates were given to the builder, but a shared client keeps its own \
                 TLS settings: configure them on that client"
                    .to_owned()
            } else {
                "TLS certificates were given, but no address uses TLS: use rediss:// URLs (or \
                 `data_node_tls(true)` behind Sentinel)"
                    .to_owned()
            }));
        }
        Ok(target)
    }
}

#[cfg(test)]
mod tests {
    use super::super::address::scrub;
    use super::super::tls::Pem;
    use super::*;

    #[test]
    fn scrubs_raw_and_decoded_passwords() {
        let opts = Options::new(Topology::Standalone("redis://:p%40ss@h:1".to_owned()));
        let secrets = opts.secrets();
        assert_eq!(scrub("x p@ss y p%40ss", &secrets), "x *** y ***");
        assert_eq!(opts.describe(), "h:1");

        let mut opts = Options::new(Topology::Sentinel {
            master: "m".to_owned(),
            sentinels: vec!["redis://:sentinel-pw@s1:26379".to_owned()],
        });
        opts.password = Some("data-pw".to_owned());
        let secrets = opts.secrets();
        assert_eq!(
            scrub("sentinel-pw data-pw", &secrets),
            "*** ***",
            "{secrets:?}"
        );
        assert_eq!(opts.describe(), "master `m` via sentinels s1:26379");
    }

    #[test]
    fn topologies_are_checked_as_a_whole() {
        let sentinel = |urls: &[&str]| {
            Options::new(Topology::Sentinel {
                master: "m".to_owned(),
                sentinels: urls.iter().map(|u| u.to_string()).collect(),
            })
        };
        assert!(sentinel(&["redis://s1", "rediss://s2"]).target().is_err());
        assert!(
            sentinel(&["redis://:a@s1", "redis://:b@s2"])
                .target()
                .is_err()
        );
        assert!(sentinel(&["redis://s1/2"]).target().is_err());
        assert!(sentinel(&["unix:///tmp/s"]).target().is_err());
        match sentinel(&["redis://:a@s1", "redis://:a@s2"])
            .target()
            .unwrap()
        {
            Target::Sentinel { data, .. } => assert!(!data.tls),
            other => panic!("{other:?}"),
        }
        let cluster = |urls: &[&str]| {
            Options::new(Topology::Cluster(
                urls.iter().map(|u| u.to_string()).collect(),
            ))
        };
        assert!(cluster(&["redis://a:1/3"]).target().is_err());
        assert!(cluster(&["redis://a:1", "rediss://b:1"]).target().is_err());
        assert!(cluster(&["redis://a:1", "redis://b:1/0"]).target().is_ok());

        // Settings that would otherwise be silently ignored.
        let mut o = Options::new(Topology::Standalone("redis://h".to_owned()));
        o.data_node_tls = Some(true);
        assert!(o.target().is_err());
        let mut o = Options::new(Topology::Standalone("redis://h".to_owned()));
        o.password = Some("x".to_owned());
        assert!(o.target().is_err());
        let mut o = Options::new(Topology::Standalone("redis://h".to_owned()));
        o.tls.ca = Some(Pem::Text(b"x".to_vec()));
        assert!(o.target().is_err(), "a CA for a plain address");

        // The builder's database overrides the URL's.
        let mut o = Options::new(Topology::Standalone("redis://h/1".to_owned()));
        o.database = Some(4);
        match o.target().unwrap() {
            Target::Standalone(a) => assert_eq!(a.database, Some(4)),
            other => panic!("{other:?}"),
        }
    }
}
