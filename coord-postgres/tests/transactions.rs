//! Idempotency in the caller's own transaction, on a real PostgreSQL server: the attribute
//! form (`#[idempotent(transaction = "tx")]`) and the handle form
//! (`Idempotent::claim_in_transaction`) write the completed record through
//! `coord_postgres::Transaction` beside a business table (`charges`), so the record and the
//! charge commit together or not at all.
//!
//! | Case (test) | What failed | The caller gets | A duplicate gets | `charges` holds | Body runs |
//! |---|---|---|---|---|---|
//! | `committed_outcome_is_replayed` | nothing | `Ok(id)`, commit `Ok` | `Ok(id)` replayed, its transaction untouched | 1 row | 1 |
//! | `rollback_leaves_nothing_and_the_next_call_runs` | the caller rolls back after `Ok` | `Ok(id)`, then the rollback | a fresh run at once (the marker was abandoned) | 0, then 1 row | 2 |
//! | `dropped_transaction_frees_the_key` | the transaction is dropped after `Ok` (lease 20 s) | `Ok(id)` | a fresh run within 5 s, so before the lease (abandoned in the background) | 0, then 1 row | 2 |
//! | `body_error_leaves_nothing` | the body wrote, then failed | the body's error | a fresh run at once | 0, then 1 row | 2 |
//! | `panic_in_body_leaves_nothing` | the body wrote, then panicked | the panic | a fresh run (waiting duplicate) | 0, then 1 row | 2 |
//! | `taken_over_during_the_body_cannot_commit` | the marker lapsed mid-body and another caller ran and committed | `TransactionRollbackOnly { Superseded }`; commit `Err(RollbackOnly)` | the other caller's outcome | 1 row (the other's) | 2 |
//! | `duplicate_does_not_wait_for_the_locked_row` | a duplicate arrives while the first caller's transaction holds the marker's row (completion written, not committed; lease lapsed too) | — | `InFlight` at once (no wait), never a hang or a takeover; a waiting duplicate replays once the first commits | 1 row | 1 |
//! | `handle_form_end_to_end` | the handle form over a `deadpool_postgres` client: commit, replay, rollback | `Ok` / replay | `Replay(id)`; after a rollback, a fresh run | 1 row per committed key | 1 per committed key (+1 rolled back) |
//! | `killed_before_commit_leaves_nothing` | a child process SIGKILLed between the body's writes (completion written) and commit | nothing | `InFlight` until the lease ends, then a fresh run | 0, then 1 row | 2 (one in the killed child) |
//! | `duplicate_storm_writes_one_row` | 100 concurrent callers on one key, half waiting, half not, over 200 trials (fresh key each) | — | every `Ok` is the one winner's id; the others `InFlight` | exactly 1 row per trial | exactly 1 per trial |

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::handle::TransactionStep;
use coord_core::{CoordError, Coordinator, RollbackCause, idempotent, observe};
use coord_postgres::{PostgresProvider, Transaction, TransactionError};

const ROLE: &str = "COORD_TX_TEST_ROLE";

#[derive(Debug)]
enum ChargeError {
    Db(#[allow(dead_code)] tokio_postgres::Error),
    Declined,
    Coord(CoordError),
}

impl From<tokio_postgres::Error> for ChargeError {
    fn from(err: tokio_postgres::Error) -> Self {
        ChargeError::Db(err)
    }
}

impl From<CoordError> for ChargeError {
    fn from(err: CoordError) -> Self {
        ChargeError::Coord(err)
    }
}

/// What a call may do in its body besides the charge.
#[derive(Clone, Copy, PartialEq)]
enum Then {
    Succeed,
    Decline,
    Panic,
    Sleep(Duration),
}

async fn insert_charge(tx: &Transaction<'_>, order: &str, cents: i64) -> Result<i64, ChargeError> {
    let row = tx
        .query_one(
            "INSERT INTO charges (order_id, cents) VALUES ($1, $2) RETURNING id",
            &[&order, &cents],
        )
        .await?;
    Ok(row.get(0))
}

/// The charge: a row in `charges` and the idempotency record, in `tx`.
#[idempotent(
    key_from = "order",
    coordinator = c,
    name = "pay.charge",
    transaction = "tx",
    in_flight_lease = "400ms"
)]
async fn charge(
    c: &Coordinator,
    tx: &mut Transaction<'_>,
    order: &str,
    cents: i64,
    then: Then,
    runs: &AtomicUsize,
) -> Result<i64, ChargeError> {
    runs.fetch_add(1, Ordering::SeqCst);
    let id = insert_charge(tx, order, cents).await?;
    match then {
        Then::Succeed => {}
        Then::Decline => return Err(ChargeError::Declined),
        Then::Panic => panic!("the body panics after its write"),
        Then::Sleep(d) => tokio::time::sleep(d).await,
    }
    Ok(id)
}

