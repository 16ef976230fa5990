//! Time promises when a process stalls, against a real redis-server (the in-process runs are
//! in the kit's `stalls` cases and in `tests/tests/stall_history.rs`).
//!
//! | test | the stall | promise |
//! |---|---|---|
//! | `cache_write_delayed_in_a_stalled_client` | the caller's whole runtime (its connection included) blocked 2 s from the body's return | the shared entry is not served older than its 1 s ttl |
//! | `cache_write_to_a_frozen_server` | the server frozen (SIGSTOP) 2 s from the body's return | the write, executed on thaw, does not outlive its ttl |
//! | `renewing_holds_that_returned_ok_held_throughout` | three processes contend a renewing fenced lock; holders stall 2 s past the 1 s lease | no call that returned `Ok` saw a newer token write between its first and last write |
//!
//! The last is `coord_history::paused_holders`, the run the in-process tests make too, here
//! with a connection of its own per process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coord_core::{CoordError, Coordinator, cached};
use coord_history::paused_holders;
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::RedisServer;
use tokio::sync::Notify;

per_client!(
    cache_write_delayed_in_a_stalled_client,
    cache_write_to_a_frozen_server,
    renewing_holds_that_returned_ok_held_throughout,
);

const STALL: Duration = Duration::from_secs(2);
const TTL: Duration = Duration::from_secs(1);
const READ_AT: Duration = Duration::from_millis(2500);

async fn coordinator(url: &str, client: Client, timeout: Duration) -> Coordinator {
    let provider = RedisProvider::builder(url)
        .client(client)
        .command_timeout(timeout)
        .connect()
        .await
        .expect("connect to the test server");
    Coordinator::builder()
        .namespace("stalls")
        .provider(provider)
        .build()
        .expect("coordinator")
}

/// The answers an operation computed, by number, and when; and what to do the moment a body
/// returns.
struct Answers {
    computed: Mutex<Vec<Instant>>,
    on_return: Box<dyn Fn() + Send + Sync>,
}

impl Answers {
    fn new(on_return: impl Fn() + Send + Sync + 'static) -> Arc<Answers> {
        Arc::new(Answers {
            computed: Mutex::new(Vec::new()),
            on_return: Box::new(on_return),
        })
    }

    fn compute(&self) -> u64 {
        let mut computed = self.computed.lock().unwrap();
        computed.push(Instant::now());
        let n = computed.len() as u64 - 1;
        drop(computed);
        (self.on_return)();
        n
    }

    fn age(&self, n: u64) -> Duration {
        self.computed.lock().unwrap()[n as usize].elapsed()
    }
}

#[cached(key_from = "slot", coordinator = coord, name = "stalls.shared", ttl = "1s", scope = "shared")]
async fn shared_answer(
    coord: &Coordinator,
    slot: u32,
    answers: Arc<Answers>,
) -> Result<u64, CoordError> {
    Ok(answers.compute())
}

/// Reads the entry from a caller that did not stall, `READ_AT` after `started`, and checks
/// that what it is served is no older than the ttl.
async fn read_later(url: &str, client: Client, started: Instant, answers: &Arc<Answers>) {
    let reader = coordinator(url, client, Duration::from_secs(2)).await;
    tokio::time::sleep_until((started + READ_AT).into()).await;
    let n = shared_answer(&reader, 1, answers.clone())
        .await
        .expect("the reader's call answers");
    let age = answers.age(n);
    assert!(
        age <= TTL,
        "served answer {n}, {age:?} old, from a shared cache with a {TTL:?} ttl: expired \
         entries are never served"
    );
}

/// The caller's process stalls (its runtime, connection included, blocked) the moment the
/// body returns: the cache write leaves 2 s late, and must not keep the entry past its ttl.
async fn cache_write_delayed_in_a_stalled_client(client: Client) {
    let server = RedisServer::start();
    let url = server.url();
    let stall = Arc::new(Notify::new());
    let answers = {
        let stall = stall.clone();
        Answers::new(move || stall.notify_one())
    };
    let started = Instant::now();
    let writer = {
        let (url, answers) = (url.clone(), answers.clone());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                // Connected on this runtime: its connection stalls with it.
                let c = coordinator(&url, client, Duration::from_secs(5)).await;
                let staller = tokio::spawn(async move {
                    stall.notified().await;
                    std::thread::sleep(STALL);
                });
                let first = shared_answer(&c, 1, answers).await;
                staller.await.unwrap();
                first
            })
        })
    };
    read_later(&url, client, started, &answers).await;
    let first = tokio::task::spawn_blocking(move || writer.join().unwrap())
        .await
        .unwrap();
    assert!(first.is_ok(), "the stalled call answers: {first:?}");
}

/// The server freezes (SIGSTOP) the moment the body returns: the write reaches it 2 s late,
/// after its caller gave up waiting, and must not keep the entry past its ttl.
async fn cache_write_to_a_frozen_server(client: Client) {
    let server = Arc::new(RedisServer::start());
    let url = server.url();
    // Connected before the freeze.
    let c = coordinator(&url, client, Duration::from_millis(300)).await;
    let answers = {
        let (server, paused) = (server.clone(), AtomicBool::new(false));
        // Only the first body freezes the server.
        Answers::new(move || {
            if !paused.swap(true, Ordering::SeqCst) {
                server.pause();
            }
        })
    };
    let started = Instant::now();
    let first = shared_answer(&c, 1, answers.clone()).await;
    assert!(
        first.is_ok(),
        "a failed cache write does not fail the call: {first:?}"
    );
    tokio::time::sleep_until((started + STALL).into()).await;
    server.resume();
    read_later(&url, client, started, &answers).await;
}

/// Three processes (threads, each with a current-thread runtime and a connection of its own)
/// take turns on one renewing fenced lock, four calls each; every third call stalls its process
/// 2 s, 50 ms into the body, past the 1 s lease. A call that returned `Ok` must have held the
/// lock throughout: no newer token wrote to the resource between its first and last write.
async fn renewing_holds_that_returned_ok_held_throughout(client: Client) {
    let server = RedisServer::start();
    let url = server.url();
    let connect = move || {
        let url = url.clone();
        async move { coordinator(&url, client, Duration::from_secs(2)).await }
    };
    tokio::task::spawn_blocking(move || paused_holders::run_and_check(connect))
        .await
        .unwrap();
}
