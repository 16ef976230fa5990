//! What each operation costs on the wire, proven two ways:
//!
//! * commands: `MONITOR` on the server, counting what client connections sent (the commands
//!   a script runs inside the server are not round trips and are left out);
//! * round trips: the provider talks through a proxy that delays everything the client sends
//!   by `DELAY`. One round trip takes a little over `DELAY`; two take over twice that.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use coord_core::provider::{ClaimOutcome, IdempotencyStore, LockProvider, OwnerToken};
use coord_core::{CoordError, Coordinator, idempotent};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::{Monitor, RedisServer};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

per_client!(
    operations_cost_one_round_trip,
    idempotent_replay_is_one_command
);

const DELAY: Duration = Duration::from_millis(100);

/// A TCP proxy to `127.0.0.1:upstream` that holds back every chunk the client sends for
/// `delay` (chunks keep their order and are not serialized behind each other's delay), and
/// passes the server's answers straight through. Stops with the test's runtime.
async fn slow_link(upstream: u16, delay: Duration) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = TcpStream::connect(("127.0.0.1", upstream)).await.unwrap();
            client.set_nodelay(true).unwrap();
            server.set_nodelay(true).unwrap();
            let (mut client_rx, mut client_tx) = client.into_split();
            let (mut server_rx, mut server_tx) = server.into_split();
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = client_rx.read(&mut buf).await {
                    if n == 0
                        || tx
                            .send((Instant::now() + delay, buf[..n].to_vec()))
                            .is_err()
                    {
                        break;
                    }
                }
            });
            tokio::spawn(async move {
                while let Some((at, chunk)) = rx.recv().await {
                    tokio::time::sleep_until(at.into()).await;
                    if server_tx.write_all(&chunk).await.is_err() {
                        break;
                    }
                }
            });
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut server_rx, &mut client_tx).await;
            });
        }
    });
    port
}

fn counts(names: Vec<String>) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for name in names {
        *out.entry(name).or_insert(0) += 1;
    }
    out
}

