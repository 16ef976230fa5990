//! redis-rs's forms of coord's addresses and TLS material, and where a connection's client
//! comes from: the one address, or the master Sentinel names now.

use std::sync::Arc;

use redis::sentinel::SentinelClient;
#[cfg(feature = "tls")]
use redis::{ClientTlsConfig, TlsCertificates};
use redis::{
    ConnectionAddr, ConnectionInfo, IntoConnectionInfo, ProtocolVersion, RedisConnectionInfo,
};

use super::command::fault;
use crate::config::{Address, Place, TlsMaterial};
use crate::transport::Fault;

/// redis-rs's address for `place` (TLS settings are added by [`client_for`]).
pub(super) fn connection_addr(place: &Place) -> ConnectionAddr {
    match place {
        Place::Tcp {
            host,
            port,
            tls: false,
        } => ConnectionAddr::Tcp(host.clone(), *port),
        Place::Tcp {
            host,
            port,
            tls: true,
        } => ConnectionAddr::TcpTls {
            host: host.clone(),
            port: *port,
            insecure: false,
            tls_params: None,
        },
        Place::Unix(path) => ConnectionAddr::Unix(path.clone()),
    }
}

/// Address, credentials and database of `address`, as redis-rs takes them.
pub(super) fn connection_info(address: &Address) -> Result<ConnectionInfo, Fault> {
    let mut redis = RedisConnectionInfo::default();
    if let Some(user) = &address.username {
        redis = redis.set_username(user);
    }
    if let Some(password) = &address.password {
        redis = redis.set_password(password);
    }
    if let Some(db) = address.database {
        redis = redis.set_db(db.into());
    }
    Ok(connection_addr(&address.place)
        .into_connection_info()
        .map_err(fault)?
        .set_redis_settings(redis))
}

/// A redis-rs client for `address`, with the TLS certificates when it uses TLS.
pub(super) fn client_for(
    address: &Address,
    #[allow(unused)] tls: &TlsMaterial,
) -> Result<redis::Client, Fault> {
    let info = connection_info(address)?;
    #[cfg(feature = "tls")]
    if address.tls() {
        crate::config::ensure_crypto_provider();
        return redis::Client::build_with_tls(info, certificates(tls)).map_err(fault);
    }
    redis::Client::open(info).map_err(fault)
}

/// The certificates in redis-rs's form; none given means the system's roots, no client
/// certificate.
#[cfg(feature = "tls")]
pub(super) fn certificates(tls: &TlsMaterial) -> TlsCertificates {
    TlsCertificates {
        client_tls: tls.client.as_ref().map(|(cert, key)| ClientTlsConfig {
            client_cert: cert.clone(),
            client_key: key.clone(),
        }),
        root_cert: tls.ca.clone(),
    }
}

/// Where a slot's connections come from.
pub(super) enum Dialer {
    Direct(Box<redis::Client>),
    Sentinel(Arc<SentinelShared>),
}

impl Dialer {
    pub(super) async fn client(&self) -> Result<redis::Client, Fault> {
        match self {
            Dialer::Direct(client) => Ok((**client).clone()),
            Dialer::Sentinel(shared) => shared.master().await,
        }
    }
}

pub(super) struct SentinelShared {
    pub(super) sentinel: tokio::sync::Mutex<SentinelClient>,
}

impl SentinelShared {
    /// The master Sentinel names now (its role is checked by redis-rs before it is returned).
    pub(super) async fn master(&self) -> Result<redis::Client, Fault> {
        self.sentinel
            .lock()
            .await
            .async_get_client()
            .await
            .map_err(fault)
    }
}

/// The same server, spoken to in RESP3 (pub/sub messages arrive as pushes).
pub(super) fn resp3(client: &redis::Client) -> Result<redis::Client, Fault> {
    let info = client.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    redis::Client::open(info.set_redis_settings(settings)).map_err(fault)
}
