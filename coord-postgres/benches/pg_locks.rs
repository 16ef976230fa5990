//! `PostgresProvider` beside what an application would write by hand, measured in the same
//! process against one private PostgreSQL server on loopback, baseline and coord interleaved
//! round by round.
//!
//! Run: `cargo bench -p coord-postgres --bench pg_locks` (about 50 s).
//!
//! | row | coord | baseline |
//! |---|---|---|
//! | lock pair | `LockProvider::acquire` (no wait, unfenced) + `release` | the same two statements, prepared, on one tokio-postgres connection per task |
//! | lock pair, attribute | a call of a `#[distributed_lock(lease = "30s")]` function with an empty body (no wait, unfenced: the attribute's defaults), through a `Coordinator` over the same provider | the same statements by hand |
//! | lock pair, handle | `Coordinator::lock(key).lease(30 s).acquire()`, then `LockGuard::release` | the same statements by hand |
//! | lock pair, application's pool | the same pair, the provider made by `PostgresProvider::from_pool` over a pool of 8 whose connections this runtime drives (no hop to the provider's connection thread) | the same statements by hand |
//! | advisory pair | the same coord pair | `pg_advisory_lock` + `pg_advisory_unlock` on one connection per task |
//! | hand-off | a waiter's acquire returns after the holder's release (LISTEN/NOTIFY, then one statement) | a session blocked in `pg_advisory_lock` returns after the holder's `pg_advisory_unlock` |
//! | claim + complete | `IdempotencyStore::claim` + `complete` on a fresh key | `INSERT .. ON CONFLICT DO NOTHING RETURNING` + an owner-checked `UPDATE` on a table of its own |
//!
//! Throughput rows run with 1 task and with 8 (each on its own key); coord's pool has 8
//! connections. Ratios are coord / baseline (higher is better for throughput, lower for
//! latency).

use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_core::provider::{
    ClaimOutcome, ClaimRequest, CompleteRequest, IdempotencyStore, LockProvider, LockRequest,
    OwnerToken,
};
use coord_core::{CallKey, CoordError, Coordinator, distributed_lock};
use coord_postgres::PostgresProvider;
use coord_postgres_testing::PostgresServer;
use tokio_postgres::Client;

const ROUNDS: usize = 3;
const ROUND: Duration = Duration::from_millis(700);
const HANDOFFS: usize = 150;

async fn raw(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
}

/// Runs `op` on `tasks` tasks for [`ROUND`] and returns operations per second.
async fn throughput<F, Fut>(tasks: usize, op: F) -> f64
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                while started.elapsed() < ROUND {
                    op(task, n).await;
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for h in handles {
        total += h.await.expect("task");
    }
    total as f64 / started.elapsed().as_secs_f64()
}

/// One lock pair by hand: the provider's own two statements, prepared, on one connection.
async fn hand_pair(
    client: &Client,
    statements: &[tokio_postgres::Statement],
    key: &CallKey,
    channel: &str,
) {
    let key = key.qualified();
    let owner = uuid::Uuid::from_u128(OwnerToken::new().as_u128());
    let rows = client
        .query(&statements[0], &[&key, &owner, &30_000i64, &false])
        .await
        .unwrap();
    assert!(rows[0].get::<_, bool>(0));
    client
        .query(
            &statements[1],
            &[&key, &owner, &channel, &"l0000000000000000"],
        )
        .await
        .unwrap();
}

/// One lock pair through the provider: acquire (no wait, unfenced) and release.
async fn coord_pair(provider: &PostgresProvider, key: &CallKey) {
    let owner = OwnerToken::new();
    let req = LockRequest {
        key,
        owner,
        lease: Duration::from_secs(30),
        wait: Duration::ZERO,
        fenced: false,
    };
    provider.acquire(req).await.unwrap().expect("uncontended");
    provider.release(key, owner).await.unwrap();
}

