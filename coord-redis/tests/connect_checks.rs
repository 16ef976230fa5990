//! What the provider checks about the server: at connect (eviction policy, persistence,
//! whether the settings can be read at all) and later (a restarted server).

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use coord_core::CallKey;
use coord_core::provider::{BackendErrorKind, LockProvider, OwnerToken};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::RedisServer;
use support::*;

per_client!(
    evicting_policies_are_refused_unless_allowed,
    noeviction_connects_and_missing_persistence_warns,
    unreadable_settings_warn_once_and_connect,
    settings_refused_by_the_acl_warn_once_and_connect,
    a_server_restart_is_detected_and_logged_once,
);

// ---------------------------------------------------------------------------------------------
// Log capture: one global subscriber for the test binary; each test picks out the lines that
// name its own server's port. Each test installs it before anything can log: a test may be the
// first of its process (under nextest every test is), and a warning logged before the
// subscriber exists is lost.

#[derive(Clone)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn sink() -> &'static Sink {
    static SINK: OnceLock<Sink> = OnceLock::new();
    SINK.get_or_init(|| {
        let sink = Sink(Arc::default());
        let writer = sink.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .init();
        sink
    })
}

/// Installs the capturing subscriber, once per process.
fn capture_logs() {
    sink();
}

/// Log lines so far that mention `port` and contain `needle`.
fn logged(port: u16, needle: &str) -> Vec<String> {
    let text = String::from_utf8_lossy(&sink().0.lock().unwrap()).into_owned();
    let at = format!("127.0.0.1:{port}");
    text.lines()
        .filter(|l| l.contains(&at) && l.contains(needle))
        .map(str::to_owned)
        .collect()
}

async fn connect(url: String, client: Client) -> Result<RedisProvider, coord_core::BackendError> {
    sink();
    RedisProvider::builder(url)
        .client(client)
        .command_timeout(Duration::from_secs(2))
        .connect()
        .await
}

/// The provider works: one lock taken and released.
async fn works(p: &RedisProvider) {
    let k = key("works");
    let a = OwnerToken::new();
    p.acquire(lock(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .expect("nobody holds it");
    p.release(&k, a).await.unwrap();
}

async fn evicting_policies_are_refused_unless_allowed(client: Client) {
    capture_logs();
    sink();
    for policy in ["allkeys-lru", "volatile-lru"] {
        let server = RedisServer::start_with(&["--maxmemory-policy", policy]);
        let err = connect(server.url(), client)
            .await
            .expect_err("an evicting policy is refused");
        assert_eq!(err.kind(), BackendErrorKind::Config, "{err}");
        let text = err.to_string();
        assert!(text.contains(policy), "names the policy: {text}");
        assert!(text.contains("noeviction"), "names the fix: {text}");
        assert!(
            text.contains("allow_eviction(true)"),
            "names the builder option: {text}"
        );
        assert!(
            text.contains(&format!("127.0.0.1:{}", server.port())),
            "names the server: {text}"
        );

        let p = RedisProvider::builder(server.url())
            .client(client)
            .allow_eviction(true)
            .connect()
            .await
            .expect("allowed explicitly");
        works(&p).await;
        assert_eq!(
            logged(server.port(), "allow_eviction(true)").len(),
            1,
            "the allowed risk is still logged"
        );
    }
}

async fn noeviction_connects_and_missing_persistence_warns(client: Client) {
    capture_logs();
    // The test servers keep nothing on disk.
    let volatile = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let p = connect(volatile.url(), client)
        .await
        .expect("noeviction is fine");
    works(&p).await;
    let warnings = logged(volatile.port(), "persistence is off");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("WARN"), "{}", warnings[0]);
    assert!(
        warnings[0].contains("forgets every lock"),
        "{}",
        warnings[0]
    );
    // Connecting again (another provider, a tool, a restart of the application's client) says
    // nothing new: the process has been told about this server.
    let again = connect(volatile.url(), client).await.unwrap();
    works(&again).await;
    assert_eq!(
        logged(volatile.port(), "persistence is off").len(),
        1,
        "once per process for each server"
    );

    let durable = RedisServer::start_with(&["--appendonly", "yes"]);
    let p = connect(durable.url(), client).await.unwrap();
    works(&p).await;
    assert_eq!(
        logged(durable.port(), "persistence is off"),
        Vec::<String>::new()
    );
}

async fn unreadable_settings_warn_once_and_connect(client: Client) {
    capture_logs();
    // As managed services do: CONFIG renamed away. The policy would be refused if coord
    // could see it; it cannot, so it connects and says so.
    let server = RedisServer::start_with(&[
        "--rename-command",
        "CONFIG",
        "",
        "--maxmemory-policy",
        "allkeys-lru",
    ]);
    assert!(
        matches!(
            server.command(&["CONFIG", "GET", "save"]),
            coord_redis_testing::Resp::Error(_)
        ),
        "CONFIG is disabled"
    );
    let p = RedisProvider::builder(server.url())
        .client(client)
        .pool_size(3)
        .connect()
        .await
        .expect("connects without CONFIG");
    works(&p).await;
    let warnings = logged(server.port(), "CONFIG GET is not permitted");
    assert_eq!(warnings.len(), 1, "warned once: {warnings:?}");
    assert!(warnings[0].contains("noeviction"), "{}", warnings[0]);
}

async fn settings_refused_by_the_acl_warn_once_and_connect(client: Client) {
    capture_logs();
    let server = RedisServer::start_with(&[
        "--user", "coord", "on", ">pw", "~*", "&*", "+@all", "-config",
    ]);
    let url = format!("redis://coord:pw@127.0.0.1:{}", server.port());
    let p = connect(url, client)
        .await
        .expect("connects without +config");
    works(&p).await;
    let warnings = logged(server.port(), "CONFIG GET is not permitted");
    assert_eq!(warnings.len(), 1, "warned once: {warnings:?}");
    assert!(warnings[0].contains("NOPERM"), "{}", warnings[0]);
}

async fn a_server_restart_is_detected_and_logged_once(client: Client) {
    capture_logs();
    sink();
    let mut server = RedisServer::start();
    let p = RedisProvider::builder(server.url())
        .client(client)
        .command_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    works(&p).await;
    assert_eq!(p.server_restarts(), 0);
    assert_eq!(logged(server.port(), "restarted"), Vec::<String>::new());

    server.restart();
    // A call may fail once while the connection is being replaced.
    let deadline = Instant::now() + Duration::from_secs(10);
    let k = key("after-restart");
    let a = OwnerToken::new();
    loop {
        match p.acquire(lock(&k, a, LONG, Duration::ZERO)).await {
            Ok(grant) => {
                assert!(grant.is_some(), "the restarted server is empty");
                break;
            }
            Err(err) => assert!(Instant::now() < deadline, "no recovery: {err}"),
        }
    }
    until("the restart to be noticed", Duration::from_secs(10), || {
        p.server_restarts() == 1
    })
    .await;
    let lines = logged(server.port(), "restarted");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("ERROR"), "{}", lines[0]);
    assert!(lines[0].contains("forgot locks"), "{}", lines[0]);

    // More calls on the same server process: no further restart.
    works(&p).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(p.server_restarts(), 1);
    assert_eq!(logged(server.port(), "restarted").len(), 1);
}

