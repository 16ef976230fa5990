//! What users run, measured through the public API on one private redis-server on loopback,
//! beside the same work written by hand with a raw redis-rs client (issue 41, point 4):
//!
//! | row | coord | by hand |
//! |---|---|---|
//! | lock pair, attribute | `#[distributed_lock(key_from = "key", lease = "30s")]` around an empty body | `SET key token NX PX 30000`, then `EVALSHA` compare-and-delete |
//! | lock pair, handle | `coord.lock(key).lease(30s).acquire()` then `guard.release()` | the same |
//! | first call | `#[idempotent]` on a fresh key: claim, body, completion | `EVALSHA` of a claim (`HSET` marker + `PEXPIRE` unless the key exists), then `EVALSHA` of a completion (`HSET` outcome + `PEXPIRE` retention) |
//! | replay | `#[idempotent]` on a key whose record is stored | `HMGET key st pl`, parse the payload |
//!
//! Every task works on keys of its own (nothing waits), at 1 and 16 tasks. Subjects alternate
//! in slices (A B, B A, A B ...) so that a change in the machine's load hits both sides alike;
//! each row reports calls per second over all slices and the median of the per-slice ratios
//! coord / by hand (above 1: coord is faster). Nothing asserts on time.
//!
//! Run: `cargo bench -p coord-redis --bench public_api --features fred`
//! (without `fred`, only the redis-rs rows).
//!
//! Profile mode, for instruction counts (`valgrind --tool=callgrind`) and system calls
//! (`strace -c -f`), which do not depend on the host's load:
//! `COORD_BENCH_PROFILE=<what>:<calls>[:<client>]` runs only `calls` sequential calls of one
//! subject (`lock-attribute`, `lock-handle`, `lock-by-hand`, `first-call`,
//! `first-call-by-hand`, `replay`, `replay-by-hand`) over `redis-rs` (the default) or `fred`,
//! and exits. Two runs with N and 2N calls give the cost of N calls without the start-up.

#[allow(dead_code)] // the percentile helper of `support` is not used here
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use coord_core::{CoordError, Coordinator, distributed_lock, idempotent};
use redis::aio::MultiplexedConnection;
use support::{Align, RawRs, Session, Table, clients, verdict};

const LEASE_MS: u64 = 30_000;
const RETENTION_MS: u64 = 86_400_000;
const WARM_UP: Duration = Duration::from_millis(300);
const SLICE: Duration = Duration::from_millis(400);
const ROUNDS: usize = 8;
const TASKS: [usize; 2] = [1, 16];
/// The bar for the paths users run: at least 0.95x the hand-written work.
const TARGET: f64 = 0.95;

/// The hand-written claim: a marker unless a record is there. KEYS: record. ARGV: owner, lease.
const HAND_CLAIM: &str = "\
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'st', 'i', 'own', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1";

/// The hand-written completion, owner-checked. KEYS: record. ARGV: owner, payload, retention.
const HAND_COMPLETE: &str = "\
if redis.call('HGET', KEYS[1], 'own') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'st', 'c', 'pl', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1";

#[distributed_lock(key_from = "key", coordinator = c, name = "api.lock", lease = "30s")]
async fn locked(c: &Coordinator, key: u64) -> Result<(), CoordError> {
    std::hint::black_box(key);
    Ok(())
}

#[idempotent(key_from = "key", coordinator = c, name = "api.charge", retention = "24h")]
async fn charge(c: &Coordinator, key: u64) -> Result<u64, CoordError> {
    Ok(key.wrapping_mul(31))
}

/// What one task repeats.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Work {
    LockAttribute,
    LockHandle,
    LockByHand,
    FirstCall,
    FirstCallByHand,
    Replay,
    ReplayByHand,
}

/// Everything a subject needs.
#[derive(Clone)]
struct Ctx {
    coord: Coordinator,
    raw: RawRs,
    claim_sha: String,
    complete_sha: String,
    namespace: String,
    /// Fresh keys for first calls, shared by every task (each call takes the next).
    next_key: Arc<AtomicU64>,
}

/// The variable that selects the profile mode (see the module docs).
const PROFILE_VAR: &str = "COORD_BENCH_PROFILE";

