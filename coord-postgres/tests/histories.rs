//! Recorded histories on PostgreSQL under a seeded nemesis, checked as a whole against coord's
//! promises (the same method as coord-redis's `histories`).
//!
//! This binary has its own `main` (`harness = false`) because it pauses, kills and restarts the
//! server and re-runs itself as client processes (`COORD_HISTORY_ROLE=worker`). It runs:
//!
//! 1. **under faults**: one PostgreSQL server behind an in-test TCP proxy; two client
//!    processes of this binary and the test process itself, three tasks each, taking fenced
//!    locks on two hot keys, making idempotent calls on a sliding window of three hot keys and
//!    single-flight calls; a seeded schedule of combined faults: proxy delay, blackhole, hold,
//!    half-open and reset; the server paused (SIGSTOP to the postmaster first, so that it forks
//!    nothing new, then to every backend and background process, each checked stopped), its
//!    clients' sessions ended with `pg_terminate_backend` (pooled and listening connections
//!    alike), the server killed (SIGKILL to all of it) and restarted on its data directory
//!    (crash recovery); one client process paused past its leases; every kind at least once
//!    per run. Each process also runs long-hold tasks (in each client process one of long
//!    unrenewed holds and one of long renewing holds, in the test process one of short holds
//!    of the unrenewed key), and the nemesis aims its pauses at those holds. Every call is
//!    recorded (JSON lines, one file per process, merged with what the protected resource
//!    witnessed), then checked: zero violations, and the faults must have bitten (a fenced
//!    write refused at the resource, a renewing hold ended `LockLost`, an idempotent call
//!    answered through a fault). The same tasks also hold permits of a 2-permit semaphore,
//!    judged at a resource of its own: never more than 2 holds inside at once among those
//!    certainly within their lease (checked on made-up writes by a case of its own). The
//!    transactional path runs among them: `#[idempotent(transaction = "tx")]` over
//!    `coord_postgres::Transaction` on each task's own application connection (through the
//!    proxy), its body inserting a row into a business table in the same transaction, then
//!    `COMMIT`; recorded as idempotent calls (`ok` only once `COMMIT` answered), its bodies'
//!    effects read from the table after the run (the committed rows), and every one of its
//!    keys asked once more after the faults healed: record ⇔ effect and replay = first
//!    outcome are judged by the same at-most-once and same-answer checks.
//! 2. **crashes the history can see** (`coord_history::crash`): a renewing hold spanning a
//!    kill and restart of a server with `fsync` on, a contender asking for its lock, and the
//!    idempotent keys completed before the kill asked again after it: zero violations. The
//!    control wipes the data directory and re-creates it (initdb, coord's schema) before the
//!    restart and must find the losses (a second execution, and a grant older than a token
//!    in use or an overlap). `COORD_HISTORY_CRASHES=<n>` crashes `n` times per run (1 by
//!    default).
//! 3. **planted bugs**: the same workload through `coord_history::planted::Planted` over a
//!    PostgreSQL provider: locks granted without asking the server (every holder token 1), and
//!    completed records reported as free; the checker must report violations for each, or it
//!    is not checking anything.
//!
//! Every run draws a fresh seed, printed as `seed 0x…`; `COORD_HISTORY_SEED=0x…` replays that
//! run's schedule. The short form (CI) runs the steps that hold every kind of fault once
//! (about 6 s). A long form:
//! `COORD_HISTORY_SECS=300 COORD_HISTORY_SEED=<n> cargo test -p coord-postgres --all-features
//! --test histories`. `COORD_HISTORY_ONLY=<text>` runs only the cases whose name contains it;
//! `COORD_HISTORY_KEEP=1` keeps a passing run's history; `COORD_HISTORY_WATCHDOG=1` prints any
//! call in flight for over 12 s with every thread's stack.
//! A failed run prints its seed and the path of the merged history, which `cargo run -p
//! coord-history --bin check -- <path>` re-checks.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coord_core::{CoordError, Coordinator, fencing_token, idempotent};
use coord_history::clock::now_ns;
use coord_history::crash::{CrashFigures, CrashPlan, crash_run};
use coord_history::nemesis::proxy::{Mode, Proxy};
use coord_history::nemesis::schedule::{FaultClass, FaultKind, Rng, cover, run_seed, seed_text};
use coord_history::planted::{Planted, PlantedBug};
use coord_history::recorder::{Ending, Recorder};
use coord_history::witness::{WitnessClient, WitnessServer};
use coord_history::workload::{
    AIM_FRESH, Caller, LongHolds, RENEWING_KEY, UNRENEWED_KEY, Watched, classify, start_watchdog,
};
use coord_history::{Event, Fault, Op, Outcome, Phase, Promise, Report};
use coord_postgres::{PostgresProvider, Transaction};
use coord_postgres_testing::{PostgresServer, ServerOptions};

const ROLE: &str = "COORD_HISTORY_ROLE";
const LEASE: Duration = Duration::from_secs(1);
const IN_FLIGHT: Duration = Duration::from_secs(2);
const COMMAND_TIMEOUT: Duration = Duration::from_millis(500);
const TASKS: u32 = 3;
const PROCESSES: usize = 2;
/// The `application_name` of every client's connections (the listening ones add
/// `-listener`): what the nemesis ends with `pg_terminate_backend`.
const APP: &str = "coord-history-client";

/// How long a client pause and a server pause last: past the lock lease with room for a
/// successor to take and write the lapsed lock (client) or for a lease of unanswered renewals
/// to pass (server), short of the 2 s in-flight marker.
const PAUSE: Duration = Duration::from_millis(1_500);
/// How long the nemesis waits, at most, for the hold a pause is aimed at before it starts the
/// pause all the same (the run then fails if nothing bit), and how much longer than its
/// schedule a run lasts to leave the aims that time.
const AIM: Duration = Duration::from_secs(3);
const AIM_BUDGET: Duration = Duration::from_secs(4);
/// How long the nemesis waits, at most, for its target process to be inside a long unrenewed
/// hold before a client pause, after asking that process to take such holds
/// ([`aimed_holds`]): generous, since on a loaded host a process that has just come out of
/// another fault may need seconds to get the lock; and how much longer a run lasts for it.
const AIM_CLIENT: Duration = Duration::from_secs(10);
/// How long a client process asked for holds (`hold` on its stdin) takes them, one after
/// another: past [`AIM_CLIENT`], so it is still at it whenever the nemesis looks.
const AIMED_HOLDING: Duration = Duration::from_secs(12);
/// How much longer than its schedule and aims a run lasts, for the time faults take to start
/// and heal beyond their steps (a restart's recovery, a pause's checks).
const SLACK: Duration = Duration::from_secs(2);

/// The lease of a crash run's locks: far longer than a restart
/// of PostgreSQL takes (crash recovery, or a re-created directory and schema), so that a
/// server that kept its data still has the lock when back.
const CRASH_LEASE: Duration = Duration::from_secs(8);

/// Permits of the semaphore every process shares.
const PERMITS: u32 = 2;

/// Which calls a worker makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mix {
    All,
    Locks,
    Idempotent,
}

// ---------------------------------------------------------------- the workload

/// What every task of one process shares: where its calls go, where they are recorded, and
/// how long and with which calls it runs.
#[derive(Clone)]
struct Workload {
    coord: Coordinator,
    rec: Recorder,
    /// The witness the fenced and idempotent bodies report to.
    witness: SocketAddr,
    /// The resource the semaphore's holders report to.
    permits: SocketAddr,
    until: Instant,
    seed: u64,
    mix: Mix,
    /// `None`: no transactional calls (the mix's share of them is skipped).
    tx: Option<TxTarget>,
}

