//! Coordination across real processes against one real PostgreSQL server: 8 processes of 16
//! tasks each contend for two hot locks, with a witness table that counts overlapping holders
//! and refuses writes whose fencing token is not newer than the last one it accepted; the
//! same processes call one idempotent operation on shared keys; they share a 3-permit
//! semaphore, with a witness of the most holders at once and of every permit's token; and they
//! read and write one read-write lock, with a witness that counts a writer beside anyone and
//! refuses a token not newer than what it must follow.
//!
//! This test binary has its own `main` (`harness = false`): run without `COORD_TEST_ROLE` it
//! starts a server and runs the scenarios, each of which re-runs this same binary as child
//! processes with `COORD_TEST_ROLE` set to the part they play. It ends with the line
//! `processes: N passed, M failed` and a non-zero exit status when anything failed.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use coord_core::{CoordError, Coordinator, distributed_lock, fencing_token, idempotent};
use coord_postgres::PostgresProvider;
use coord_postgres_testing::PostgresServer;

const ROLE: &str = "COORD_TEST_ROLE";
const PROCESSES: usize = 8;
const TASKS: usize = 16;
/// Lock sections per task (alternating between the two hot keys).
const ROUNDS: usize = 4;
/// Keys of the idempotent operation every process calls.
const ORDERS: usize = 24;

// ---------------------------------------------------------------- child processes

/// One section under the lock of `slot`: enter (counting an overlap if someone else is
/// inside), offer the fencing token to the witness (counting a refusal if it is not newer than
/// the newest it accepted), leave.
#[distributed_lock(key_from = "slot", coordinator = c, name = "proc.contend", lease = "10s", wait = "60s", fenced = true)]
async fn contend_once(
    c: &Coordinator,
    slot: i32,
    witness: &tokio_postgres::Client,
) -> Result<(), CoordError> {
    let token = fencing_token().expect("a fenced lock has a token").get() as i64;
    witness
        .execute(
            "UPDATE witness SET holders = holders + 1, entries = entries + 1, \
             overlapped = overlapped + (holders > 0)::int, \
             refused = refused + (last_token >= $2)::int, \
             last_token = greatest(last_token, $2) WHERE slot = $1",
            &[&slot, &token],
        )
        .await
        .expect("witness enter");
    tokio::time::sleep(Duration::from_millis(1)).await;
    witness
        .execute(
            "UPDATE witness SET holders = holders - 1 WHERE slot = $1",
            &[&slot],
        )
        .await
        .expect("witness leave");
    Ok(())
}

/// Permits of the shared semaphore per task.
const PERMIT_ROUNDS: usize = 3;

/// One section under a permit of the 3-permit semaphore: enter (raising the witness's high-water
/// mark of holders), record the permit's token, leave.
#[distributed_lock(key_from = "slot", coordinator = c, name = "proc.permits", permits = 3, lease = "10s", wait = "120s")]
async fn permit_once(
    c: &Coordinator,
    slot: i32,
    witness: &tokio_postgres::Client,
) -> Result<(), CoordError> {
    let token = fencing_token().expect("a permit has a token").get() as i64;
    witness
        .execute(
            "UPDATE permit_witness SET holders = holders + 1, entries = entries + 1, \
             most = greatest(most, holders + 1) WHERE slot = $1",
            &[&slot],
        )
        .await
        .expect("witness enter");
    witness
        .execute("INSERT INTO permit_tokens (token) VALUES ($1)", &[&token])
        .await
        .expect("witness token");
    tokio::time::sleep(Duration::from_millis(2)).await;
    witness
        .execute(
            "UPDATE permit_witness SET holders = holders - 1 WHERE slot = $1",
            &[&slot],
        )
        .await
        .expect("witness leave");
    Ok(())
}

/// Read-write sections per task (one in three a write).
const RW_ROUNDS: usize = 3;

