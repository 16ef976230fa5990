//! Redis URLs, parsed once into [`Address`]es, the one form both client libraries are
//! configured from; how a node is named in messages; and the scrubbing of passwords from
//! texts that reach users.

use std::fmt;
use std::path::{Path, PathBuf};

use coord_core::BackendError;
use percent_encoding::percent_decode_str;

use super::config_error;

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

    /// The password as decoded and as written in the URL (percent-encoded): both forms may
    /// appear in a client library's error text, to be scrubbed.
    pub(crate) fn secrets(&self) -> impl Iterator<Item = String> + use<> {
        self.password
            .clone()
            .into_iter()
            .chain(self.raw_password.clone())
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

#[cfg(test)]
mod tests {
    use coord_core::provider::BackendErrorKind;

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
}