/// One worker task, numbered `client`: calls until the workload's end, recording each.
async fn work(workload: Workload, client: u32) {
    let Workload {
        coord,
        rec,
        witness,
        permits,
        until,
        seed,
        mix,
        tx,
    } = workload;
    let mut app: Option<tokio_postgres::Client> = None;
    let witness = WitnessClient::connect(witness)
        .await
        .expect("the witness listens on loopback");
    let permits = WitnessClient::connect(permits)
        .await
        .expect("the semaphore's resource listens on loopback");
    let mut rng = Rng::new(seed ^ (u64::from(std::process::id()) << 16) ^ u64::from(client));
    while Instant::now() < until {
        let pick = rng.between(0, 9);
        let op = match mix {
            Mix::Locks => Op::Lock,
            Mix::Idempotent => Op::Idempotent,
            Mix::All if pick < 3 => Op::Lock,
            Mix::All if pick < 5 => Op::Idempotent,
            Mix::All if pick < 6 => {
                let Some(tx) = &tx else {
                    continue;
                };
                // The same sliding window as the plain idempotent calls, keys of their own.
                let window = now_ns() / 700_000_000;
                let name = format!("tx{window}-{}", rng.between(0, 2));
                transactional_call(&coord, &rec, tx, &mut app, client, &name).await;
                continue;
            }
            Mix::All if pick < 8 => {
                // Semaphore holds are judged apart (no `Op` of their own in the history).
                semaphore_call(&coord, &rec, &permits, &mut rng).await;
                continue;
            }
            Mix::All => Op::SingleFlight,
        };
        let caller = Caller {
            coord: &coord,
            rec: &rec,
            witness: &witness,
            client,
        };
        match op {
            Op::Lock => {
                let name = format!("lk{}", rng.between(0, 1));
                let hold = Duration::from_millis(rng.between(5, 40));
                caller.fenced_hold(&name, LEASE, hold).await
            }
            Op::Idempotent => {
                // A sliding window of three hot keys, shared by every process (one clock).
                let window = now_ns() / 700_000_000;
                let name = format!("id{window}-{}", rng.between(0, 2));
                caller.idempotent(&name, IN_FLIGHT).await
            }
            _ => {
                let name = format!("sf{}", rng.between(0, 1));
                caller.single_flight(&name).await
            }
        }
    }
}

// ---------------------------------------------------------------- the transactional path

/// The business table the transactional path writes in the same transaction as its record:
/// one row per committed body, naming its key and its call.
const CHARGES: &str = "hist_charges";

/// Where the transactional path's calls go: the URL the application's own connection takes
/// (through the proxy, so the faults reach it), and a provider on that database, whose
/// records its transactions complete.
#[derive(Clone)]
struct TxTarget {
    url: String,
    provider: PostgresProvider,
}

#[derive(Debug)]
enum TxError {
    Db(tokio_postgres::Error),
    Coord(CoordError),
}

impl From<tokio_postgres::Error> for TxError {
    fn from(err: tokio_postgres::Error) -> Self {
        TxError::Db(err)
    }
}

impl From<CoordError> for TxError {
    fn from(err: CoordError) -> Self {
        TxError::Coord(err)
    }
}

/// The transactional call under test: its row in [`CHARGES`] and its completed record commit
/// together, or neither does. Answers `proposal` (naming the call).
#[idempotent(
    key_from = "key",
    coordinator = c,
    name = "hist.tx",
    transaction = "tx",
    in_flight_lease = "2s",
    wait = "3s"
)]
async fn tx_charge(
    c: &Coordinator,
    tx: &mut Transaction<'_>,
    key: &str,
    call: i64,
    proposal: &str,
) -> Result<String, TxError> {
    tx.execute(
        "INSERT INTO hist_charges (key, call) VALUES ($1, $2)",
        &[&key, &call],
    )
    .await?;
    Ok(proposal.to_owned())
}

/// How long one transactional call may take, from `BEGIN` through `COMMIT`, before it is
/// given up (its outcome then unknown): the application's connection has no timeout of its
/// own, and a blackholed or held connection would hang it.
const TX_BOUND: Duration = Duration::from_secs(6);

/// One transactional call of `name`, recorded as an idempotent call: `BEGIN` on the
/// application's connection `app` (opened again when gone), [`tx_charge`], `COMMIT`. `ok`
/// only when `COMMIT` succeeded (or a replay answered and committed); `fail` when the call
/// failed before `COMMIT` was sent (rolled back: certainly no effect); `info` when `COMMIT`
/// failed or the call was given up after sending it. The body writes nothing at the witness:
/// its effect is its committed row, read from the database after the run
/// ([`committed_charges`]).
async fn transactional_call(
    coord: &Coordinator,
    rec: &Recorder,
    target: &TxTarget,
    app: &mut Option<tokio_postgres::Client>,
    client: u32,
    name: &str,
) {
    let (invoked, proposal) = rec.invoke_proposing(client, Op::Idempotent, name, |call| {
        format!("answer-of-{call}")
    });
    let _watched = Watched::new(invoked.call, &format!("transactional {name}"));
    let call = invoked.call.0 as i64;
    let committing = AtomicBool::new(false);
    let attempt = async {
        if app.as_ref().is_none_or(|a| a.is_closed()) {
            *app = None;
            let url = format!("{}&application_name={APP}", target.url);
            match tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
                Ok((c, connection)) => {
                    tokio::spawn(connection);
                    *app = Some(c);
                }
                Err(_) => {
                    // A server that is down refuses at once: no tight loop of reconnects
                    // (a run counts calls, not attempts).
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    return Ending::failed(Outcome::Fail, "Connect");
                }
            }
        }
        let Some(conn) = app.as_mut() else {
            return Ending::failed(Outcome::Fail, "Connect");
        };
        let mut tx = match target.provider.begin(conn).await {
            Ok(tx) => tx,
            Err(_) => return Ending::failed(Outcome::Fail, "Begin"),
        };
        match tx_charge(coord, &mut tx, name, call, &proposal).await {
            Ok(answer) => {
                committing.store(true, Ordering::Release);
                match tx.commit().await {
                    Ok(()) => Ending::ok(Some(answer), None),
                    // The commit's reply may be what was lost: committed or not, unknown.
                    Err(_) => Ending::failed(Outcome::Info, "Commit"),
                }
            }
            Err(err) => {
                // Rolled back (or rolled back by the server when the connection ends): no
                // `COMMIT` was sent, so certainly nothing committed.
                let _ = tx.rollback().await;
                let kind = match err {
                    TxError::Coord(e) => classify(&e).1,
                    TxError::Db(e) => format!("Db({})", e.code().map_or("no code", |c| c.code())),
                };
                Ending::failed(Outcome::Fail, kind)
            }
        }
    };
    let ending = match tokio::time::timeout(TX_BOUND, attempt).await {
        Ok(ending) => ending,
        Err(_) => {
            // A connection given up mid-call is not used again.
            *app = None;
            if committing.load(Ordering::Acquire) {
                Ending::failed(Outcome::Info, "Timeout")
            } else {
                Ending::failed(Outcome::Fail, "TimeoutBeforeCommit")
            }
        }
    };
    rec.complete(&invoked, ending);
}

