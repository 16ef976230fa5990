//! Coordination across real processes against one real redis-server, including processes that
//! are frozen (SIGSTOP) or killed (SIGKILL) while they hold a lock.
//!
//! This test binary has its own `main` (`harness = false`): run without `COORD_TEST_ROLE` it
//! starts a redis-server and runs the scenarios, each of which re-runs this same binary as
//! child processes with `COORD_TEST_ROLE` set to the part they play. It ends with the line
//! `processes: N passed, M failed` and a non-zero exit status when anything failed.

use coord_core::CallKey;
use std::process::Stdio;
use std::time::{Duration, Instant};

use coord_core::{CoordError, Coordinator, distributed_lock, fencing_token, idempotent};
use coord_history::child_process::{ChildProcess, run_scenarios};
use coord_redis::RedisProvider;
use coord_redis::fence::{FencedWrite, write_fenced};
use coord_redis_testing::{RedisServer, command_at};

const ROLE: &str = "COORD_TEST_ROLE";

// ---------------------------------------------------------------- child processes

#[derive(Debug)]
enum ChildError {
    Coord(CoordError),
}

impl From<CoordError> for ChildError {
    fn from(err: CoordError) -> Self {
        ChildError::Coord(err)
    }
}

fn witness(port: u16, args: &[&str]) -> i64 {
    command_at(port, args)
        .expect("witness command")
        .int()
        .unwrap_or(0)
}

#[distributed_lock(key_from = "slot", coordinator = c, name = "proc.contend", lease = "10s", wait = "120s", fenced = true)]
async fn contend_once(c: &Coordinator, slot: u32, port: u16, ns: &str) -> Result<(), ChildError> {
    let holders = format!("{ns}:w:holders");
    let inside = witness(port, &["INCR", &holders]);
    if inside != 1 {
        witness(port, &["INCR", &format!("{ns}:w:overlaps")]);
    }
    let token = fencing_token().expect("fenced").get().to_string();
    witness(port, &["RPUSH", &format!("{ns}:w:tokens"), &token]);
    tokio::time::sleep(Duration::from_millis(1)).await;
    witness(port, &["DECR", &holders]);
    Ok(())
}

/// One section under a permit of a 3-permit semaphore: a witness counts the holders inside and
/// every time a fourth was inside, and logs the permit's token.
#[distributed_lock(key_from = "slot", coordinator = c, name = "proc.permits", permits = 3, lease = "10s", wait = "120s")]
async fn permit_once(c: &Coordinator, slot: u32, port: u16, ns: &str) -> Result<(), ChildError> {
    let holders = format!("{ns}:w:holders");
    if witness(port, &["INCR", &holders]) > 3 {
        witness(port, &["INCR", &format!("{ns}:w:overfull")]);
    }
    witness(port, &["INCR", &format!("{ns}:w:entries")]);
    let token = fencing_token()
        .expect("a permit has a token")
        .get()
        .to_string();
    witness(port, &["SADD", &format!("{ns}:w:tokens"), &token]);
    tokio::time::sleep(Duration::from_millis(2)).await;
    witness(port, &["DECR", &holders]);
    Ok(())
}

#[idempotent(key_from = "order", coordinator = c, name = "proc.charge", wait = "60s")]
async fn charge(c: &Coordinator, order: &str, port: u16, ns: &str) -> Result<String, ChildError> {
    witness(port, &["INCR", &format!("{ns}:w:runs")]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(format!("receipt-by-pid-{}", std::process::id()))
}

#[distributed_lock(key_from = "slot", coordinator = c, name = "proc.hold", lease = "1s", fenced = true, renew = true)]
async fn hold_renewed(c: &Coordinator, slot: u32) -> Result<(), ChildError> {
    println!("ACQUIRED {}", fencing_token().expect("fenced"));
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        println!("TICK");
    }
    Ok(())
}

#[distributed_lock(key_from = "slot", coordinator = c, name = "proc.hold", lease = "1s", fenced = true)]
async fn hold_then_write(c: &Coordinator, slot: u32, url: &str) -> Result<(), ChildError> {
    let token = fencing_token().expect("fenced");
    println!("ACQUIRED {token}");
    // The parent freezes this process here, past the lease.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let client = redis::Client::open(url).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    match write_fenced(&mut conn, "proc:resource", b"from the paused holder", token)
        .await
        .expect("fenced write")
    {
        FencedWrite::Accepted => println!("WRITE accepted"),
        FencedWrite::Rejected { newest } => println!("WRITE rejected newest={newest}"),
    }
    Ok(())
}

