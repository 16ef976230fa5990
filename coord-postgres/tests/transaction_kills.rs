//! Idempotency in the caller's transaction under `kill -9`, judged on the database.
//!
//! Each trial is a process of its own (this binary again, as a child) that charges one order
//! through `#[idempotent(transaction = "tx")]`: claim, the body's `INSERT` into `charges`, the
//! completion written in the same transaction, `COMMIT`. The parent kills it with SIGKILL at a
//! point drawn from a seeded generator: a random instant of its whole run, or just after one of
//! the stages it announces (started, in the body, body done and completion being written,
//! `COMMIT` sent, committed), so that every point from before the claim through `COMMIT` and
//! after it is hit in every run. Then, on the database:
//!
//! * **record ⇔ effect**: a completed record of the order exists exactly when its charge row
//!   does (both commit together or not at all); never two charge rows;
//! * **retry**: the order is charged again, as a client retrying would; an order whose charge
//!   committed is replayed (the same charge id, the body not run); one whose charge never
//!   committed runs its body exactly once, and the order ends with one charge row;
//! * **replay**: a second retry answers the same id again.
//!
//! A control runs the same trials without the transactional form (the charge committed by the
//! body, the record completed after it, as a non-transactional `#[idempotent]` does) and must
//! find at least one order charged twice: it shows the judge can see the loss the transactional
//! form prevents. A run fails when the control finds nothing, or when no kill landed at one of
//! the stages.
//!
//! `COORD_TX_KILLS` sets the number of processes (30 by default: the short form the test
//! command runs; 200 or more for the long form); `COORD_TX_KILLS_SEED=0x…` replays a run. Each run
//! prints `seed 0x…`, the kills per stage and `N processes killed`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use coord_core::{CoordError, Coordinator, idempotent};
use coord_postgres::{PostgresProvider, Transaction};
use coord_postgres_testing::PostgresServer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ROLE: &str = "COORD_TX_KILLS_ROLE";
const NAMESPACE: &str = "kills";
/// Processes run at once: enough to keep the run short on two cores, few enough that a
/// child's stages are not stretched by the others.
const AT_ONCE: usize = 4;

#[derive(Debug)]
enum ChargeError {
    Db(#[allow(dead_code)] tokio_postgres::Error),
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

/// Announces a stage on stdout, where the parent reads it.
fn stage(name: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "STAGE {name}").expect("stdout");
    out.flush().expect("stdout");
}

/// The charge under test: its row and the record commit together.
#[idempotent(
    key_from = "order",
    coordinator = c,
    name = "kills.charge",
    transaction = "tx",
    in_flight_lease = "500ms"
)]
async fn charge(
    c: &Coordinator,
    tx: &mut Transaction<'_>,
    order: &str,
    announce: bool,
    runs: &AtomicUsize,
) -> Result<i64, ChargeError> {
    runs.fetch_add(1, Ordering::SeqCst);
    if announce {
        stage("body");
    }
    let row = tx
        .query_one(
            "INSERT INTO charges (order_id) VALUES ($1) RETURNING id",
            &[&order],
        )
        .await?;
    if announce {
        stage("completing");
    }
    Ok(row.get(0))
}

/// The control: the body commits its charge on its own connection, and the record is
/// completed after it, outside that transaction.
#[idempotent(
    key_from = "order",
    coordinator = c,
    name = "kills.control",
    in_flight_lease = "500ms"
)]
async fn charge_outside(
    c: &Coordinator,
    app: &tokio_postgres::Client,
    order: &str,
    announce: bool,
    runs: &AtomicUsize,
) -> Result<i64, ChargeError> {
    runs.fetch_add(1, Ordering::SeqCst);
    let row = app
        .query_one(
            "INSERT INTO charges (order_id) VALUES ($1) RETURNING id",
            &[&order],
        )
        .await?;
    if announce {
        // The charge is committed; the record is not written yet.
        stage("charged");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Ok(row.get(0))
}

async fn client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("the application's connection to the test server");
    tokio::spawn(connection);
    client
}

async fn coordinator(url: &str) -> (Coordinator, PostgresProvider) {
    let provider = PostgresProvider::builder(url)
        .command_timeout(Duration::from_secs(5))
        .pool_size(2)
        .connect()
        .await
        .expect("connect to the test server");
    let coord = Coordinator::builder()
        .namespace(NAMESPACE)
        .provider(provider.clone())
        .build()
        .expect("coordinator");
    (coord, provider)
}

