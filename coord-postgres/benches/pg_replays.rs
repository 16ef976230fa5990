//! An idempotent replay through the public API beside the same read written by hand, in one
//! process against one private PostgreSQL server on loopback (`fsync` on, the server's
//! defaults otherwise: `synchronous_commit = on`), baseline and coord interleaved round by
//! round.
//!
//! Run: `cargo bench -p coord-postgres --bench pg_replays` (about 40 s).
//!
//! | row | coord | baseline |
//! |---|---|---|
//! | replay, attribute | an `#[idempotent]` call whose record is completed: the stored outcome, decoded | a prepared `SELECT` of the record's row (state, payload, fingerprint, live) through a `deadpool_postgres` pool |
//! | replay, handle | the same through `Coordinator::idempotent(key).run(..)` | the same `SELECT` |
//! | replay, attribute, application's pool | the attribute row, with the provider made by `PostgresProvider::from_pool` over a pool of 8 of the bench's own (its connections run on the bench's runtime, not on the provider's connection thread) | the same `SELECT` |
//! | replay, provider | `IdempotencyStore::claim` on the provider (no coordinator, no decoding) | the same `SELECT` |
//! | coord's read by hand | the provider's own read statement, prepared, through the baseline's pool (no provider) | the same `SELECT` |
//! | first call | an `#[idempotent]` call on a fresh key: read, claim, body, completion | `INSERT .. ON CONFLICT DO NOTHING RETURNING` + an owner-checked `UPDATE` through the same pool |
//!
//! 16 tasks, each on a key of its own; coord's pool and the baseline's pool both hold 8
//! connections. Ratios are coord / baseline (higher is better).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use coord_core::provider::{ClaimOutcome, ClaimRequest, IdempotencyStore, OwnerToken};
use coord_core::{CallKey, CoordError, Coordinator, idempotent};
use coord_postgres::PostgresProvider;
use coord_postgres_testing::{PostgresServer, ServerOptions};
use deadpool_postgres::{Manager, Pool};

const ROUNDS: usize = 5;
const ROUND: Duration = Duration::from_millis(1000);
const TASKS: usize = 16;
const POOL: usize = 8;

/// The hand-written replay: the record's row, read as an application would.
const HAND_READ: &str = "SELECT state, payload, fingerprint, expires_at > clock_timestamp() \
                         FROM coord.records WHERE key = $1";

#[idempotent(key_from = "order", coordinator = coord, name = "bench.charge")]
async fn charge(coord: &Coordinator, order: &str) -> Result<String, CoordError> {
    Ok(format!("receipt for {order}"))
}

/// One side's round: operations per second, and the process's voluntary context switches
/// per operation (every thread: the runtime's workers, the provider's connection thread).
#[derive(Clone, Copy)]
struct Measured {
    rate: f64,
    switches: f64,
}