impl Work {
    /// The subject named `name` in a profile spec.
    fn named(name: &str) -> Option<Work> {
        Some(match name {
            "lock-attribute" => Work::LockAttribute,
            "lock-handle" => Work::LockHandle,
            "lock-by-hand" => Work::LockByHand,
            "first-call" => Work::FirstCall,
            "first-call-by-hand" => Work::FirstCallByHand,
            "replay" => Work::Replay,
            "replay-by-hand" => Work::ReplayByHand,
            _ => return None,
        })
    }
}

/// A coordinator over `client` in a namespace of its own, with the replays' records stored.
fn context(session: &Session, client: coord_redis::Client, name: &str, shas: (&str, &str)) -> Ctx {
    let provider = session.provider(client);
    let namespace = format!("bench-api-{name}");
    let coord = Coordinator::builder()
        .namespace(namespace.clone())
        .provider(provider)
        .build()
        .expect("a coordinator");
    let ctx = Ctx {
        coord,
        raw: session.raw.clone(),
        claim_sha: shas.0.to_owned(),
        complete_sha: shas.1.to_owned(),
        namespace,
        next_key: Arc::new(AtomicU64::new(1 << 40)),
    };
    // The replays' records, stored once: keys 0..16 through the attribute, and the same
    // outcome by hand under names of their own.
    session.rt.block_on(prepare_replays(&ctx));
    ctx
}

/// Runs `spec`'s calls in one task (the profile mode).
fn profile(session: &Session, spec: &str, shas: (&str, &str)) {
    let parsed = (|| {
        let mut parts = spec.split(':');
        let work = Work::named(parts.next()?)?;
        let calls = parts.next()?.parse::<u64>().ok()?;
        let client = parts.next().unwrap_or("redis-rs");
        parts.next().is_none().then_some((work, calls, client))
    })();
    let Some((work, calls, client_name)) = parsed else {
        panic!("{PROFILE_VAR} is <what>:<calls>[:<client>], not {spec:?}");
    };
    let (client, name) = clients()
        .into_iter()
        .find(|(_, name)| *name == client_name)
        .unwrap_or_else(|| panic!("this build has no {client_name} client (see its features)"));
    let ctx = context(session, client, name, shas);
    if std::env::var_os(PAUSE_VAR).is_some() {
        eprintln!("pid {}", std::process::id());
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .expect("read the go-ahead line");
    }
    let before = command_stats(session);
    // On the runtime's worker, as the bench's tasks run (not on the thread that blocks).
    let ctx = session
        .rt
        .block_on(session.rt.spawn(async move {
            let mut conn = ctx.raw.conn.clone();
            let token = format!("{:032x}", 0xbe00);
            for _ in 0..calls {
                one_call(&ctx, &mut conn, work, 0, &token).await;
            }
            ctx
        }))
        .expect("the profile task panicked");
    let after = command_stats(session);
    println!("profile: {calls} calls of {work:?} over {name}");
    // What the server ran per call (commands inside scripts included) and its time per call.
    let mut usec = 0;
    for (command, (n, us)) in &after {
        let (n0, us0) = before.get(command).copied().unwrap_or_default();
        if command != "info" && n > &n0 {
            println!(
                "server: {command} {:.2} per call",
                (n - n0) as f64 / calls as f64
            );
            usec += us - us0;
        }
    }
    println!(
        "server: {:.2} us of commands per call",
        usec as f64 / calls as f64
    );
    session.rt.block_on(async move { drop(ctx) });
}

/// With `COORD_BENCH_PROFILE_PAUSE` set, the profile mode prints `pid <pid>` and waits for a
/// line on its standard input before its calls, so that a counter can be attached to this
/// process alone (`perf stat -p <pid>`, without redis-server's system calls).
const PAUSE_VAR: &str = "COORD_BENCH_PROFILE_PAUSE";

/// `INFO commandstats`: calls and microseconds per command (lower-case name).
fn command_stats(session: &Session) -> std::collections::BTreeMap<String, (u64, u64)> {
    let info = session
        .server
        .command(&["INFO", "commandstats"])
        .text()
        .unwrap_or_default();
    info.lines()
        .filter_map(|line| {
            let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| {
                fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))?
                    .parse::<u64>()
                    .ok()
            };
            Some((name.to_owned(), (field("calls")?, field("usec")?)))
        })
        .collect()
}

