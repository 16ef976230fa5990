//! Addresses, topologies and the options a provider is built with.
//!
//! URLs are parsed with the `url` crate into [`Address`]es, the one form both client
//! libraries are configured from. Everything that ends up in an error message or a log line
//! goes through [`Address::display`] or [`Options::describe`], which never include
//! credentials; client libraries' own error texts pass through [`scrub`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use coord_core::BackendError;
use coord_core::provider::BackendErrorKind;
use percent_encoding::percent_decode_str;

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

fn config_error(message: String) -> BackendError {
    BackendError::new(BackendErrorKind::Config, message)
}

impl Options {
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
            Topology::RedisClient(client) => crate::transport::redis_rs::describe_client(client),
            #[cfg(feature = "fred")]
            Topology::FredClients(clients) => match clients.first() {
                Some(client) => crate::transport::fred_client::describe_client(client),
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
                if let Some(p) = client.get_connection_info().redis_settings().password() {
                    out.push(p.to_owned());
                }
                Vec::new()
            }
            #[cfg(feature = "fred")]
            Topology::FredClients(clients) => {
                for client in clients {
                    out.extend(crate::transport::fred_client::client_secrets(client));
                }
                Vec::new()
            }
        };
        for url in urls {
            if let Ok(a) = Address::parse(url, 6379) {
                out.extend(a.password);
                out.extend(a.raw_password);
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

/// Replaces every secret in `text` with `***`.
pub(crate) fn scrub(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_owned();
    for secret in secrets {
        if !secret.is_empty() {
            out = out.replace(secret.as_str(), "***");
        }
    }
    out
}

/// Where one node is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// TCP, with TLS when `tls`.
    Tcp { host: String, port: u16, tls: bool },
    /// A Unix domain socket.
    Unix(PathBuf),
}

/// One parsed Redis URL.
///
/// Accepted forms:
/// * `redis://[user[:password]@]host[:port][/db]` (also `valkey://`), or a bare `host:port`;
/// * `rediss://...` (also `valkeys://`): the same over TLS;
/// * `unix:///path/to/redis.sock` or `redis+unix:///path` (also `valkey+unix://`), with
///   `?db=N`, `?user=..` and `?pass=..` query parameters (or `user:password@localhost` before
///   the path).
///
/// Anything else (another scheme, an unknown query parameter, a fragment) is refused rather
/// than ignored.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Address {
    pub(crate) place: Place,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) database: Option<u8>,
    /// The password as written in the URL (percent-encoded), to scrub it from texts.
    raw_password: Option<String>,
}

impl fmt::Debug for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the password, even in debug output.
        f.debug_struct("Address")
            .field("place", &self.place)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("database", &self.database)
            .finish()
    }
}