/// The lock pair as users write it: the attribute around an empty body, on the key `key`
/// names (each task its own). The attribute's defaults (no wait, unfenced) are the provider
/// pair's; the lease is the provider pair's too.
#[distributed_lock(key_from = "key", coordinator = c, name = "bench.attribute", lease = "30s")]
async fn locked(c: &Coordinator, key: u64) -> Result<(), CoordError> {
    std::hint::black_box(key);
    Ok(())
}

/// The lock pair through the handle: `Coordinator::lock(..).acquire()`, then the guard's
/// release, on a key of `task`'s own.
async fn handle_pair(coord: &Coordinator, task: usize) {
    let key = coord.key("bench.handle").part(&(task as u64)).finish();
    let guard = coord
        .lock(key)
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .expect("a free lock");
    assert!(guard.release().await.expect("released"), "released");
}

/// `COORD_BENCH_PROFILE=<side>:<pairs>` runs only `pairs` sequential lock pairs of one side on
/// one key and exits, printing the process's context switches per pair, for running the bench
/// under `valgrind --tool=callgrind` (instructions are counted, not seconds; two runs with N
/// and 3N pairs give 2N pairs' worth without the start-up, as BENCHMARKS.md does). Sides:
/// `attribute` (`#[distributed_lock]`), `handle` (`Coordinator::lock`), `coord` (the
/// `LockProvider` pair), `app` (the provider pair over the application's pool), `hand` (the
/// same statements by hand).
const PROFILE_VAR: &str = "COORD_BENCH_PROFILE";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

struct Row {
    name: String,
    coord: Vec<f64>,
    base: Vec<f64>,
}