fn main() {
    let session = Session::start(
        "public_api",
        &format!(
            "{ROUNDS} alternating slices of {SLICE:?} per subject and row, warm-up {WARM_UP:?}"
        ),
    );
    let (claim_sha, complete_sha) = session.rt.block_on(async {
        let mut conn = session.raw.conn.clone();
        (
            support::raw::script_load(&mut conn, HAND_CLAIM).await,
            support::raw::script_load(&mut conn, HAND_COMPLETE).await,
        )
    });
    if let Ok(spec) = std::env::var(PROFILE_VAR) {
        profile(&session, &spec, (&claim_sha, &complete_sha));
        session.finish();
        return;
    }
    let table = Table::start(
        "The public API against the same work by hand (each task on keys of its own)",
        &[
            ("client", Align::Left),
            ("what", Align::Left),
            ("tasks", Align::Right),
            ("coord calls/s", Align::Right),
            ("by hand calls/s", Align::Right),
            ("coord / by hand (median of slices)", Align::Right),
            ("per slice (min–max)", Align::Right),
            ("≥ 0.95x", Align::Left),
        ],
    );
    for (client, name) in clients() {
        let ctx = context(&session, client, name, (&claim_sha, &complete_sha));
        let rows = [
            (
                "lock pair, attribute",
                Work::LockAttribute,
                Work::LockByHand,
            ),
            ("lock pair, handle", Work::LockHandle, Work::LockByHand),
            (
                "first call, #[idempotent]",
                Work::FirstCall,
                Work::FirstCallByHand,
            ),
            ("replay, #[idempotent]", Work::Replay, Work::ReplayByHand),
        ];
        for (what, coord_work, hand_work) in rows {
            for tasks in TASKS {
                let row = session
                    .rt
                    .block_on(compare(&ctx, coord_work, hand_work, tasks));
                let ratios: Vec<f64> = row.slices.iter().map(|(c, h)| c / h).collect();
                let median = median(&ratios);
                table.row(&[
                    name.to_owned(),
                    what.to_owned(),
                    tasks.to_string(),
                    format!("{:.0}", row.total_a),
                    format!("{:.0}", row.total_b),
                    format!("{median:.2}x"),
                    format!("{:.2}–{:.2}", min(&ratios), max(&ratios)),
                    verdict(median >= TARGET).to_owned(),
                ]);
            }
        }
        session.rt.block_on(async move { drop(ctx) });
    }
    session.finish();
}

async fn prepare_replays(ctx: &Ctx) {
    let mut conn = ctx.raw.conn.clone();
    for key in 0..16u64 {
        charge(&ctx.coord, key).await.expect("store a record");
        let name = hand_record(ctx, key);
        let owner = format!("{key:032x}");
        let _: i64 = claim_by_hand(ctx, &mut conn, &name, &owner).await;
        let _: i64 = complete_by_hand(ctx, &mut conn, &name, &owner, key).await;
    }
}

fn hand_record(ctx: &Ctx, key: u64) -> String {
    format!("{}:hand-idem:{{api.charge:{key}}}", ctx.namespace)
}

async fn claim_by_hand(
    ctx: &Ctx,
    conn: &mut MultiplexedConnection,
    name: &str,
    owner: &str,
) -> i64 {
    redis::cmd("EVALSHA")
        .arg(&ctx.claim_sha)
        .arg(1)
        .arg(name)
        .arg(owner)
        .arg(LEASE_MS)
        .query_async(conn)
        .await
        .expect("hand claim")
}

async fn complete_by_hand(
    ctx: &Ctx,
    conn: &mut MultiplexedConnection,
    name: &str,
    owner: &str,
    key: u64,
) -> i64 {
    let payload = key.wrapping_mul(31).to_string();
    redis::cmd("EVALSHA")
        .arg(&ctx.complete_sha)
        .arg(1)
        .arg(name)
        .arg(owner)
        .arg(payload)
        .arg(RETENTION_MS)
        .query_async(conn)
        .await
        .expect("hand completion")
}

