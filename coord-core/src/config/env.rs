//! Reading a [`CoordConfig`] from `COORD_*` variables.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use super::{ConfigError, CoordConfig, Profile, ProviderConfig, TlsFiles, check_profile_name};
use crate::policy::OnBackendError;

pub(crate) const NAMESPACE: &str = "COORD_NAMESPACE";
const REDIS_URL: &str = "COORD_REDIS_URL";
const TLS_CA_FILE: &str = "COORD_REDIS_TLS_CA_FILE";
const TLS_CERT_FILE: &str = "COORD_REDIS_TLS_CLIENT_CERT_FILE";
const TLS_KEY_FILE: &str = "COORD_REDIS_TLS_CLIENT_KEY_FILE";
const SENTINEL_URLS: &str = "COORD_REDIS_SENTINEL_URLS";
const SENTINEL_SERVICE: &str = "COORD_REDIS_SENTINEL_SERVICE_NAME";
const SENTINEL_USERNAME: &str = "COORD_REDIS_SENTINEL_USERNAME";
const SENTINEL_PASSWORD: &str = "COORD_REDIS_SENTINEL_PASSWORD";
const CLUSTER_URLS: &str = "COORD_REDIS_CLUSTER_URLS";
const POSTGRES_URL: &str = "COORD_POSTGRES_URL";
const POSTGRES_SCHEMA: &str = "COORD_POSTGRES_SCHEMA";
const POSTGRES_CA_FILE: &str = "COORD_POSTGRES_TLS_CA_FILE";
const COMMAND_TIMEOUT: &str = "COORD_COMMAND_TIMEOUT";
const PROFILE_PREFIX: &str = "COORD_PROFILE_";

/// Every variable [`CoordConfig::from_env`](super::CoordConfig::from_env) reads, with what it
/// sets. A profile's fields are `COORD_PROFILE_<NAME>_<FIELD>` with `<FIELD>` one of `LEASE`,
/// `WAIT`, `RETENTION`, `IN_FLIGHT_LEASE`, `RENEW`, `ON_BACKEND_ERROR` and `<NAME>` the
/// profile's name in capitals (`COORD_PROFILE_BULK_JOBS_WAIT` sets `profiles.bulk_jobs.wait`).
///
/// At most one of `COORD_REDIS_URL`, `COORD_REDIS_SENTINEL_URLS`, `COORD_REDIS_CLUSTER_URLS`
/// and `COORD_POSTGRES_URL` may be set; none means the in-process provider. Lists are
/// comma-separated.
pub const ENV_VARIABLES: &[(&str, &str)] = &[
    (NAMESPACE, "namespace"),
    (REDIS_URL, "provider = redis, its url"),
    (TLS_CA_FILE, "provider.tls.ca_file"),
    (TLS_CERT_FILE, "provider.tls.client_cert_file"),
    (TLS_KEY_FILE, "provider.tls.client_key_file"),
    (SENTINEL_URLS, "provider = sentinel, its urls"),
    (SENTINEL_SERVICE, "provider.service_name (Sentinel)"),
    (SENTINEL_USERNAME, "provider.username (Sentinel data nodes)"),
    (SENTINEL_PASSWORD, "provider.password (Sentinel data nodes)"),
    (CLUSTER_URLS, "provider = cluster, its urls"),
    (POSTGRES_URL, "provider = postgres, its url"),
    (POSTGRES_SCHEMA, "provider.schema (PostgreSQL)"),
    (POSTGRES_CA_FILE, "provider.tls.ca_file (PostgreSQL)"),
    (COMMAND_TIMEOUT, "command_timeout"),
    ("COORD_LEASE", "defaults.lease"),
    ("COORD_WAIT", "defaults.wait"),
    ("COORD_RETENTION", "defaults.retention"),
    ("COORD_IN_FLIGHT_LEASE", "defaults.in_flight_lease"),
    ("COORD_RENEW", "defaults.renew"),
    ("COORD_ON_BACKEND_ERROR", "defaults.on_backend_error"),
];