/// Every Cluster master is checked, and script calls go straight to the node that owns the
/// key (no `MOVED` detour).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cluster_master_is_checked() {
    sink();
    let cluster = coord_redis_testing::RedisCluster::start(3);
    let evicting = &cluster.nodes()[2];
    assert_eq!(
        evicting.command(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lfu"]),
        coord_redis_testing::Resp::Simple("OK".into())
    );
    for client in clients() {
        let err = RedisProvider::cluster(cluster.urls())
            .client(client)
            .connect()
            .await
            .expect_err("one master may evict");
        assert_eq!(err.kind(), BackendErrorKind::Config, "{client:?}: {err}");
        let text = err.to_string();
        assert!(
            text.contains(&format!("127.0.0.1:{}", evicting.port()))
                && text.contains("allkeys-lfu"),
            "{client:?}: names the node and its policy: {text}"
        );

        let p = RedisProvider::cluster(cluster.urls())
            .client(client)
            .allow_eviction(true)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{client:?}: {e}"));
        for i in 0..12 {
            let k = kk(&format!("routed{i}:op:{client:?}"));
            let a = OwnerToken::new();
            p.acquire(fenced(&k, a, LONG, Duration::ZERO))
                .await
                .unwrap()
                .expect("free");
            p.release(&k, a).await.unwrap();
        }
    }
    for node in cluster.nodes() {
        let errors = node
            .command(&["INFO", "errorstats"])
            .text()
            .unwrap_or_default();
        assert!(
            !errors.contains("MOVED"),
            "node {} redirected a command: {errors}",
            node.port()
        );
    }
}

/// A restarted Cluster master is noticed too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_master_restart_is_detected() {
    capture_logs();
    sink();
    let mut cluster = coord_redis_testing::RedisCluster::start(3);
    let providers: Vec<(Client, RedisProvider)> = {
        let mut out = Vec::new();
        for client in clients() {
            let p = RedisProvider::cluster(cluster.urls())
                .client(client)
                .command_timeout(Duration::from_millis(500))
                .connect()
                .await
                .unwrap_or_else(|e| panic!("{client:?}: {e}"));
            out.push((client, p));
        }
        out
    };
    // A key whose slot the restarted node owns.
    let k = &CallKey::builder("restart", "op").part("part").finish();
    let owner = cluster.node_for(&redis_key(k, "lock")).port();
    let index = cluster
        .nodes()
        .iter()
        .position(|n| n.port() == owner)
        .unwrap();
    for (_, p) in &providers {
        works(p).await;
        assert_eq!(p.server_restarts(), 0);
    }

    cluster.node_mut(index).restart();
    for (client, p) in &providers {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let a = OwnerToken::new();
            match p.acquire(lock(k, a, LONG, Duration::ZERO)).await {
                Ok(Some(_)) => {
                    p.release(k, a).await.unwrap();
                    break;
                }
                Ok(None) => panic!("{client:?}: nobody holds it"),
                Err(err) => assert!(Instant::now() < deadline, "{client:?}: {err}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        until(
            "the cluster restart to be noticed",
            Duration::from_secs(10),
            || p.server_restarts() == 1,
        )
        .await;
    }
    // One error line per provider, naming the node.
    assert_eq!(logged(owner, "restarted").len(), providers.len());
}