/// The same charge, for a duplicate that waits for an in-flight first call.
#[idempotent(
    key_from = "order",
    coordinator = c,
    name = "pay.charge",
    transaction = "tx",
    in_flight_lease = "400ms",
    wait = "10s"
)]
async fn charge_waiting(
    c: &Coordinator,
    tx: &mut Transaction<'_>,
    order: &str,
    cents: i64,
    runs: &AtomicUsize,
) -> Result<i64, ChargeError> {
    runs.fetch_add(1, Ordering::SeqCst);
    insert_charge(tx, order, cents).await
}

/// The charge with a lease no loaded machine outlives (the storm: exactly one run is expected;
/// the dropped transaction: only an abandon frees the key in time).
#[idempotent(
    key_from = "order",
    coordinator = c,
    name = "pay.storm",
    transaction = "tx",
    in_flight_lease = "20s"
)]
async fn storm_charge(
    c: &Coordinator,
    tx: &mut Transaction<'_>,
    order: &str,
    runs: &AtomicUsize,
) -> Result<i64, ChargeError> {
    runs.fetch_add(1, Ordering::SeqCst);
    insert_charge(tx, order, 1).await
}

/// The storm's charge, for a caller that waits for the first.
#[idempotent(
    key_from = "order",
    coordinator = c,
    name = "pay.storm",
    transaction = "tx",
    in_flight_lease = "20s",
    wait = "20s"
)]
async fn storm_charge_waiting(
    c: &Coordinator,
    tx: &mut Transaction<'_>,
    order: &str,
    runs: &AtomicUsize,
) -> Result<i64, ChargeError> {
    runs.fetch_add(1, Ordering::SeqCst);
    insert_charge(tx, order, 1).await
}

/// The process's shared server, migrated, with the `charges` table.
fn server_url() -> String {
    static TABLE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    let server = support::server();
    TABLE.get_or_init(|| {
        server.sql(
            "CREATE TABLE IF NOT EXISTS charges (id bigserial PRIMARY KEY, order_id text NOT NULL, \
             cents bigint NOT NULL)",
        );
    });
    server.url()
}

struct Setup {
    url: String,
    provider: PostgresProvider,
    coord: Coordinator,
}

async fn setup(pool: usize) -> Setup {
    let url = server_url();
    let provider = PostgresProvider::builder(&url)
        .command_timeout(Duration::from_secs(2))
        .pool_size(pool)
        .connect()
        .await
        .expect("connect to the test server");
    let coord = Coordinator::builder()
        .namespace(support::namespace("tx"))
        .provider(provider.clone())
        .build()
        .expect("coordinator");
    Setup {
        url,
        provider,
        coord,
    }
}

async fn client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("the application's connection to the test server");
    tokio::spawn(connection);
    client
}

/// How many rows `charges` holds for `order`, read on a connection of its own.
async fn rows(url: &str, order: &str) -> i64 {
    let c = client(url).await;
    c.query_one(
        "SELECT count(*) FROM charges WHERE order_id = $1",
        &[&order],
    )
    .await
    .unwrap()
    .get(0)
}