/// The transactional path's committed bodies, read from [`CHARGES`]: one body effect per row,
/// at its call's invocation (the checker judges at most one per key, and every answer one of
/// them).
fn committed_charges(server: &PostgresServer, events: &[Event]) -> Vec<Event> {
    let invoked: BTreeMap<u64, u64> = events
        .iter()
        .filter_map(|e| match e {
            Event::Invoke(i) => Some((i.call.0, i.at)),
            _ => None,
        })
        .collect();
    server
        .sql("SELECT key, call FROM hist_charges")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(seq, line)| {
            let (key, call) = line.split_once('|').expect("key|call");
            let call = call.trim().parse::<i64>().expect("a call id") as u64;
            Event::Effect(coord_history::Effect {
                seq: seq as u64,
                at: invoked.get(&call).copied().unwrap_or(0),
                key: key.trim().to_owned(),
                call: coord_history::CallId(call),
                kind: coord_history::EffectKind::Body,
            })
        })
        .collect()
}

/// What the transactional path did in a run.
#[derive(Debug, Default)]
struct TxFigures {
    calls: usize,
    ok: usize,
    fail: usize,
    info: usize,
    /// Rows committed in [`CHARGES`] (bodies whose transaction committed).
    committed: usize,
}

impl std::fmt::Display for TxFigures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} calls ({} ok, {} fail, {} info), {} bodies committed",
            self.calls, self.ok, self.fail, self.info, self.committed
        )
    }
}

fn transactional_figures(events: &[Event], charges: &[Event]) -> TxFigures {
    let mut figures = TxFigures {
        committed: charges.len(),
        ..TxFigures::default()
    };
    for e in events {
        if let Event::Complete(c) = e
            && c.op == Op::Idempotent
            && c.key.starts_with("tx")
        {
            figures.calls += 1;
            match c.outcome {
                Outcome::Ok => figures.ok += 1,
                Outcome::Fail => figures.fail += 1,
                Outcome::Info => figures.info += 1,
            }
        }
    }
    figures
}

/// A hold of one of the [`PERMITS`] permits of the shared semaphore; the body writes `enter`
/// and `exit` at the semaphore's resource (which admits everything: a permit's token orders
/// nothing among holders) under a key naming when the permit's lease ends at the latest
/// could end: the lease counted from this call's invocation, before the acquire was sent, so
/// no earlier than the server's own expiry of the permit.
async fn semaphore_call(
    coord: &Coordinator,
    rec: &Recorder,
    permits: &WitnessClient,
    rng: &mut Rng,
) {
    let call = rec.next_call();
    let _watched = Watched::new(call, "semaphore sm0");
    let valid_until = now_ns() + LEASE.as_nanos() as u64;
    let name = format!("sm0~{valid_until}");
    let hold = Duration::from_millis(rng.between(5, 40));
    let key = coord.key("hist.sem").part("sm0").finish();
    let _: Result<(), CoordError> = coord
        .semaphore(key, PERMITS)
        .lease(LEASE)
        .wait(Duration::from_secs(2))
        .run(|| async {
            // As for locks: no token once the lease has run out here; then no write.
            let Some(token) = fencing_token() else {
                return Ok(());
            };
            let token = token.get();
            permits.fenced_write(&name, token, call, Phase::Enter).await;
            tokio::time::sleep(hold).await;
            permits.fenced_write(&name, token, call, Phase::Exit).await;
            Ok(())
        })
        .await;
}

/// What the semaphore's resource saw: holds, holds certainly within their permit's lease,
/// the most of those at once, and the most of all holds at once.
#[derive(Debug, Default)]
struct PermitFigures {
    holds: usize,
    certain: usize,
    most_certain: usize,
    most_any: usize,
    /// The calls inside when more than [`PERMITS`] certain holds were inside at once.
    over: Vec<String>,
}

/// The semaphore's promise, judged at its resource: never more than [`PERMITS`] holds inside
/// at once, among the holds whose `exit` reached the resource before their lease could have
/// ended (a holder stalled past its lease, its permit someone else's, is the one thing a
/// lease cannot prevent; those are counted in `most_any` only). Inside: from the `enter` to
/// the `exit` in the resource's own order; a hold whose `exit` never came is not certain.
fn check_permits(events: &[Event]) -> PermitFigures {
    let mut holds: BTreeMap<u64, (u64, Option<u64>, bool)> = BTreeMap::new();
    let mut writes: Vec<&coord_history::event::ResourceWrite> = events
        .iter()
        .filter_map(|e| match e {
            Event::Resource(w) => Some(w),
            _ => None,
        })
        .collect();
    writes.sort_by_key(|w| w.seq);
    for w in &writes {
        let valid_until: u64 = w
            .key
            .split_once('~')
            .and_then(|(_, t)| t.parse().ok())
            .expect("a semaphore key names its lease end");
        match w.phase {
            Phase::Enter => {
                holds.insert(w.call.0, (w.seq, None, false));
            }
            Phase::Exit => {
                if let Some(h) = holds.get_mut(&w.call.0) {
                    h.1 = Some(w.seq);
                    h.2 = w.at < valid_until;
                }
            }
        }
    }
    let mut figures = PermitFigures {
        holds: holds.len(),
        certain: holds.values().filter(|h| h.2).count(),
        ..PermitFigures::default()
    };
    // Sweep the resource's order.
    let mut inside_any = 0usize;
    let mut inside_certain: Vec<u64> = Vec::new();
    for w in &writes {
        let (_, exit, certain) = holds[&w.call.0];
        match w.phase {
            Phase::Enter => {
                if exit.is_some() {
                    inside_any += 1;
                }
                if certain {
                    inside_certain.push(w.call.0);
                }
            }
            Phase::Exit => {
                inside_any = inside_any.saturating_sub(1);
                inside_certain.retain(|c| *c != w.call.0);
            }
        }
        figures.most_any = figures.most_any.max(inside_any);
        figures.most_certain = figures.most_certain.max(inside_certain.len());
        if inside_certain.len() > PERMITS as usize && figures.over.is_empty() {
            figures.over = inside_certain
                .iter()
                .map(|c| coord_history::CallId(*c).to_string())
                .collect();
        }
    }
    figures
}

// ---------------------------------------------------------------- processes

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A coordinator on `url` (through the proxy). The nemesis may already be at work when a
/// client process starts, so connecting is retried for up to 30 s.
async fn coordinator(url: &str, ns: &str) -> Coordinator {
    coordinator_and_provider(url, ns).await.0
}