/// The child: one charge, each stage announced, then it waits to be killed (a child that
/// is never killed ends on its own after a minute, which the parent reports).
async fn child(url: String, order: String, control: bool) {
    stage("started");
    let (coord, provider) = coordinator(&url).await;
    // Named, so that the parent can wait for this session to end before judging.
    let mut app = client(&format!("{url}?application_name={order}")).await;
    let runs = AtomicUsize::new(0);
    if control {
        charge_outside(&coord, &app, &order, true, &runs)
            .await
            .expect("the control's charge");
    } else {
        let mut tx = provider.begin(&mut app).await.expect("begin");
        charge(&coord, &mut tx, &order, true, &runs)
            .await
            .expect("the charge");
        stage("committing");
        tx.commit().await.expect("commit");
    }
    stage("committed");
    tokio::time::sleep(Duration::from_secs(60)).await;
}

/// Where a kill is aimed.
#[derive(Debug, Clone, Copy)]
enum Aim {
    /// A random instant of the child's whole run, from its start.
    Anytime(Duration),
    /// Just after the child announced this stage, within the given delay.
    After(&'static str, Duration),
}

/// The stages a transactional child announces, in order.
const STAGES: [&str; 5] = ["started", "body", "completing", "committing", "committed"];

/// Where the `trial`-th kill of a series is aimed. The first trials of a transactional
/// series take one stage each, the kill sent as soon as the stage is announced, so every
/// stage is hit in every run whatever the random draws (a stage as short as `completing` was
/// missed by 30 random draws now and then); the rest are drawn from `rng`.
fn aim(rng: &mut StdRng, control: bool, trial: usize) -> Aim {
    if control {
        return Aim::After("charged", Duration::from_millis(rng.random_range(0..100)));
    }
    if let Some(stage) = STAGES.get(trial) {
        return Aim::After(stage, Duration::ZERO);
    }
    if rng.random_bool(0.3) {
        return Aim::Anytime(Duration::from_millis(rng.random_range(0..400)));
    }
    let stage = STAGES[rng.random_range(0..STAGES.len())];
    // Up to 2 ms after a stage: before, during or just after the next step's round trip. After
    // `COMMIT` is sent, within 200 µs, so that the kill usually lands before its reply does.
    let most = if stage == "committing" { 200 } else { 2_000 };
    Aim::After(stage, Duration::from_micros(rng.random_range(0..most)))
}

/// One trial's child, started and killed where `aim` says. Returns the last stage the child
/// announced before it died.
fn run_trial(url: &str, order: &str, control: bool, aim: Aim) -> String {
    let mut child: Child = Command::new(std::env::current_exe().expect("this binary"))
        .env(ROLE, if control { "control" } else { "charge" })
        .env("COORD_TX_KILLS_URL", url)
        .env("COORD_TX_KILLS_ORDER", order)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the child");
    let started = Instant::now();
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(name) = line.strip_prefix("STAGE ")
                && tx.send(name.to_owned()).is_err()
            {
                break;
            }
        }
    });
    let mut last = String::from("none");
    let give_up = started + Duration::from_secs(60);
    match aim {
        Aim::Anytime(at) => {
            while let Some(left) = (started + at).checked_duration_since(Instant::now()) {
                match rx.recv_timeout(left) {
                    Ok(name) => last = name,
                    Err(mpsc::RecvTimeoutError::Timeout) => break,
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        panic!("the child ended on its own before its kill: {order}")
                    }
                }
            }
        }
        Aim::After(target, delay) => {
            loop {
                let left = give_up
                    .checked_duration_since(Instant::now())
                    .unwrap_or_else(|| panic!("the child never reached `{target}`: {order}"));
                match rx.recv_timeout(left) {
                    Ok(name) => {
                        let reached = name == target;
                        last = name;
                        if reached {
                            break;
                        }
                    }
                    Err(e) => panic!("the child never reached `{target}` ({e:?}): {order}"),
                }
            }
            spin_for(delay);
        }
    }
    child.kill().expect("SIGKILL the child"); // std's kill is SIGKILL on Unix
    child.wait().expect("reap the child");
    // What the child announced before the signal landed still counts.
    reader.join().expect("the reader thread");
    while let Ok(name) = rx.try_recv() {
        last = name;
    }
    last
}