impl Address {
    /// Parses a Redis URL (see the type's documentation for the forms). `default_port` is the
    /// port of a TCP address that names none.
    pub(crate) fn parse(text: &str, default_port: u16) -> Result<Address, BackendError> {
        // Never quote `text` in an error: it may hold a password.
        let invalid = |why: &str| {
            config_error(format!(
                "invalid Redis address: {why} (expected redis://[user[:password]@]host[:port][/db], \
                 rediss://... for TLS, or unix:///path/to/socket)"
            ))
        };
        let with_scheme;
        let text = if text.contains("://") {
            text
        } else {
            with_scheme = format!("redis://{text}");
            &with_scheme
        };
        let url = url::Url::parse(text).map_err(|e| invalid(&e.to_string()))?;
        if url.fragment().is_some() {
            return Err(invalid("a fragment (`#...`) is not supported"));
        }
        let decode = |s: &str, what: &str| {
            percent_decode_str(s)
                .decode_utf8()
                .map(|c| c.into_owned())
                .map_err(|_| invalid(&format!("the {what} is not valid UTF-8 once decoded")))
        };
        let mut username = Some(decode(url.username(), "user name")?).filter(|u| !u.is_empty());
        let mut raw_password = url.password().map(str::to_owned).filter(|p| !p.is_empty());
        let mut password = match &raw_password {
            Some(raw) => Some(decode(raw, "password")?),
            None => None,
        };
        let mut database = None;
        let parse_db = |db: &str| -> Result<u8, BackendError> {
            db.parse::<u8>()
                .map_err(|_| invalid("the database must be a number from 0 to 255"))
        };
        let place = match url.scheme() {
            scheme @ ("redis" | "valkey" | "rediss" | "valkeys") => {
                let tls = matches!(scheme, "rediss" | "valkeys");
                let host = match url.host() {
                    Some(url::Host::Domain(d)) if !d.is_empty() => decode(d, "host")?,
                    Some(url::Host::Ipv4(ip)) => ip.to_string(),
                    Some(url::Host::Ipv6(ip)) => ip.to_string(),
                    _ => return Err(invalid("missing host")),
                };
                let port = url.port().unwrap_or(default_port);
                if port == 0 {
                    return Err(invalid("port 0"));
                }
                match url.path().trim_start_matches('/') {
                    "" => {}
                    db => database = Some(parse_db(db)?),
                }
                if let Some((name, _)) = url.query_pairs().next() {
                    return Err(invalid(&format!(
                        "unknown query parameter `{name}` (a TCP address takes none; the \
                         database goes in the path)"
                    )));
                }
                Place::Tcp { host, port, tls }
            }
            "unix" | "redis+unix" | "valkey+unix" => {
                match url.host_str() {
                    None | Some("") | Some("localhost") => {}
                    Some(_) => {
                        return Err(invalid(
                            "a Unix socket URL names no host other than `localhost`",
                        ));
                    }
                }
                if url.port().is_some() {
                    return Err(invalid("a Unix socket URL names no port"));
                }
                let path = decode(url.path(), "socket path")?;
                if path.is_empty() || path == "/" {
                    return Err(invalid("missing socket path"));
                }
                for (name, value) in url.query_pairs() {
                    match &*name {
                        "db" => database = Some(parse_db(&value)?),
                        "user" => username = Some(value.into_owned()).filter(|u| !u.is_empty()),
                        "pass" | "password" => {
                            password = Some(value.into_owned()).filter(|p| !p.is_empty());
                            raw_password = url
                                .query()
                                .and_then(|q| {
                                    q.split('&').find_map(|kv| {
                                        kv.strip_prefix("pass=")
                                            .or_else(|| kv.strip_prefix("password="))
                                    })
                                })
                                .map(str::to_owned);
                        }
                        other => {
                            return Err(invalid(&format!(
                                "unknown query parameter `{other}` (a Unix socket URL takes \
                                 db, user and pass)"
                            )));
                        }
                    }
                }
                Place::Unix(PathBuf::from(path))
            }
            other => return Err(invalid(&format!("unsupported scheme `{other}`"))),
        };
        Ok(Address {
            place,
            username,
            password,
            database,
            raw_password,
        })
    }

    /// Whether this address is reached over TLS.
    pub(crate) fn tls(&self) -> bool {
        matches!(self.place, Place::Tcp { tls: true, .. })
    }

    /// `host:port` (`[v6]:port` for an IPv6 address), or `unix:/path`: the form used in
    /// messages. Never includes credentials.
    pub(crate) fn display(&self) -> String {
        match &self.place {
            Place::Tcp { host, port, .. } => display_parts(host, *port),
            Place::Unix(path) => display_socket(path),
        }
    }
}