/// [`coordinator`], with its provider (which the transactional path's transactions wrap).
async fn coordinator_and_provider(url: &str, ns: &str) -> (Coordinator, PostgresProvider) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let provider = loop {
        match PostgresProvider::builder(url)
            .command_timeout(COMMAND_TIMEOUT)
            .application_name(APP)
            .pool_size(4)
            .connect()
            .await
        {
            Ok(p) => break p,
            Err(e) if Instant::now() > deadline => {
                panic!("connect to the test server through the proxy at {url}: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let coord = Coordinator::builder()
        .namespace(ns)
        .provider(provider.clone())
        .build()
        .expect("coordinator");
    (coord, provider)
}

/// Runs `TASKS` workers of `workload` until its end, and a long-hold task for each of `long`,
/// then gives stragglers `grace`. Returns how many tasks panicked (a harness bug: their calls
/// would show only as never completed).
async fn run_workers(workload: Workload, long: &[LongHolds]) -> usize {
    // The client processes (the ones the nemesis pauses, which run unrenewed long holds) also
    // take holds when asked.
    let aimed = long.contains(&LongHolds::Unrenewed).then(|| {
        let client = TASKS + long.len() as u32;
        tokio::spawn(aimed_holds(workload.clone(), client))
    });
    let long: Vec<_> = long
        .iter()
        .enumerate()
        .map(|(i, &role)| {
            let client = TASKS + i as u32;
            tokio::spawn(long_holds(workload.clone(), role, client))
        })
        .chain(aimed)
        .collect();
    let tasks: Vec<_> = (0..TASKS)
        .map(|client| tokio::spawn(work(workload.clone(), client)))
        .collect();
    let grace = workload.until + Duration::from_secs(20);
    let mut panicked = 0;
    for t in tasks {
        // A call stuck past the grace is left out as never completed (unknown outcome).
        let left = grace.saturating_duration_since(Instant::now());
        if let Ok(Err(err)) = tokio::time::timeout(left, t).await {
            panicked += usize::from(err.is_panic());
        }
    }
    for long in long {
        let left = grace.saturating_duration_since(Instant::now());
        if let Ok(Err(err)) = tokio::time::timeout(left, long).await {
            panicked += usize::from(err.is_panic());
        }
    }
    panicked
}

/// One long-hold task ([`LongHolds`]) of a process, numbered `client`, until the workload's
/// end: what the nemesis aims its pauses at.
async fn long_holds(workload: Workload, role: LongHolds, client: u32) {
    let Workload {
        coord,
        rec,
        witness,
        until,
        seed,
        ..
    } = workload;
    let witness = WitnessClient::connect(witness)
        .await
        .expect("the witness listens on loopback");
    let mut rng = Rng::new(seed ^ (u64::from(std::process::id()) << 16) ^ u64::from(client));
    // Numbered after the mix's tasks.
    let caller = Caller {
        coord: &coord,
        rec: &rec,
        witness: &witness,
        client,
    };
    while Instant::now() < until {
        caller.long_hold(role, LEASE, "", &mut rng).await;
    }
}

/// Asked for by the nemesis (`hold` on a client process's stdin) before it pauses that process:
/// long unrenewed holds are to be taken at once.
static HOLD_ASKED: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Reads the nemesis's commands from stdin, one a line: `hold` ([`aimed_holds`]).
fn listen_for_commands() {
    std::thread::spawn(|| {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { return };
            if line.trim() == "hold" {
                HOLD_ASKED.notify_one();
            }
        }
    });
}

/// The task of a client process that takes long unrenewed holds of [`UNRENEWED_KEY`] when the
/// nemesis asks (`hold`), one after another for [`AIMED_HOLDING`], so that the pause the nemesis
/// aims at this process finds it inside one, however the other long-hold task fares (it may be
/// waiting out a fault, or keep losing the key to the other holders). The nemesis waits until
/// this process is inside a hold, with a generous deadline, before it starts the pause.
async fn aimed_holds(workload: Workload, client: u32) {
    let Workload {
        coord,
        rec,
        witness,
        until,
        seed,
        ..
    } = workload;
    let witness = WitnessClient::connect(witness)
        .await
        .expect("the witness listens on loopback");
    let mut rng = Rng::new(seed ^ (u64::from(std::process::id()) << 16) ^ u64::from(client));
    let caller = Caller {
        coord: &coord,
        rec: &rec,
        witness: &witness,
        client,
    };
    loop {
        tokio::select! {
            () = HOLD_ASKED.notified() => {}
            () = tokio::time::sleep(until.saturating_duration_since(Instant::now())) => return,
        }
        let holding_until = Instant::now() + AIMED_HOLDING;
        while Instant::now() < holding_until.min(until) {
            caller
                .long_hold(LongHolds::Unrenewed, LEASE, "", &mut rng)
                .await;
        }
    }
}

fn child() {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let url = var("COORD_HISTORY_URL");
    let witness: SocketAddr = var("COORD_HISTORY_WITNESS").parse().expect("address");
    let permits: SocketAddr = var("COORD_HISTORY_PERMITS").parse().expect("address");
    let ns = var("COORD_HISTORY_NS");
    let millis: u64 = var("COORD_HISTORY_MILLIS").parse().expect("millis");
    let seed: u64 = var("COORD_HISTORY_SEED_CHILD").parse().expect("seed");
    let out = var("COORD_HISTORY_OUT");
    start_watchdog();
    listen_for_commands();
    let rec = Recorder::new();
    let rt = runtime();
    let panicked = rt.block_on(async {
        let until = Instant::now() + Duration::from_millis(millis);
        let (coord, provider) = coordinator_and_provider(&url, &ns).await;
        let long = [LongHolds::Unrenewed, LongHolds::Renewing];
        let tx = TxTarget {
            url: url.clone(),
            provider,
        };
        let workload = Workload {
            coord,
            rec: rec.clone(),
            witness,
            permits,
            until,
            seed,
            mix: Mix::All,
            tx: Some(tx),
        };
        run_workers(workload, &long).await
    });
    rec.write_to(std::path::Path::new(&out))
        .expect("write the history");
    // Calls stuck past the grace must not keep the process alive; a panicked task fails the
    // run (the parent reads the status).
    std::process::exit(if panicked == 0 { 0 } else { 3 });
}

struct Worker {
    child: Child,
    out: std::path::PathBuf,
    /// The client process's stdin, where it takes the nemesis's commands.
    commands: Mutex<Option<std::process::ChildStdin>>,
}

impl Worker {
    /// Sends one command (`hold`).
    fn tell(&self, command: &str) {
        if let Some(stdin) = self.commands.lock().unwrap().as_mut() {
            // A client process that already ended reads no more commands.
            let _ = writeln!(stdin, "{command}");
            let _ = stdin.flush();
        }
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: `kill` takes no pointers. Our own child, not yet reaped: the pid is its.
        unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.out);
    }
}

// ---------------------------------------------------------------- the nemesis

/// The faults of this run. The proxy, pause, kill and client-pause faults are the ones
/// coord-history names ([`FaultKind`]); ending the clients' sessions is PostgreSQL's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PgFault {
    Common(FaultKind),
    /// `pg_terminate_backend` of every session of the clients, pooled and listening.
    TerminateSessions,
}

impl PgFault {
    const ALL: [PgFault; 9] = [
        PgFault::Common(FaultKind::ProxyDelay),
        PgFault::Common(FaultKind::ProxyBlackhole),
        PgFault::Common(FaultKind::ProxyHold),
        PgFault::Common(FaultKind::ProxyHalfOpen),
        PgFault::Common(FaultKind::ProxyReset),
        PgFault::Common(FaultKind::ServerPause),
        PgFault::Common(FaultKind::ServerKillRestart),
        PgFault::TerminateSessions,
        PgFault::Common(FaultKind::ClientPause),
    ];

    fn name(self) -> &'static str {
        match self {
            PgFault::Common(kind) => kind.name(),
            PgFault::TerminateSessions => "server-terminate-sessions",
        }
    }

    /// Ending sessions needs the server answering: it never shares a step with a pause or a
    /// kill (one fault of a class per step).
    fn class(self) -> FaultClass {
        match self {
            PgFault::Common(kind) => kind.class(),
            PgFault::TerminateSessions => FaultClass::Server,
        }
    }
}

/// One step: wait `gap`, start every fault, keep them for `hold`, heal them all.
#[derive(Debug, Clone)]
struct Step {
    gap: Duration,
    faults: Vec<PgFault>,
    hold: Duration,
    delay: Duration,
    target: u64,
}