async fn child(role: &str) {
    let url = std::env::var("COORD_TEST_URL").expect("COORD_TEST_URL");
    let ns = std::env::var("COORD_TEST_NS").expect("COORD_TEST_NS");
    let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    let provider = RedisProvider::connect(&url).await.expect("connect");
    let c = Coordinator::builder()
        .namespace(ns.clone())
        .provider(provider)
        .build()
        .expect("coordinator");
    match role {
        "contend" => {
            let tasks: Vec<_> = (0..8)
                .map(|_| {
                    let (c, ns) = (c.clone(), ns.clone());
                    tokio::spawn(async move {
                        for _ in 0..8 {
                            contend_once(&c, 1, port, &ns)
                                .await
                                .expect("lock within wait");
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.expect("task");
            }
            println!("DONE");
        }
        "permits" => {
            let tasks: Vec<_> = (0..16)
                .map(|_| {
                    let (c, ns) = (c.clone(), ns.clone());
                    tokio::spawn(async move {
                        for _ in 0..3 {
                            permit_once(&c, 1, port, &ns)
                                .await
                                .expect("a permit within the wait");
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.expect("task");
            }
            println!("DONE");
        }
        "charge" => {
            let receipt = charge(&c, "order-1", port, &ns).await.expect("charge");
            println!("RESULT {receipt}");
        }
        "hold-renewed" => match hold_renewed(&c, 1).await {
            Ok(()) => println!("RESULT finished"),
            Err(ChildError::Coord(CoordError::LockLost { .. })) => println!("RESULT lost"),
            Err(other) => println!("RESULT {other:?}"),
        },
        "wait-queued" => {
            // Stands in the queue of a lock the parent holds; killed there by the parent.
            let key = lock_key(&c, "proc.queue", 1);
            let me = coord_core::provider::OwnerToken::new();
            println!("OWNER {me}");
            let grant = c
                .lock_provider()
                .acquire(coord_core::provider::LockRequest {
                    key: &key,
                    owner: me,
                    lease: Duration::from_secs(30),
                    wait: Duration::from_secs(120),
                    fenced: false,
                })
                .await;
            println!("RESULT {grant:?}");
        }
        "hold-then-write" => {
            let outcome = hold_then_write(&c, 1, &url).await;
            println!("RESULT {}", if outcome.is_ok() { "ok" } else { "err" });
        }
        other => panic!("unknown role {other}"),
    }
}

// ---------------------------------------------------------------- the parent side

/// A child process of this binary in `role`, reaching `server` under namespace `ns`, its
/// stderr kept for [`ChildProcess::finish`].
fn start_player(role: &str, server: &RedisServer, ns: &str) -> ChildProcess {
    let mut command = ChildProcess::of_this_binary(ROLE, role);
    command
        .env("COORD_TEST_URL", server.url())
        .env("COORD_TEST_NS", ns)
        .env("RUST_LOG", "warn")
        .stderr(Stdio::piped());
    ChildProcess::spawn(command)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn parent_coordinator(rt: &tokio::runtime::Runtime, server: &RedisServer, ns: &str) -> Coordinator {
    let provider = rt
        .block_on(RedisProvider::connect(&server.url()))
        .expect("connect");
    Coordinator::builder()
        .namespace(ns)
        .provider(provider)
        .build()
        .expect("coordinator")
}

/// Takes `key` as a fresh owner from the parent, waiting up to 5 s.
fn acquire_from_parent(
    rt: &tokio::runtime::Runtime,
    c: &Coordinator,
    key: &CallKey,
    fenced: bool,
) -> (
    coord_core::provider::OwnerToken,
    Option<coord_core::provider::LockGrant>,
) {
    let me = coord_core::provider::OwnerToken::new();
    let grant = rt
        .block_on(
            c.lock_provider()
                .acquire(coord_core::provider::LockRequest {
                    key,
                    owner: me,
                    lease: Duration::from_secs(30),
                    wait: Duration::from_secs(5),
                    fenced,
                }),
        )
        .expect("acquire");
    (me, grant)
}

fn lock_key(c: &Coordinator, op: &str, slot: u32) -> CallKey {
    c.key(op).part(&slot).finish()
}

/// 4 processes x 8 tasks contend one key: never two holders at once, and fencing tokens
/// strictly increase in the order the holders held the lock.
fn four_processes_never_overlap_and_fence_in_order(server: &RedisServer) {
    let ns = "xproc-lock";
    let players: Vec<ChildProcess> = (0..4)
        .map(|_| start_player("contend", server, ns))
        .collect();
    for p in &players {
        p.expect_line("DONE", Duration::from_secs(240));
    }
    for p in players {
        p.finish(Duration::from_secs(10));
    }
    let overlaps = command_at(server.port(), &["GET", &format!("{ns}:w:overlaps")]).unwrap();
    assert_eq!(overlaps.text(), None, "two holders were inside at once");
    let tokens = command_at(
        server.port(),
        &["LRANGE", &format!("{ns}:w:tokens"), "0", "-1"],
    )
    .unwrap();
    let tokens: Vec<u64> = match tokens {
        coord_redis_testing::Resp::Array(items) => items
            .iter()
            .map(|t| t.text().unwrap().parse().unwrap())
            .collect(),
        other => panic!("tokens list: {other:?}"),
    };
    assert_eq!(
        tokens.len(),
        4 * 8 * 8,
        "every acquisition recorded its token"
    );
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens must strictly increase in holder order"
    );
}

/// 8 processes x 16 tasks share a 3-permit semaphore: the witness never sees a fourth holder,
/// every permit has a token of its own, and no permit is left held after the run.
fn eight_processes_share_three_permits(server: &RedisServer) {
    let ns = "xproc-permits";
    let players: Vec<ChildProcess> = (0..8)
        .map(|_| start_player("permits", server, ns))
        .collect();
    for p in &players {
        p.expect_line("DONE", Duration::from_secs(240));
    }
    for p in players {
        p.finish(Duration::from_secs(10));
    }
    let read = |name: &str| {
        command_at(server.port(), &["GET", &format!("{ns}:w:{name}")])
            .unwrap()
            .text()
    };
    let entries = 8 * 16 * 3;
    assert_eq!(read("overfull"), None, "a fourth holder was inside");
    assert_eq!(read("entries"), Some(entries.to_string()));
    assert_eq!(read("holders"), Some("0".to_owned()));
    let tokens = command_at(server.port(), &["SCARD", &format!("{ns}:w:tokens")])
        .unwrap()
        .int();
    assert_eq!(tokens, Some(entries), "every permit had a token of its own");
    let rt = runtime();
    let c = parent_coordinator(&rt, server, ns);
    let key = lock_key(&c, "proc.permits", 1);
    let permits = format!("{}:sem:{{{}}}", key.namespace(), key.op_key());
    let left = command_at(server.port(), &["ZCARD", &permits])
        .unwrap()
        .int();
    assert_eq!(left, Some(0), "permits left held after the run");
    println!(
        "permits: {entries} sections by 8 processes x 16 tasks, never more than 3 inside, 0 left"
    );
}

/// One idempotent operation called concurrently from 4 processes with one key runs once, and
/// all 4 get the same result.
fn four_processes_charge_once(server: &RedisServer) {
    let ns = "xproc-idem";
    let players: Vec<ChildProcess> = (0..4).map(|_| start_player("charge", server, ns)).collect();
    let results: Vec<String> = players
        .iter()
        .map(|p| p.expect_line("RESULT", Duration::from_secs(60)))
        .collect();
    for p in players {
        p.finish(Duration::from_secs(10));
    }
    assert!(
        results.windows(2).all(|w| w[0] == w[1]),
        "one result for all: {results:?}"
    );
    let runs = command_at(server.port(), &["GET", &format!("{ns}:w:runs")]).unwrap();
    assert_eq!(
        runs.text().as_deref(),
        Some("1"),
        "the body ran exactly once"
    );
}

/// A holder frozen past its lease lets another acquire; when it thaws, its renewal finds the
/// lock gone (or its local clock a whole lease passed) and its body is cancelled.
fn frozen_renewing_holder_is_cancelled_on_resume(server: &RedisServer) {
    let ns = "xproc-freeze";
    let rt = runtime();
    let c = parent_coordinator(&rt, server, ns);
    let holder = start_player("hold-renewed", server, ns);
    holder.expect_line("ACQUIRED", Duration::from_secs(20));
    holder.signal(libc::SIGSTOP);
    let stopped_at = Instant::now();
    let key = lock_key(&c, "proc.hold", 1);
    let (me, grant) = acquire_from_parent(&rt, &c, &key, true);
    assert!(
        grant.is_some(),
        "the frozen holder's lease lapsed and freed the lock"
    );
    assert!(
        stopped_at.elapsed() < Duration::from_secs(1) + Duration::from_secs(1),
        "replaced within lease + 1 s"
    );
    holder.signal(libc::SIGCONT);
    let result = holder.expect_line("RESULT", Duration::from_secs(10));
    assert_eq!(
        result, "RESULT lost",
        "the thawed holder's body is cancelled"
    );
    let stderr = holder.finish(Duration::from_secs(10));
    assert!(
        stderr.contains("lease lost"),
        "the loss is logged: {stderr}"
    );
    rt.block_on(c.lock_provider().release(&key, me)).unwrap();
}

/// Without renewal, a holder frozen past its lease wakes up and writes with its old token: the
/// resource refuses it, and its release is a warned no-op.
fn frozen_unrenewed_holder_is_fenced_off(server: &RedisServer) {
    let ns = "xproc-fence";
    let rt = runtime();
    let c = parent_coordinator(&rt, server, ns);
    let holder = start_player("hold-then-write", server, ns);
    let acquired = holder.expect_line("ACQUIRED", Duration::from_secs(20));
    holder.signal(libc::SIGSTOP);
    let old: u64 = acquired["ACQUIRED ".len()..].parse().unwrap();
    let key = lock_key(&c, "proc.hold", 1);
    let (me, grant) = acquire_from_parent(&rt, &c, &key, true);
    let grant = grant.expect("the frozen holder's lease lapsed");
    let newer = grant.fencing_token.expect("fenced");
    assert!(newer.get() > old, "the successor's token is newer");
    let written = rt.block_on(async {
        let client = redis::Client::open(server.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        write_fenced(&mut conn, "proc:resource", b"from the successor", newer).await
    });
    assert_eq!(written.unwrap(), FencedWrite::Accepted);
    holder.signal(libc::SIGCONT);
    let write = holder.expect_line("WRITE", Duration::from_secs(10));
    assert!(
        write.starts_with("WRITE rejected"),
        "the stale write is refused: {write}"
    );
    holder.expect_line("RESULT", Duration::from_secs(10));
    let stderr = holder.finish(Duration::from_secs(10));
    assert!(
        stderr.contains("not exclusive throughout"),
        "the stale holder's release is a warned no-op: {stderr}"
    );
    let value = command_at(server.port(), &["HGET", "proc:resource", "value"]).unwrap();
    assert_eq!(value.text().as_deref(), Some("from the successor"));
    assert_eq!(
        rt.block_on(c.lock_provider().release(&key, me)).unwrap(),
        coord_core::provider::ReleaseOutcome::Released,
        "the stale release did not free the successor"
    );
}

/// A holder killed with SIGKILL is replaced within lease + 1 s.
fn killed_holder_is_replaced_within_lease_plus_one_second(server: &RedisServer) {
    let ns = "xproc-kill";
    let rt = runtime();
    let c = parent_coordinator(&rt, server, ns);
    let holder = start_player("hold-renewed", server, ns);
    holder.expect_line("ACQUIRED", Duration::from_secs(20));
    holder.signal(libc::SIGKILL);
    let killed_at = Instant::now();
    let key = lock_key(&c, "proc.hold", 1);
    let (me, grant) = acquire_from_parent(&rt, &c, &key, false);
    let replaced_after = killed_at.elapsed();
    assert!(grant.is_some(), "the dead holder's lock frees itself");
    assert!(
        replaced_after < Duration::from_secs(2),
        "replaced within lease (1 s) + 1 s, took {replaced_after:?}"
    );
    rt.block_on(c.lock_provider().release(&key, me)).unwrap();
}

/// A waiter killed with SIGKILL while it stands in a lock's queue is handed the lock by the
/// release (it cannot know it is dead), and skipped once its claim window (1 s) ends: the next
/// waiter holds the lock within the window plus its re-check interval (at most 1 s) and a
/// margin, far within the 30 s lease the dead waiter asked for.
fn killed_waiter_is_skipped_after_its_claim_window(server: &RedisServer) {
    let ns = "xproc-killed-waiter";
    let rt = runtime();
    let c = parent_coordinator(&rt, server, ns);
    let key = lock_key(&c, "proc.queue", 1);
    let queue = format!("{ns}:lock-queue:{{{}}}", key.op_key());
    let lock = format!("{ns}:lock:{{{}}}", key.op_key());
    let (holder, grant) = acquire_from_parent(&rt, &c, &key, false);
    assert!(grant.is_some());
    let child = start_player("wait-queued", server, ns);
    let dead_owner =
        child.expect_line("OWNER ", Duration::from_secs(20))["OWNER ".len()..].to_owned();
    let queued = |n: i64| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while server.command(&["LLEN", &queue]).int() != Some(n) {
            assert!(Instant::now() < deadline, "{n} waiters in the queue");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    queued(1);
    child.signal(libc::SIGKILL);
    drop(child);
    // The next waiter, in the parent, behind the dead one.
    let next = {
        let (c, key) = (c.clone(), key.clone());
        rt.spawn(async move {
            let me = coord_core::provider::OwnerToken::new();
            let grant = c
                .lock_provider()
                .acquire(coord_core::provider::LockRequest {
                    key: &key,
                    owner: me,
                    lease: Duration::from_secs(30),
                    wait: Duration::from_secs(60),
                    fenced: false,
                })
                .await
                .expect("acquire");
            (me, grant, Instant::now())
        })
    };
    queued(2);
    let released_at = Instant::now();
    assert_eq!(
        rt.block_on(c.lock_provider().release(&key, holder))
            .unwrap(),
        coord_core::provider::ReleaseOutcome::Released
    );
    // The release handed the lock to the dead waiter, first in line.
    let held_by = match server.command(&["GET", &lock]) {
        coord_redis_testing::Resp::Bulk(v) => String::from_utf8(v).unwrap(),
        other => panic!("the lock is handed over, not freed: {other:?}"),
    };
    assert_eq!(held_by.trim_end_matches('*'), dead_owner);
    let (me, grant, at) = rt.block_on(next).expect("the next waiter");
    assert!(grant.is_some(), "the next waiter gets the lock");
    let after = at.duration_since(released_at);
    // The window is the server's (PX), so the lower bound is firm; the upper one leaves a
    // loaded host 8 s of margin and still tells the skip from the 30 s lease.
    assert!(
        after >= Duration::from_millis(900) && after < Duration::from_secs(10),
        "skipped after the claim window (1 s) plus at most the re-check (1 s) and a margin, \
         far within the dead waiter's 30 s lease: {after:?}"
    );
    rt.block_on(c.lock_provider().release(&key, me)).unwrap();
}

/// One scenario of this binary, run against the shared server.
fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .init();
        runtime().block_on(child(&role));
        return;
    }
    let server = RedisServer::start();
    run_scenarios(
        "processes",
        &server,
        &[
            (
                "four_processes_never_overlap_and_fence_in_order",
                four_processes_never_overlap_and_fence_in_order,
            ),
            ("four_processes_charge_once", four_processes_charge_once),
            (
                "eight_processes_share_three_permits",
                eight_processes_share_three_permits,
            ),
            (
                "frozen_renewing_holder_is_cancelled_on_resume",
                frozen_renewing_holder_is_cancelled_on_resume,
            ),
            (
                "frozen_unrenewed_holder_is_fenced_off",
                frozen_unrenewed_holder_is_fenced_off,
            ),
            (
                "killed_holder_is_replaced_within_lease_plus_one_second",
                killed_holder_is_replaced_within_lease_plus_one_second,
            ),
            (
                "killed_waiter_is_skipped_after_its_claim_window",
                killed_waiter_is_skipped_after_its_claim_window,
            ),
        ],
    );
}