impl Row {
    fn print(&self, unit: &str) {
        let (c, b) = (median(self.coord.clone()), median(self.base.clone()));
        println!(
            "| {} | {c:.0} {unit} | {b:.0} {unit} | {:.2}x | {} |",
            self.name,
            c / b,
            self.coord
                .iter()
                .zip(&self.base)
                .map(|(c, b)| format!("{:.2}", c / b))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// The whole process's context switches so far (every thread, `getrusage(RUSAGE_SELF)`).
#[derive(Clone, Copy)]
struct Switches {
    voluntary: i64,
    involuntary: i64,
}

impl Switches {
    fn since(self, before: Switches) -> (i64, i64) {
        (
            self.voluntary - before.voluntary,
            self.involuntary - before.involuntary,
        )
    }
}

fn switches() -> Switches {
    // SAFETY: `getrusage` writes one `rusage` into the zeroed value it is given, which lives
    // for the call; an all-zero `rusage` is a valid value of that plain C struct.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut usage), 0);
        usage
    };
    Switches {
        voluntary: usage.ru_nvcsw,
        involuntary: usage.ru_nivcsw,
    }
}

/// One coord hand-off on `key`: the holder releases; the waiter, marked and listening, is
/// woken and takes the lock. The time from the release's start to the waiter's grant.
/// `watcher` (a session of the bench's own) sees when the waiter has marked the holder's row.
async fn coord_handoff(provider: &PostgresProvider, key: &CallKey, watcher: &Client) -> Duration {
    // coord: the holder releases; the waiter, marked and listening, is woken.
    let holder = OwnerToken::new();
    let lease = Duration::from_secs(30);
    let req = |owner, wait| LockRequest {
        key,
        owner,
        lease,
        wait,
        fenced: false,
    };
    provider
        .acquire(req(holder, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let waiter = tokio::spawn({
        let (provider, key) = (provider.clone(), key.clone());
        async move {
            let owner = OwnerToken::new();
            let granted = provider
                .acquire(LockRequest {
                    key: &key,
                    owner,
                    lease,
                    wait: Duration::from_secs(10),
                    fenced: false,
                })
                .await
                .unwrap()
                .expect("handed over");
            let at = Instant::now();
            assert!(granted.contended);
            provider.release(&key, owner).await.unwrap();
            at
        }
    });
    // Released once the waiter has found the lock held and marked the holder's row (on a
    // loaded host a fixed pause was sometimes too short, and the waiter then took a free
    // lock), then a moment for its listening to start.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let marked = watcher
            .query_opt(
                "SELECT 1 FROM coord.locks WHERE key = $1 AND waited",
                &[&key.qualified()],
            )
            .await
            .unwrap();
        if marked.is_some() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the waiter never marked the holder"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    let released = Instant::now();
    provider.release(key, holder).await.unwrap();
    let granted = waiter.await.unwrap();
    granted.saturating_duration_since(released)
}

fn main() {
    let server = PostgresServer::start();
    let url = server.url();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(&server, &url));
}

async fn run(server: &PostgresServer, url: &str) {
    PostgresProvider::migrate(url).await.expect("migrate");
    server.sql(
        "CREATE TABLE hand_records (key text PRIMARY KEY, owner uuid NOT NULL, \
         payload bytea, done boolean NOT NULL DEFAULT false)",
    );
    let provider = PostgresProvider::builder(url)
        .pool_size(8)
        .sweep_interval(None)
        .connect()
        .await
        .expect("connect");
    // The same provider over an application's pool: its connections are driven by this
    // runtime, as the baseline's are, so the gap between the two coord rows is the provider's
    // connection thread.
    let on_app_pool = PostgresProvider::from_pool(
        deadpool_postgres::Pool::builder(deadpool_postgres::Manager::new(
            url.parse::<tokio_postgres::Config>()
                .expect("the server's URL"),
            tokio_postgres::NoTls,
        ))
        .max_size(8)
        .build()
        .expect("the application's pool"),
        url,
    )
    .sweep_interval(None)
    .connect()
    .await
    .expect("connect over the application's pool");
    let (acquire_sql, release_sql) = coord_postgres::__bench::lock_statements("coord");
    let mut clients = Vec::new();
    for _ in 0..8 {
        let client = raw(url).await;
        let acquire = client.prepare(&acquire_sql).await.unwrap();
        let release = client.prepare(&release_sql).await.unwrap();
        let lock = client.prepare("SELECT pg_advisory_lock($1)").await.unwrap();
        let unlock = client
            .prepare("SELECT pg_advisory_unlock($1)")
            .await
            .unwrap();
        let claim = client
            .prepare(
                "INSERT INTO hand_records (key, owner) VALUES ($1, $2) \
                 ON CONFLICT (key) DO NOTHING RETURNING 1",
            )
            .await
            .unwrap();
        let complete = client
            .prepare(
                "UPDATE hand_records SET payload = $3, done = true \
                 WHERE key = $1 AND owner = $2 AND NOT done",
            )
            .await
            .unwrap();
        clients.push(Arc::new((
            client,
            [acquire, release, lock, unlock, claim, complete],
        )));
    }
    let clients = Arc::new(clients);
    let keys: Arc<Vec<CallKey>> = Arc::new(
        (0..8)
            .map(|i| CallKey::builder("bench", "pair").part(&i).finish())
            .collect(),
    );
    let channel = provider.channel().to_owned();
    // The public API over the same provider (its own pool of 8, its connection thread).
    let coordinator = Arc::new(
        Coordinator::builder()
            .namespace("bench")
            .provider(provider.clone())
            .build()
            .expect("coordinator"),
    );
    if let Ok(spec) = std::env::var(PROFILE_VAR) {
        let (side, pairs) = spec
            .split_once(':')
            .and_then(|(side, pairs)| Some((side, pairs.parse::<u64>().ok()?)))
            .unwrap_or_else(|| {
                panic!("{PROFILE_VAR} is <attribute|handle|coord|app|hand>:<pairs>, not {spec:?}")
            });
        let before = switches();
        for _ in 0..pairs {
            match side {
                "attribute" => locked(&coordinator, 0).await.expect("a free lock"),
                "handle" => handle_pair(&coordinator, 0).await,
                "coord" => coord_pair(&provider, &keys[0]).await,
                "app" => coord_pair(&on_app_pool, &keys[0]).await,
                "hand" => {
                    let (client, s) = &*clients[0];
                    hand_pair(client, s, &keys[0], &channel).await
                }
                other => panic!("unknown profile side {other:?}"),
            }
        }
        let (voluntary, involuntary) = switches().since(before);
        println!(
            "profile: {pairs} lock pairs by {side}; context switches (whole process) per pair: \
             {:.2} voluntary, {:.2} involuntary",
            voluntary as f64 / pairs as f64,
            involuntary as f64 / pairs as f64
        );
        return;
    }
    let mut rows = Vec::new();

    for tasks in [1usize, 8] {
        let mut pair = Row {
            name: format!("lock pair, {tasks} task(s), vs the same statements by hand"),
            coord: vec![],
            base: vec![],
        };
        let mut attribute = Row {
            name: format!(
                "lock pair, `#[distributed_lock]`, {tasks} task(s), vs the same statements by hand"
            ),
            coord: vec![],
            base: vec![],
        };
        let mut handle = Row {
            name: format!(
                "lock pair, `Coordinator::lock` + release, {tasks} task(s), vs the same statements by hand"
            ),
            coord: vec![],
            base: vec![],
        };
        let mut app_pair = Row {
            name: format!(
                "lock pair, provider on the application's pool, {tasks} task(s), vs the same statements by hand"
            ),
            coord: vec![],
            base: vec![],
        };
        let mut advisory = Row {
            name: format!("lock pair, {tasks} task(s), vs pg_advisory_lock/unlock"),
            coord: vec![],
            base: vec![],
        };
        let mut records = Row {
            name: format!("claim + complete, {tasks} task(s), vs INSERT .. ON CONFLICT by hand"),
            coord: vec![],
            base: vec![],
        };
        for round in 0..ROUNDS {
            let by_hand = {
                let (clients, keys, channel) = (clients.clone(), keys.clone(), channel.clone());
                throughput(tasks, move |task, _| {
                    let (clients, keys, channel) = (clients.clone(), keys.clone(), channel.clone());
                    async move {
                        let (client, s) = &*clients[task];
                        hand_pair(client, s, &keys[task], &channel).await;
                    }
                })
                .await
            };
            let coord = {
                let (provider, keys) = (provider.clone(), keys.clone());
                throughput(tasks, move |task, _| {
                    let (provider, keys) = (provider.clone(), keys.clone());
                    async move { coord_pair(&provider, &keys[task]).await }
                })
                .await
            };
            let through_attribute = {
                let coordinator = coordinator.clone();
                throughput(tasks, move |task, _| {
                    let coordinator = coordinator.clone();
                    async move {
                        locked(&coordinator, task as u64)
                            .await
                            .expect("a free lock");
                    }
                })
                .await
            };
            let through_handle = {
                let coordinator = coordinator.clone();
                throughput(tasks, move |task, _| {
                    let coordinator = coordinator.clone();
                    async move { handle_pair(&coordinator, task).await }
                })
                .await
            };
            let over_app_pool = {
                let (provider, keys) = (on_app_pool.clone(), keys.clone());
                throughput(tasks, move |task, _| {
                    let (provider, keys) = (provider.clone(), keys.clone());
                    async move { coord_pair(&provider, &keys[task]).await }
                })
                .await
            };
            let adv = {
                let clients = clients.clone();
                throughput(tasks, move |task, _| {
                    let clients = clients.clone();
                    async move {
                        let (client, s) = &*clients[task];
                        let id = task as i64;
                        client.query(&s[2], &[&id]).await.unwrap();
                        client.query(&s[3], &[&id]).await.unwrap();
                    }
                })
                .await
            };
            pair.base.push(by_hand);
            pair.coord.push(coord);
            attribute.base.push(by_hand);
            attribute.coord.push(through_attribute);
            handle.base.push(by_hand);
            handle.coord.push(through_handle);
            app_pair.base.push(by_hand);
            app_pair.coord.push(over_app_pool);
            advisory.base.push(adv);
            advisory.coord.push(coord);

            let hand_records = {
                let clients = clients.clone();
                throughput(tasks, move |task, n| {
                    let clients = clients.clone();
                    async move {
                        let (client, s) = &*clients[task];
                        let key = format!("bench:hand:{tasks}:{round}:{task}:{n}");
                        let owner = uuid::Uuid::from_u128(OwnerToken::new().as_u128());
                        let claimed = client.query(&s[4], &[&key, &owner]).await.unwrap();
                        assert_eq!(claimed.len(), 1);
                        let payload: &[u8] = b"receipt-0000000000";
                        client
                            .execute(&s[5], &[&key, &owner, &payload])
                            .await
                            .unwrap();
                    }
                })
                .await
            };
            let coord_records = {
                let provider = provider.clone();
                throughput(tasks, move |task, n| {
                    let provider = provider.clone();
                    async move {
                        let key = CallKey::builder("bench", "charge")
                            .part(&format!("{tasks}:{round}:{task}:{n}"))
                            .finish();
                        let owner = OwnerToken::new();
                        let claimed = provider
                            .claim(ClaimRequest {
                                key: &key,
                                owner,
                                in_flight_lease: Duration::from_secs(30),
                                fingerprint: None,
                                keep_abandoned_for: None,
                                transactional: false,
                            })
                            .await
                            .unwrap();
                        assert_eq!(claimed, ClaimOutcome::Claimed);
                        provider
                            .complete(CompleteRequest {
                                key: &key,
                                owner,
                                payload: Arc::from(&b"receipt-0000000000"[..]),
                                retention: Duration::from_secs(3600),
                                fingerprint: None,
                            })
                            .await
                            .unwrap();
                    }
                })
                .await
            };
            records.base.push(hand_records);
            records.coord.push(coord_records);
        }
        rows.push(pair);
        rows.push(attribute);
        rows.push(handle);
        rows.push(app_pair);
        rows.push(advisory);
        rows.push(records);
    }

    // Hand-offs, interleaved sample by sample.
    let key = CallKey::builder("bench", "handoff").finish();
    let (mut coord_handoffs, mut app_handoffs, mut advisory_handoffs) =
        (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..HANDOFFS {
        let watcher = &clients[7].0;
        coord_handoffs.push(coord_handoff(&provider, &key, watcher).await);
        app_handoffs.push(coord_handoff(&on_app_pool, &key, watcher).await);

        // Advisory: a second session blocked in pg_advisory_lock.
        let (a, sa) = &*clients[0];
        a.query(&sa[2], &[&99i64]).await.unwrap();
        let waiting = tokio::spawn({
            let clients = clients.clone();
            async move {
                let (b, sb) = &*clients[1];
                b.query(&sb[2], &[&99i64]).await.unwrap();
                let at = Instant::now();
                b.query(&sb[3], &[&99i64]).await.unwrap();
                at
            }
        });
        tokio::time::sleep(Duration::from_millis(15)).await;
        let released = Instant::now();
        a.query(&sa[3], &[&99i64]).await.unwrap();
        let granted = waiting.await.unwrap();
        advisory_handoffs.push(granted.saturating_duration_since(released));
    }
    coord_handoffs.sort();
    app_handoffs.sort();
    advisory_handoffs.sort();

    println!();
    println!("| throughput | coord (median) | baseline (median) | ratio | ratio per round |");
    println!("|---|---|---|---|---|");
    for row in &rows {
        row.print("ops/s");
    }
    println!();
    println!("| hand-off ({HANDOFFS} each, interleaved) | p50 | p90 | p99 |");
    println!("|---|---|---|---|");
    for (name, v) in [
        ("coord (LISTEN/NOTIFY, then one statement)", &coord_handoffs),
        ("coord, provider on the application's pool", &app_handoffs),
        ("pg_advisory_lock (blocked session)", &advisory_handoffs),
    ] {
        println!(
            "| {name} | {:.3} ms | {:.3} ms | {:.3} ms |",
            percentile(v, 0.5).as_secs_f64() * 1e3,
            percentile(v, 0.9).as_secs_f64() * 1e3,
            percentile(v, 0.99).as_secs_f64() * 1e3
        );
    }
}