/// A profile field's variable suffix, longest first so `_IN_FLIGHT_LEASE` wins over `_LEASE`.
const PROFILE_FIELDS: [&str; 6] = [
    "IN_FLIGHT_LEASE",
    "ON_BACKEND_ERROR",
    "RETENTION",
    "LEASE",
    "RENEW",
    "WAIT",
];

/// The variable that names a provider of `kind` (for messages).
pub(super) fn provider_variable(kind: &str) -> &'static str {
    match kind {
        "sentinel" => SENTINEL_URLS,
        "cluster" => CLUSTER_URLS,
        _ => REDIS_URL,
    }
}

/// A `COORD_*` variable of the defaults or of a profile whose value a coordinator does not
/// hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unapplied {
    /// The variable's name (`COORD_PROFILE_NIGHTLY_LEASE`).
    pub(crate) variable: String,
    /// The configuration field it sets (`profiles.nightly.lease`).
    pub(crate) field: String,
    /// The profile it belongs to, if any.
    pub(crate) profile: Option<String>,
}

/// The variables among `vars` that [`read`] would apply to the defaults (`COORD_LEASE`, ...)
/// or to a profile (`COORD_PROFILE_<NAME>_<FIELD>`) whose value `defaults`, `profiles` and the
/// backend-fault `policy` do not hold, in name order: what a coordinator built without them
/// ignores. A value that does not parse is never held.
pub(crate) fn unapplied_variables<I, K, V>(
    vars: I,
    defaults: &Profile,
    profiles: &std::collections::BTreeMap<String, Profile>,
    policy: OnBackendError,
) -> Vec<Unapplied>
where
    I: IntoIterator<Item = (K, V)>,
    K: Into<OsString>,
    V: Into<OsString>,
{
    let mut out = Vec::new();
    for (name, value) in vars {
        let (name, value) = (name.into(), value.into());
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with("COORD_") {
            continue;
        }
        let value = value.to_str().unwrap_or("");
        let (profile, field) = if let Some(field) = name
            .strip_prefix("COORD_")
            .filter(|f| PROFILE_FIELDS.contains(f))
        {
            (None, field)
        } else if let Some(rest) = name.strip_prefix(PROFILE_PREFIX) {
            let Some((profile, field)) = PROFILE_FIELDS.iter().find_map(|field| {
                rest.strip_suffix(field)
                    .and_then(|p| p.strip_suffix('_'))
                    .map(|p| (p.to_ascii_lowercase(), *field))
            }) else {
                continue;
            };
            (Some(profile), field)
        } else {
            continue;
        };
        // What the variable asks for, as the reader would apply it.
        let mut wanted = Profile::default();
        if set_field(&mut wanted, field, name, value).is_err() {
            wanted = Profile::default();
        }
        let held = match &profile {
            None => {
                let mut held = *defaults;
                held.on_backend_error = Some(defaults.on_backend_error.unwrap_or(policy));
                held
            }
            Some(p) => profiles.get(p).copied().unwrap_or_default(),
        };
        let applied = wanted != Profile::default()
            && match field {
                "LEASE" => wanted.lease == held.lease,
                "WAIT" => wanted.wait == held.wait,
                "RETENTION" => wanted.retention == held.retention,
                "IN_FLIGHT_LEASE" => wanted.in_flight_lease == held.in_flight_lease,
                "RENEW" => wanted.renew == held.renew,
                _ => wanted.on_backend_error == held.on_backend_error,
            };
        if !applied {
            let field_name = field.to_ascii_lowercase();
            let path = match &profile {
                None => format!("defaults.{field_name}"),
                Some(p) => format!("profiles.{p}.{field_name}"),
            };
            out.push(Unapplied {
                variable: name.to_owned(),
                field: path,
                profile,
            });
        }
    }
    out.sort_by(|a, b| a.variable.cmp(&b.variable));
    out
}

fn bad(variable: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Variable {
        variable: variable.to_owned(),
        reason: reason.into(),
    }
}

fn duration(variable: &str, value: &str) -> Result<Duration, ConfigError> {
    super::parse_duration(value.trim()).map_err(|why| bad(variable, why))
}