fn expect(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// Runs `op` through the slow link, checking it took exactly one round trip and that client
/// connections sent exactly `commands`.
async fn measure<T, F>(what: &str, monitor: &Monitor, commands: &[(&str, u64)], op: F) -> T
where
    F: Future<Output = T>,
{
    monitor.drain();
    let started = Instant::now();
    let out = op.await;
    let took = started.elapsed();
    assert_eq!(
        counts(monitor.client_commands()),
        expect(commands),
        "{what}: commands sent"
    );
    assert!(
        took >= DELAY && took < DELAY * 19 / 10,
        "{what}: one round trip takes about {DELAY:?}, this took {took:?}"
    );
    out
}

async fn operations_cost_one_round_trip(client: Client) {
    let server = RedisServer::start();
    let port = slow_link(server.port(), DELAY).await;
    let p = RedisProvider::builder(format!("redis://127.0.0.1:{port}"))
        .client(client)
        .command_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    // Warm up: load every script once (the first call of a script after a server start is
    // EVALSHA, NOSCRIPT, EVAL).
    let w = key("warm-up");
    let o = OwnerToken::new();
    p.acquire(fenced(&w, o, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    p.renew(&w, o, LONG).await.unwrap();
    p.release(&w, o).await.unwrap();
    p.claim(claim(&w, o, LONG)).await.unwrap();
    complete_stored(&p, &w, o, Arc::from(&b"1"[..]), LONG)
        .await
        .unwrap();
    p.claim(claim(&w, o, LONG)).await.unwrap();
    // ... and open the subscriber connection.
    let held = OwnerToken::new();
    p.acquire(lock(&w, held, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let waited = p
        .acquire(lock(&w, o, LONG, Duration::from_secs(1)))
        .await
        .unwrap();
    assert_eq!(waited, None);

    let monitor = Monitor::start(&server);
    // The waiter's unsubscription goes out after it gave up: let it pass before measuring.
    until(
        "the warm-up waiter to unsubscribe",
        Duration::from_secs(5),
        || subscribers(&server, &redis_key(&w, "lock")) == 0,
    )
    .await;
    let k = key("rt");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    let grant = measure("single-attempt acquire", &monitor, &[("set", 1)], async {
        p.acquire(lock(&k, a, LONG, Duration::ZERO)).await.unwrap()
    })
    .await;
    assert!(grant.is_some());
    let refused = measure("refused single attempt", &monitor, &[("set", 1)], async {
        p.acquire(lock(&k, b, LONG, Duration::ZERO)).await.unwrap()
    })
    .await;
    assert_eq!(refused, None);
    measure("release", &monitor, &[("evalsha", 1)], async {
        p.release(&k, a).await.unwrap()
    })
    .await;
    // A caller that would wait asks for the lease in the same round trip; uncontended, that
    // is all it sends.
    let grant = measure(
        "uncontended acquire with wait",
        &monitor,
        &[("set", 1), ("pttl", 1)],
        async {
            p.acquire(lock(&k, b, LONG, Duration::from_secs(5)))
                .await
                .unwrap()
        },
    )
    .await;
    assert!(grant.is_some());
    measure("renew", &monitor, &[("evalsha", 1)], async {
        p.renew(&k, b, LONG).await.unwrap()
    })
    .await;
    p.release(&k, b).await.unwrap();

    let f = key("fenced");
    let grant = measure("fenced acquire", &monitor, &[("evalsha", 1)], async {
        p.acquire(fenced(&f, a, LONG, Duration::from_secs(5)))
            .await
            .unwrap()
    })
    .await;
    assert!(grant.unwrap().fencing_token.is_some());
    p.release(&f, a).await.unwrap();

    let r = key("record");
    let claimed = measure("claim", &monitor, &[("evalsha", 1)], async {
        p.claim(claim(&r, a, LONG)).await.unwrap()
    })
    .await;
    assert_eq!(claimed, ClaimOutcome::Claimed);
    measure("complete", &monitor, &[("evalsha", 1)], async {
        complete_stored(&p, &r, a, Arc::from(&b"done"[..]), LONG)
            .await
            .unwrap()
    })
    .await;
    let replay = measure("replay", &monitor, &[("evalsha", 1)], async {
        p.claim(claim(&r, b, LONG)).await.unwrap()
    })
    .await;
    assert!(matches!(replay, ClaimOutcome::Completed { .. }));

    // Contended, with a wait: the failed attempt brought the remaining lease along (no
    // separate PTTL round trip), then the waiter subscribed and retried once, with the
    // script that also marks the holder as waited for.
    monitor.drain();
    let refused = p
        .acquire(lock(&w, b, LONG, Duration::from_millis(600)))
        .await
        .unwrap();
    assert_eq!(refused, None);
    // (fred confirms a subscription with a PING on the subscriber connection.)
    let sent: Vec<String> = monitor
        .client_commands()
        .into_iter()
        .filter(|c| c != "ping")
        .collect();
    assert_eq!(
        sent[..4],
        ["set", "pttl", "subscribe", "evalsha"],
        "contended acquire: {sent:?}"
    );
}

#[idempotent(key_from = "request", coordinator = coord)]
async fn charge(
    coord: &Coordinator,
    request: u32,
    runs: Arc<AtomicU64>,
) -> Result<u64, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(u64::from(request) * 100)
}

async fn idempotent_replay_is_one_command(client: Client) {
    let server = RedisServer::start();
    let coord = Coordinator::builder()
        .namespace("billing")
        .provider(provider(&server, client).await)
        .build()
        .unwrap();
    let runs = Arc::new(AtomicU64::new(0));
    assert_eq!(charge(&coord, 7, runs.clone()).await.unwrap(), 700);
    let monitor = Monitor::start(&server);
    assert_eq!(
        charge(&coord, 7, runs.clone()).await.unwrap(),
        700,
        "replayed"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
    let sent = monitor.drain();
    let from_clients: Vec<&str> = sent
        .iter()
        .filter(|m| !m.from_script)
        .map(|m| m.name.as_str())
        .collect();
    assert_eq!(
        from_clients,
        ["evalsha"],
        "a replay is the claim script alone: {sent:#?}"
    );
}