/// Two subjects measured in alternating slices.
struct Row {
    total_a: f64,
    total_b: f64,
    /// Per round: (rate of `a`, rate of `b`).
    slices: Vec<(f64, f64)>,
}

async fn compare(ctx: &Ctx, a: Work, b: Work, tasks: usize) -> Row {
    run(ctx, a, tasks, WARM_UP).await;
    run(ctx, b, tasks, WARM_UP).await;
    let mut slices = Vec::with_capacity(ROUNDS);
    let (mut calls_a, mut calls_b, mut secs_a, mut secs_b) = (0u64, 0u64, 0f64, 0f64);
    for round in 0..ROUNDS {
        let (first, second) = if round % 2 == 0 { (a, b) } else { (b, a) };
        let (n1, t1) = run(ctx, first, tasks, SLICE).await;
        let (n2, t2) = run(ctx, second, tasks, SLICE).await;
        let (na, ta, nb, tb) = if round % 2 == 0 {
            (n1, t1, n2, t2)
        } else {
            (n2, t2, n1, t1)
        };
        calls_a += na;
        calls_b += nb;
        secs_a += ta.as_secs_f64();
        secs_b += tb.as_secs_f64();
        slices.push((na as f64 / ta.as_secs_f64(), nb as f64 / tb.as_secs_f64()));
    }
    Row {
        total_a: calls_a as f64 / secs_a,
        total_b: calls_b as f64 / secs_b,
        slices,
    }
}

/// Runs `work` on `tasks` tasks for about `length`: the calls completed, and the time until
/// every task stopped (a call under way when the time is up is finished and counted).
async fn run(ctx: &Ctx, work: Work, tasks: usize, length: Duration) -> (u64, Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..tasks as u64)
        .map(|task| {
            let (stop, done, ctx) = (stop.clone(), done.clone(), ctx.clone());
            tokio::spawn(async move {
                let mut conn = ctx.raw.conn.clone();
                let token = format!("{:032x}", 0xbe00 + task);
                while !stop.load(Ordering::Relaxed) {
                    one_call(&ctx, &mut conn, work, task, &token).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.expect("a bench task panicked");
    }
    (done.load(Ordering::Relaxed), started.elapsed())
}

async fn one_call(ctx: &Ctx, conn: &mut MultiplexedConnection, work: Work, task: u64, token: &str) {
    match work {
        Work::LockAttribute => locked(&ctx.coord, task).await.expect("a free lock"),
        Work::LockHandle => {
            let key = ctx.coord.key("api.lock").part(&task).finish();
            let guard = ctx
                .coord
                .lock(key)
                .lease(Duration::from_millis(LEASE_MS))
                .acquire()
                .await
                .expect("a free lock");
            guard.release().await.expect("released");
        }
        Work::LockByHand => {
            let name = format!("{}:hand-lock:{{api.lock:{task}}}", ctx.namespace);
            assert!(ctx.raw.try_acquire(conn, &name, token, LEASE_MS).await);
            assert!(ctx.raw.release(conn, &name, token).await);
        }
        Work::FirstCall => {
            let key = ctx.next_key.fetch_add(1, Ordering::Relaxed);
            charge(&ctx.coord, key).await.expect("a first call");
        }
        Work::FirstCallByHand => {
            let key = ctx.next_key.fetch_add(1, Ordering::Relaxed);
            let name = hand_record(ctx, key);
            assert_eq!(claim_by_hand(ctx, conn, &name, token).await, 1);
            assert_eq!(complete_by_hand(ctx, conn, &name, token, key).await, 1);
        }
        Work::Replay => {
            let got = charge(&ctx.coord, task % 16).await.expect("a replay");
            std::hint::black_box(got);
        }
        Work::ReplayByHand => {
            let name = hand_record(ctx, task % 16);
            let (state, payload): (Option<String>, Option<String>) = redis::cmd("HMGET")
                .arg(&name)
                .arg("st")
                .arg("pl")
                .query_async(conn)
                .await
                .expect("hand replay");
            assert_eq!(state.as_deref(), Some("c"));
            let got: u64 = payload.expect("a payload").parse().expect("decode");
            std::hint::black_box(got);
        }
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

fn min(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}
