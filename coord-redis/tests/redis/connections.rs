//! Connections after an ambiguous fault: a call that timed out or lost its connection leaves
//! that connection behind (the next call goes out on a fresh one), and no command is sent
//! twice behind the caller's back.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use coord_core::BackendError;
use coord_core::provider::{BackendErrorKind, LockProvider, OwnerToken, ReleaseOutcome};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::{Monitor, RedisServer, Resp};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

per_client!(
    a_stuck_connection_is_not_reused_after_a_timeout,
    after_a_paused_server_the_next_call_uses_a_new_connection,
    after_client_kill_the_next_call_uses_a_new_connection,
    a_command_whose_connection_drops_in_flight_runs_once,
);

/// The command timeout. A call after a fault must succeed well within it: without a fresh
/// connection it would fail (stuck) rather than merely be slow, so the margin is generous.
const TIMEOUT: Duration = Duration::from_millis(800);

/// A TCP proxy to a server, able to break the connections open so far in two ways. New
/// connections always pass.
struct Proxy {
    port: u16,
    ctl: Arc<Control>,
}

#[derive(Default)]
struct Control {
    /// Connection ids are handed out in accept order.
    next: AtomicU64,
    /// Connections open now.
    open: AtomicU64,
    /// Connections with a lower id no longer get replies (requests still reach the server).
    frozen_below: AtomicU64,
    /// Connections with a lower id forward their next request, then close without passing
    /// on the reply: the command runs, the client only sees its connection close.
    cut_below: AtomicU64,
}