/// Waits `delay` without yielding the thread to a sleep's coarse timer.
fn spin_for(delay: Duration) {
    let until = Instant::now() + delay;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// Waits until the killed child's application session has ended on the server. A `COMMIT`
/// the child sent just before its kill is still carried out by its server process, which
/// notices the dead socket only afterwards: judging before then could see neither the charge
/// nor the record, and then both.
async fn session_gone(app: &tokio_postgres::Client, order: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left: i64 = app
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                &[&order],
            )
            .await
            .expect("read pg_stat_activity")
            .get(0);
        if left == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{order}: the killed child's session still lives 20 s later"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the database holds for `order`: its charge ids, and its record's state if one lives.
async fn judge(
    app: &tokio_postgres::Client,
    name: &str,
    order: &str,
) -> (Vec<i64>, Option<String>) {
    let charges = app
        .query(
            "SELECT id FROM charges WHERE order_id = $1 ORDER BY id",
            &[&order],
        )
        .await
        .expect("read the charges")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let key = format!("{NAMESPACE}:{name}:{order}");
    let record = app
        .query_opt(
            "SELECT state FROM coord.records WHERE key = $1 AND expires_at > clock_timestamp()",
            &[&key],
        )
        .await
        .expect("read the record")
        .map(|row| row.get(0));
    (charges, record)
}

/// Charges `order` again as a retrying client would: an in-flight marker of the killed child
/// is waited out (its lease is 500 ms), anything else is the answer.
async fn retry(
    coord: &Coordinator,
    provider: &PostgresProvider,
    app: &mut tokio_postgres::Client,
    order: &str,
    control: bool,
    runs: &AtomicUsize,
) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = if control {
            charge_outside(coord, app, order, false, runs).await
        } else {
            let mut tx = provider.begin(app).await.expect("begin");
            match charge(coord, &mut tx, order, false, runs).await {
                Ok(id) => {
                    tx.commit().await.expect("the retry's commit");
                    Ok(id)
                }
                Err(e) => Err(e),
            }
        };
        match answer {
            Ok(id) => return id,
            Err(ChargeError::Coord(CoordError::InFlight { .. })) => {
                assert!(
                    Instant::now() < deadline,
                    "{order}: still in flight 20 s after its caller was killed"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(other) => panic!("{order}: the retry failed: {other:?}"),
        }
    }
}

/// What one series of trials found.
#[derive(Default)]
struct Tally {
    killed: usize,
    at_stage: BTreeMap<String, usize>,
    committed_before_kill: usize,
    /// Of the kills after `COMMIT` was sent and before its reply was seen: how many had
    /// committed, and how many had not (both happen: the kill races the commit).
    during_commit: (usize, usize),
    violations: Vec<String>,
}

async fn series(url: &str, rng: &mut StdRng, count: usize, control: bool) -> Tally {
    let (coord, provider) = coordinator(url).await;
    let mut app = client(url).await;
    let name = if control {
        "kills.control"
    } else {
        "kills.charge"
    };
    let mut tally = Tally::default();
    let mut next = 0;
    while next < count {
        let batch: Vec<(String, Aim)> = (next..count.min(next + AT_ONCE))
            .map(|i| {
                let kind = if control { "control" } else { "order" };
                (format!("{kind}-{i}"), aim(rng, control, i))
            })
            .collect();
        next += batch.len();
        let url_owned = url.to_owned();
        let lasts = tokio::task::spawn_blocking(move || {
            std::thread::scope(|s| {
                let handles: Vec<_> = batch
                    .iter()
                    .map(|(order, aim)| {
                        let url = &url_owned;
                        s.spawn(move || (order.clone(), run_trial(url, order, control, *aim)))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("a trial thread"))
                    .collect::<Vec<_>>()
            })
        })
        .await
        .expect("the trials");
        for (order, last) in lasts {
            tally.killed += 1;
            session_gone(&app, &order).await;
            *tally.at_stage.entry(last.clone()).or_default() += 1;
            let (charges, record) = judge(&app, name, &order).await;
            let completed = record.as_deref() == Some("completed");
            if charges.len() > 1 {
                tally.violations.push(format!(
                    "{order}: {} charge rows after the kill",
                    charges.len()
                ));
            }
            if !control && completed != (charges.len() == 1) {
                tally.violations.push(format!(
                    "{order}: record {record:?} beside {} charge rows (killed after `{last}`)",
                    charges.len()
                ));
            }
            if charges.len() == 1 {
                tally.committed_before_kill += 1;
            }
            if last == "committing" {
                if charges.len() == 1 {
                    tally.during_commit.0 += 1;
                } else {
                    tally.during_commit.1 += 1;
                }
            }
            let runs = AtomicUsize::new(0);
            let first = retry(&coord, &provider, &mut app, &order, control, &runs).await;
            let again = retry(&coord, &provider, &mut app, &order, control, &runs).await;
            let (after, _) = judge(&app, name, &order).await;
            let ran = runs.load(Ordering::SeqCst);
            let expected_runs = usize::from(charges.is_empty());
            if first != again {
                tally.violations.push(format!(
                    "{order}: the replay answered {again}, the retry {first}"
                ));
            }
            if let [committed] = charges[..]
                && first != committed
            {
                tally.violations.push(format!(
                    "{order}: the retry answered {first}, the committed charge is {committed}"
                ));
            }
            if ran != expected_runs || after.len() != 1 {
                tally.violations.push(format!(
                    "{order}: killed after `{last}` with {} charge rows; the retries ran the body \
                     {ran} times (expected {expected_runs}) and left {} rows",
                    charges.len(),
                    after.len()
                ));
            }
        }
    }
    tally
}

fn print_tally(what: &str, tally: &Tally) {
    println!("{what}: {} processes killed", tally.killed);
    for (stage, n) in &tally.at_stage {
        println!("{what}:   last stage `{stage}`: {n}");
    }
    println!(
        "{what}: {} had committed their charge before the kill, {} had not",
        tally.committed_before_kill,
        tally.killed - tally.committed_before_kill
    );
    if tally.at_stage.contains_key("committing") {
        println!(
            "{what}: killed during COMMIT: {} had committed, {} had not",
            tally.during_commit.0, tally.during_commit.1
        );
    }
    println!("{what}: {} violations", tally.violations.len());
    for v in &tally.violations {
        println!("{what}:   {v}");
    }
}

fn parse_seed(text: &str) -> u64 {
    let digits = text.trim().trim_start_matches("0x");
    u64::from_str_radix(digits, 16).unwrap_or_else(|e| panic!("COORD_TX_KILLS_SEED {text:?}: {e}"))
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    if let Ok(role) = std::env::var(ROLE) {
        let url = std::env::var("COORD_TX_KILLS_URL").expect("the child's URL");
        let order = std::env::var("COORD_TX_KILLS_ORDER").expect("the child's order");
        runtime.block_on(child(url, order, role == "control"));
        eprintln!("the child was not killed");
        std::process::exit(3);
    }
    // libtest's arguments (a filter, --list) are accepted and ignored: this binary is one test.
    if std::env::args().any(|a| a == "--list") {
        println!("transaction_kills: test");
        return;
    }
    let count: usize = std::env::var("COORD_TX_KILLS")
        .ok()
        .map(|v| v.parse().expect("COORD_TX_KILLS is a number"))
        .unwrap_or(30);
    let seed = std::env::var("COORD_TX_KILLS_SEED")
        .map(|s| parse_seed(&s))
        .unwrap_or_else(|_| rand::rng().random());
    println!(
        "transaction_kills: seed 0x{seed:016x} ({count} processes; COORD_TX_KILLS_SEED replays it)"
    );
    let mut rng = StdRng::seed_from_u64(seed);

    let server = PostgresServer::start();
    let url = server.url();
    let failures = runtime.block_on(async {
        PostgresProvider::migrate(&url).await.expect("migrate");
        client(&url)
            .await
            .batch_execute(
                "CREATE TABLE charges (id bigserial PRIMARY KEY, order_id text NOT NULL)",
            )
            .await
            .expect("the business table");
        let mut failures = Vec::new();

        let started = Instant::now();
        let tally = series(&url, &mut rng, count, false).await;
        print_tally("transactional", &tally);
        println!("transactional: {:.1} s", started.elapsed().as_secs_f64());
        failures.extend(tally.violations.iter().cloned());
        for stage in STAGES {
            if !tally.at_stage.contains_key(stage) && count >= 30 {
                failures.push(format!("no kill landed after stage `{stage}`: the run tested less than it says"));
            }
        }
        if tally.committed_before_kill == 0 || tally.committed_before_kill == tally.killed {
            failures.push(format!(
                "{} of {} killed processes had committed: a run must kill some before and some after COMMIT",
                tally.committed_before_kill, tally.killed
            ));
        }

        let control_count = (count / 6).max(3);
        let control = series(&url, &mut rng, control_count, true).await;
        print_tally("control (completion outside the transaction)", &control);
        if control.violations.is_empty() {
            failures.push(
                "the control, whose record is completed outside the charge's transaction, found \
                 no order charged twice: the judge cannot see the loss it must catch"
                    .to_owned(),
            );
        }
        failures
    });
    if failures.is_empty() {
        println!("transaction_kills: 1 passed, 0 failed");
    } else {
        for f in &failures {
            println!("transaction_kills: FAILED: {f}");
        }
        println!("transaction_kills: 0 passed, 1 failed");
        std::process::exit(1);
    }
}