/// One read or write section of the shared read-write lock: enter (counting an overlap when a
/// writer finds anyone inside or a reader finds a writer; counting a refusal when a writer's
/// token is not newer than every token accepted before, or a reader's not newer than the last
/// writer's), leave.
async fn rw_once(
    c: &Coordinator,
    write: bool,
    witness: &tokio_postgres::Client,
) -> Result<(), CoordError> {
    let key = c.key("proc.rw").part(&0u32).finish();
    let rw = c
        .rw_lock(key)
        .lease(Duration::from_secs(10))
        .wait(Duration::from_secs(120));
    let guard = if write {
        rw.write().await?
    } else {
        rw.read().await?
    };
    let token = guard.fencing_token().expect("every hold has a token").get() as i64;
    let enter = if write {
        "UPDATE rw_witness SET writers = writers + 1, entries = entries + 1, \
         overlapped = overlapped + (readers + writers > 0)::int, \
         refused = refused + (last_token >= $1)::int, \
         last_token = greatest(last_token, $1), last_write = greatest(last_write, $1)"
    } else {
        "UPDATE rw_witness SET readers = readers + 1, entries = entries + 1, \
         most_readers = greatest(most_readers, readers + 1), \
         overlapped = overlapped + (writers > 0)::int, \
         refused = refused + (last_write >= $1)::int, \
         last_token = greatest(last_token, $1)"
    };
    witness
        .execute(enter, &[&token])
        .await
        .expect("witness enter");
    tokio::time::sleep(Duration::from_millis(2)).await;
    let leave = if write {
        "UPDATE rw_witness SET writers = writers - 1"
    } else {
        "UPDATE rw_witness SET readers = readers - 1"
    };
    witness.execute(leave, &[]).await.expect("witness leave");
    assert!(guard.release().await?, "the hold was still ours");
    Ok(())
}

#[idempotent(key_from = "order", coordinator = c, name = "proc.charge", wait = "30s")]
async fn charge(
    c: &Coordinator,
    order: &str,
    witness: &tokio_postgres::Client,
) -> Result<String, CoordError> {
    witness
        .execute(
            "INSERT INTO runs (order_id, pid) VALUES ($1, $2)",
            &[&order, &(std::process::id() as i32)],
        )
        .await
        .expect("witness run");
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(format!("receipt-by-pid-{}", std::process::id()))
}