impl Proxy {
    async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let ctl = Arc::new(Control::default());
        let shared = ctl.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let id = shared.next.fetch_add(1, Ordering::SeqCst);
                let server = TcpStream::connect(("127.0.0.1", upstream)).await.unwrap();
                shared.open.fetch_add(1, Ordering::SeqCst);
                let ctl = shared.clone();
                tokio::spawn(async move {
                    pipe(client, server, id, ctl.clone()).await;
                    ctl.open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Proxy { port, ctl }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Connections accepted so far.
    fn accepted(&self) -> u64 {
        self.ctl.next.load(Ordering::SeqCst)
    }

    /// Connections open now (closed by either side: gone).
    fn open(&self) -> u64 {
        self.ctl.open.load(Ordering::SeqCst)
    }

    fn freeze_open_connections(&self) {
        let open = self.ctl.next.load(Ordering::SeqCst);
        self.ctl.frozen_below.store(open, Ordering::SeqCst);
    }

    fn cut_open_connections_after_next_request(&self) {
        let open = self.ctl.next.load(Ordering::SeqCst);
        self.ctl.cut_below.store(open, Ordering::SeqCst);
    }
}

async fn pipe(client: TcpStream, server: TcpStream, id: u64, ctl: Arc<Control>) {
    client.set_nodelay(true).unwrap();
    server.set_nodelay(true).unwrap();
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let mut up = vec![0u8; 64 * 1024];
    let mut down = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            read = client_rx.read(&mut up) => {
                let n = match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if server_tx.write_all(&up[..n]).await.is_err() {
                    return;
                }
                if id < ctl.cut_below.load(Ordering::SeqCst) {
                    // Let the server run it, then drop both sides (the reply with them).
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    return;
                }
            }
            read = server_rx.read(&mut down) => {
                let n = match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if id < ctl.frozen_below.load(Ordering::SeqCst)
                    || id < ctl.cut_below.load(Ordering::SeqCst)
                {
                    // Swallowed: to the client, the reply never comes.
                    continue;
                }
                if client_tx.write_all(&down[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

async fn tight(url: String, client: Client) -> RedisProvider {
    RedisProvider::builder(url)
        .client(client)
        .command_timeout(TIMEOUT)
        .connect()
        .await
        .unwrap()
}

fn assert_ambiguous(err: &BackendError, what: &str) {
    assert!(
        matches!(
            err.kind(),
            BackendErrorKind::Timeout | BackendErrorKind::Unavailable
        ),
        "{what}: expected a timeout or unavailability, got {err:?}"
    );
}

/// Takes and releases a lock: loads the scripts and proves the provider works.
async fn round(p: &RedisProvider) {
    let k = key("round");
    let a = OwnerToken::new();
    p.acquire(lock(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .expect("nobody holds it");
    assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::Released);
}

/// `127.0.0.1:5000` from a `MONITOR` line `+1700000000.000000 [0 127.0.0.1:5000] "SET" ...`.
fn source(line: &str) -> String {
    let open = line.find('[').expect("a MONITOR line names its client");
    let close = open + line[open..].find(']').expect("closing bracket");
    line[open + 1..close]
        .split_whitespace()
        .last()
        .expect("db and address")
        .to_owned()
}

/// The client address that sent the last `name` command the monitor saw since its last drain.
fn sender_of(monitor: &Monitor, name: &str) -> String {
    let seen = monitor.drain();
    let found = seen
        .iter()
        .rev()
        .find(|m| !m.from_script && m.name == name)
        .unwrap_or_else(|| panic!("no `{name}` among {seen:#?}"));
    source(&found.line)
}

async fn a_stuck_connection_is_not_reused_after_a_timeout(client: Client) {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let p = tight(proxy.url(), client).await;
    round(&p).await;
    let dialled = proxy.accepted();

    // Replies on every open connection stop coming back (a half-open connection, a
    // blackholed path): the server is fine, the connection is not.
    proxy.freeze_open_connections();
    let k = key("stuck");
    let a = OwnerToken::new();
    let started = Instant::now();
    let err = p
        .acquire(lock(&k, a, LONG, Duration::ZERO))
        .await
        .expect_err("no reply comes");
    assert_eq!(err.kind(), BackendErrorKind::Timeout, "{err:?}");
    assert!(started.elapsed() < TIMEOUT * 3, "{:?}", started.elapsed());

    // The next call does not queue behind the lost reply: it goes out on a new connection
    // and succeeds well within one timeout. (The lock is ours: the first SET did land.)
    let started = Instant::now();
    let outcome = p.release(&k, a).await.expect("a fresh connection answers");
    assert_eq!(
        outcome,
        ReleaseOutcome::Released,
        "the timed-out SET ran once"
    );
    assert!(
        started.elapsed() < TIMEOUT,
        "the retry took {:?}",
        started.elapsed()
    );
    assert!(proxy.accepted() > dialled, "a new connection was made");
    round(&p).await;
    // The stuck connection is closed, not kept open beside its replacement.
    until(
        "the stuck connection to close",
        Duration::from_secs(10),
        || proxy.open() == dialled,
    )
    .await;
}

async fn after_a_paused_server_the_next_call_uses_a_new_connection(client: Client) {
    let server = RedisServer::start();
    let p = tight(server.url(), client).await;
    round(&p).await;
    let monitor = Monitor::start(&server);
    round(&p).await;
    let before = sender_of(&monitor, "set");

    server.pause();
    let k = key("paused");
    let err = p
        .acquire(lock(&k, OwnerToken::new(), LONG, Duration::ZERO))
        .await
        .expect_err("the server is frozen");
    assert_eq!(err.kind(), BackendErrorKind::Timeout, "{err:?}");
    // Past the command timeout, then thawed.
    tokio::time::sleep(TIMEOUT).await;
    server.resume();

    let started = Instant::now();
    let b = OwnerToken::new();
    let k = key("resumed");
    p.acquire(lock(&k, b, LONG, Duration::ZERO))
        .await
        .expect("the next call succeeds")
        .expect("nobody holds it");
    assert!(
        started.elapsed() < TIMEOUT,
        "took {:?} after resume",
        started.elapsed()
    );
    let after = sender_of(&monitor, "set");
    assert_ne!(
        before, after,
        "the call after the timeout used a new connection"
    );
    p.release(&k, b).await.unwrap();
}

async fn after_client_kill_the_next_call_uses_a_new_connection(client: Client) {
    let server = RedisServer::start();
    let p = tight(server.url(), client).await;
    round(&p).await;
    let monitor = Monitor::start(&server);
    round(&p).await;
    let before = sender_of(&monitor, "set");
    assert_eq!(
        server.command(&["CLIENT", "KILL", &before]),
        Resp::Simple("OK".into())
    );
    // Give the client a moment to see the connection close.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let started = Instant::now();
    let k = key("after-kill");
    let a = OwnerToken::new();
    p.acquire(lock(&k, a, LONG, Duration::ZERO))
        .await
        .expect("the first call after the kill succeeds")
        .expect("nobody holds it");
    assert!(started.elapsed() < TIMEOUT, "took {:?}", started.elapsed());
    let after = sender_of(&monitor, "set");
    assert_ne!(before, after, "a new connection");
    p.release(&k, a).await.unwrap();
}

async fn a_command_whose_connection_drops_in_flight_runs_once(client: Client) {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let p = tight(proxy.url(), client).await;
    round(&p).await;
    let sets = calls(&server, "set");

    // The next request on each open connection reaches the server, and then the connection
    // closes before the reply gets back: the reply is lost, the command ran.
    proxy.cut_open_connections_after_next_request();
    let k = key("in-flight");
    let a = OwnerToken::new();
    let err = p
        .acquire(lock(&k, a, LONG, Duration::ZERO))
        .await
        .expect_err("the reply was lost");
    assert_ambiguous(&err, "acquire with its connection cut");
    assert_eq!(
        server.command(&["GET", &redis_key(&k, "lock")]),
        Resp::Bulk(a.to_string().into_bytes()),
        "the command reached the server"
    );
    // Long enough for any resend (after a reconnect) to have arrived.
    tokio::time::sleep(TIMEOUT * 3).await;
    assert_eq!(calls(&server, "set"), sets + 1, "the SET was sent once");

    // The provider goes on, on a new connection.
    assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::Released);
    round(&p).await;
    assert_eq!(calls(&server, "set"), sets + 2);
}

/// An application's fred client resends a command after a reconnect (its default
/// `max_command_attempts` is 3); coord's commands on that shared client are still written
/// once, by fred's per-command options.
#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_fred_client_also_sends_each_command_once() {
    use ::fred::prelude::{Builder, ClientLike, Config, ReconnectPolicy};

    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let mut builder = Builder::from_config(Config::from_url(&proxy.url()).unwrap());
    builder
        .with_connection_config(|conn| conn.max_command_attempts = 3)
        .set_policy(ReconnectPolicy::new_constant(0, 20));
    let app_client = builder.build().unwrap();
    app_client.init().await.unwrap();

    let p = RedisProvider::from_fred_client(app_client.clone())
        .command_timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    round(&p).await;
    let sets = calls(&server, "set");

    proxy.cut_open_connections_after_next_request();
    let k = key("shared-in-flight");
    let a = OwnerToken::new();
    let err = p
        .acquire(lock(&k, a, LONG, Duration::ZERO))
        .await
        .expect_err("the reply was lost");
    assert_ambiguous(&err, "acquire on a shared client with its connection cut");
    assert_eq!(
        server.command(&["GET", &redis_key(&k, "lock")]),
        Resp::Bulk(a.to_string().into_bytes()),
        "the command reached the server"
    );
    tokio::time::sleep(TIMEOUT * 3).await;
    assert_eq!(calls(&server, "set"), sets + 1, "the SET was sent once");

    // fred reconnected the application's client; coord goes on with it.
    assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::Released);
    round(&p).await;
    let _ = app_client.quit().await;
}