/// `host:port` (`[v6]:port` for an IPv6 address).
pub(crate) fn display_parts(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `unix:/path`.
pub(crate) fn display_socket(path: &Path) -> String {
    format!("unix:{}", path.display())
}

/// PEM text, given directly or read from a file when the provider connects.
#[derive(Clone)]
#[cfg_attr(not(feature = "tls"), allow(dead_code))] // the builder sets it only with TLS
pub(crate) enum Pem {
    Text(Vec<u8>),
    File(PathBuf),
}

impl Pem {
    fn load(&self, what: &str) -> Result<Vec<u8>, BackendError> {
        match self {
            Pem::Text(bytes) => Ok(bytes.clone()),
            Pem::File(path) => std::fs::read(path).map_err(|e| {
                config_error(format!("reading the {what} from {}: {e}", path.display()))
            }),
        }
    }
}

/// Certificates for TLS connections, as the builder was given them.
#[derive(Clone, Default)]
pub(crate) struct TlsOptions {
    /// Trust only these CAs (instead of the system's store).
    pub(crate) ca: Option<Pem>,
    /// A client certificate (chain) and its private key.
    pub(crate) client: Option<(Pem, Pem)>,
}

impl TlsOptions {
    pub(crate) fn is_empty(&self) -> bool {
        self.ca.is_none() && self.client.is_none()
    }

    /// Reads the files and checks that each holds what it should.
    pub(crate) fn load(&self) -> Result<TlsMaterial, BackendError> {
        let material = TlsMaterial {
            ca: self.ca.as_ref().map(|p| p.load("TLS CA")).transpose()?,
            client: match &self.client {
                Some((cert, key)) => Some((
                    cert.load("TLS client certificate")?,
                    key.load("TLS client key")?,
                )),
                None => None,
            },
        };
        material.check()?;
        Ok(material)
    }
}

impl fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = |p: &Pem| match p {
            Pem::Text(_) => "<PEM given>".to_owned(),
            Pem::File(path) => path.display().to_string(),
        };
        f.debug_struct("TlsOptions")
            .field("ca", &self.ca.as_ref().map(shown))
            .field(
                "client_cert",
                &self.client.as_ref().map(|(cert, _)| shown(cert)),
            )
            .finish()
    }
}

/// Loaded PEM bytes for TLS connections. Never printed.
#[derive(Clone, Default)]
pub(crate) struct TlsMaterial {
    pub(crate) ca: Option<Vec<u8>>,
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl TlsMaterial {
    #[cfg(not(feature = "tls"))]
    fn check(&self) -> Result<(), BackendError> {
        Ok(())
    }

    /// Every given PEM holds what it should: the CA at least one certificate, the client
    /// certificate at least one and the key a private key.
    #[cfg(feature = "tls")]
    fn check(&self) -> Result<(), BackendError> {
        if let Some(ca) = &self.ca {
            roots_from_pem(ca)?;
        }
        if let Some((cert, key)) = &self.client {
            client_identity(cert, key)?;
        }
        Ok(())
    }

    /// A rustls client configuration with these certificates (the system's roots when no CA
    /// was given), on ring, whatever provider the process has installed.
    #[cfg(feature = "tls")]
    #[allow(dead_code)] // used by the fred transport only
    pub(crate) fn rustls_config(&self) -> Result<rustls::ClientConfig, BackendError> {
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| config_error(format!("TLS setup: {e}")))?;
        let roots = match &self.ca {
            Some(ca) => roots_from_pem(ca)?,
            None => system_roots()?,
        };
        let builder = builder.with_root_certificates(roots);
        match &self.client {
            Some((cert, key)) => {
                let (chain, key) = client_identity(cert, key)?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| config_error(format!("the TLS client certificate: {e}")))
            }
            None => Ok(builder.with_no_client_auth()),
        }
    }
}

/// Makes sure rustls has a process-wide crypto provider before a client library asks for
/// it: ring's, unless the application installed one. (rustls picks one by itself only when
/// exactly one is compiled in; with two, a library that asks would panic.)
#[cfg(feature = "tls")]
#[allow(dead_code)] // used by the redis-rs transport only
pub(crate) fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: one provider is in place either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(feature = "tls")]
fn roots_from_pem(pem: &[u8]) -> Result<rustls::RootCertStore, BackendError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| config_error(format!("the TLS CA is not valid PEM: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| config_error(format!("the TLS CA certificate is refused: {e}")))?;
    }
    if roots.is_empty() {
        return Err(config_error(
            "the TLS CA holds no certificate (expected PEM `BEGIN CERTIFICATE` blocks)".to_owned(),
        ));
    }
    Ok(roots)
}