async fn child(role: &str) {
    let url = std::env::var("COORD_TEST_URL").expect("COORD_TEST_URL");
    let ns = std::env::var("COORD_TEST_NS").expect("COORD_TEST_NS");
    let provider = PostgresProvider::builder(&url)
        .pool_size(6)
        .command_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect");
    let c = Coordinator::builder()
        .namespace(ns)
        .provider(provider)
        .build()
        .expect("coordinator");
    let (witness, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("witness connection");
    tokio::spawn(connection);
    let witness = std::sync::Arc::new(witness);
    match role {
        "contend" => {
            let tasks: Vec<_> = (0..TASKS)
                .map(|task| {
                    let (c, witness) = (c.clone(), witness.clone());
                    tokio::spawn(async move {
                        for round in 0..ROUNDS {
                            let slot = ((task + round) % 2) as i32;
                            contend_once(&c, slot, &witness)
                                .await
                                .expect("the lock within its wait");
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.expect("task");
            }
            println!("DONE");
        }
        "permits" => {
            let tasks: Vec<_> = (0..TASKS)
                .map(|_| {
                    let (c, witness) = (c.clone(), witness.clone());
                    tokio::spawn(async move {
                        for _ in 0..PERMIT_ROUNDS {
                            permit_once(&c, 0, &witness)
                                .await
                                .expect("a permit within its wait");
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.expect("task");
            }
            println!("DONE");
        }
        "rw" => {
            let tasks: Vec<_> = (0..TASKS)
                .map(|task| {
                    let (c, witness) = (c.clone(), witness.clone());
                    tokio::spawn(async move {
                        for round in 0..RW_ROUNDS {
                            rw_once(&c, (task + round) % 3 == 0, &witness)
                                .await
                                .expect("a hold within its wait");
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.expect("task");
            }
            println!("DONE");
        }
        "charge" => {
            let tasks: Vec<_> = (0..TASKS)
                .map(|task| {
                    let (c, witness) = (c.clone(), witness.clone());
                    tokio::spawn(async move {
                        let mut lines = Vec::new();
                        for order in (task..ORDERS).step_by(TASKS.min(ORDERS)) {
                            let order = format!("order-{order}");
                            let receipt = charge(&c, &order, &witness).await.expect("charged");
                            lines.push(format!("RECEIPT {order} {receipt}"));
                        }
                        // Every task also charges order-0, the hottest key.
                        let receipt = charge(&c, "order-0", &witness).await.expect("charged");
                        lines.push(format!("RECEIPT order-0 {receipt}"));
                        lines
                    })
                })
                .collect();
            for task in tasks {
                for line in task.await.expect("task") {
                    println!("{line}");
                }
            }
        }
        other => panic!("unknown role {other}"),
    }
}

// ---------------------------------------------------------------- the parent

fn spawn(role: &str, url: &str, ns: &str) -> Child {
    Command::new(std::env::current_exe().expect("own path"))
        .env(ROLE, role)
        .env("COORD_TEST_URL", url)
        .env("COORD_TEST_NS", ns)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn a child process")
}

/// Waits for every child and returns their stdout lines; fails if one failed or took longer
/// than `limit`.
fn collect(children: Vec<Child>, limit: Duration) -> Result<Vec<String>, String> {
    let deadline = Instant::now() + limit;
    let mut lines = Vec::new();
    for mut child in children {
        let stdout = child.stdout.take().expect("piped");
        let reader = std::thread::spawn(move || {
            BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .collect::<Vec<_>>()
        });
        loop {
            match child.try_wait().expect("wait") {
                Some(status) if status.success() => break,
                Some(status) => return Err(format!("a child process failed: {status}")),
                None if Instant::now() > deadline => {
                    let _ = child.kill();
                    return Err(format!("a child process did not finish within {limit:?}"));
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        lines.extend(reader.join().expect("reader"));
    }
    Ok(lines)
}

fn contend(server: &PostgresServer) -> Result<(), String> {
    let url = server.url();
    let children: Vec<Child> = (0..PROCESSES)
        .map(|_| spawn("contend", &url, "procs"))
        .collect();
    let started = Instant::now();
    let lines = collect(children, Duration::from_secs(120))?;
    let done = lines.iter().filter(|l| *l == "DONE").count();
    if done != PROCESSES {
        return Err(format!("{done} of {PROCESSES} processes finished"));
    }
    let row =
        server.sql("SELECT sum(entries), sum(overlapped), sum(refused), sum(holders) FROM witness");
    let numbers: Vec<i64> = row.split('|').map(|n| n.parse().unwrap_or(-1)).collect();
    let expected = (PROCESSES * TASKS * ROUNDS) as i64;
    println!(
        "contend: {} sections by {PROCESSES} processes x {TASKS} tasks on 2 keys in {:.1?}: {} overlaps, {} stale tokens",
        numbers[0],
        started.elapsed(),
        numbers[1],
        numbers[2]
    );
    if numbers != [expected, 0, 0, 0] {
        return Err(format!(
            "expected {expected} sections, no overlap, no stale token, nobody inside: {row}"
        ));
    }
    Ok(())
}

fn charge_everywhere(server: &PostgresServer) -> Result<(), String> {
    let url = server.url();
    let children: Vec<Child> = (0..PROCESSES)
        .map(|_| spawn("charge", &url, "procs"))
        .collect();
    let lines = collect(children, Duration::from_secs(120))?;
    let mut receipts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in lines.iter().filter_map(|l| l.strip_prefix("RECEIPT ")) {
        let (order, receipt) = line.split_once(' ').expect("order and receipt");
        receipts
            .entry(order.to_owned())
            .or_default()
            .push(receipt.to_owned());
    }
    if receipts.len() != ORDERS {
        return Err(format!("{} orders answered of {ORDERS}", receipts.len()));
    }
    for (order, answers) in &receipts {
        if answers.iter().any(|a| a != &answers[0]) {
            return Err(format!("{order} was answered differently: {answers:?}"));
        }
    }
    let runs = server.sql("SELECT count(*), count(DISTINCT order_id) FROM runs");
    println!(
        "charge: {} calls from {PROCESSES} processes on {ORDERS} keys: runs, distinct keys = {runs}",
        receipts.values().map(Vec::len).sum::<usize>()
    );
    if runs != format!("{ORDERS}|{ORDERS}") {
        return Err(format!("each key must run once: {runs}"));
    }
    Ok(())
}

fn share_a_semaphore(server: &PostgresServer) -> Result<(), String> {
    let url = server.url();
    let children: Vec<Child> = (0..PROCESSES)
        .map(|_| spawn("permits", &url, "procs"))
        .collect();
    let started = Instant::now();
    let lines = collect(children, Duration::from_secs(180))?;
    let done = lines.iter().filter(|l| *l == "DONE").count();
    if done != PROCESSES {
        return Err(format!("{done} of {PROCESSES} processes finished"));
    }
    let row = server.sql(
        "SELECT entries, most, holders, (SELECT count(*) - count(DISTINCT token) FROM permit_tokens) \
         FROM permit_witness",
    );
    let numbers: Vec<i64> = row.split('|').map(|n| n.parse().unwrap_or(-1)).collect();
    let leaked = server.sql("SELECT count(*) FROM coord.semaphore_permits");
    println!(
        "permits: {} sections by {PROCESSES} processes x {TASKS} tasks on a 3-permit semaphore in {:.1?}: at most {} holders at once, {} repeated tokens, {leaked} permits left",
        numbers[0],
        started.elapsed(),
        numbers[1],
        numbers[3]
    );
    let expected = (PROCESSES * TASKS * PERMIT_ROUNDS) as i64;
    if numbers[0] != expected
        || !(1..=3).contains(&numbers[1])
        || numbers[2] != 0
        || numbers[3] != 0
    {
        return Err(format!(
            "expected {expected} sections, at most 3 holders, nobody inside, distinct tokens: {row}"
        ));
    }
    if leaked != "0" {
        return Err(format!("{leaked} permits left after every holder released"));
    }
    Ok(())
}

fn share_a_rw_lock(server: &PostgresServer) -> Result<(), String> {
    let url = server.url();
    let children: Vec<Child> = (0..PROCESSES).map(|_| spawn("rw", &url, "procs")).collect();
    let started = Instant::now();
    let lines = collect(children, Duration::from_secs(180))?;
    let done = lines.iter().filter(|l| *l == "DONE").count();
    if done != PROCESSES {
        return Err(format!("{done} of {PROCESSES} processes finished"));
    }
    let row = server.sql(
        "SELECT entries, overlapped, refused, readers + writers, most_readers FROM rw_witness",
    );
    let numbers: Vec<i64> = row.split('|').map(|n| n.parse().unwrap_or(-1)).collect();
    let leaked = server.sql("SELECT count(*) FROM coord.rw_holds");
    println!(
        "rw: {} read and write sections by {PROCESSES} processes x {TASKS} tasks on one key in {:.1?}: {} overlaps, {} stale tokens, at most {} readers at once, {leaked} holds left",
        numbers[0],
        started.elapsed(),
        numbers[1],
        numbers[2],
        numbers[4]
    );
    let expected = (PROCESSES * TASKS * RW_ROUNDS) as i64;
    if numbers[..4] != [expected, 0, 0, 0] || numbers[4] < 2 {
        return Err(format!(
            "expected {expected} sections, no overlap, no stale token, nobody inside, readers \
             sharing: {row}"
        ));
    }
    if leaked != "0" {
        return Err(format!("{leaked} holds left after every holder released"));
    }
    Ok(())
}

/// One scenario against the shared server: `Err` says what went wrong.
type Scenario = fn(&PostgresServer) -> Result<(), String>;

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(child(&role));
        return;
    }
    let started = Instant::now();
    let server = PostgresServer::start();
    let url = server.url();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(PostgresProvider::migrate(&url))
        .expect("migrate");
    server.sql(
        "CREATE TABLE witness (slot int PRIMARY KEY, holders int NOT NULL DEFAULT 0, \
         entries int NOT NULL DEFAULT 0, overlapped int NOT NULL DEFAULT 0, \
         last_token bigint NOT NULL DEFAULT 0, refused int NOT NULL DEFAULT 0); \
         INSERT INTO witness (slot) VALUES (0), (1); \
         CREATE TABLE runs (order_id text NOT NULL, pid int NOT NULL); \
         CREATE TABLE permit_witness (slot int PRIMARY KEY, holders int NOT NULL DEFAULT 0, \
         entries int NOT NULL DEFAULT 0, most int NOT NULL DEFAULT 0); \
         INSERT INTO permit_witness (slot) VALUES (0); \
         CREATE TABLE permit_tokens (token bigint NOT NULL); \
         CREATE TABLE rw_witness (readers int NOT NULL DEFAULT 0, writers int NOT NULL DEFAULT 0, \
         entries int NOT NULL DEFAULT 0, overlapped int NOT NULL DEFAULT 0, \
         refused int NOT NULL DEFAULT 0, most_readers int NOT NULL DEFAULT 0, \
         last_token bigint NOT NULL DEFAULT 0, last_write bigint NOT NULL DEFAULT 0); \
         INSERT INTO rw_witness DEFAULT VALUES",
    );
    let scenarios: [(&str, Scenario); 4] = [
        ("contend_with_a_fencing_witness", contend),
        ("idempotent_across_processes", charge_everywhere),
        ("share_a_semaphore_with_a_witness", share_a_semaphore),
        ("share_a_rw_lock_with_a_fencing_witness", share_a_rw_lock),
    ];
    let (mut passed, mut failed) = (0, 0);
    for (name, scenario) in scenarios {
        match scenario(&server) {
            Ok(()) => {
                println!("test {name} ... ok");
                passed += 1;
            }
            Err(why) => {
                println!("test {name} ... FAILED: {why}");
                failed += 1;
            }
        }
    }
    println!("(in {:.1?})", started.elapsed());
    println!("processes: {passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}