/// Every fault of [`PgFault::ALL`] at least once (`coord_history::nemesis::schedule::cover`:
/// as few steps as one fault of a class per step allows, the client pause in a step of its own,
/// since a fault on the network or the server in its step would keep the successor from the
/// lapsed lock; gaps 150 to 400 ms, holds 250 to 700 ms), then, while that fills less than
/// `total`, steps as `coord_history::nemesis::schedule::Schedule::seeded` draws them (gaps 300
/// to 900 ms, holds 300 to 1 500 ms, half the steps combining two or three faults of different
/// classes). A step pausing a client process or the server holds [`PAUSE`], past the lease;
/// those steps come first. Returns the steps and how many of the first hold every kind once.
fn schedule(seed: u64, total: Duration) -> (Vec<Step>, usize) {
    let mut rng = Rng::new(seed);
    let mut steps = Vec::new();
    let mut used = Duration::ZERO;
    let paused = |faults: &[PgFault]| {
        faults.iter().any(|f| {
            matches!(
                f,
                PgFault::Common(FaultKind::ClientPause | FaultKind::ServerPause)
            )
        })
    };
    let alone = |f: PgFault| f == PgFault::Common(FaultKind::ClientPause);
    let mut covered = cover(&mut rng, &PgFault::ALL, PgFault::class, alone);
    // The paused steps first, while the clients are in their stride: what they are aimed at
    // may take seconds to come back after a kill or a reset.
    covered.sort_by_key(|faults| !paused(faults));
    let covering = covered.len();
    for faults in covered {
        let gap = Duration::from_millis(rng.between(150, 400));
        let mut hold = Duration::from_millis(rng.between(250, 700));
        if paused(&faults) {
            hold = hold.max(PAUSE);
        }
        steps.push(Step {
            gap,
            faults,
            hold,
            delay: Duration::from_millis(rng.between(50, 250)),
            target: rng.next_u64(),
        });
        used += gap + hold;
    }
    let pick = |rng: &mut Rng| PgFault::ALL[rng.between(0, PgFault::ALL.len() as u64 - 1) as usize];
    while used < total {
        let gap = Duration::from_millis(rng.between(300, 900));
        let mut hold = Duration::from_millis(rng.between(300, 1500));
        let mut faults = vec![pick(&mut rng)];
        if rng.next_u64().is_multiple_of(2) {
            for _ in 0..2 {
                let extra = pick(&mut rng);
                if faults.iter().all(|f| f.class() != extra.class()) {
                    faults.push(extra);
                }
            }
        }
        if paused(&faults) {
            hold = hold.max(PAUSE);
        }
        steps.push(Step {
            gap,
            faults,
            hold,
            delay: Duration::from_millis(rng.between(50, 250)),
            target: rng.next_u64(),
        });
        used += gap + hold;
    }
    (steps, covering)
}

struct Target {
    server: Mutex<PostgresServer>,
    proxy: Arc<Proxy>,
    workers: Vec<Worker>,
    witness: Arc<WitnessServer>,
    /// Sessions ended by `pg_terminate_backend`, all steps.
    terminated: AtomicUsize,
    /// Processes of the server seen stopped by a pause, all steps.
    stopped: AtomicUsize,
    /// Processes a pause missed (stopped late, by the nemesis itself).
    late: Mutex<Vec<String>>,
}

fn fault_event(fault: PgFault, start: bool) -> Event {
    Event::Fault(Fault {
        at: now_ns(),
        fault: fault.name().into(),
        start,
        data_loss: false,
    })
}

/// The processes whose parent is `parent`, from /proc.
fn children(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| process_field(*pid, 1).and_then(|p| p.parse().ok()) == Some(parent))
        .collect()
}

/// Field `n` after the command name in `/proc/<pid>/stat` (0: the state, 1: the parent).
fn process_field(pid: u32, n: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(n).map(str::to_owned)
}

