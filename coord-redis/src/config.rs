//! Addresses, topologies and the options a provider is built with.
//!
//! Everything that ends up in an error message goes through [`Endpoint::display`], which
//! never includes credentials.

use std::fmt;
use std::time::Duration;

use coord_core::{BackendError, BackendErrorKind};

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

/// How the servers are laid out.
#[derive(Clone)]
pub(crate) enum Topology {
    /// One server (or one endpoint in front of a managed service).
    Standalone(String),
    /// A master found through Sentinel.
    Sentinel {
        master: String,
        sentinels: Vec<String>,
    },
    /// Redis Cluster, discovered from seed nodes.
    Cluster(Vec<String>),
}

/// Everything a transport needs to connect.
#[derive(Clone)]
pub(crate) struct Options {
    pub(crate) topology: Topology,
    pub(crate) command_timeout: Duration,
    pub(crate) pool_size: usize,
    pub(crate) client: Client,
    /// Credentials for the data nodes when they cannot come from a URL (Sentinel).
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    /// Logical database for the data nodes behind Sentinel.
    pub(crate) database: Option<u8>,
    /// Connect even to servers whose `maxmemory-policy` may evict coord's keys.
    pub(crate) allow_eviction: bool,
}

impl Options {
    /// A description of where the provider connects, without any credentials.
    pub(crate) fn describe(&self) -> String {
        fn list(urls: &[String], default_port: u16) -> String {
            urls.iter()
                .map(|u| match Endpoint::parse(u, default_port) {
                    Ok(e) => e.display(),
                    Err(_) => "<invalid address>".to_owned(),
                })
                .collect::<Vec<_>>()
                .join(",")
        }
        match &self.topology {
            Topology::Standalone(url) => match Endpoint::parse(url, 6379) {
                Ok(e) => e.display(),
                Err(_) => "<invalid address>".to_owned(),
            },
            Topology::Sentinel { master, sentinels } => {
                format!("master `{master}` via sentinels {}", list(sentinels, 26379))
            }
            Topology::Cluster(seeds) => format!("cluster seeds {}", list(seeds, 6379)),
        }
    }

    /// Every password that might appear in a library's error text, to scrub it out.
    pub(crate) fn secrets(&self) -> Vec<String> {
        let mut out = Vec::new();
        let urls: Vec<&String> = match &self.topology {
            Topology::Standalone(url) => vec![url],
            Topology::Sentinel { sentinels, .. } => sentinels.iter().collect(),
            Topology::Cluster(seeds) => seeds.iter().collect(),
        };
        for url in urls {
            if let Ok(e) = Endpoint::parse(url, 6379) {
                if let Some(p) = e.password {
                    out.push(p);
                }
                if let Some(raw) = raw_password(url) {
                    out.push(raw.to_owned());
                }
            }
        }
        if let Some(p) = &self.password {
            out.push(p.clone());
        }
        out.retain(|s| !s.is_empty());
        out
    }
}

/// The password exactly as written in a URL (before percent-decoding).
fn raw_password(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    let (userinfo, _) = authority.rsplit_once('@')?;
    userinfo.split_once(':').map(|(_, p)| p)
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

/// One parsed `redis://[user[:password]@]host[:port][/db]` address.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) database: Option<u8>,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the password, even in debug output.
        f.debug_struct("Endpoint")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("database", &self.database)
            .finish()
    }
}

impl Endpoint {
    /// Parses a Redis URL. A bare `host:port` is accepted too. `rediss://` (TLS) is refused:
    /// this build has no TLS support.
    pub(crate) fn parse(url: &str, default_port: u16) -> Result<Endpoint, BackendError> {
        let invalid = |why: &str| {
            BackendError::new(
                BackendErrorKind::Config,
                format!(
                    "invalid Redis address: {why} (expected redis://[user[:password]@]host[:port][/db])"
                ),
            )
        };
        let rest = match url.split_once("://") {
            Some(("redis", rest)) | Some(("valkey", rest)) => rest,
            Some(("rediss", _)) | Some(("valkeys", _)) => {
                return Err(invalid("TLS (rediss://) is not supported by this build"));
            }
            Some((scheme, _)) => {
                return Err(invalid(&format!("unsupported scheme `{scheme}`")));
            }
            None => url,
        };
        let (authority, path) = match rest.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (rest, None),
        };
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(info) => {
                let (user, pass) = match info.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (info, None),
                };
                let user = percent_decode(user).ok_or_else(|| invalid("bad escape in user"))?;
                let pass = match pass {
                    Some(p) => {
                        Some(percent_decode(p).ok_or_else(|| invalid("bad escape in password"))?)
                    }
                    None => None,
                };
                (
                    (!user.is_empty()).then_some(user),
                    pass.filter(|p| !p.is_empty()),
                )
            }
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (host, after) = v6.split_once(']').ok_or_else(|| invalid("unclosed `[`"))?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| invalid("bad port"))?,
                None if after.is_empty() => default_port,
                None => return Err(invalid("bad host")),
            };
            (host.to_owned(), port)
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h.to_owned(), p.parse().map_err(|_| invalid("bad port"))?),
                None => (hostport.to_owned(), default_port),
            }
        };
        if host.is_empty() {
            return Err(invalid("missing host"));
        }
        let database = match path.map(|p| p.split('?').next().unwrap_or("")) {
            None | Some("") => None,
            Some(db) => Some(db.parse().map_err(|_| invalid("bad database number"))?),
        };
        Ok(Endpoint {
            host,
            port,
            username,
            password,
            database,
        })
    }

    /// `host:port`, the form used in messages.
    pub(crate) fn display(&self) -> String {
        Endpoint::display_parts(&self.host, self.port)
    }

    /// `host:port` (`[v6]:port` for an IPv6 address).
    pub(crate) fn display_parts(host: &str, port: u16) -> String {
        if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        }
    }
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_redacts() {
        let e = Endpoint::parse("redis://user:s%40cret@10.1.2.3:7000/2", 6379).unwrap();
        assert_eq!(e.host, "10.1.2.3");
        assert_eq!(e.port, 7000);
        assert_eq!(e.username.as_deref(), Some("user"));
        assert_eq!(e.password.as_deref(), Some("s@cret"));
        assert_eq!(e.database, Some(2));
        assert_eq!(e.display(), "10.1.2.3:7000");
        assert!(!format!("{e:?}").contains("cret"));

        let e = Endpoint::parse("redis://:pw@[::1]", 6379).unwrap();
        assert_eq!((e.host.as_str(), e.port), ("::1", 6379));
        assert_eq!(e.display(), "[::1]:6379");
        assert_eq!(e.username, None);

        let e = Endpoint::parse("127.0.0.1:26380", 26379).unwrap();
        assert_eq!(e.port, 26380);
        assert!(Endpoint::parse("rediss://h:1", 6379).is_err());
        assert!(Endpoint::parse("http://h:1", 6379).is_err());
        assert!(Endpoint::parse("redis://h:notaport", 6379).is_err());
    }

    #[test]
    fn scrubs_raw_and_decoded_passwords() {
        let opts = Options {
            topology: Topology::Standalone("redis://:p%40ss@h:1".to_owned()),
            command_timeout: Duration::from_secs(1),
            pool_size: 1,
            client: Client::default(),
            username: None,
            password: None,
            database: None,
            allow_eviction: false,
        };
        let secrets = opts.secrets();
        assert_eq!(scrub("x p@ss y p%40ss", &secrets), "x *** y ***");
        assert_eq!(opts.describe(), "h:1");
    }
}
