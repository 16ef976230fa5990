//! Connecting the way production does: TLS (a given CA, client certificates), Unix sockets,
//! ACL users, database numbers, Sentinel and Cluster over TLS. Each test fails if the option
//! it covers is ignored: the server only accepts what the option provides, and where the
//! connection lands (listener, user, database) is read back from the server.

#![cfg(feature = "tls")]

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use coord_core::provider::{
    ClaimOutcome, IdempotencyStore, LockProvider, OwnerToken, ReleaseOutcome,
};
use coord_core::{BackendError, CallKey};
use coord_redis::{Client, RedisProvider, RedisProviderBuilder};
use coord_redis_testing::{
    RedisCluster, RedisServer, Resp, SentinelOptions, SentinelSetup, ServerOptions, TestCerts,
};
use support::*;

per_client!(
    tls_trusts_the_given_ca_and_nothing_else,
    tls_presents_the_client_certificate,
    plain_and_tls_do_not_mix,
    unix_socket,
    acl_user_and_password,
    database_number,
    credentials_never_shown,
);

const TIMEOUT: Duration = Duration::from_secs(2);

fn builder(url: impl Into<String>, client: Client) -> RedisProviderBuilder {
    RedisProvider::builder(url)
        .client(client)
        .command_timeout(TIMEOUT)
}