/// Waits until the postmaster and every process it started are stopped (state `T`) and
/// returns how many there are, and the processes that were still running half a second after
/// the pause (each then stopped here directly, and named with its state and command): a
/// pause that missed a backend would leave it answering on its connection. Panics if one
/// still runs a second after that.
fn all_stopped(postmaster: u32) -> (usize, Vec<String>) {
    let running = |pids: &[u32]| -> Vec<u32> {
        pids.iter()
            .copied()
            // A process gone meanwhile (None), or exited and not yet reaped (Z, X), runs
            // nothing.
            .filter(|p| {
                process_field(*p, 0).is_some_and(|s| !matches!(s.as_str(), "T" | "t" | "Z" | "X"))
            })
            .collect()
    };
    let mut late = Vec::new();
    let started = Instant::now();
    loop {
        let mut pids = children(postmaster);
        pids.push(postmaster);
        let still = running(&pids);
        if still.is_empty() {
            return (pids.len(), late);
        }
        let waited = started.elapsed();
        if waited > Duration::from_millis(500) && late.is_empty() {
            for pid in &still {
                let state = process_field(*pid, 0).unwrap_or_default();
                let comm = std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                    .unwrap_or_default()
                    .replace('\0', " ");
                late.push(format!("{pid} ({state}) {}", comm.trim()));
                // SAFETY: `kill` takes no pointers; the pid was just read as a child of the
                // server this test started.
                unsafe { libc::kill(*pid as libc::pid_t, libc::SIGSTOP) };
            }
            eprintln!("histories: a pause missed server processes, stopped now: {late:?}");
        }
        assert!(
            waited < Duration::from_millis(1500),
            "server processes {still:?} still run 1.5 s after the pause (late: {late:?})"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn apply(target: &Target, step: &Step, fault: PgFault) {
    let mut server = target.server.lock().unwrap();
    match fault {
        PgFault::Common(kind) => match kind {
            FaultKind::ProxyDelay => target.proxy.set(Mode::Delay(step.delay)),
            FaultKind::ProxyBlackhole => target.proxy.set(Mode::Blackhole),
            FaultKind::ProxyHold => target.proxy.set(Mode::Hold),
            FaultKind::ProxyHalfOpen => target.proxy.set(Mode::HalfOpen),
            FaultKind::ProxyReset => target.proxy.set(Mode::Reset),
            FaultKind::ServerPause => {
                server.pause();
                let pid = server.pid().expect("the server runs");
                let (stopped, late) = all_stopped(pid);
                target.stopped.fetch_add(stopped, Ordering::Relaxed);
                target.late.lock().unwrap().extend(late);
            }
            FaultKind::ServerKillRestart => server.kill(),
            FaultKind::ClientPause => {
                let w = &target.workers[(step.target % target.workers.len() as u64) as usize];
                w.signal(libc::SIGSTOP);
            }
            other => unreachable!("not scheduled here: {other:?}"),
        },
        PgFault::TerminateSessions => {
            // Through psql straight to the server, not through the proxy.
            let ended = server
                .try_sql(&format!(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE application_name LIKE '{APP}%' AND pid <> pg_backend_pid()"
                ))
                .ok()
                .and_then(|n| n.trim().parse::<usize>().ok())
                .unwrap_or(0);
            target.terminated.fetch_add(ended, Ordering::Relaxed);
        }
    }
}

fn heal(target: &Target, step: &Step, fault: PgFault) {
    let mut server = target.server.lock().unwrap();
    match fault {
        PgFault::Common(kind) => match kind {
            FaultKind::ProxyDelay
            | FaultKind::ProxyBlackhole
            | FaultKind::ProxyHold
            | FaultKind::ProxyHalfOpen
            | FaultKind::ProxyReset => target.proxy.set(Mode::Pass),
            FaultKind::ServerPause => server.resume(),
            // Crash recovery on the same data directory: what was committed is there.
            FaultKind::ServerKillRestart => server.start_again(),
            FaultKind::ClientPause => {
                let w = &target.workers[(step.target % target.workers.len() as u64) as usize];
                w.signal(libc::SIGCONT);
            }
            other => unreachable!("not scheduled here: {other:?}"),
        },
        // A one-shot fault: the clients reconnect by themselves.
        PgFault::TerminateSessions => {}
    }
}

/// Waits, until `latest` at most, until the holds `step`'s pauses are
/// aimed at are there: for a client pause, its target process inside a long unrenewed hold;
/// for a server pause, a renewing hold that came in within [`AIM_FRESH`]. Returns whether
/// they were.
fn aim(target: &Target, step: &Step, latest: Instant) -> bool {
    let client = step
        .faults
        .contains(&PgFault::Common(FaultKind::ClientPause))
        .then(|| {
            target.workers[(step.target % target.workers.len() as u64) as usize]
                .child
                .id()
        });
    let server = step
        .faults
        .contains(&PgFault::Common(FaultKind::ServerPause));
    let deadline = latest;
    loop {
        let client_ready = client.is_none_or(|pid| {
            target
                .witness
                .inside(UNRENEWED_KEY)
                .iter()
                .any(|(call, _)| call.pid() == pid)
        });
        let server_ready = !server || {
            let fresh = now_ns().saturating_sub(AIM_FRESH.as_nanos() as u64);
            target
                .witness
                .inside(RENEWING_KEY)
                .iter()
                .any(|(_, at)| *at >= fresh)
        };
        if client_ready && server_ready {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Runs `steps` against `target` until `until`, recording every fault.
fn nemesis(target: &Target, steps: &[Step], covering: usize, rec: &Recorder, until: Instant) {
    let mut aim_left = AIM_BUDGET;
    let mut client_aim_left = AIM_CLIENT;
    for (i, step) in steps.iter().enumerate() {
        std::thread::sleep(step.gap);
        // The steps that hold every kind once all run, late or not (the run's length leaves
        // them room); the ones after them only while they fit.
        if i >= covering && Instant::now() + step.hold > until {
            break;
        }
        // The aims of a run share one allowance, which its length includes.
        let aim_started = Instant::now();
        let at_client = step
            .faults
            .contains(&PgFault::Common(FaultKind::ClientPause));
        // A client pause is not left to find a hold by chance: its target is asked to take
        // long holds now, and is waited for (generously) until inside one.
        if at_client {
            target.workers[(step.target % target.workers.len() as u64) as usize].tell("hold");
        }
        let from_client = at_client && !client_aim_left.is_zero();
        let allowance = if from_client {
            AIM_CLIENT.min(client_aim_left)
        } else {
            AIM.min(aim_left)
        };
        let aimed = aim(target, step, aim_started + allowance);
        let spent = aim_started.elapsed();
        if from_client {
            client_aim_left = client_aim_left.saturating_sub(spent);
        } else {
            aim_left = aim_left.saturating_sub(spent);
        }
        println!(
            "  nemesis: aim of {:?}: {} after {:?}",
            step.faults,
            if aimed {
                "found its hold"
            } else {
                "found none; started anyway"
            },
            spent
        );
        for &fault in &step.faults {
            rec.push(fault_event(fault, true));
            apply(target, step, fault);
        }
        std::thread::sleep(step.hold);
        for &fault in step.faults.iter().rev() {
            heal(target, step, fault);
            rec.push(fault_event(fault, false));
        }
    }
}

// ---------------------------------------------------------------- runs

/// The run's seed: `COORD_HISTORY_SEED` (decimal or `0x…`), else a fresh one, drawn once per
/// run of this binary and printed (`seed 0x…`), so a failing run replays exactly.
fn seed() -> u64 {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(run_seed)
}

/// How long the schedule's steps fill at least (`COORD_HISTORY_SECS`): by default only the
/// steps that hold every kind of fault once (about 6 s); a longer run adds seeded steps.
fn fault_millis() -> u64 {
    std::env::var("COORD_HISTORY_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(0, |s| s * 1000)
}

fn save(events: &[Event], name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "coord-history-postgres-{name}-{}.jsonl",
        std::process::id()
    ));
    coord_history::write_jsonl(&path, events).expect("write the merged history");
    path
}

/// A fresh server with coord's schema.
fn migrated_server(rt: &tokio::runtime::Runtime) -> PostgresServer {
    let server = PostgresServer::start();
    rt.block_on(PostgresProvider::migrate(&server.url()))
        .expect("migrate the test server");
    server
}

/// Lock holds spanning a server kill and restart, and completed keys asked again after each
/// ([`coord_history::crash`]): with `persistent` (`fsync` on, restarted on its data directory:
/// crash recovery) zero violations; without (its data directory wiped and re-created, coord's
/// schema migrated again, before the restart), the control, whose losses the checker must
/// find (the test asserts which).
fn crash_case(persistent: bool) -> (Report, CrashFigures) {
    let label = if persistent {
        "persistent"
    } else {
        "without-data"
    };
    let rt = runtime();
    let server = PostgresServer::start_configured(ServerOptions::new().durable());
    rt.block_on(PostgresProvider::migrate(&server.url()))
        .expect("migrate the test server");
    let url = server.url();
    let server = Arc::new(Mutex::new(server));
    let witness = WitnessServer::start();
    let rec = Recorder::new();
    let plan = CrashPlan {
        cycles: crash_cycles(),
        lease: CRASH_LEASE,
        keys_before_crash: 5,
        fault: if persistent {
            "server-kill-restart".into()
        } else {
            "server-kill-restart-without-data".into()
        },
    };
    let started = Instant::now();
    let figures = rt.block_on(async {
        let coord = coordinator(&url, &format!("crash-postgres-{label}")).await;
        let crashed = server.clone();
        let migrate_url = url.clone();
        let crash = Arc::new(move || {
            let mut server = crashed.lock().unwrap();
            if persistent {
                server.restart();
                return;
            }
            server.restart_without_data();
            // The schema again, on a runtime of its own (this runs on a blocking thread of
            // the test's runtime, which cannot be blocked on).
            let url = migrate_url.clone();
            std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime")
                    .block_on(PostgresProvider::migrate(&url))
                    .expect("migrate the re-created server")
            })
            .join()
            .expect("the migration thread does not panic");
        });
        crash_run(&coord, &rec, witness.addr(), &plan, crash).await
    });
    let mut events = rec.events();
    events.extend(witness.events());
    let report = coord_history::check(&events);
    let path = save(&events, &format!("crash-{label}"));
    println!(
        "histories/postgres/crash-{label} ({:.1} s, history {}): {figures}; violations {:?}",
        started.elapsed().as_secs_f64(),
        path.display(),
        violations_by_promise(&report)
    );
    assert!(
        figures.spanning >= 1 && figures.asked_again >= plan.keys_before_crash,
        "the crash run did not span a crash with a hold or ask keys again after it: {figures}; {report}"
    );
    // Kept when the case is about to fail: violations in the real run, none in the control.
    if report.violations.is_empty() == persistent {
        let _ = std::fs::remove_file(&path);
    }
    (report, figures)
}

/// Kill-and-restart cycles of a crash run: `COORD_HISTORY_CRASHES`, else 1 (a PostgreSQL restart (crash recovery with fsync on, or a re-created directory and schema) takes seconds on a loaded host, so the short form crashes once).
fn crash_cycles() -> usize {
    std::env::var("COORD_HISTORY_CRASHES")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(1)
}

/// How many violations of each promise a report holds.
fn violations_by_promise(report: &Report) -> BTreeMap<Promise, usize> {
    let mut out = BTreeMap::new();
    for v in &report.violations {
        *out.entry(v.promise).or_default() += 1;
    }
    out
}

/// How the calls ended, by error kind (`ok` for answers), for the printed figures.
fn endings(events: &[Event]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for e in events {
        if let Event::Complete(c) = e {
            let kind = c.error.clone().unwrap_or_else(|| "ok".into());
            *out.entry(kind).or_default() += 1;
        }
    }
    out
}

/// Client processes and in-process tasks under the seeded schedule: zero violations.
fn under_faults() -> Report {
    let seed = seed();
    let (steps, covering) = schedule(seed, Duration::from_millis(fault_millis()));
    let length: Duration = steps.iter().map(|s| s.gap + s.hold).sum();
    let millis =
        u64::try_from((length + AIM_BUDGET + AIM_CLIENT + SLACK).as_millis()).expect("short");
    println!("histories/postgres/under-faults: seed {}", seed_text(seed));
    start_watchdog();
    let rt = runtime();
    let server = migrated_server(&rt);
    server.sql(&format!(
        "CREATE TABLE {CHARGES} (key text NOT NULL, call bigint NOT NULL)"
    ));
    let upstream: SocketAddr = format!("127.0.0.1:{}", server.port()).parse().unwrap();
    let proxy = Arc::new(
        rt.block_on(Proxy::start(upstream))
            .expect("start the proxy"),
    );
    let url = format!(
        "postgres://postgres@{}/postgres?sslmode=disable",
        proxy.addr()
    );
    let witness = Arc::new(WitnessServer::start());
    let permits = WitnessServer::start_unfenced();
    let ns = "hist-postgres";
    let workers: Vec<Worker> = (0..PROCESSES)
        .map(|i| {
            let out = std::env::temp_dir().join(format!(
                "coord-history-postgres-{}-child{i}.jsonl",
                std::process::id()
            ));
            let child = Command::new(std::env::current_exe().expect("own path"))
                .env(ROLE, "worker")
                .env("COORD_HISTORY_URL", &url)
                .env("COORD_HISTORY_WITNESS", witness.addr().to_string())
                .env("COORD_HISTORY_PERMITS", permits.addr().to_string())
                .env("COORD_HISTORY_NS", ns)
                .env("COORD_HISTORY_MILLIS", millis.to_string())
                .env(
                    "COORD_HISTORY_SEED_CHILD",
                    (seed + i as u64 + 1).to_string(),
                )
                .env("COORD_HISTORY_OUT", &out)
                .env("RUST_LOG", "off")
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("re-run this test binary as a client process");
            let mut child = child;
            let commands = Mutex::new(child.stdin.take());
            Worker {
                child,
                out,
                commands,
            }
        })
        .collect();
    let rec = Recorder::new();
    let until = Instant::now() + Duration::from_millis(millis);
    let target = Target {
        server: Mutex::new(server),
        proxy: proxy.clone(),
        workers,
        terminated: AtomicUsize::new(0),
        stopped: AtomicUsize::new(0),
        late: Mutex::new(Vec::new()),
        witness: witness.clone(),
    };
    let started = Instant::now();
    std::thread::scope(|scope| {
        let nemesis_rec = rec.clone();
        let target = &target;
        let steps = &steps;
        scope.spawn(move || nemesis(target, steps, covering, &nemesis_rec, until));
        let panicked = rt.block_on(async {
            let (coord, provider) = coordinator_and_provider(&url, ns).await;
            let tx = TxTarget {
                url: url.clone(),
                provider,
            };
            let workload = Workload {
                coord,
                rec: rec.clone(),
                witness: witness.addr(),
                permits: permits.addr(),
                until,
                seed,
                mix: Mix::All,
                tx: Some(tx),
            };
            run_workers(workload, &[LongHolds::Successor]).await
        });
        assert_eq!(
            panicked, 0,
            "a task of the test process panicked (seed {seed:#x})"
        );
    });
    // Everything healed (the nemesis heals each step before it ends); collect the children.
    let mut events = rec.events();
    let mut target = target;
    for w in &mut target.workers {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            if let Some(status) = w.child.try_wait().expect("wait") {
                assert!(
                    status.success(),
                    "a client process ended with {status} (a task panicked: see its output; seed {seed:#x})"
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "a client process did not finish within 40 s of the run's end (seed {seed:#x})"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut theirs = coord_history::read_jsonl(&w.out).unwrap_or_else(|e| {
            panic!("the client process wrote no readable history ({e}); seed {seed:#x}")
        });
        events.append(&mut theirs);
    }
    events.extend(witness.events());
    // Every transactional key asked once more, faults healed: a key whose body committed
    // must replay its answer (a record lost beside its row would run the body again: two
    // rows); one whose body never committed runs it now, once (a record kept without its
    // row would answer what no committed body produced).
    let tx_keys: std::collections::BTreeSet<String> = events
        .iter()
        .filter_map(|e| match e {
            Event::Invoke(i) if i.op == Op::Idempotent && i.key.starts_with("tx") => {
                Some(i.key.clone())
            }
            _ => None,
        })
        .collect();
    // On the test process's own recorder (call ids go on from its run's), keeping only what
    // it records from here on.
    let after = rec.clone();
    let recorded_before = after.events().len();
    rt.block_on(async {
        let (coord, provider) = coordinator_and_provider(&url, ns).await;
        let target = TxTarget {
            url: url.clone(),
            provider,
        };
        let mut app = None;
        for key in &tx_keys {
            transactional_call(&coord, &after, &target, &mut app, 0, key).await;
        }
    });
    let asked_after: Vec<Event> = after.events().split_off(recorded_before);
    let replays_ok = asked_after
        .iter()
        .filter(|e| matches!(e, Event::Complete(c) if c.outcome == Outcome::Ok))
        .count();
    events.extend(asked_after);
    let target_server = target.server.lock().unwrap();
    let charges = committed_charges(&target_server, &events);
    drop(target_server);
    let tx_figures = transactional_figures(&events, &charges);
    events.extend(charges);
    let path = save(&events, "under-faults");
    let report = coord_history::check(&events);
    let seed = seed_text(seed);
    println!(
        "histories/postgres/under-faults (seed {seed}, {:.1} s, history {}): {report}",
        started.elapsed().as_secs_f64(),
        path.display()
    );
    for line in report.bite_lines() {
        println!("  {line}");
    }
    println!("  {}", report.bite_summary());
    println!(
        "  transactional path: {}; asked again after the faults healed: {} keys, {replays_ok} answered",
        tx_figures,
        tx_keys.len()
    );
    let sem = check_permits(&permits.events());
    println!(
        "  endings {:?}; sessions ended by pg_terminate_backend {}; server processes stopped by pauses {} (missed by a pause and stopped late: {:?})",
        endings(&events),
        target.terminated.load(Ordering::Relaxed),
        target.stopped.load(Ordering::Relaxed),
        target.late.lock().unwrap(),
    );
    println!(
        "  semaphore ({PERMITS} permits): {} holds, {} certainly within their lease, at most {} of those inside at once (of all holds: {})",
        sem.holds, sem.certain, sem.most_certain, sem.most_any
    );
    assert!(
        report.violations.is_empty(),
        "{} violations under faults on PostgreSQL (seed {seed}); the history is {}",
        report.violations.len(),
        path.display()
    );
    assert!(
        sem.over.is_empty(),
        "more than {PERMITS} semaphore holds inside at once, each within its lease: calls {:?} (seed {seed}); the history is {}",
        sem.over,
        path.display()
    );
    assert!(
        sem.certain >= 10,
        "too few semaphore holds to judge: {sem:?}"
    );
    for op in ["lock", "idempotent", "single_flight"] {
        assert!(
            report.calls.get(op).copied().unwrap_or(0) >= 10,
            "too few {op} calls to judge anything: {report}"
        );
    }
    assert!(report.writes_accepted > 0 && report.effects > 0, "{report}");
    assert!(
        tx_figures.committed >= 3 && replays_ok == tx_keys.len(),
        "the transactional path committed too little to judge, or a key asked again after the faults healed did not answer: {tx_figures}; {replays_ok} of {} answered (seed {seed}; history {})",
        tx_keys.len(),
        path.display()
    );
    for fault in PgFault::ALL {
        assert!(
            report.faults.contains_key(fault.name()),
            "the schedule holds {} but it was never injected (seed {seed}): {report}",
            fault.name()
        );
    }
    if let Err(missing) = report.faults_bit() {
        panic!(
            "{missing} (seed {seed}; {}; history {})",
            report.bite_summary(),
            path.display()
        );
    }
    // `COORD_HISTORY_KEEP=1` keeps a passing run's history too, to study it.
    if std::env::var_os("COORD_HISTORY_KEEP").is_none() {
        let _ = std::fs::remove_file(&path);
    }
    report
}

/// The workload through a PostgreSQL provider with `bug` planted, with fencing checked at the
/// resource: the checker must report it.
fn planted(bug: PlantedBug, mix: Mix) -> Report {
    let rt = runtime();
    let server = migrated_server(&rt);
    let witness = WitnessServer::start();
    let rec = Recorder::new();
    rt.block_on(async {
        let provider = PostgresProvider::builder(server.url())
            .command_timeout(COMMAND_TIMEOUT)
            .connect()
            .await
            .expect("connect to the test server");
        let coord = Coordinator::builder()
            .namespace("planted-postgres")
            .provider(Planted::new(provider, bug))
            .build()
            .expect("coordinator");
        let until = Instant::now() + Duration::from_millis(2_500);
        // The planted bugs are in locks and records: no semaphore calls (`mix`).
        let workload = Workload {
            coord,
            rec: rec.clone(),
            witness: witness.addr(),
            // The mixes here make no semaphore calls: nothing reports to the permits' address.
            permits: witness.addr(),
            until,
            seed: seed(),
            mix,
            tx: None,
        };
        let _ = run_workers(workload, &[]).await;
    });
    let mut events = rec.events();
    events.extend(witness.events());
    let report = coord_history::check(&events);
    println!(
        "histories/postgres/planted {bug:?}: {} calls, {} violations {:?}",
        report.total_calls(),
        report.violations.len(),
        report
            .violations
            .iter()
            .map(|v| v.promise)
            .collect::<std::collections::BTreeSet<_>>()
    );
    if let Some(v) = report.violations.first() {
        print!("  for example: {v}");
    }
    report
}

/// The semaphore's check on made-up resource writes: three holds inside at once, each within
/// its lease, are one too many; the same with one of them past its lease are not.
fn semaphore_check_sees_an_excess() {
    let write = |seq: u64, call: u64, phase: Phase, valid_until: u64| {
        Event::Resource(coord_history::event::ResourceWrite {
            seq,
            at: seq * 10,
            key: format!("sm0~{valid_until}"),
            token: call,
            call: coord_history::CallId(call),
            phase,
            accepted: true,
        })
    };
    let history = |third_valid_until: u64| {
        vec![
            write(1, 1, Phase::Enter, 1_000),
            write(2, 2, Phase::Enter, 1_000),
            write(3, 3, Phase::Enter, third_valid_until),
            write(4, 1, Phase::Exit, 1_000),
            write(5, 2, Phase::Exit, 1_000),
            write(6, 3, Phase::Exit, third_valid_until),
        ]
    };
    let excess = check_permits(&history(1_000));
    assert_eq!(excess.over.len(), 3, "{excess:?}");
    assert_eq!((excess.most_certain, excess.most_any), (3, 3), "{excess:?}");
    // The third hold's exit (at 60) came after its lease could have ended (at 55).
    let lapsed = check_permits(&history(55));
    assert!(lapsed.over.is_empty(), "{lapsed:?}");
    assert_eq!(
        (lapsed.certain, lapsed.most_certain, lapsed.most_any),
        (2, 2, 3)
    );
}

fn main() {
    if std::env::var(ROLE).is_ok() {
        return child();
    }
    let started = Instant::now();
    let mut passed = 0;
    let mut failed = Vec::new();
    // `COORD_HISTORY_ONLY=<text>` runs only the cases whose name contains it.
    let only = std::env::var("COORD_HISTORY_ONLY").unwrap_or_default();
    let mut case = |name: &str, f: &dyn Fn()| {
        if !name.contains(&only) {
            return;
        }
        println!("histories/{name} ...");
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(()) => passed += 1,
            Err(_) => failed.push(name.to_owned()),
        }
    };
    case("postgres/under_faults_zero_violations", &|| {
        under_faults();
    });
    case("postgres/crash_persistent_zero_violations", &|| {
        let (report, figures) = crash_case(true);
        assert!(
            report.violations.is_empty(),
            "a server with fsync on lost a lock or a record in a crash: {figures}; {report}"
        );
        assert!(
            figures.replayed_same == figures.asked_again,
            "a key asked again after a crash did not replay its first answer: {figures}"
        );
    });
    case("postgres/crash_without_data_control_finds_losses", &|| {
        let (report, figures) = crash_case(false);
        let locks = report.count(Promise::TokensGrow)
            + report.count(Promise::NoOverlap)
            + report.count(Promise::HeldThroughout);
        assert!(
            report.count(Promise::AtMostOnce) > 0 && locks > 0,
            "with its data directory wiped and re-created, the server lost locks and records the checker did not find: {figures}; {report}"
        );
        println!(
            "  control found: {} second executions, {} lock losses ({:?})",
            report.count(Promise::AtMostOnce),
            locks,
            violations_by_promise(&report)
        );
    });
    case("postgres/semaphore_check_sees_an_excess", &|| {
        semaphore_check_sees_an_excess();
    });
    case("postgres/planted_grant_without_check_is_caught", &|| {
        let report = planted(PlantedBug::GrantWithoutCheck, Mix::Locks);
        assert!(
            report.count(Promise::NoOverlap) > 0 && report.count(Promise::TokensGrow) > 0,
            "the checker missed locks granted without checking: {report}"
        );
    });
    case("postgres/planted_fresh_answer_on_replay_is_caught", &|| {
        let report = planted(PlantedBug::FreshAnswerOnReplay, Mix::Idempotent);
        assert!(
            report.count(Promise::AtMostOnce) > 0 && report.count(Promise::SameAnswer) > 0,
            "the checker missed replays answering fresh: {report}"
        );
    });
    if !failed.is_empty() {
        println!("histories: failed: {}", failed.join(", "));
    }
    println!("histories: {:.1} s in all", started.elapsed().as_secs_f64());
    // Exactly `<name>: N passed, M failed`: the line scripts/test-summary totals.
    println!("histories: {passed} passed, {} failed", failed.len());
    if !failed.is_empty() {
        std::process::exit(1);
    }
}