#[cfg(feature = "tls")]
#[allow(dead_code)] // used by the fred transport only
fn system_roots() -> Result<rustls::RootCertStore, BackendError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (_added, _ignored) = roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        let why = found
            .errors
            .first()
            .map_or_else(|| "none found".to_owned(), |e| e.to_string());
        return Err(config_error(format!(
            "no trusted CA certificates in the system store ({why}): install them, or name the \
             CA with `tls_ca_file`"
        )));
    }
    Ok(roots)
}

#[cfg(feature = "tls")]
type Identity = (
    Vec<rustls::pki_types::CertificateDer<'static>>,
    rustls::pki_types::PrivateKeyDer<'static>,
);

#[cfg(feature = "tls")]
fn client_identity(cert: &[u8], key: &[u8]) -> Result<Identity, BackendError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| config_error(format!("the TLS client certificate is not valid PEM: {e}")))?;
    if chain.is_empty() {
        return Err(config_error(
            "the TLS client certificate holds no certificate".to_owned(),
        ));
    }
    // The key's own text never goes into a message.
    let key = PrivateKeyDer::from_pem_slice(key)
        .map_err(|_| config_error("the TLS client key holds no PEM private key".to_owned()))?;
    Ok((chain, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16, tls: bool) -> Place {
        Place::Tcp {
            host: host.to_owned(),
            port,
            tls,
        }
    }

    #[test]
    fn parses_tcp_addresses_and_redacts() {
        let a = Address::parse("redis://user:s%40cret@10.1.2.3:7000/2", 6379).unwrap();
        assert_eq!(a.place, tcp("10.1.2.3", 7000, false));
        assert_eq!(a.username.as_deref(), Some("user"));
        assert_eq!(a.password.as_deref(), Some("s@cret"));
        assert_eq!(a.raw_password.as_deref(), Some("s%40cret"));
        assert_eq!(a.database, Some(2));
        assert_eq!(a.display(), "10.1.2.3:7000");
        assert!(!format!("{a:?}").contains("cret"));

        let a = Address::parse("redis://:pw@[::1]", 6379).unwrap();
        assert_eq!(a.place, tcp("::1", 6379, false));
        assert_eq!(a.display(), "[::1]:6379");
        assert_eq!(a.username, None);
        assert_eq!(a.password.as_deref(), Some("pw"));

        let a = Address::parse("127.0.0.1:26380", 26379).unwrap();
        assert_eq!(a.place, tcp("127.0.0.1", 26380, false));
        let a = Address::parse("sentinel-b", 26379).unwrap();
        assert_eq!(a.place, tcp("sentinel-b", 26379, false));

        let a = Address::parse("rediss://cache.example.com:6380/0", 6379).unwrap();
        assert_eq!(a.place, tcp("cache.example.com", 6380, true));
        assert_eq!(a.database, Some(0));
        assert!(a.tls());
        assert!(Address::parse("valkeys://h", 6379).unwrap().tls());
        assert!(!Address::parse("redis://h", 6379).unwrap().tls());
        assert!(!Address::parse("h:1", 6379).unwrap().tls());
        assert!(!Address::parse("valkey://h", 6379).unwrap().tls());
    }

    #[test]
    fn parses_unix_addresses() {
        let a = Address::parse("unix:///run/redis/redis.sock", 6379).unwrap();
        assert_eq!(a.place, Place::Unix("/run/redis/redis.sock".into()));
        assert_eq!(a.display(), "unix:/run/redis/redis.sock");
        assert_eq!(a.database, None);

        let a = Address::parse("redis+unix:///tmp/r.sock?db=3&user=app&pass=p%26w", 6379).unwrap();
        assert_eq!(a.place, Place::Unix("/tmp/r.sock".into()));
        assert_eq!(a.database, Some(3));
        assert_eq!(a.username.as_deref(), Some("app"));
        assert_eq!(a.password.as_deref(), Some("p&w"));
        assert_eq!(a.raw_password.as_deref(), Some("p%26w"));

        let a = Address::parse("unix://app:pw@localhost/tmp/r.sock", 6379).unwrap();
        assert_eq!(a.place, Place::Unix("/tmp/r.sock".into()));
        assert_eq!(
            (a.username.as_deref(), a.password.as_deref()),
            (Some("app"), Some("pw"))
        );
    }

    #[test]
    fn refuses_what_it_would_otherwise_ignore() {
        for bad in [
            "http://h:1",
            "redis://h:notaport",
            "redis://h:1/300",
            "redis://h:1/x",
            "redis://h:1?db=2",
            "redis://h:1#insecure",
            "redis://:pw@",
            "unix:///tmp/s?protocol=resp3",
            "unix://other-host/tmp/s",
            "unix://",
        ] {
            let err = Address::parse(bad, 6379).expect_err(bad);
            assert_eq!(err.kind(), BackendErrorKind::Config, "{bad}");
        }
        // The URL itself is never quoted: it may hold a password.
        let err = Address::parse("redis://u:hunter2@h:1/x", 6379).unwrap_err();
        assert!(!err.message().contains("hunter2"), "{err}");
    }

    fn options(topology: Topology) -> Options {
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
        }
    }

    #[test]
    fn scrubs_raw_and_decoded_passwords() {
        let opts = options(Topology::Standalone("redis://:p%40ss@h:1".to_owned()));
        let secrets = opts.secrets();
        assert_eq!(scrub("x p@ss y p%40ss", &secrets), "x *** y ***");
        assert_eq!(opts.describe(), "h:1");

        let mut opts = options(Topology::Sentinel {
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
            options(Topology::Sentinel {
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
            options(Topology::Cluster(
                urls.iter().map(|u| u.to_string()).collect(),
            ))
        };
        assert!(cluster(&["redis://a:1/3"]).target().is_err());
        assert!(cluster(&["redis://a:1", "rediss://b:1"]).target().is_err());
        assert!(cluster(&["redis://a:1", "redis://b:1/0"]).target().is_ok());

        // Settings that would otherwise be silently ignored.
        let mut o = options(Topology::Standalone("redis://h".to_owned()));
        o.data_node_tls = Some(true);
        assert!(o.target().is_err());
        let mut o = options(Topology::Standalone("redis://h".to_owned()));
        o.password = Some("x".to_owned());
        assert!(o.target().is_err());
        let mut o = options(Topology::Standalone("redis://h".to_owned()));
        o.tls.ca = Some(Pem::Text(b"x".to_vec()));
        assert!(o.target().is_err(), "a CA for a plain address");

        // The builder's database overrides the URL's.
        let mut o = options(Topology::Standalone("redis://h/1".to_owned()));
        o.database = Some(4);
        match o.target().unwrap() {
            Target::Standalone(a) => assert_eq!(a.database, Some(4)),
            other => panic!("{other:?}"),
        }
    }

    #[cfg(feature = "tls")]
    #[test]
    fn bad_pem_is_refused_without_quoting_it() {
        let tls = TlsOptions {
            ca: Some(Pem::Text(b"not a certificate".to_vec())),
            client: None,
        };
        assert_eq!(tls.load().unwrap_err().kind(), BackendErrorKind::Config);
        let tls = TlsOptions {
            ca: Some(Pem::File("/nonexistent/ca.pem".into())),
            client: None,
        };
        let err = tls.load().unwrap_err();
        assert!(err.message().contains("/nonexistent/ca.pem"), "{err}");
        let tls = TlsOptions {
            ca: None,
            client: Some((
                Pem::Text(b"no cert".to_vec()),
                Pem::Text(b"secret-key-text".to_vec()),
            )),
        };
        let err = tls.load().unwrap_err();
        assert!(!err.message().contains("secret-key-text"), "{err}");
    }
}