/// The lock path (acquire, a waiter woken by the release over the subscriber connection,
/// release) and the record path (claim, complete, replay) through `p`, on a key of its own.
/// Returns the key.
async fn exercise(p: &RedisProvider) -> CallKey {
    // A new operation name each time, so that keys spread over a cluster's slots.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let k = key(&format!("c{}-connect", n.wrapping_mul(2_654_435_761)));
    let a = OwnerToken::new();
    let grant = p
        .acquire(fenced(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .expect("a free lock");
    assert!(grant.fencing_token.is_some());
    let b = OwnerToken::new();
    let waiter = spawn_acquire(p, lock(&k, b, LONG, Duration::from_secs(20)));
    // Let the waiter subscribe and mark the lock before it is released.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::Released);
    let woken = waiter.await.unwrap();
    assert!(woken.grant.is_some(), "the waiter gets the lock");
    assert_eq!(p.release(&k, b).await.unwrap(), ReleaseOutcome::Released);

    let c = OwnerToken::new();
    assert_eq!(
        p.claim(claim(&k, c, LONG)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert!(
        complete_stored(p, &k, c, Arc::from(&b"done"[..]), LONG)
            .await
            .unwrap()
    );
    match p.claim(claim(&k, OwnerToken::new(), LONG)).await.unwrap() {
        ClaimOutcome::Completed { payload, .. } => assert_eq!(&payload[..], b"done"),
        other => panic!("expected the stored outcome, got {other:?}"),
    }
    k
}

/// `CLIENT LIST` on `server`, without the line of the connection asking.
fn client_list(server: &RedisServer) -> Vec<String> {
    server
        .command(&["CLIENT", "LIST"])
        .text()
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.contains("cmd=client|list"))
        .map(str::to_owned)
        .collect()
}

/// The value of `field` (`laddr`, `user`, `db`, `flags`) in a `CLIENT LIST` line.
fn field<'a>(line: &'a str, name: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        .unwrap_or("")
}

/// Asserts that every client connection of `server` came in on `laddr` (the TLS port, the
/// socket) and there is at least one.
fn all_arrived_on(server: &RedisServer, laddr: &str) {
    let clients = client_list(server);
    assert!(!clients.is_empty(), "no client connection");
    for line in &clients {
        assert_eq!(field(line, "laddr"), laddr, "{line}");
    }
}

fn connect_error(result: Result<RedisProvider, BackendError>, what: &str) -> BackendError {
    match result {
        Ok(_) => panic!("{what}: connected, but it should not have"),
        Err(err) => err,
    }
}

async fn tls_trusts_the_given_ca_and_nothing_else(client: Client) {
    let certs = TestCerts::generate();
    let server = RedisServer::start_tls(&certs, false);
    let tls_addr = format!("127.0.0.1:{}", server.tls_port().unwrap());

    // The system's store does not know the test CA: verification is on.
    let err = connect_error(
        builder(server.tls_url(), client).connect().await,
        "no CA given",
    );
    assert!(err.message().contains(&tls_addr), "names the server: {err}");

    // Another CA is not enough either.
    let other = TestCerts::generate();
    connect_error(
        builder(server.tls_url(), client)
            .tls_ca_file(other.ca_file())
            .connect()
            .await,
        "another CA",
    );

    // The right CA, from a file: every path works, over the TLS port only.
    let p = builder(server.tls_url(), client)
        .tls_ca_file(certs.ca_file())
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{client:?}: {e}"));
    exercise(&p).await;
    all_arrived_on(&server, &tls_addr);
    drop(p);

    // The same CA as PEM text, and the server reached by its DNS name (verified against the
    // certificate's names).
    let url = format!("rediss://localhost:{}", server.tls_port().unwrap());
    let p = builder(url, client)
        .tls_ca_pem(certs.ca_pem())
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{client:?}: {e}"));
    exercise(&p).await;
}

async fn tls_presents_the_client_certificate(client: Client) {
    let certs = TestCerts::generate();
    let server = RedisServer::start_tls(&certs, true);
    assert!(server.requires_client_cert());
    let tls_addr = format!("127.0.0.1:{}", server.tls_port().unwrap());

    connect_error(
        builder(server.tls_url(), client)
            .tls_ca_file(certs.ca_file())
            .connect()
            .await,
        "no client certificate",
    );
    let stranger = TestCerts::generate();
    connect_error(
        builder(server.tls_url(), client)
            .tls_ca_file(certs.ca_file())
            .tls_client_cert_files(stranger.client_cert_file(), stranger.client_key_file())
            .connect()
            .await,
        "a client certificate from another CA",
    );

    let p = builder(server.tls_url(), client)
        .tls_ca_file(certs.ca_file())
        .tls_client_cert_files(certs.client_cert_file(), certs.client_key_file())
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{client:?}: {e}"));
    exercise(&p).await;
    all_arrived_on(&server, &tls_addr);
    drop(p);

    let p = builder(server.tls_url(), client)
        .tls_ca_pem(certs.ca_pem())
        .tls_client_cert_pem(certs.client_cert_pem(), certs.client_key_pem())
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{client:?}: {e}"));
    exercise(&p).await;
}

async fn plain_and_tls_do_not_mix(client: Client) {
    let certs = TestCerts::generate();
    let server = RedisServer::start_tls(&certs, false);
    let tls_port = server.tls_port().unwrap();

    // A plain-TCP client is refused by the TLS port, within the bound.
    let started = std::time::Instant::now();
    let err = connect_error(
        builder(format!("redis://127.0.0.1:{tls_port}"), client)
            .connect()
            .await,
        "plain TCP to the TLS port",
    );
    assert!(started.elapsed() < TIMEOUT * 4, "{:?}", started.elapsed());
    assert!(
        err.message().contains(&format!("127.0.0.1:{tls_port}")),
        "{err}"
    );
    // And a TLS client gets nowhere on the plain port.
    connect_error(
        builder(format!("rediss://127.0.0.1:{}", server.port()), client)
            .tls_ca_file(certs.ca_file())
            .connect()
            .await,
        "TLS to the plain port",
    );
    // Certificates for an address that does not use TLS are refused, not ignored.
    let err = connect_error(
        builder(server.url(), client)
            .tls_ca_file(certs.ca_file())
            .connect()
            .await,
        "a CA for a plain address",
    );
    assert_eq!(
        err.kind(),
        coord_core::provider::BackendErrorKind::Config,
        "{err}"
    );
}

async fn unix_socket(client: Client) {
    let server = RedisServer::start_unix();
    let socket = server.unix_socket().unwrap();
    let laddr = format!("{}:0", socket.display());

    let p = builder(server.unix_url(), client)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{client:?}: {e}"));
    assert!(p.address().contains(&socket.display().to_string()), "{p:?}");
    exercise(&p).await;
    all_arrived_on(&server, &laddr);
    for line in client_list(&server) {
        assert!(field(&line, "flags").contains('U'), "{line}");
    }
    drop(p);

    // The `redis+unix` form, with a database in its query.
    let url = format!("redis+unix://{}?db=3", socket.display());
    let p = builder(url, client)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{client:?}: {e}"));
    exercise(&p).await;
    let keyspace = server.command(&["INFO", "keyspace"]).text().unwrap();
    assert!(keyspace.contains("db3:"), "{keyspace}");
}

async fn acl_user_and_password(client: Client) {
    // The default user needs a password coord is not given: only the ACL user gets in.
    let server = RedisServer::start_configured(ServerOptions::new().password("admin-only"));
    // Only the commands DEPLOYMENT.md lists for coord (keys and channels unrestricted here:
    // each test key has a namespace of its own).
    server.add_acl_user(
        "coord-app",
        "app-s3cret",
        &[
            "~*",
            "&*",
            "+@connection",
            "+evalsha",
            "+eval",
            "+set",
            "+get",
            "+del",
            "+exists",
            "+hset",
            "+hmget",
            "+hdel",
            "+pexpire",
            "+pttl",
            "+lrem",
            "+rpush",
            "+lpop",
            "+llen",
            "+lpos",
            "+publish",
            "+subscribe",
            "+unsubscribe",
            "+time",
            "+info",
            "+config|get",
        ],
    );
    let port = server.port();

    let err = connect_error(
        builder(format!("redis://127.0.0.1:{port}"), client)
            .connect()
            .await,
        "no credentials",
    );
    assert_eq!(
        err.kind(),
        coord_core::provider::BackendErrorKind::Config,
        "{err}"
    );

    let err = connect_error(
        builder(
            format!("redis://coord-app:wrong-guess-77@127.0.0.1:{port}"),
            client,
        )
        .connect()
        .await,
        "a wrong password",
    );
    assert_eq!(
        err.kind(),
        coord_core::provider::BackendErrorKind::Config,
        "{err}"
    );
    assert!(
        !format!("{err} {err:?}").contains("wrong-guess-77"),
        "{err}"
    );

    let p = builder(
        format!("redis://coord-app:app-s3cret@127.0.0.1:{port}"),
        client,
    )
    .connect()
    .await
    .unwrap_or_else(|e| panic!("{client:?}: {e}"));
    exercise(&p).await;
    let clients = client_list(&server);
    assert!(!clients.is_empty());
    for line in &clients {
        assert_eq!(field(line, "user"), "coord-app", "{line}");
    }
    assert!(!format!("{p:?}").contains("app-s3cret"));
}

async fn database_number(client: Client) {
    let server = RedisServer::start();
    let p = builder(format!("{}/7", server.url()), client)
        .connect()
        .await
        .unwrap();
    let k = exercise(&p).await;
    let keyspace = server.command(&["INFO", "keyspace"]).text().unwrap();
    assert!(keyspace.contains("db7:"), "{keyspace}");
    assert!(!keyspace.contains("db0:"), "{keyspace}");
    assert_eq!(
        server.command(&["EXISTS", &redis_key(&k, "idem")]),
        Resp::Int(0),
        "nothing in database 0"
    );
    drop(p);

    // The builder's database wins over the URL's.
    let p = builder(format!("{}/7", server.url()), client)
        .database(9)
        .connect()
        .await
        .unwrap();
    exercise(&p).await;
    let keyspace = server.command(&["INFO", "keyspace"]).text().unwrap();
    assert!(keyspace.contains("db9:"), "{keyspace}");
    for line in client_list(&server) {
        assert_eq!(field(&line, "db"), "9", "{line}");
    }
}

async fn credentials_never_shown(client: Client) {
    let certs = TestCerts::generate();
    let server = RedisServer::start_tls(&certs, true);
    let url = format!(
        "rediss://coord:hunter2%2Fpw@127.0.0.1:{}",
        server.tls_port().unwrap()
    );
    let key_pem = certs.client_key_pem();
    let key_line = key_pem.lines().nth(1).unwrap();
    let b = builder(&url, client)
        .tls_ca_pem(certs.ca_pem())
        .tls_client_cert_pem(certs.client_cert_pem(), key_pem);
    let shown = format!("{b:?}");
    for secret in ["hunter2", "hunter2/pw", key_line] {
        assert!(
            !shown.contains(secret),
            "builder debug shows {secret}: {shown}"
        );
    }

    // Refused (no such user): neither the password nor the key in the error.
    let err = connect_error(b.connect().await, "an unknown user");
    let shown = format!("{err} {err:?}");
    for secret in ["hunter2", key_line] {
        assert!(!shown.contains(secret), "the error shows {secret}: {shown}");
    }
    assert!(
        shown.contains(&format!("127.0.0.1:{}", server.tls_port().unwrap())),
        "{shown}"
    );

    // A bad key is reported without quoting it.
    let err = connect_error(
        builder(&url, client)
            .tls_ca_pem(certs.ca_pem())
            .tls_client_cert_pem(certs.client_cert_pem(), "not-a-key-but-secret")
            .connect()
            .await,
        "a key that is no key",
    );
    assert!(!err.to_string().contains("not-a-key-but-secret"), "{err}");

    // Unix socket URLs carry the password in the query.
    let unix = RedisServer::start_configured(ServerOptions::new().unix_socket().password("qpw-9"));
    let url = format!("{}?pass=wrong-qpw-1", unix.unix_url());
    let err = connect_error(builder(&url, client).connect().await, "a wrong password");
    assert!(!format!("{err} {err:?}").contains("wrong-qpw-1"), "{err}");
    let p = builder(format!("{}?pass=qpw-9", unix.unix_url()), client)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{client:?}: {e}"));
    exercise(&p).await;
    assert!(!format!("{p:?}").contains("qpw-9"));
}

// ---------------------------------------------------------------------------------------------
// Topologies over TLS: one deployment each, every client in turn.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_over_tls() {
    let certs = TestCerts::generate();
    let cluster = RedisCluster::start_tls(3, &certs);
    for client in clients() {
        connect_error(
            RedisProvider::cluster(cluster.tls_urls())
                .client(client)
                .command_timeout(TIMEOUT)
                .connect()
                .await,
            "no CA given",
        );
        let p = RedisProvider::cluster(cluster.tls_urls())
            .client(client)
            .command_timeout(TIMEOUT)
            .tls_ca_file(certs.ca_file())
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{client:?}: {e}"));
        let mut owners = std::collections::BTreeSet::new();
        for _ in 0..12 {
            let k = exercise(&p).await;
            let node = cluster.node_for(&redis_key(&k, "idem"));
            assert_eq!(
                node.command(&["EXISTS", &redis_key(&k, "idem")]),
                Resp::Int(1)
            );
            owners.insert(node.port());
        }
        assert!(owners.len() > 1, "{client:?}: keys on several nodes");
        // Every connection to every node came in on its TLS port.
        for node in cluster.nodes() {
            let tls = format!("127.0.0.1:{}", node.tls_port().unwrap());
            for line in client_list(node) {
                let laddr = field(&line, "laddr");
                // (Other nodes' bus links are not client connections; replication is off.)
                assert_eq!(laddr, tls, "{client:?}: {line}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_with_passwords_over_tls() {
    let certs = TestCerts::generate();
    let setup = SentinelSetup::start_configured(
        SentinelOptions::new()
            .tls(&certs, false)
            .sentinel_password("sentinel-pw")
            .data_password("data-pw"),
    );
    let with_password = |pw: &str| -> Vec<String> {
        setup
            .sentinel_tls_urls()
            .iter()
            .map(|u| u.replacen("rediss://", &format!("rediss://:{pw}@"), 1))
            .collect()
    };
    for client in clients() {
        let sentinel = |urls: Vec<String>| {
            RedisProvider::sentinel(SentinelSetup::MASTER_NAME, urls)
                .client(client)
                .command_timeout(TIMEOUT)
                .tls_ca_file(certs.ca_file())
        };
        // Each credential is needed: the Sentinels' and the data nodes'.
        connect_error(
            sentinel(with_password("wrong-sentinel-pw"))
                .data_node_credentials(None, "data-pw")
                .connect()
                .await,
            "a wrong Sentinel password",
        );
        let err = connect_error(
            sentinel(with_password("sentinel-pw"))
                .data_node_credentials(None, "wrong-data-pw")
                .connect()
                .await,
            "a wrong data-node password",
        );
        assert!(!err.to_string().contains("wrong-data-pw"), "{err}");

        let p = sentinel(with_password("sentinel-pw"))
            .data_node_credentials(None, "data-pw")
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{client:?}: {e}"));
        let k = exercise(&p).await;
        assert_eq!(
            setup.master().command(&["EXISTS", &redis_key(&k, "idem")]),
            Resp::Int(1)
        );
        // (The master is reachable by TLS only at the address the Sentinels name: its TLS
        // port.)
    }
}

/// Sentinels on plain TCP naming data nodes that speak TLS: redis-rs connects to each as
/// told; fred, which has one TLS setting for both, refuses the mix at connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_node_tls_behind_plain_sentinels() {
    let certs = TestCerts::generate();
    let setup = SentinelSetup::start_configured(SentinelOptions::new().tls(&certs, false));
    for client in clients() {
        let b = RedisProvider::sentinel(SentinelSetup::MASTER_NAME, setup.sentinel_urls())
            .client(client)
            .command_timeout(TIMEOUT);
        // Without saying so, the data nodes are spoken to like the Sentinels, in plain TCP:
        // refused by their TLS port.
        connect_error(b.clone().connect().await, "plain TCP to a TLS data node");
        let result = b
            .data_node_tls(true)
            .tls_ca_file(certs.ca_file())
            .connect()
            .await;
        match client {
            #[cfg(feature = "fred")]
            Client::Fred => {
                let err = connect_error(result, "mixed TLS with fred");
                assert_eq!(
                    err.kind(),
                    coord_core::provider::BackendErrorKind::Config,
                    "{err}"
                );
            }
            _ => {
                let p = result.unwrap_or_else(|e| panic!("{client:?}: {e}"));
                exercise(&p).await;
            }
        }
    }
}