/// Runs `op` on [`TASKS`] tasks for [`ROUND`].
async fn throughput<F, Fut>(op: F) -> Measured
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let before = switches();
    let started = Instant::now();
    let handles: Vec<_> = (0..TASKS)
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
    let rate = total as f64 / started.elapsed().as_secs_f64();
    let (voluntary, _) = switches().since(before);
    Measured {
        rate,
        switches: voluntary as f64 / total.max(1) as f64,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Row {
    name: &'static str,
    coord: Vec<f64>,
    base: Vec<f64>,
    coord_switches: Vec<f64>,
    base_switches: Vec<f64>,
}

impl Row {
    fn new(name: &'static str) -> Row {
        Row {
            name,
            coord: vec![],
            base: vec![],
            coord_switches: vec![],
            base_switches: vec![],
        }
    }

    fn push(&mut self, base: Measured, coord: Measured) {
        self.base.push(base.rate);
        self.coord.push(coord.rate);
        self.base_switches.push(base.switches);
        self.coord_switches.push(coord.switches);
    }

    fn print(&self) {
        let (c, b) = (median(self.coord.clone()), median(self.base.clone()));
        let (cs, bs) = (
            median(self.coord_switches.clone()),
            median(self.base_switches.clone()),
        );
        println!(
            "| {} | {c:.0} /s | {b:.0} /s | {:.2}x | {cs:.2} / {bs:.2} | {} |",
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

fn main() {
    // The server's durable defaults: a statement that writes waits for its commit's flush.
    let server = PostgresServer::start_configured(ServerOptions::new().durable());
    let url = server.url();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(&server, &url));
}

/// `COORD_BENCH_PROFILE=<side>:<replays>` runs only `replays` sequential replays on one task
/// of one side (`attribute`, `app` for the attribute over the application's pool, `provider`,
/// `statement` for coord's read by hand, `hand`) and exits, printing the process's context
/// switches per replay; for running under `valgrind --tool=callgrind` or `strace -c -f`, where
/// two runs with N and 3N replays give 2N replays' worth without the start-up.
const PROFILE_VAR: &str = "COORD_BENCH_PROFILE";

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

/// The hand-written replay of `key` on a connection of `pool`, with the statement `sql`.
async fn hand_replay(pool: &Pool, sql: &str, key: &str) {
    let client = pool.get().await.expect("a pooled connection");
    let statement = client.prepare_cached(sql).await.expect("prepare");
    let row = client
        .query_opt(&statement, &[&key])
        .await
        .expect("read")
        .expect("the record");
    let state: &str = row.get(0);
    assert_eq!(state, "completed");
}

async fn run(server: &PostgresServer, url: &str) {
    PostgresProvider::migrate(url).await.expect("migrate");
    server.sql(
        "CREATE TABLE hand_records (key text PRIMARY KEY, owner uuid NOT NULL, \
         payload bytea, done boolean NOT NULL DEFAULT false)",
    );
    let provider = PostgresProvider::builder(url)
        .pool_size(POOL)
        .sweep_interval(None)
        .connect()
        .await
        .expect("connect");
    let coord = Arc::new(
        Coordinator::builder()
            .namespace("bench")
            .provider(provider.clone())
            .build()
            .expect("coordinator"),
    );
    let config: tokio_postgres::Config = url.parse().expect("the server's URL");
    let pool = Pool::builder(Manager::new(config, tokio_postgres::NoTls))
        .max_size(POOL)
        .build()
        .expect("the baseline's pool");

    // The same coordinator's namespace over a provider on an application's pool: its
    // connections are driven by this runtime, as the baseline's are.
    let app_pool = Pool::builder(Manager::new(
        url.parse::<tokio_postgres::Config>()
            .expect("the server's URL"),
        tokio_postgres::NoTls,
    ))
    .max_size(POOL)
    .build()
    .expect("the application's pool");
    let on_app_pool = Arc::new(
        Coordinator::builder()
            .namespace("bench")
            .provider(
                PostgresProvider::from_pool(app_pool, url)
                    .sweep_interval(None)
                    .connect()
                    .await
                    .expect("connect over the application's pool"),
            )
            .build()
            .expect("coordinator"),
    );

    // One completed record per task, for each form, and the qualified keys the baseline reads.
    let orders: Arc<Vec<String>> = Arc::new((0..TASKS).map(|t| format!("o-{t}")).collect());
    let handle_keys: Arc<Vec<_>> = Arc::new(
        (0..TASKS)
            .map(|t| coord.key("bench.refund").part(&t).finish())
            .collect(),
    );
    let runs = Arc::new(AtomicU64::new(0));
    let handle_call = {
        let (coord, runs) = (coord.clone(), runs.clone());
        move |task: usize| {
            let (coord, runs) = (coord.clone(), runs.clone());
            let key = handle_keys[task].clone();
            async move {
                coord
                    .idempotent(key)
                    .run(move || async move {
                        runs.fetch_add(1, Ordering::Relaxed);
                        Ok::<_, CoordError>(42_u64)
                    })
                    .await
                    .expect("replayed");
            }
        }
    };
    for task in 0..TASKS {
        charge(&coord, &orders[task]).await.expect("first call");
        handle_call(task).await;
    }
    let stored: Vec<String> = server
        .sql("SELECT key FROM coord.records WHERE key LIKE 'bench:bench.charge%' ORDER BY key")
        .lines()
        .map(|l| l.trim().to_owned())
        .filter(|l| l.starts_with("bench:"))
        .collect();
    assert_eq!(stored.len(), TASKS, "one record per task: {stored:?}");
    // The same keys as the provider names them (the operator's form: without the namespace).
    let provider_keys: Arc<Vec<CallKey>> = Arc::new(
        stored
            .iter()
            .map(|k| {
                let shown = k.strip_prefix("bench:").expect("in the namespace");
                coord.operator().key(shown).expect("a key coord wrote")
            })
            .collect(),
    );
    let hand_keys = Arc::new(stored);
    let coord_read: Arc<str> = coord_postgres::__bench::record_read_statement("coord").into();

    if let Ok(spec) = std::env::var(PROFILE_VAR) {
        let (side, replays) = spec
            .split_once(':')
            .and_then(|(side, n)| Some((side, n.parse::<u64>().ok()?)))
            .unwrap_or_else(|| {
                panic!("{PROFILE_VAR} is <attribute|app|provider|statement|hand>:<replays>, not {spec:?}")
            });
        let before = switches();
        for _ in 0..replays {
            match side {
                "attribute" => {
                    charge(&coord, &orders[0]).await.expect("replayed");
                }
                "app" => {
                    charge(&on_app_pool, &orders[0]).await.expect("replayed");
                }
                "provider" => {
                    let found = provider
                        .claim(ClaimRequest {
                            key: &provider_keys[0],
                            owner: OwnerToken::new(),
                            in_flight_lease: Duration::from_secs(30),
                            fingerprint: None,
                            keep_abandoned_for: None,
                            transactional: false,
                        })
                        .await
                        .expect("claim");
                    assert!(matches!(found, ClaimOutcome::Completed { .. }));
                }
                "statement" => hand_replay(&pool, &coord_read, &hand_keys[0]).await,
                "hand" => hand_replay(&pool, HAND_READ, &hand_keys[0]).await,
                other => panic!("unknown profile side {other:?}"),
            }
        }
        let (voluntary, involuntary) = switches().since(before);
        println!(
            "profile: {replays} replays by {side}; context switches (whole process) per replay: \
             {:.2} voluntary, {:.2} involuntary",
            voluntary as f64 / replays as f64,
            involuntary as f64 / replays as f64
        );
        return;
    }

    let mut attribute = Row::new("replay, `#[idempotent]`, 16 tasks, vs a `SELECT` by hand");
    let mut handle = Row::new("replay, `Idempotent` handle, 16 tasks, vs a `SELECT` by hand");
    let mut app = Row::new(
        "replay, `#[idempotent]`, provider on the application's pool, 16 tasks, vs a `SELECT` by hand",
    );
    let mut direct = Row::new("replay, `IdempotencyStore::claim`, 16 tasks, vs a `SELECT` by hand");
    let mut statement = Row::new("coord's read statement by hand, 16 tasks, vs a `SELECT` by hand");
    let mut first = Row::new("first call, `#[idempotent]`, 16 tasks, vs claim + complete by hand");
    for round in 0..ROUNDS {
        let by_hand = {
            let (pool, keys) = (pool.clone(), hand_keys.clone());
            throughput(move |task, _| {
                let (pool, keys) = (pool.clone(), keys.clone());
                async move { hand_replay(&pool, HAND_READ, &keys[task]).await }
            })
            .await
        };
        let through_attribute = {
            let (coord, orders) = (coord.clone(), orders.clone());
            throughput(move |task, _| {
                let (coord, orders) = (coord.clone(), orders.clone());
                async move {
                    charge(&coord, &orders[task]).await.expect("replayed");
                }
            })
            .await
        };
        let through_handle = {
            let handle_call = handle_call.clone();
            throughput(move |task, _| handle_call(task)).await
        };
        let through_provider = {
            let (provider, keys) = (provider.clone(), provider_keys.clone());
            throughput(move |task, _| {
                let (provider, keys) = (provider.clone(), keys.clone());
                async move {
                    let found = provider
                        .claim(ClaimRequest {
                            key: &keys[task],
                            owner: OwnerToken::new(),
                            in_flight_lease: Duration::from_secs(30),
                            fingerprint: None,
                            keep_abandoned_for: None,
                            transactional: false,
                        })
                        .await
                        .expect("claim");
                    assert!(matches!(found, ClaimOutcome::Completed { .. }));
                }
            })
            .await
        };
        let coord_statement = {
            let (pool, keys, sql) = (pool.clone(), hand_keys.clone(), coord_read.clone());
            throughput(move |task, _| {
                let (pool, keys, sql) = (pool.clone(), keys.clone(), sql.clone());
                async move { hand_replay(&pool, &sql, &keys[task]).await }
            })
            .await
        };
        let over_app_pool = {
            let (coord, orders) = (on_app_pool.clone(), orders.clone());
            throughput(move |task, _| {
                let (coord, orders) = (coord.clone(), orders.clone());
                async move {
                    charge(&coord, &orders[task]).await.expect("replayed");
                }
            })
            .await
        };
        app.push(by_hand, over_app_pool);
        direct.push(by_hand, through_provider);
        statement.push(by_hand, coord_statement);
        attribute.push(by_hand, through_attribute);
        handle.push(by_hand, through_handle);

        let hand_first = {
            let pool = pool.clone();
            throughput(move |task, n| {
                let pool = pool.clone();
                async move {
                    let client = pool.get().await.expect("a pooled connection");
                    let claim = client
                        .prepare_cached(
                            "INSERT INTO hand_records (key, owner) VALUES ($1, $2) \
                             ON CONFLICT (key) DO NOTHING RETURNING 1",
                        )
                        .await
                        .unwrap();
                    let complete = client
                        .prepare_cached(
                            "UPDATE hand_records SET payload = $3, done = true \
                             WHERE key = $1 AND owner = $2 AND NOT done",
                        )
                        .await
                        .unwrap();
                    let key = format!("bench:hand:{round}:{task}:{n}");
                    let owner = uuid::Uuid::new_v4();
                    let claimed = client.query(&claim, &[&key, &owner]).await.unwrap();
                    assert_eq!(claimed.len(), 1);
                    let payload: &[u8] = b"\"receipt for o-000\"";
                    client
                        .execute(&complete, &[&key, &owner, &payload])
                        .await
                        .unwrap();
                }
            })
            .await
        };
        let coord_first = {
            let coord = coord.clone();
            throughput(move |task, n| {
                let coord = coord.clone();
                async move {
                    let order = format!("fresh-{round}-{task}-{n}");
                    charge(&coord, &order).await.expect("first call");
                }
            })
            .await
        };
        first.push(hand_first, coord_first);
    }
    assert_eq!(
        runs.load(Ordering::Relaxed),
        TASKS as u64,
        "every handle call after the first replayed"
    );
    println!(
        "| row | coord | baseline | ratio (median) | voluntary context switches per op, coord / baseline (median) | ratio per round |"
    );
    println!("|---|---|---|---|---|---|");
    attribute.print();
    handle.print();
    app.print();
    direct.print();
    statement.print();
    first.print();
}
