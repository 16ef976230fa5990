//! Providers built from an application's own client: a redis-rs `Client` (its settings,
//! TLS included), a fred client or pool (shared, not duplicated).

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use coord_core::provider::{
    ClaimOutcome, IdempotencyStore, LockProvider, OwnerToken, ReleaseOutcome,
};
use coord_redis::RedisProvider;
use coord_redis_testing::RedisServer;
use support::*;

const TIMEOUT: Duration = Duration::from_secs(2);

/// Locks (with a waiter woken by a release) and records through `p`.
async fn exercise(p: &RedisProvider, name: &str) -> coord_core::CallKey {
    let k = key(name);
    let a = OwnerToken::new();
    p.acquire(lock(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .expect("a free lock");
    let waiter = spawn_acquire(
        p,
        lock(&k, OwnerToken::new(), LONG, Duration::from_secs(20)),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::Released);
    let woken = waiter.await.unwrap();
    assert!(woken.grant.is_some(), "the waiter gets the lock");
    p.release(&k, woken.owner).await.unwrap();

    let c = OwnerToken::new();
    assert_eq!(
        p.claim(claim(&k, c, LONG)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert!(
        complete_stored(p, &k, c, Arc::from(&b"ok"[..]), LONG)
            .await
            .unwrap()
    );
    k
}

#[cfg(feature = "redis-client")]
mod redis_rs {
    use super::*;
    use coord_redis_testing::Resp;

    /// Settings a URL cannot carry (TLS certificates) come with the client.
    #[cfg(feature = "tls")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn uses_the_clients_tls_settings() {
        use coord_redis_testing::TestCerts;
        use redis::{ClientTlsConfig, TlsCertificates};

        let certs = TestCerts::generate();
        let server = RedisServer::start_tls(&certs, true);
        let client = redis::Client::build_with_tls(
            server.tls_url(),
            TlsCertificates {
                client_tls: Some(ClientTlsConfig {
                    client_cert: certs.client_cert_pem().as_bytes().to_vec(),
                    client_key: certs.client_key_pem().as_bytes().to_vec(),
                }),
                root_cert: Some(certs.ca_pem().as_bytes().to_vec()),
            },
        )
        .unwrap();
        // The same address without the client's certificates gets nowhere.
        assert!(
            RedisProvider::builder(server.tls_url())
                .command_timeout(TIMEOUT)
                .connect()
                .await
                .is_err()
        );
        let p = RedisProvider::from_redis_client(client.clone())
            .command_timeout(TIMEOUT)
            .connect()
            .await
            .unwrap();
        assert_eq!(
            p.address(),
            format!("127.0.0.1:{}", server.tls_port().unwrap())
        );
        exercise(&p, "rr-tls").await;

        // TLS settings on the builder are refused: the client has its own.
        let err = RedisProvider::from_redis_client(client)
            .tls_ca_file(certs.ca_file())
            .connect()
            .await
            .unwrap_err();
        assert_eq!(
            err.kind(),
            coord_core::provider::BackendErrorKind::Config,
            "{err}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn uses_the_clients_database_and_credentials() {
        let server = RedisServer::start();
        server.add_acl_user("own-client", "own-pw-42", &[]);
        let url = format!("redis://own-client:own-pw-42@127.0.0.1:{}/6", server.port());
        let client = redis::Client::open(url).unwrap();
        let p = RedisProvider::from_redis_client(client)
            .command_timeout(TIMEOUT)
            .connect()
            .await
            .unwrap();
        assert!(!format!("{p:?}").contains("own-pw-42"));
        let k = exercise(&p, "rr-db").await;
        let keyspace = server.command(&["INFO", "keyspace"]).text().unwrap();
        assert!(keyspace.contains("db6:"), "{keyspace}");
        assert!(!keyspace.contains("db0:"), "{keyspace}");
        assert_eq!(
            server.command(&["EXISTS", &redis_key(&k, "idem")]),
            Resp::Int(0),
            "not in database 0"
        );
        let list = server.command(&["CLIENT", "LIST"]).text().unwrap();
        assert!(list.contains("user=own-client"), "{list}");
    }

    #[cfg(feature = "fred")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn another_client_library_is_refused() {
        let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
        let err = RedisProvider::from_redis_client(client)
            .client(coord_redis::Client::Fred)
            .connect()
            .await
            .unwrap_err();
        assert_eq!(
            err.kind(),
            coord_core::provider::BackendErrorKind::Config,
            "{err}"
        );
    }
}

#[cfg(feature = "fred")]
mod fred_shared {
    use super::*;
    use coord_core::provider::BackendErrorKind;
    /// Client connections of `server` (not counting the one asking).
    fn connections(server: &RedisServer) -> usize {
        server
            .command(&["CLIENT", "LIST"])
            .text()
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.contains("cmd=client|list"))
            .count()
    }
    use fred::prelude::{Builder, ClientLike, Config};
    use fred::types::RespVersion;

    async fn app_client(server: &RedisServer, resp3: bool) -> fred::clients::Client {
        let mut config = Config::from_url(&server.url()).unwrap();
        if resp3 {
            config.version = RespVersion::RESP3;
        }
        let client = Builder::from_config(config).build().unwrap();
        client.init().await.unwrap();
        client
    }

    /// coord sends its commands on the application's client: the only connection it adds
    /// is the subscriber's. Dropping the provider leaves the client working.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shares_the_client() {
        for resp3 in [false, true] {
            let server = RedisServer::start();
            let client = app_client(&server, resp3).await;
            assert_eq!(connections(&server), 1);
            let p = RedisProvider::from_fred_client(client.clone())
                .command_timeout(TIMEOUT)
                .connect()
                .await
                .unwrap();
            assert_eq!(connections(&server), 1, "no connection of coord's own yet");
            exercise(&p, "fred-shared").await;
            assert_eq!(
                connections(&server),
                2,
                "resp3={resp3}: the application's client and coord's subscriber"
            );
            drop(p);
            tokio::time::sleep(Duration::from_millis(200)).await;
            let _: String = client.ping(None).await.unwrap();
            let _ = client.quit().await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shares_a_pool() {
        let server = RedisServer::start();
        let pool = Builder::from_config(Config::from_url(&server.url()).unwrap())
            .build_pool(3)
            .unwrap();
        pool.init().await.unwrap();
        assert_eq!(connections(&server), 3);
        let p = RedisProvider::from_fred_pool(&pool)
            .command_timeout(TIMEOUT)
            .connect()
            .await
            .unwrap();
        // Round-robin: enough calls to use every client of the pool.
        for i in 0..4 {
            exercise(&p, &format!("fred-pool-{i}")).await;
        }
        assert_eq!(
            connections(&server),
            4,
            "the pool's three and the subscriber"
        );
        // Each pool connection's latest command is one of coord's (fred's own connection
        // setup leaves `info`); the subscriber (last seen (un)subscribing or pinging) aside.
        let list = server.command(&["CLIENT", "LIST"]).text().unwrap();
        let pool_lines: Vec<&str> = list
            .lines()
            .filter(|l| {
                !l.contains("cmd=client|list")
                    && !l.contains("subscribe ")
                    && !l.contains("cmd=ping ")
            })
            .collect();
        assert_eq!(pool_lines.len(), 3, "{list}");
        for line in pool_lines {
            assert!(
                !line.contains("cmd=info "),
                "a pool client coord did not use: {line}"
            );
        }

        let err = RedisProvider::from_fred_pool(&pool)
            .pool_size(2)
            .connect()
            .await
            .unwrap_err();
        assert_eq!(err.kind(), BackendErrorKind::Config, "{err}");
        let _ = pool.quit().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unconnected_client_is_reported() {
        let server = RedisServer::start();
        let client = Builder::from_config(Config::from_url(&server.url()).unwrap())
            .build()
            .unwrap();
        let err = RedisProvider::from_fred_client(client)
            .command_timeout(Duration::from_millis(300))
            .connect()
            .await
            .unwrap_err();
        assert!(err.message().contains("init()"), "{err}");
    }
}