fn policy(variable: &str, value: &str) -> Result<OnBackendError, ConfigError> {
    match value.trim() {
        "fail_closed" => Ok(OnBackendError::FailClosed),
        "fail_open" => Ok(OnBackendError::FailOpen),
        other => Err(bad(
            variable,
            format!("{other:?} is not a policy: write `fail_closed` or `fail_open`"),
        )),
    }
}

fn list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Sets one field of a profile from its suffix (`LEASE`, `WAIT`, ...).
fn set_field(
    profile: &mut Profile,
    field: &str,
    variable: &str,
    value: &str,
) -> Result<(), ConfigError> {
    match field {
        "LEASE" => profile.lease = Some(duration(variable, value)?),
        "WAIT" => profile.wait = Some(duration(variable, value)?),
        "RETENTION" => profile.retention = Some(duration(variable, value)?),
        "IN_FLIGHT_LEASE" => profile.in_flight_lease = Some(duration(variable, value)?),
        "RENEW" => profile.renew = Some(duration(variable, value)?),
        "ON_BACKEND_ERROR" => profile.on_backend_error = Some(policy(variable, value)?),
        _ => unreachable!("only called with PROFILE_FIELDS"),
    }
    Ok(())
}

/// The edit distance between two short names, for "did you mean".
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// The known variable `name` is probably a misspelling of, if any.
fn likely_meant(name: &str) -> Option<&'static str> {
    ENV_VARIABLES
        .iter()
        .map(|(known, _)| *known)
        .filter(|known| distance(name, known) <= 2)
        .min_by_key(|known| distance(name, known))
}