fn order(prefix: &str) -> String {
    support::namespace(prefix)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn committed_outcome_is_replayed() {
    let s = setup(4).await;
    let o = order("commit");
    let runs = AtomicUsize::new(0);
    let mut app = client(&s.url).await;

    let mut tx = s.provider.begin(&mut app).await.unwrap();
    let id = charge(&s.coord, &mut tx, &o, 100, Then::Succeed, &runs)
        .await
        .unwrap();
    assert_eq!(tx.records_written(), 1);
    assert_eq!(
        rows(&s.url, &o).await,
        0,
        "nothing visible before the commit"
    );
    tx.commit().await.expect("commit");
    assert_eq!(rows(&s.url, &o).await, 1);

    let mut tx = s.provider.begin(&mut app).await.unwrap();
    let (again, report) = observe(charge(&s.coord, &mut tx, &o, 100, Then::Succeed, &runs)).await;
    assert_eq!(again.unwrap(), id, "the duplicate replays");
    assert!(report.replayed());
    assert_eq!(
        tx.records_written(),
        0,
        "a replay never touches the transaction"
    );
    tx.commit().await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(rows(&s.url, &o).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rollback_leaves_nothing_and_the_next_call_runs() {
    let s = setup(4).await;
    let o = order("rollback");
    let runs = AtomicUsize::new(0);
    let mut app = client(&s.url).await;

    let mut tx = s.provider.begin(&mut app).await.unwrap();
    let first = charge(&s.coord, &mut tx, &o, 5, Then::Succeed, &runs)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(rows(&s.url, &o).await, 0);

    // At once, without waiting: the rollback abandoned the marker.
    let mut tx = s.provider.begin(&mut app).await.unwrap();
    let second = charge(&s.coord, &mut tx, &o, 5, Then::Succeed, &runs)
        .await
        .expect("a fresh run at once after the rollback");
    tx.commit().await.unwrap();
    assert_ne!(first, second, "the body ran again");
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    let mut tx = s.provider.begin(&mut app).await.unwrap();
    let third = charge(&s.coord, &mut tx, &o, 5, Then::Succeed, &runs)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(third, second, "the committed run is replayed");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(rows(&s.url, &o).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_transaction_frees_the_key() {
    let s = setup(4).await;
    let o = order("drop");
    let runs = AtomicUsize::new(0);
    let mut app = client(&s.url).await;

    {
        let mut tx = s.provider.begin(&mut app).await.unwrap();
        storm_charge(&s.coord, &mut tx, &o, &runs).await.unwrap();
        // Dropped: rolled back, the marker abandoned in the background.
    }
    assert_eq!(rows(&s.url, &o).await, 0);
    // The marker's lease is 20 s: only the abandon can free the key within these 5 s. Its
    // first attempts may race the driver's rollback (and fail without waiting), hence a loop.
    let started = Instant::now();
    let id = loop {
        let mut tx = s.provider.begin(&mut app).await.unwrap();
        match storm_charge(&s.coord, &mut tx, &o, &runs).await {
            Ok(id) => {
                tx.commit().await.unwrap();
                break id;
            }
            Err(ChargeError::Coord(CoordError::InFlight { .. })) => {
                drop(tx);
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "the dropped transaction's marker was not abandoned"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(other) => panic!("unexpected: {other:?}"),
        }
    };
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let mut tx = s.provider.begin(&mut app).await.unwrap();
    assert_eq!(
        storm_charge(&s.coord, &mut tx, &o, &runs).await.unwrap(),
        id,
        "the duplicate replays"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(rows(&s.url, &o).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn body_error_leaves_nothing() {
    let s = setup(4).await;
    let o = order("declined");
    let runs = AtomicUsize::new(0);
    let mut app = client(&s.url).await;

    let mut tx = s.provider.begin(&mut app).await.unwrap();
    let err = charge(&s.coord, &mut tx, &o, 5, Then::Decline, &runs)
        .await
        .unwrap_err();
    assert!(matches!(err, ChargeError::Declined), "{err:?}");
    assert_eq!(tx.records_written(), 0);
    tx.rollback().await.unwrap();
    assert_eq!(rows(&s.url, &o).await, 0);

    let mut tx = s.provider.begin(&mut app).await.unwrap();
    let id = charge(&s.coord, &mut tx, &o, 5, Then::Succeed, &runs)
        .await
        .expect("a fresh run at once: the marker was abandoned");
    tx.commit().await.unwrap();
    let mut tx = s.provider.begin(&mut app).await.unwrap();
    assert_eq!(
        charge(&s.coord, &mut tx, &o, 5, Then::Succeed, &runs)
            .await
            .unwrap(),
        id
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(rows(&s.url, &o).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn panic_in_body_leaves_nothing() {
    let s = setup(4).await;
    let o = order("panic");
    let runs = Arc::new(AtomicUsize::new(0));

    let task = {
        let (provider, coord, url, o, runs) = (
            s.provider.clone(),
            s.coord.clone(),
            s.url.clone(),
            o.clone(),
            runs.clone(),
        );
        tokio::spawn(async move {
            let mut app = client(&url).await;
            let mut tx = provider.begin(&mut app).await.unwrap();
            let _ = charge(&coord, &mut tx, &o, 5, Then::Panic, &runs).await;
        })
    };
    let joined = task.await.unwrap_err();
    assert!(joined.is_panic(), "the caller gets the panic");
    assert_eq!(rows(&s.url, &o).await, 0);

    let mut app = client(&s.url).await;
    let mut tx = s.provider.begin(&mut app).await.unwrap();
    let id = charge_waiting(&s.coord, &mut tx, &o, 5, &runs)
        .await
        .expect("a fresh run");
    tx.commit().await.unwrap();
    let mut tx = s.provider.begin(&mut app).await.unwrap();
    assert_eq!(
        charge_waiting(&s.coord, &mut tx, &o, 5, &runs)
            .await
            .unwrap(),
        id
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(rows(&s.url, &o).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn taken_over_during_the_body_cannot_commit() {
    let s = setup(4).await;
    let o = order("takeover");
    let runs = Arc::new(AtomicUsize::new(0));

    // The first caller's body outlives its 400 ms lease.
    let slow = {
        let (provider, coord, url, o, runs) = (
            s.provider.clone(),
            s.coord.clone(),
            s.url.clone(),
            o.clone(),
            runs.clone(),
        );
        tokio::spawn(async move {
            let mut app = client(&url).await;
            let mut tx = provider.begin(&mut app).await.unwrap();
            let called = charge(
                &coord,
                &mut tx,
                &o,
                1,
                Then::Sleep(Duration::from_millis(1200)),
                &runs,
            )
            .await;
            let committed = tx.commit().await;
            (called, committed)
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut app = client(&s.url).await;
    let mut tx = s.provider.begin(&mut app).await.unwrap();
    let other = charge(&s.coord, &mut tx, &o, 2, Then::Succeed, &runs)
        .await
        .expect("the lapsed transactional marker is absent: the second caller runs");
    tx.commit().await.unwrap();

    let (called, committed) = slow.await.unwrap();
    match called {
        Err(ChargeError::Coord(CoordError::TransactionRollbackOnly {
            cause: RollbackCause::Superseded { completed, .. },
            ..
        })) => assert!(completed, "the other caller had committed"),
        other => panic!("expected TransactionRollbackOnly(Superseded), got {other:?}"),
    }
    assert!(
        matches!(committed, Err(TransactionError::RollbackOnly { .. })),
        "{committed:?}"
    );
    assert_eq!(rows(&s.url, &o).await, 1, "only the other caller's charge");

    let mut tx = s.provider.begin(&mut app).await.unwrap();
    assert_eq!(
        charge(&s.coord, &mut tx, &o, 2, Then::Succeed, &runs)
            .await
            .unwrap(),
        other,
        "a duplicate replays the other caller's outcome"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicate_does_not_wait_for_the_locked_row() {
    let s = setup(4).await;
    let o = order("locked");
    let runs = Arc::new(AtomicUsize::new(0));
    let mut first_app = client(&s.url).await;
    let mut tx = s.provider.begin(&mut first_app).await.unwrap();
    let id = charge(&s.coord, &mut tx, &o, 7, Then::Succeed, &runs)
        .await
        .unwrap();
    // The completion is written: `tx` holds the marker's row until it ends.

    let mut app = client(&s.url).await;
    for _ in 0..2 {
        let started = Instant::now();
        let mut dup = s.provider.begin(&mut app).await.unwrap();
        let got = charge(&s.coord, &mut dup, &o, 7, Then::Succeed, &runs).await;
        assert!(
            matches!(got, Err(ChargeError::Coord(CoordError::InFlight { .. }))),
            "{got:?}"
        );
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "the duplicate waited for the row lock ({:?})",
            started.elapsed()
        );
        dup.rollback().await.unwrap();
        // The second round: past the 400 ms lease, still the first caller's.
        tokio::time::sleep(Duration::from_millis(600)).await;
    }

    let waiter = {
        let (provider, coord, url, o, runs) = (
            s.provider.clone(),
            s.coord.clone(),
            s.url.clone(),
            o.clone(),
            runs.clone(),
        );
        tokio::spawn(async move {
            let mut app = client(&url).await;
            let mut tx = provider.begin(&mut app).await.unwrap();
            let got = charge_waiting(&coord, &mut tx, &o, 7, &runs).await;
            tx.commit().await.unwrap();
            got
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    tx.commit().await.unwrap();
    let started = Instant::now();
    assert_eq!(waiter.await.unwrap().unwrap(), id, "the waiter replays");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(rows(&s.url, &o).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn handle_form_end_to_end() {
    let s = setup(4).await;
    let mut config = deadpool_postgres::Config::new();
    config.url = Some(s.url.clone());
    let pool = config
        .create_pool(
            Some(deadpool_postgres::Runtime::Tokio1),
            tokio_postgres::NoTls,
        )
        .unwrap();
    let runs = AtomicUsize::new(0);

    async fn charge_by_hand(
        s: &Setup,
        pool: &deadpool_postgres::Pool,
        o: &str,
        runs: &AtomicUsize,
        commit: bool,
    ) -> Result<(i64, bool), ChargeError> {
        let mut client = pool.get().await.unwrap();
        let mut tx = s.provider.begin(&mut client).await?;
        let key = s.coord.key("pay.by_hand").part(o).finish();
        match s
            .coord
            .idempotent(key)
            .claim_in_transaction::<i64>()
            .await?
        {
            TransactionStep::Replay(id) => {
                assert_eq!(tx.records_written(), 0);
                Ok((id, true))
            }
            TransactionStep::Run(run) => {
                runs.fetch_add(1, Ordering::SeqCst);
                let id = match insert_charge(&tx, o, 3).await {
                    Ok(id) => id,
                    Err(err) => {
                        run.abandon().await;
                        return Err(err);
                    }
                };
                run.complete_in(&mut tx, &id).await?;
                if commit {
                    tx.commit().await.map_err(CoordError::from)?;
                } else {
                    tx.rollback().await?;
                }
                Ok((id, false))
            }
        }
    }

    let o = order("hand");
    let (rolled_back, replayed) = charge_by_hand(&s, &pool, &o, &runs, false).await.unwrap();
    assert!(!replayed);
    assert_eq!(rows(&s.url, &o).await, 0);
    let (id, replayed) = charge_by_hand(&s, &pool, &o, &runs, true).await.unwrap();
    assert!(!replayed, "after the rollback, a fresh run at once");
    assert_ne!(id, rolled_back);
    let (again, replayed) = charge_by_hand(&s, &pool, &o, &runs, true).await.unwrap();
    assert!(replayed);
    assert_eq!(again, id);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(rows(&s.url, &o).await, 1);
}

/// The child's part of `killed_before_commit_leaves_nothing`: charge, say so, and wait to be
/// killed with the transaction open. Does nothing unless run as that child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_role_charge_and_hang() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    assert_eq!(role, "charge-and-hang");
    let url = std::env::var("COORD_TX_TEST_URL").unwrap();
    let ns = std::env::var("COORD_TX_TEST_NS").unwrap();
    let o = std::env::var("COORD_TX_TEST_ORDER").unwrap();
    let provider = PostgresProvider::builder(&url).connect().await.unwrap();
    let coord = Coordinator::builder()
        .namespace(ns)
        .provider(provider.clone())
        .build()
        .unwrap();
    let mut app = client(&url).await;
    let mut tx = provider.begin(&mut app).await.unwrap();
    let runs = AtomicUsize::new(0);
    let id = charge(&coord, &mut tx, &o, 9, Then::Succeed, &runs)
        .await
        .unwrap();
    println!("CHARGED {id}");
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    tokio::time::sleep(Duration::from_secs(120)).await;
    panic!("the child was not killed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_before_commit_leaves_nothing() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    let s = setup(4).await;
    let o = order("killed");
    let ns = s.coord.namespace().to_owned();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_role_charge_and_hang",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, "charge-and-hang")
        .env("COORD_TX_TEST_URL", &s.url)
        .env("COORD_TX_TEST_NS", &ns)
        .env("COORD_TX_TEST_ORDER", &o)
        .stdout(Stdio::piped())
        .spawn()
        .expect("re-run this test binary as the child");
    let stdout = child.stdout.take().unwrap();
    let charged = tokio::task::spawn_blocking(move || {
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            // libtest prints `test <name> ... ` before the test runs, on the same line.
            if let Some((_, id)) = line.split_once("CHARGED ") {
                return Some(id.trim().parse::<i64>().unwrap());
            }
        }
        None
    });
    let child_id = tokio::time::timeout(Duration::from_secs(60), charged)
        .await
        .expect("the child charged within a minute")
        .unwrap()
        .expect("the child printed its charge");
    child.kill().expect("SIGKILL the child"); // std's kill is SIGKILL on Unix
    child.wait().unwrap();
    // The server ends the child's transaction when its connection drops.
    let runs = AtomicUsize::new(0);
    let mut app = client(&s.url).await;
    let started = Instant::now();
    let id = loop {
        assert_eq!(
            rows(&s.url, &o).await,
            0,
            "the killed transaction's charge never commits"
        );
        let mut tx = s.provider.begin(&mut app).await.unwrap();
        match charge(&s.coord, &mut tx, &o, 9, Then::Succeed, &runs).await {
            Ok(id) => {
                tx.commit().await.unwrap();
                break id;
            }
            Err(ChargeError::Coord(CoordError::InFlight { .. })) => {
                // The killed caller's marker, until its 400 ms lease ends.
                assert!(started.elapsed() < Duration::from_secs(10));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(other) => panic!("unexpected: {other:?}"),
        }
    };
    assert_ne!(id, child_id);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the body ran again, once, here"
    );
    let mut tx = s.provider.begin(&mut app).await.unwrap();
    assert_eq!(
        charge(&s.coord, &mut tx, &o, 9, Then::Succeed, &runs)
            .await
            .unwrap(),
        id
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(rows(&s.url, &o).await, 1);
}

/// Trials of the storm, each on a fresh key.
const STORM_TRIALS: usize = 200;
/// Concurrent callers per trial.
const STORM_CALLERS: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicate_storm_writes_one_row() {
    let s = setup(16).await;
    let mut config = deadpool_postgres::Config::new();
    config.url = Some(s.url.clone());
    config.pool = Some(deadpool_postgres::PoolConfig::new(24));
    let pool = config
        .create_pool(
            Some(deadpool_postgres::Runtime::Tokio1),
            tokio_postgres::NoTls,
        )
        .unwrap();
    let started = Instant::now();
    let prefix = order("storm");
    let (mut replays, mut in_flight) = (0usize, 0usize);
    for trial in 0..STORM_TRIALS {
        let o = format!("{prefix}-{trial}");
        let runs = Arc::new(AtomicUsize::new(0));
        let mut callers = Vec::with_capacity(STORM_CALLERS);
        for i in 0..STORM_CALLERS {
            let (provider, coord, pool, o, runs) = (
                s.provider.clone(),
                s.coord.clone(),
                pool.clone(),
                o.clone(),
                runs.clone(),
            );
            callers.push(tokio::spawn(async move {
                let mut client = pool.get().await.unwrap();
                let mut tx = provider.begin(&mut client).await.unwrap();
                let got = if i % 2 == 0 {
                    storm_charge_waiting(&coord, &mut tx, &o, &runs).await
                } else {
                    storm_charge(&coord, &mut tx, &o, &runs).await
                };
                let wrote = tx.records_written() > 0;
                match &got {
                    Ok(_) => tx.commit().await.expect("commit"),
                    Err(_) => tx.rollback().await.unwrap(),
                }
                (got, wrote)
            }));
        }
        let mut winner = None;
        let mut oks = Vec::new();
        for caller in callers {
            let (got, wrote) = caller.await.unwrap();
            match got {
                Ok(id) if wrote => {
                    assert!(
                        winner.replace(id).is_none(),
                        "trial {trial}: two runs committed"
                    );
                }
                Ok(id) => oks.push(id),
                Err(ChargeError::Coord(CoordError::InFlight { .. })) => in_flight += 1,
                Err(other) => panic!("trial {trial}: unexpected {other:?}"),
            }
        }
        let winner = winner.unwrap_or_else(|| panic!("trial {trial}: nobody ran the body"));
        assert!(
            oks.iter().all(|id| *id == winner),
            "trial {trial}: a duplicate got another outcome than the winner's"
        );
        replays += oks.len();
        assert_eq!(runs.load(Ordering::SeqCst), 1, "trial {trial}: body runs");
        assert_eq!(rows(&s.url, &o).await, 1, "trial {trial}: rows in charges");
    }
    eprintln!(
        "duplicate storm: {STORM_TRIALS} trials x {STORM_CALLERS} callers in {:?}: \
         exactly one row each; {replays} replays, {in_flight} in flight",
        started.elapsed()
    );
}

/// The charge of the failed-commit cases: it reads the charges of `order` and `other` before
/// writing its own, so that two serializable transactions doing the same conflict.
#[idempotent(
    key_from = "order",
    coordinator = c,
    name = "pay.read_then_charge",
    transaction = "tx",
    in_flight_lease = "20s"
)]
async fn read_then_charge(
    c: &Coordinator,
    tx: &mut Transaction<'_>,
    order: &str,
    other: &str,
    runs: &AtomicUsize,
) -> Result<i64, ChargeError> {
    runs.fetch_add(1, Ordering::SeqCst);
    tx.query_one(
        "SELECT count(*) FROM charges WHERE order_id IN ($1, $2)",
        &[&order, &other],
    )
    .await?;
    insert_charge(tx, order, 5).await
}

/// The state of `order`'s record in `namespace`, read on a connection of its own.
async fn record_state(url: &str, namespace: &str, order: &str) -> Option<String> {
    let c = client(url).await;
    c.query_opt(
        "SELECT state FROM coord.records WHERE key = $1 AND expires_at > clock_timestamp()",
        &[&format!("{namespace}:pay.read_then_charge:{order}")],
    )
    .await
    .unwrap()
    .map(|row| row.get(0))
}

/// A real serialization failure at `COMMIT` (two `SERIALIZABLE` transactions that each read what
/// the other writes; the other commits first): the caller gets the database's error, neither the
/// charge nor the record is there, and a duplicate runs the body afresh at once (the wrapper
/// abandons the marker whose completion did not commit), well before the 20 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serialization_failure_at_commit_leaves_neither() {
    let s = setup(4).await;
    let o = order("serial");
    let other = order("serial-other");
    let runs = AtomicUsize::new(0);
    let mut app = client(&s.url).await;
    let raw = app
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::Serializable)
        .start()
        .await
        .unwrap();
    let mut tx = Transaction::new(&s.provider, raw);
    // The call is the transaction's first statement: its snapshot is taken after the claim.
    let id = read_then_charge(&s.coord, &mut tx, &o, &other, &runs)
        .await
        .unwrap();

    let mut rival = client(&s.url).await;
    let b = rival
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::Serializable)
        .start()
        .await
        .unwrap();
    b.query_one(
        "SELECT count(*) FROM charges WHERE order_id IN ($1, $2)",
        &[&o, &other],
    )
    .await
    .unwrap();
    b.execute(
        "INSERT INTO charges (order_id, cents) VALUES ($1, 1)",
        &[&other],
    )
    .await
    .unwrap();
    b.commit().await.unwrap();

    match tx.commit().await {
        Err(TransactionError::Database(e)) => assert_eq!(
            e.code(),
            Some(&tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE),
            "{e}"
        ),
        other => panic!("the commit must fail with a serialization failure: {other:?}"),
    }
    assert_eq!(rows(&s.url, &o).await, 0, "the charge did not commit");
    assert_ne!(
        record_state(&s.url, s.coord.namespace(), &o)
            .await
            .as_deref(),
        Some("completed"),
        "the record did not commit"
    );

    let started = Instant::now();
    let again = loop {
        let mut tx = s.provider.begin(&mut app).await.unwrap();
        match read_then_charge(&s.coord, &mut tx, &o, &other, &runs).await {
            Ok(again) => {
                tx.commit().await.unwrap();
                break again;
            }
            // The wrapper's abandon runs in the background: at once, not after the lease.
            Err(ChargeError::Coord(CoordError::InFlight { .. })) => {
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "the failed commit's marker still blocks the key"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(other) => panic!("unexpected: {other:?}"),
        }
    };
    assert_ne!(again, id, "a fresh run, not the failed one's outcome");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the body ran again, once");
    assert_eq!(rows(&s.url, &o).await, 1);
    assert_eq!(
        record_state(&s.url, s.coord.namespace(), &o)
            .await
            .as_deref(),
        Some("completed")
    );
}

/// The session terminated during `COMMIT`, after the commit was made durable: the server waits
/// for a synchronous standby that does not exist (`synchronous_standby_names`, with
/// `synchronous_commit = on` for this transaction only), and is told to end the session while it
/// waits. The caller gets the connection's error, although the transaction committed locally; the
/// database holds the charge and the record together, and a duplicate gets the replay (the
/// wrapper's owner-checked abandon leaves a completed record alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn session_terminated_during_commit_is_an_error_and_the_duplicate_replays() {
    // A server of its own: every other session commits locally, without waiting.
    let server = coord_postgres_testing::PostgresServer::start_configured(
        coord_postgres_testing::ServerOptions::new()
            .setting("synchronous_standby_names", "nobody")
            .setting("synchronous_commit", "local"),
    );
    let url = server.url();
    PostgresProvider::migrate(&url).await.unwrap();
    server.sql(
        "CREATE TABLE charges (id bigserial PRIMARY KEY, order_id text NOT NULL, cents bigint NOT NULL)",
    );
    let provider = PostgresProvider::builder(&url)
        .command_timeout(Duration::from_secs(5))
        .pool_size(2)
        .connect()
        .await
        .unwrap();
    let coord = Coordinator::builder()
        .namespace("sync")
        .provider(provider.clone())
        .build()
        .unwrap();
    let o = "order-committing";
    let runs = AtomicUsize::new(0);

    let mut app = client(&format!("{url}?application_name=committing-app")).await;
    let mut tx = provider.begin(&mut app).await.unwrap();
    tx.batch_execute("SET LOCAL synchronous_commit = on")
        .await
        .unwrap();
    let id = read_then_charge(&coord, &mut tx, o, "none", &runs)
        .await
        .unwrap();
    // Wait until the commit is durable and waiting for the standby, then end the session.
    let end_the_session = async {
        let waiting = Instant::now();
        loop {
            let at = server.sql(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = 'committing-app' AND wait_event = 'SyncRep'",
            );
            if at.trim() == "1" {
                break;
            }
            assert!(
                waiting.elapsed() < Duration::from_secs(20),
                "the commit never waited for the standby"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(server.terminate_connections("committing-app"), 1);
    };
    let (answer, ()) = tokio::join!(tx.commit(), end_the_session);
    match answer {
        Err(TransactionError::Database(_)) => {}
        other => panic!("the caller must get the database's error: {other:?}"),
    }
    drop(app);

    // Committed all the same: the charge and the record, together.
    let c = client(&url).await;
    let charged: i64 = c
        .query_one("SELECT count(*) FROM charges WHERE order_id = $1", &[&o])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        charged, 1,
        "the commit was durable before the session ended"
    );
    assert_eq!(
        record_state(&url, "sync", o).await.as_deref(),
        Some("completed")
    );

    let mut app = client(&url).await;
    let mut tx = provider.begin(&mut app).await.unwrap();
    let replayed = read_then_charge(&coord, &mut tx, o, "none", &runs)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(replayed, id, "the duplicate gets the committed outcome");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
}