pub(super) fn read<I, K, V>(vars: I) -> Result<CoordConfig, ConfigError>
where
    I: IntoIterator<Item = (K, V)>,
    K: Into<OsString>,
    V: Into<OsString>,
{
    let mut config = CoordConfig::default();
    let mut tls = TlsFiles::default();
    let mut redis_url = None;
    let mut sentinel_urls = None;
    let mut sentinel_service = None;
    let mut sentinel_username = None;
    let mut sentinel_password = None;
    let mut cluster_urls = None;
    let mut postgres_url = None;
    let mut postgres_schema = None;
    let mut postgres_ca = None;
    // Sorted, so the first error reported does not depend on the environment's order.
    let mut pairs: Vec<(String, OsString)> = Vec::new();
    for (key, value) in vars {
        let (key, value) = (key.into(), value.into());
        let Some(key) = key.to_str() else { continue };
        if key.starts_with("COORD_") {
            pairs.push((key.to_owned(), value));
        }
    }
    pairs.sort();
    for (name, value) in &pairs {
        let name = name.as_str();
        let Some(value) = value.to_str() else {
            return Err(bad(name, "the value is not valid UTF-8"));
        };
        match name {
            NAMESPACE => config.namespace = Some(value.trim().to_owned()),
            REDIS_URL => redis_url = Some(value.trim().to_owned()),
            TLS_CA_FILE => tls.ca_file = Some(PathBuf::from(value)),
            TLS_CERT_FILE => tls.client_cert_file = Some(PathBuf::from(value)),
            TLS_KEY_FILE => tls.client_key_file = Some(PathBuf::from(value)),
            SENTINEL_URLS => sentinel_urls = Some(list(value)),
            SENTINEL_SERVICE => sentinel_service = Some(value.trim().to_owned()),
            SENTINEL_USERNAME => sentinel_username = Some(value.to_owned()),
            SENTINEL_PASSWORD => sentinel_password = Some(value.to_owned()),
            CLUSTER_URLS => cluster_urls = Some(list(value)),
            POSTGRES_URL => postgres_url = Some(value.trim().to_owned()),
            POSTGRES_SCHEMA => postgres_schema = Some(value.trim().to_owned()),
            POSTGRES_CA_FILE => postgres_ca = Some(PathBuf::from(value)),
            COMMAND_TIMEOUT => config.command_timeout = Some(duration(name, value)?),
            _ => {
                if let Some(field) = name
                    .strip_prefix("COORD_")
                    .filter(|f| PROFILE_FIELDS.contains(f))
                {
                    set_field(&mut config.defaults, field, name, value)?;
                } else if let Some(rest) = name.strip_prefix(PROFILE_PREFIX) {
                    let Some((profile, field)) = PROFILE_FIELDS.iter().find_map(|field| {
                        rest.strip_suffix(field)
                            .and_then(|p| p.strip_suffix('_'))
                            .map(|p| (p, *field))
                    }) else {
                        return Err(bad(
                            name,
                            format!(
                                "not a profile field: write COORD_PROFILE_<NAME>_<FIELD> with <FIELD> one of {}",
                                PROFILE_FIELDS.join(", ")
                            ),
                        ));
                    };
                    let profile = profile.to_ascii_lowercase();
                    check_profile_name(&profile).map_err(|why| bad(name, why))?;
                    let entry = config.profiles.entry(profile).or_default();
                    set_field(entry, field, name, value)?;
                } else if name.starts_with("COORD_REDIS_") || name.starts_with("COORD_POSTGRES_") {
                    let hint = likely_meant(name)
                        .map(|known| format!("; did you mean {known}?"))
                        .unwrap_or_default();
                    return Err(bad(
                        name,
                        format!("coord does not read this variable{hint}"),
                    ));
                } else if let Some(known) = likely_meant(name) {
                    return Err(bad(
                        name,
                        format!("coord does not read this variable; did you mean {known}?"),
                    ));
                }
                // Any other `COORD_` name is left to whoever reads it (an application's or a
                // tool's own setting), since it is not close to one of coord's.
            }
        }
    }

    let tls = (tls != TlsFiles::default()).then_some(tls);
    let chosen = [
        (REDIS_URL, redis_url.is_some()),
        (SENTINEL_URLS, sentinel_urls.is_some()),
        (CLUSTER_URLS, cluster_urls.is_some()),
        (POSTGRES_URL, postgres_url.is_some()),
    ];
    let set: Vec<&str> = chosen.iter().filter(|(_, s)| *s).map(|(n, _)| *n).collect();
    if set.len() > 1 {
        return Err(bad(
            set[1],
            format!("{} is set too: set one of them, for one provider", set[0]),
        ));
    }
    if postgres_url.is_none() {
        let stray = [
            (POSTGRES_SCHEMA, postgres_schema.is_some()),
            (POSTGRES_CA_FILE, postgres_ca.is_some()),
        ];
        if let Some((name, _)) = stray.iter().find(|(_, set)| *set) {
            return Err(bad(
                name,
                format!("applies to a PostgreSQL provider, and {POSTGRES_URL} is not set"),
            ));
        }
    }
    config.provider = if let Some(url) = postgres_url {
        if tls.is_some() {
            return Err(bad(
                TLS_CA_FILE,
                format!("applies to a Redis provider; for PostgreSQL set {POSTGRES_CA_FILE}"),
            ));
        }
        let tls = postgres_ca.map(|ca_file| TlsFiles {
            ca_file: Some(ca_file),
            ..TlsFiles::default()
        });
        Some(ProviderConfig::Postgres {
            url,
            schema: postgres_schema,
            tls,
        })
    } else if let Some(url) = redis_url {
        Some(ProviderConfig::Redis { url, tls })
    } else if let Some(urls) = sentinel_urls {
        let Some(service_name) = sentinel_service else {
            return Err(bad(
                SENTINEL_SERVICE,
                format!(
                    "is not set, and {SENTINEL_URLS} needs it: the master's name as Sentinel knows it"
                ),
            ));
        };
        Some(ProviderConfig::Sentinel {
            urls,
            service_name,
            username: sentinel_username,
            password: sentinel_password,
            tls,
        })
    } else if let Some(urls) = cluster_urls {
        Some(ProviderConfig::Cluster { urls, tls })
    } else {
        let stray = [
            (SENTINEL_SERVICE, sentinel_service.is_some()),
            (SENTINEL_USERNAME, sentinel_username.is_some()),
            (SENTINEL_PASSWORD, sentinel_password.is_some()),
            (TLS_CA_FILE, tls.is_some()),
        ];
        if let Some((name, _)) = stray.iter().find(|(_, set)| *set) {
            return Err(bad(
                name,
                format!(
                    "applies to a Redis provider, and none is set ({REDIS_URL}, {SENTINEL_URLS} or {CLUSTER_URLS})"
                ),
            ));
        }
        None
    };
    Ok(config)
}
