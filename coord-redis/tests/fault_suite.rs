//! The fault and load suite: locks and records under process and server faults, with figures.
//!
//! Every case prints one line, `case <name> [<client>]: expected <...>; saw <...>: PASS|FAIL`,
//! and the run ends with `fault_suite: N passed, M failed` (non-zero exit status on failure).
//! `[<client>]` is `redis-rs`, `fred` (with the `fred` feature) or `memory` (the in-process
//! provider, for the cases that apply to it).
//!
//! Two sizes:
//! * short (default, what `cargo test` runs): every case, small sizes;
//! * long: `COORD_FAULT_SUITE=long cargo test -p coord-redis --all-features --test fault_suite`,
//!   8 processes x 16 tasks on hot keys, 10 000 waiters on one key, 1 000 000 records.
//!
//! This binary has its own `main` (`harness = false`). Cases that need several processes
//! re-run this same binary with `COORD_FAULT_ROLE` set to the part the child plays. Overlaps are
//! checked through a log kept on a separate redis-server (the "witness"), which no fault case
//! touches: each holder appends `E <token>` when it enters and `X <token>` when it leaves, and
//! writes the guarded resource with its fencing token.
//!
//! Arguments that do not start with `-` filter cases by substring of `<name> [<client>]`.

use coord_core::CallKey;
use std::panic::AssertUnwindSafe;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::provider::{
    BackendErrorKind, ClaimOutcome, ClaimRequest, CompleteRequest, Fingerprint, IdempotencyStore,
    LockProvider, LockRequest, OwnerToken, ReleaseOutcome,
};
use coord_core::{CoordError, Coordinator, distributed_lock, fencing_token, idempotent};
use coord_history::child_process::ChildProcess;
use coord_redis::fence::{FencedWrite, write_fenced};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::{RedisServer, Resp, SentinelSetup, command_at};
use tokio::sync::Notify;

const ROLE: &str = "COORD_FAULT_ROLE";

// ---------------------------------------------------------------- sizes and reporting

/// How big the load cases are.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    processes: usize,
    tasks: usize,
    iterations: usize,
    hot_keys: u32,
    waiters: usize,
    records: usize,
}

fn long_form() -> bool {
    std::env::var("COORD_FAULT_SUITE").as_deref() == Ok("long")
}

fn sizes() -> Sizes {
    if long_form() {
        Sizes {
            processes: 8,
            tasks: 16,
            iterations: 8,
            hot_keys: 2,
            waiters: 10_000,
            records: 1_000_000,
        }
    } else {
        Sizes {
            processes: 3,
            tasks: 4,
            iterations: 4,
            hot_keys: 2,
            waiters: 500,
            records: 10_000,
        }
    }
}

/// What a case saw, and the promised behaviour it found broken (empty: it passed).
#[derive(Default)]
struct Seen {
    saw: Vec<String>,
    broken: Vec<String>,
}

impl Seen {
    fn note(&mut self, what: impl Into<String>) {
        self.saw.push(what.into());
    }

    /// Records `what` as seen, and as a failure unless `ok`.
    fn check(&mut self, ok: bool, what: impl Into<String>) {
        let what = what.into();
        if !ok {
            self.broken.push(what.clone());
        }
        self.saw.push(what);
    }
}

struct Case {
    name: &'static str,
    label: &'static str,
    expected: String,
    run: Box<dyn FnOnce() -> Seen>,
}

fn case(
    name: &'static str,
    label: &'static str,
    expected: impl Into<String>,
    run: impl FnOnce() -> Seen + 'static,
) -> Case {
    Case {
        name,
        label,
        expected: expected.into(),
        run: Box::new(run),
    }
}

fn label(client: Client) -> &'static str {
    match client {
        Client::RedisRs => "redis-rs",
        #[cfg(feature = "fred")]
        Client::Fred => "fred",
        _ => "other",
    }
}

fn client_named(name: &str) -> Client {
    match name {
        #[cfg(feature = "fred")]
        "fred" => Client::Fred,
        _ => Client::RedisRs,
    }
}

fn clients() -> Vec<Client> {
    vec![
        Client::RedisRs,
        #[cfg(feature = "fred")]
        Client::Fred,
    ]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// The `q`-quantile of sorted samples.
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let at = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

// ---------------------------------------------------------------- shared helpers

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

async fn connect(url: &str, client: Client, timeout: Duration) -> RedisProvider {
    RedisProvider::builder(url)
        .client(client)
        .command_timeout(timeout)
        .connect()
        .await
        .expect("connect to the test server")
}

async fn connect_sentinel(setup: &SentinelSetup, client: Client) -> RedisProvider {
    RedisProvider::sentinel(SentinelSetup::MASTER_NAME, setup.sentinel_urls())
        .client(client)
        .command_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect through Sentinel")
}

fn coordinator(ns: &str, provider: RedisProvider) -> Coordinator {
    Coordinator::builder()
        .namespace(ns)
        .provider(provider)
        .build()
        .expect("coordinator")
}

/// The call key of `op` with one part, as the macros build it.
fn call_key(ns: &str, op: &str, part: u32) -> CallKey {
    CallKey::builder(ns, op).part(&part).finish()
}

/// Where the Redis provider stores `kind` (`lock`, `fence`, `idem`) of a call key (spelled out
/// by hand, so a change of layout fails here).
fn redis_key(call_key: &CallKey, kind: &str) -> String {
    format!("{}:{kind}:{{{}}}", call_key.namespace(), call_key.op_key())
}

fn request(key: &CallKey, owner: OwnerToken, lease: Duration, wait: Duration) -> LockRequest<'_> {
    LockRequest {
        key,
        owner,
        lease,
        wait,
        fenced: false,
    }
}

fn subscribers(server: &RedisServer, channel: &str) -> i64 {
    match command_at(server.port(), &["PUBSUB", "NUMSUB", channel]) {
        Ok(Resp::Array(items)) => items.get(1).and_then(Resp::int).unwrap_or(0),
        _ => 0,
    }
}

async fn until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while !done() {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

fn used_memory(server: &RedisServer) -> i64 {
    let info = server
        .command(&["INFO", "memory"])
        .text()
        .unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO memory reports used_memory")
}

/// A connection to the witness server, where holders log what they did.
#[derive(Clone)]
struct Witness {
    conn: redis::aio::MultiplexedConnection,
    ns: String,
}

impl Witness {
    async fn open(url: &str, ns: &str) -> Witness {
        let client = redis::Client::open(url).expect("witness url");
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the witness");
        Witness {
            conn,
            ns: ns.to_owned(),
        }
    }

    async fn log(&self, slot: u32, event: char, token: u64) {
        let mut conn = self.conn.clone();
        let _: i64 = redis::cmd("RPUSH")
            .arg(format!("{}:log:{slot}", self.ns))
            .arg(format!("{event} {token}"))
            .query_async(&mut conn)
            .await
            .expect("witness log");
    }

    async fn write(&self, slot: u32, value: &str, token: u64) -> FencedWrite {
        let mut conn = self.conn.clone();
        write_fenced(
            &mut conn,
            &format!("{}:resource:{slot}", self.ns),
            value.as_bytes(),
            coord_core::FencingToken::new(token),
        )
        .await
        .expect("witness fenced write")
    }
}

/// What the witness log of the hot-key case says.
#[derive(Debug, Default)]
struct LogCheck {
    sections: usize,
    overlaps: usize,
    out_of_order: usize,
}

/// Reads every slot's log: sections must alternate `E t` / `X t` with the same token, tokens
/// strictly increasing. An `E` while another section is open, or an `X` that is not the open
/// section's, is an overlap.
fn check_log(witness: &RedisServer, ns: &str, slots: u32) -> LogCheck {
    let mut check = LogCheck::default();
    for slot in 0..slots {
        let items = match witness.command(&["LRANGE", &format!("{ns}:log:{slot}"), "0", "-1"]) {
            Resp::Array(items) => items,
            Resp::Nil => Vec::new(),
            other => panic!("witness log: {other:?}"),
        };
        let mut open: Option<u64> = None;
        let mut last: Option<u64> = None;
        for item in items {
            let text = item.text().unwrap_or_default();
            let (event, token) = text.split_once(' ').expect("event and token");
            let token: u64 = token.parse().expect("token");
            match event {
                "E" => {
                    if open.is_some() {
                        check.overlaps += 1;
                    }
                    if last.is_some_and(|l| token <= l) {
                        check.out_of_order += 1;
                    }
                    open = Some(token);
                    last = Some(token);
                }
                _ => {
                    if open != Some(token) {
                        check.overlaps += 1;
                    }
                    open = None;
                    check.sections += 1;
                }
            }
        }
        if open.is_some() {
            check.overlaps += 1;
        }
    }
    check
}

// ---------------------------------------------------------------- child processes

#[distributed_lock(key_from = "slot", coordinator = c, name = "fs.hold", lease = "1s", fenced = true, renew = true)]
async fn hold_renewed(c: &Coordinator, slot: u32) -> Result<(), CoordError> {
    println!("ACQUIRED {}", fencing_token().expect("fenced"));
    for _ in 0..300 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[distributed_lock(key_from = "slot", coordinator = c, name = "fs.hold", lease = "1s", fenced = true)]
async fn hold_then_write(c: &Coordinator, slot: u32, witness: &Witness) -> Result<(), CoordError> {
    let token = fencing_token().expect("fenced");
    println!("ACQUIRED {token}");
    // The parent freezes this process here, past the lease.
    tokio::time::sleep(Duration::from_millis(800)).await;
    match witness
        .write(slot, "from the paused holder", token.get())
        .await
    {
        FencedWrite::Accepted => println!("WRITE accepted"),
        FencedWrite::Rejected { newest } => println!("WRITE rejected newest={newest}"),
    }
    Ok(())
}

/// One section on a hot key: logged on entry and exit, with a fenced write in between that
/// must be accepted (a rejection means a newer holder already wrote: an overlap).
#[distributed_lock(key_from = "slot", coordinator = c, name = "fs.hot", lease = "10s", wait = "600s", fenced = true)]
async fn hot_section(c: &Coordinator, slot: u32, witness: &Witness) -> Result<bool, CoordError> {
    let token = fencing_token().expect("fenced").get();
    witness.log(slot, 'E', token).await;
    let accepted = witness.write(slot, "section", token).await == FencedWrite::Accepted;
    tokio::time::sleep(Duration::from_millis(1)).await;
    witness.log(slot, 'X', token).await;
    Ok(accepted)
}

/// What a run of [`hammer`] did.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    /// Sections run.
    done: usize,
    /// Sections whose fenced write was rejected (a newer holder had written: an overlap).
    rejected: usize,
    /// Calls that failed (not acquired within their wait, backend errors).
    failed: usize,
}

/// Runs `tasks` tasks of `iterations` sections each over `slots` hot keys.
async fn hammer(
    c: &Coordinator,
    witness: &Witness,
    tasks: usize,
    iterations: usize,
    slots: u32,
) -> Tally {
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (c, witness) = (c.clone(), witness.clone());
            tokio::spawn(async move {
                let mut tally = Tally::default();
                for i in 0..iterations {
                    let slot = ((t + i) % slots as usize) as u32;
                    match hot_section(&c, slot, &witness).await {
                        Ok(accepted) => {
                            tally.done += 1;
                            tally.rejected += usize::from(!accepted);
                        }
                        Err(_) => tally.failed += 1,
                    }
                }
                tally
            })
        })
        .collect();
    let mut total = Tally::default();
    for h in handles {
        let t = h.await.unwrap_or(Tally {
            failed: iterations,
            ..Tally::default()
        });
        total.done += t.done;
        total.rejected += t.rejected;
        total.failed += t.failed;
    }
    total
}

/// The part a child process plays, chosen by `COORD_FAULT_ROLE`.
async fn child(role: &str) {
    let url = std::env::var("COORD_FS_URL").expect("COORD_FS_URL");
    let ns = std::env::var("COORD_FS_NS").expect("COORD_FS_NS");
    let client = client_named(&std::env::var("COORD_FS_CLIENT").unwrap_or_default());
    let witness_url = std::env::var("COORD_FS_WITNESS").ok();
    let provider = connect(&url, client, Duration::from_secs(2)).await;
    let c = coordinator(&ns, provider);
    match role {
        "hold-renewed" => match hold_renewed(&c, 1).await {
            Ok(()) => println!("RESULT finished"),
            Err(CoordError::LockLost { cause, .. }) => println!("RESULT lost {cause}"),
            Err(other) => println!("RESULT {other:?}"),
        },
        "hold-then-write" => {
            let witness = Witness::open(&witness_url.expect("witness"), &ns).await;
            let outcome = hold_then_write(&c, 1, &witness).await;
            println!("RESULT {}", if outcome.is_ok() { "ok" } else { "err" });
        }
        "hammer" => {
            let witness = Witness::open(&witness_url.expect("witness"), &ns).await;
            let s = sizes();
            let t = hammer(&c, &witness, s.tasks, s.iterations, s.hot_keys).await;
            println!("DONE {} {} {}", t.done, t.rejected, t.failed);
        }
        other => panic!("unknown role {other}"),
    }
}

/// A child process of this binary in `role`, for `client` on the server at `url` under
/// namespace `ns`, writing to `witness` when given.
fn start_player(
    role: &str,
    url: &str,
    client: Client,
    ns: &str,
    witness: Option<&RedisServer>,
) -> ChildProcess {
    let mut command = ChildProcess::of_this_binary(ROLE, role);
    command
        .env("COORD_FS_URL", url)
        .env("COORD_FS_NS", ns)
        .env("COORD_FS_CLIENT", label(client))
        .env("RUST_LOG", "error")
        .stderr(Stdio::null());
    if let Some(w) = witness {
        command.env("COORD_FS_WITNESS", w.url());
    }
    ChildProcess::spawn(command)
}

// ---------------------------------------------------------------- holder faults (processes)

/// A child holds with renewal; SIGKILL it and time how long until the lock is free again.
fn kill9_holder(client: Client) -> Seen {
    let mut seen = Seen::default();
    let server = RedisServer::start();
    let ns = "fs-kill";
    let holder = start_player("hold-renewed", &server.url(), client, ns, None);
    holder.expect_line("ACQUIRED", Duration::from_secs(20));
    let rt = runtime();
    rt.block_on(async {
        let p = connect(&server.url(), client, Duration::from_secs(2)).await;
        let key = call_key(ns, "fs.hold", 1);
        // The holder renews (lease 1 s): it is still held now.
        let early = p
            .acquire(request(
                &key,
                OwnerToken::new(),
                Duration::from_secs(30),
                Duration::ZERO,
            ))
            .await;
        seen.check(
            matches!(early, Ok(None)),
            format!("held before the kill: {}", matches!(early, Ok(None))),
        );
        holder.signal(libc::SIGKILL);
        let killed_at = Instant::now();
        let me = OwnerToken::new();
        let grant = p
            .acquire(request(
                &key,
                me,
                Duration::from_secs(30),
                Duration::from_secs(10),
            ))
            .await;
        let after = killed_at.elapsed();
        seen.check(
            matches!(grant, Ok(Some(_))),
            format!("successor granted: {}", matches!(grant, Ok(Some(_)))),
        );
        seen.check(
            after < Duration::from_secs(2),
            format!("replaced {} after SIGKILL", ms(after)),
        );
    });
    seen
}

/// A renewing child frozen past its lease: replaced meanwhile, cancelled when thawed.
fn sigstop_renewed_holder(client: Client) -> Seen {
    let mut seen = Seen::default();
    let server = RedisServer::start();
    let ns = "fs-stop-renewed";
    let holder = start_player("hold-renewed", &server.url(), client, ns, None);
    holder.expect_line("ACQUIRED", Duration::from_secs(20));
    holder.signal(libc::SIGSTOP);
    let stopped = Instant::now();
    let rt = runtime();
    rt.block_on(async {
        let p = connect(&server.url(), client, Duration::from_secs(2)).await;
        let key = call_key(ns, "fs.hold", 1);
        let me = OwnerToken::new();
        let grant = p
            .acquire(request(
                &key,
                me,
                Duration::from_secs(30),
                Duration::from_secs(10),
            ))
            .await;
        let after = stopped.elapsed();
        seen.check(
            matches!(grant, Ok(Some(_))),
            format!("successor granted: {}", matches!(grant, Ok(Some(_)))),
        );
        seen.check(
            after < Duration::from_secs(2),
            format!("successor in {} after SIGSTOP", ms(after)),
        );
        holder.signal(libc::SIGCONT);
        let resumed = Instant::now();
        let result = holder.line("RESULT", Duration::from_secs(10));
        let detected = resumed.elapsed();
        seen.check(
            result
                .as_deref()
                .is_some_and(|r| r.starts_with("RESULT lost")),
            format!(
                "resumed body: {} ({} after SIGCONT)",
                result.as_deref().unwrap_or("no result"),
                ms(detected)
            ),
        );
        let still = p.release(&key, me).await;
        seen.check(
            matches!(still, Ok(ReleaseOutcome::Released)),
            format!(
                "successor still held at the end: {}",
                matches!(still, Ok(ReleaseOutcome::Released))
            ),
        );
    });
    seen
}

/// An unrenewed fenced child frozen past its lease: its late write is refused by the fence.
fn sigstop_unrenewed_holder(client: Client) -> Seen {
    let mut seen = Seen::default();
    let server = RedisServer::start();
    let witness = RedisServer::start();
    let ns = "fs-stop-fenced";
    let holder = start_player("hold-then-write", &server.url(), client, ns, Some(&witness));
    let acquired = holder.expect_line("ACQUIRED", Duration::from_secs(20));
    holder.signal(libc::SIGSTOP);
    let old: u64 = acquired["ACQUIRED ".len()..].parse().expect("token");
    let rt = runtime();
    rt.block_on(async {
        let p = connect(&server.url(), client, Duration::from_secs(2)).await;
        let key = call_key(ns, "fs.hold", 1);
        let me = OwnerToken::new();
        let grant = p
            .acquire(LockRequest {
                fenced: true,
                ..request(&key, me, Duration::from_secs(30), Duration::from_secs(10))
            })
            .await
            .expect("acquire")
            .expect("the frozen holder's lease lapsed");
        let newer = grant.fencing_token.expect("fenced").get();
        seen.check(newer > old, format!("tokens {old} then {newer}"));
        let w = Witness::open(&witness.url(), ns).await;
        let first = w.write(1, "from the successor", newer).await;
        seen.check(
            first == FencedWrite::Accepted,
            format!("successor's write {first:?}"),
        );
        holder.signal(libc::SIGCONT);
        let write = holder.line("WRITE", Duration::from_secs(10));
        seen.check(
            write
                .as_deref()
                .is_some_and(|w| w.starts_with("WRITE rejected")),
            format!("stale write: {}", write.as_deref().unwrap_or("none")),
        );
        let value = witness
            .command(&["HGET", &format!("{ns}:resource:1"), "value"])
            .text();
        seen.check(
            value.as_deref() == Some("from the successor"),
            format!("resource keeps {value:?}"),
        );
        let released = p.release(&key, me).await;
        seen.check(
            matches!(released, Ok(ReleaseOutcome::Released)),
            format!(
                "stale release left the successor holding: {}",
                matches!(released, Ok(ReleaseOutcome::Released))
            ),
        );
    });
    seen
}

// ---------------------------------------------------------------- Redis faults

#[derive(Debug, Clone, Copy)]
enum Fault {
    /// SIGSTOP for one second, then SIGCONT.
    Pause,
    /// SIGKILL, one second down, then a fresh server (no persistence) on the same port.
    Restart,
    /// `CLIENT KILL` of every normal and pub/sub connection.
    ClientKill,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Pause => "sigstop",
            Fault::Restart => "restart",
            Fault::ClientKill => "client_kill",
        }
    }

    fn begin(self, server: &mut RedisServer) {
        match self {
            Fault::Pause => server.pause(),
            Fault::Restart => server.kill(),
            Fault::ClientKill => {
                // SKIPME is the default: the connection sending it survives.
                server.command(&["CLIENT", "KILL", "TYPE", "normal"]);
                server.command(&["CLIENT", "KILL", "TYPE", "pubsub"]);
            }
        }
    }

    /// Ends the fault (after the one second it lasts, for pause and restart).
    async fn heal(self, server: &mut RedisServer) {
        match self {
            Fault::Pause => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                server.resume();
            }
            Fault::Restart => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                tokio::task::block_in_place(|| server.restart());
            }
            Fault::ClientKill => {}
        }
    }
}

/// Timeouts and unavailability: what a call may answer while the server is faulted.
fn transient(err: &coord_core::BackendError) -> bool {
    matches!(
        err.kind(),
        BackendErrorKind::Timeout | BackendErrorKind::Unavailable
    )
}

/// After a fault, the provider works again: a fresh key is granted within 10 s of retries.
async fn recovers(p: &RedisProvider, ns: &str) -> Option<Duration> {
    let started = Instant::now();
    let key = call_key(ns, "fs.recover", 0);
    while started.elapsed() < Duration::from_secs(10) {
        let me = OwnerToken::new();
        if let Ok(Some(_)) = p
            .acquire(request(&key, me, Duration::from_secs(30), Duration::ZERO))
            .await
        {
            let _ = p.release(&key, me).await;
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// The raw value at a call key's lock (the holder's token, perhaps with a waiter mark).
fn lock_value(server: &RedisServer, key: &CallKey) -> Option<String> {
    command_at(server.port(), &["GET", &redis_key(key, "lock")])
        .ok()
        .and_then(|r| r.text())
}

/// A waiter queued behind a holder while Redis is faulted, then the holder releases.
fn fault_mid_acquire(client: Client, fault: Fault) -> Seen {
    let mut seen = Seen::default();
    let mut server = RedisServer::start();
    let rt = runtime();
    rt.block_on(async {
        let p = connect(&server.url(), client, Duration::from_millis(500)).await;
        let ns = "fs-acq";
        let key = call_key(ns, "fs.acq", 1);
        let a = OwnerToken::new();
        p.acquire(request(&key, a, Duration::from_secs(2), Duration::ZERO))
            .await
            .expect("acquire")
            .expect("free key");
        let b = OwnerToken::new();
        let waiter = tokio::spawn({
            let (p, key) = (p.clone(), key.clone());
            async move {
                let r = p
                    .acquire(request(
                        &key,
                        b,
                        Duration::from_secs(30),
                        Duration::from_secs(15),
                    ))
                    .await;
                (r, Instant::now())
            }
        });
        let channel = redis_key(&key, "lock");
        let queued = until(Duration::from_secs(5), || {
            subscribers(&server, &channel) >= 1
        })
        .await;
        seen.check(queued, format!("waiter queued: {queued}"));
        fault.begin(&mut server);
        fault.heal(&mut server).await;
        let healed = Instant::now();
        // The first holder releases (after a restart there is nothing left to release).
        for _ in 0..50 {
            if p.release(&key, a).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        match tokio::time::timeout(Duration::from_secs(20), waiter).await {
            Err(_) => seen.check(false, "the waiter hung past its wait"),
            Ok(joined) => {
                let (result, at) = joined.expect("waiter task");
                let took = at.saturating_duration_since(healed);
                match result {
                    Ok(Some(_)) => {
                        let value = lock_value(&server, &key).unwrap_or_default();
                        seen.check(
                            value.starts_with(&b.to_string()),
                            format!(
                                "waiter granted {} after healing; server names it: {}",
                                ms(took),
                                value.starts_with(&b.to_string())
                            ),
                        );
                        seen.check(
                            took < Duration::from_secs(4),
                            "granted within 4 s of healing",
                        );
                        let _ = p.release(&key, b).await;
                    }
                    Ok(None) => seen.check(
                        false,
                        "waiter told the lock stayed held for all of its wait",
                    ),
                    Err(err) => seen.check(
                        transient(&err),
                        format!(
                            "waiter got {:?} error ({} after healing)",
                            err.kind(),
                            ms(took)
                        ),
                    ),
                }
            }
        }
        let back = recovers(&p, ns).await;
        seen.check(
            back.is_some(),
            format!("recovered: {}", back.map(ms).unwrap_or("never".into())),
        );
    });
    seen
}

#[distributed_lock(key_from = "id", coordinator = c, name = "fs.midhold", lease = "3s", renew = true)]
async fn mid_hold_body(c: &Coordinator, id: u32, entered: Arc<Notify>) -> Result<(), CoordError> {
    entered.notify_one();
    tokio::time::sleep(Duration::from_secs(5)).await;
    Ok(())
}

/// A renewing hold while Redis is faulted, with another owner probing for a gap.
fn fault_mid_hold(client: Client, fault: Fault) -> Seen {
    let mut seen = Seen::default();
    let mut server = RedisServer::start();
    let rt = runtime();
    rt.block_on(async {
        let ns = "fs-hold";
        let c = coordinator(
            ns,
            connect(&server.url(), client, Duration::from_millis(500)).await,
        );
        let prober = connect(&server.url(), client, Duration::from_millis(500)).await;
        let entered = Arc::new(Notify::new());
        let call = tokio::spawn({
            let (c, entered) = (c.clone(), entered.clone());
            async move {
                let r = mid_hold_body(&c, 1, entered).await;
                (r, Instant::now())
            }
        });
        entered.notified().await;
        // Another owner tries every 100 ms, so a moment where the lock is free is noticed.
        let key = call_key(ns, "fs.midhold", 1);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let probe = tokio::spawn({
            let (key, stop) = (key.clone(), stop.clone());
            async move {
                while !stop.load(Ordering::SeqCst) {
                    let me = OwnerToken::new();
                    if let Ok(Some(_)) = prober
                        .acquire(request(&key, me, Duration::from_secs(30), Duration::ZERO))
                        .await
                    {
                        return Some(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                None
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        fault.begin(&mut server);
        fault.heal(&mut server).await;
        let healed = Instant::now();
        let joined = tokio::time::timeout(Duration::from_secs(15), call).await;
        stop.store(true, Ordering::SeqCst);
        let probed = probe.await.expect("probe task");
        let Ok(joined) = joined else {
            seen.check(false, "the holder's call hung");
            return;
        };
        let (result, ended) = joined.expect("call task");
        let window = probed
            .map(|g| ended.saturating_duration_since(g))
            .unwrap_or_default();
        match fault {
            Fault::Pause | Fault::ClientKill => {
                seen.check(
                    result.is_ok(),
                    format!(
                        "body finished: {:?}",
                        result.as_ref().map_err(|e| e.to_string())
                    ),
                );
                seen.check(
                    probed.is_none_or(|g| g >= ended),
                    format!(
                        "another owner got in while it held: {} (window {})",
                        probed.is_some_and(|g| g < ended),
                        ms(window)
                    ),
                );
            }
            Fault::Restart => {
                let lost = matches!(result, Err(CoordError::LockLost { .. }));
                let detected = ended.saturating_duration_since(healed);
                seen.check(
                    lost,
                    format!(
                        "body cancelled: {} ({:?}), {} after the restart",
                        lost,
                        result.as_ref().err().map(|e| e.to_string()),
                        ms(detected)
                    ),
                );
                seen.check(
                    detected < Duration::from_secs(4),
                    "loss noticed within lease + 1 s of the restart",
                );
                seen.note(format!(
                    "double-holder window (restart forgot the lock): {}",
                    ms(window)
                ));
            }
        }
        let back = recovers(&fresh_provider(&server, client).await, ns).await;
        seen.check(
            back.is_some(),
            format!("recovered: {}", back.map(ms).unwrap_or("never".into())),
        );
    });
    seen
}

/// A provider of its own (own connections) on `server`, with a 500 ms command timeout.
async fn fresh_provider(server: &RedisServer, client: Client) -> RedisProvider {
    connect(&server.url(), client, Duration::from_millis(500)).await
}

#[distributed_lock(key_from = "id", coordinator = c, name = "fs.midrel", lease = "8s")]
async fn mid_release_body(
    c: &Coordinator,
    id: u32,
    entered: Arc<Notify>,
    go: Arc<Notify>,
) -> Result<(), CoordError> {
    entered.notify_one();
    go.notified().await;
    Ok(())
}

/// The body returns while Redis is faulted, so the release fails or is delayed; the lock
/// must be free soon after healing (the runtime retries the release), not at lease end.
fn fault_mid_release(client: Client, fault: Fault) -> Seen {
    let mut seen = Seen::default();
    let mut server = RedisServer::start();
    let rt = runtime();
    rt.block_on(async {
        let ns = "fs-rel";
        let c = coordinator(
            ns,
            connect(&server.url(), client, Duration::from_millis(500)).await,
        );
        let (entered, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let call = tokio::spawn({
            let (c, entered, go) = (c.clone(), entered.clone(), go.clone());
            async move {
                let r = mid_release_body(&c, 1, entered, go).await;
                (r, Instant::now())
            }
        });
        entered.notified().await;
        fault.begin(&mut server);
        let released_at = Instant::now();
        go.notify_one();
        let joined = tokio::time::timeout(Duration::from_secs(10), call).await;
        match joined {
            Err(_) => seen.check(false, "the call hung in its release"),
            Ok(j) => {
                let (result, at) = j.expect("call task");
                let took = at.saturating_duration_since(released_at);
                seen.check(
                    result.is_ok(),
                    format!(
                        "call returned {:?} in {}",
                        result.as_ref().map_err(|e| e.to_string()),
                        ms(took)
                    ),
                );
                seen.check(
                    took < Duration::from_secs(3),
                    "the release did not hold the call up past the command timeout",
                );
            }
        }
        fault.heal(&mut server).await;
        let healed = Instant::now();
        let p = fresh_provider(&server, client).await;
        let key = call_key(ns, "fs.midrel", 1);
        let me = OwnerToken::new();
        let grant = p
            .acquire(request(
                &key,
                me,
                Duration::from_secs(30),
                Duration::from_secs(12),
            ))
            .await;
        let after = healed.elapsed();
        seen.check(
            matches!(grant, Ok(Some(_))),
            format!("next owner granted: {}", matches!(grant, Ok(Some(_)))),
        );
        seen.check(
            after < Duration::from_secs(4),
            format!(
                "{} after healing (the 8 s lease would free it only ~7 s later)",
                ms(after)
            ),
        );
    });
    seen
}

// ---------------------------------------------------------------- slow and full servers

#[distributed_lock(key_from = "id", coordinator = c, name = "fs.slowlock", lease = "30s")]
async fn slow_lock(c: &Coordinator, id: u32) -> Result<(), CoordError> {
    Ok(())
}

#[idempotent(key_from = "order", coordinator = c, name = "fs.slowcharge", wait = "10s")]
async fn slow_charge(
    c: &Coordinator,
    order: u32,
    runs: Arc<AtomicUsize>,
    slow_port: u16,
) -> Result<u32, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    if slow_port != 0 {
        // The server turns slow just as the body returns: the completion write is late.
        start_slow(slow_port, "1.5");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(order * 10)
}

/// `DEBUG SLEEP seconds` from another thread: the server answers nothing meanwhile, then
/// executes every queued command.
fn start_slow(port: u16, seconds: &'static str) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let _ = command_at(port, &["DEBUG", "SLEEP", seconds]);
    })
}

/// A server that answers after the client's timeout: what landed late must not linger or be
/// lost.
fn slow_server(client: Client) -> Seen {
    let mut seen = Seen::default();
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let rt = runtime();
    rt.block_on(async {
        let ns = "fs-slow";
        let timeout = Duration::from_millis(300);
        let c = coordinator(ns, connect(&server.url(), client, timeout).await);
        let p = connect(&server.url(), client, Duration::from_secs(5)).await;
        // Warm up the scripts and connections.
        slow_lock(&c, 0).await.expect("warm up");

        // A lock whose acquire lands after the caller gave up.
        let sleeper = start_slow(server.port(), "1.5");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let started = Instant::now();
        let result = slow_lock(&c, 1).await;
        let took = started.elapsed();
        seen.check(
            matches!(&result, Err(CoordError::Backend(e)) if e.kind() == BackendErrorKind::Timeout),
            format!(
                "lock call: {:?} after {}",
                result.as_ref().map_err(|e| e.to_string()),
                ms(took)
            ),
        );
        seen.check(
            took < timeout + Duration::from_secs(1),
            "failed within the command timeout + 1 s",
        );
        tokio::task::block_in_place(|| sleeper.join().expect("sleeper"));
        let after_slow = Instant::now();
        let key = call_key(ns, "fs.slowlock", 1);
        let me = OwnerToken::new();
        let grant = p
            .acquire(request(
                &key,
                me,
                Duration::from_secs(30),
                Duration::from_secs(10),
            ))
            .await;
        let freed = after_slow.elapsed();
        seen.check(
            matches!(grant, Ok(Some(_))) && freed < Duration::from_secs(3),
            format!(
                "the late-landing lock was released {} after the server caught up (lease 30 s)",
                ms(freed)
            ),
        );

        // A claim that lands late: the body must not be lost nor run twice.
        let runs = Arc::new(AtomicUsize::new(0));
        let sleeper = start_slow(server.port(), "1.5");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let first = slow_charge(&c, 1, runs.clone(), 0).await;
        seen.check(
            matches!(&first, Err(CoordError::Backend(e)) if e.kind() == BackendErrorKind::Timeout),
            format!(
                "idempotent call while slow: {:?}",
                first.as_ref().map_err(|e| e.to_string())
            ),
        );
        tokio::task::block_in_place(|| sleeper.join().expect("sleeper"));
        let retried = retry_charge(&c, 1, &runs).await;
        seen.check(retried == Some(10), format!("retry after: {retried:?}"));
        seen.check(
            runs.load(Ordering::SeqCst) == 1,
            format!("body ran {} time(s)", runs.load(Ordering::SeqCst)),
        );

        // A completion that lands late: the duplicate replays it.
        let runs = Arc::new(AtomicUsize::new(0));
        let first = slow_charge(&c, 2, runs.clone(), server.port()).await;
        seen.note(format!(
            "call whose completion was slow: {:?}",
            first.as_ref().map_err(|e| e.to_string())
        ));
        tokio::time::sleep(Duration::from_millis(1600)).await;
        let again = retry_charge(&c, 2, &runs).await;
        let lost = runs.load(Ordering::SeqCst) != 1;
        seen.check(
            again == Some(20) && !lost,
            format!(
                "duplicate got {again:?}; body ran {} time(s); lost outcomes {}",
                runs.load(Ordering::SeqCst),
                u8::from(lost)
            ),
        );
    });
    seen
}

/// Calls `slow_charge` until it stops reporting a transient state (in flight, backend), at
/// most 10 s.
async fn retry_charge(c: &Coordinator, order: u32, runs: &Arc<AtomicUsize>) -> Option<u32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        match slow_charge(c, order, runs.clone(), 0).await {
            Ok(v) => return Some(v),
            Err(CoordError::InFlight { .. }) | Err(CoordError::Backend(_)) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(_) => return None,
        }
    }
    None
}

/// A server over `maxmemory` with `noeviction`.
fn full_server(client: Client) -> Seen {
    let mut seen = Seen::default();
    let server =
        RedisServer::start_with(&["--maxmemory", "8mb", "--maxmemory-policy", "noeviction"]);
    let rt = runtime();
    rt.block_on(async {
        let p = connect(&server.url(), client, Duration::from_secs(2)).await;
        let held = call_key("fs-full", "fs.full", 1);
        let a = OwnerToken::new();
        p.acquire(request(&held, a, Duration::from_secs(60), Duration::ZERO))
            .await
            .expect("acquire")
            .expect("free");
        let record = call_key("fs-full", "fs.rec", 1);
        let claimed = p.claim(claim(&record, a)).await.expect("claim");
        assert_eq!(claimed, ClaimOutcome::Claimed);
        // Fill the server, then lower `maxmemory` below what it uses: every write is refused
        // from then on, however small (filling up to the limit alone leaves room for small
        // writes whenever a connection's buffers are freed).
        let filler = "x".repeat(100_000);
        for i in 0..20 {
            server.command(&["SET", &format!("filler:{i}"), &filler]);
        }
        let used = used_memory(&server);
        let limit = (used - 1_000_000).to_string();
        server.command(&["CONFIG", "SET", "maxmemory", &limit]);
        let probe = server.command(&["SET", "probe", "1"]);
        seen.check(
            matches!(&probe, Resp::Error(e) if e.starts_with("OOM")),
            format!("server full ({used} B used, maxmemory {limit} B): a plain SET gets {probe:?}"),
        );
        let key = call_key("fs-full", "fs.full", 2);
        let b = OwnerToken::new();
        let plain = p
            .acquire(request(&key, b, Duration::from_secs(60), Duration::ZERO))
            .await;
        seen.check(
            matches!(&plain, Err(e) if e.kind() == BackendErrorKind::OutOfMemory),
            format!("acquire: {:?}", plain.as_ref().map_err(|e| e.kind())),
        );
        let fenced = p
            .acquire(LockRequest {
                fenced: true,
                ..request(&key, b, Duration::from_secs(60), Duration::ZERO)
            })
            .await;
        seen.check(
            matches!(&fenced, Err(e) if e.kind() == BackendErrorKind::OutOfMemory),
            format!(
                "fenced acquire: {:?}",
                fenced.as_ref().map_err(|e| e.kind())
            ),
        );
        let waiting = p
            .acquire(request(
                &key,
                b,
                Duration::from_secs(60),
                Duration::from_secs(1),
            ))
            .await;
        seen.check(
            matches!(&waiting, Err(e) if e.kind() == BackendErrorKind::OutOfMemory),
            format!(
                "waiting acquire: {:?}",
                waiting.as_ref().map_err(|e| e.kind())
            ),
        );
        seen.check(
            lock_value(&server, &key).is_none(),
            "nothing written for the refused lock",
        );
        let other = call_key("fs-full", "fs.rec", 2);
        let c2 = p.claim(claim(&other, b)).await;
        seen.check(
            matches!(&c2, Err(e) if e.kind() == BackendErrorKind::OutOfMemory),
            format!("claim: {:?}", c2.as_ref().map_err(|e| e.kind())),
        );
        let done = p
            .complete(CompleteRequest {
                key: &record,
                owner: a,
                payload: Arc::from(&b"receipt"[..]),
                retention: Duration::from_secs(60),
                fingerprint: None,
            })
            .await;
        seen.note(format!(
            "completion of a claimed record: {:?}",
            done.as_ref().map_err(|e| e.kind())
        ));
        if let Ok(outcome) = done {
            // Whatever it says must be true.
            let now = p.claim(claim(&record, OwnerToken::new())).await;
            seen.check(
                !outcome.is_stored() || matches!(now, Ok(ClaimOutcome::Completed { .. })),
                "a completion reported stored is stored",
            );
        } else {
            seen.check(
                matches!(&done, Err(e) if e.kind() == BackendErrorKind::OutOfMemory),
                "a refused completion is OutOfMemory",
            );
        }
        let released = p.release(&held, a).await;
        seen.check(
            matches!(released, Ok(ReleaseOutcome::Released)),
            format!(
                "release while full: {:?}",
                released.as_ref().map_err(|e| e.kind())
            ),
        );
        for i in 0..20 {
            server.command(&["DEL", &format!("filler:{i}")]);
        }
        server.command(&["CONFIG", "SET", "maxmemory", "0"]);
        let after = p
            .acquire(request(&key, b, Duration::from_secs(60), Duration::ZERO))
            .await;
        seen.check(
            matches!(after, Ok(Some(_))),
            format!(
                "acquire after freeing memory: {:?}",
                after.as_ref().map(|g| g.is_some()).map_err(|e| e.kind())
            ),
        );
    });
    seen
}

/// A fingerprinted claim with a 60 s in-flight lease.
fn claim(key: &CallKey, owner: OwnerToken) -> ClaimRequest<'_> {
    ClaimRequest {
        key,
        owner,
        in_flight_lease: Duration::from_secs(60),
        fingerprint: Some(Fingerprint([7; 16])),
        keep_abandoned_for: None,
        transactional: false,
    }
}

// ---------------------------------------------------------------- Sentinel failover

#[distributed_lock(key_from = "id", coordinator = c, name = "fs.failover", lease = "10s", renew = true, fenced = true)]
async fn failover_hold(
    c: &Coordinator,
    id: u32,
    token: Arc<std::sync::Mutex<Option<u64>>>,
    entered: Arc<Notify>,
) -> Result<(), CoordError> {
    *token.lock().unwrap() = Some(fencing_token().expect("fenced").get());
    entered.notify_one();
    tokio::time::sleep(Duration::from_secs(25)).await;
    Ok(())
}

/// A Sentinel failover that loses a held lock: measures how long two owners both believed
/// they held it, and checks the fence refuses the older one.
fn sentinel_failover(client: Client) -> Seen {
    let mut seen = Seen::default();
    let mut setup = SentinelSetup::start();
    let witness = RedisServer::start();
    let rt = runtime();
    rt.block_on(async {
        let ns = "fs-failover";
        let a = coordinator(ns, connect_sentinel(&setup, client).await);
        let b = connect_sentinel(&setup, client).await;
        let key = call_key(ns, "fs.failover", 1);
        // Point the replica at a dead port just before the acquire, then crash the master
        // right after it: the lock is written on the master only, exactly what a failover
        // that loses the latest writes of asynchronous replication looks like. (Sentinel
        // would point the replica back only after its failover timeout, 10 s; the failover
        // happens before.)
        let dead = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port()
            .to_string();
        let token = Arc::new(std::sync::Mutex::new(None));
        let entered = Arc::new(Notify::new());
        let redirected = setup.replica().command(&["REPLICAOF", "127.0.0.1", &dead]);
        assert_eq!(redirected, Resp::Simple("OK".into()), "REPLICAOF");
        let call = tokio::spawn({
            let (a, token, entered) = (a.clone(), token.clone(), entered.clone());
            async move {
                let r = failover_hold(&a, 1, token, entered).await;
                (r, Instant::now())
            }
        });
        entered.notified().await;
        tokio::task::block_in_place(|| setup.crash_master());
        let crashed = Instant::now();
        let ta = token.lock().unwrap().expect("token");
        let replicated = setup
            .replica()
            .command(&["EXISTS", &redis_key(&key, "lock")])
            == Resp::Int(1);
        seen.note(format!("lock on the replica at the crash: {replicated}"));
        // B tries until granted.
        let me = OwnerToken::new();
        let mut b_grant = None;
        while crashed.elapsed() < Duration::from_secs(60) {
            match b
                .acquire(LockRequest {
                    fenced: true,
                    ..request(&key, me, Duration::from_secs(30), Duration::from_secs(1))
                })
                .await
            {
                Ok(Some(g)) => {
                    b_grant = Some((Instant::now(), g.fencing_token.expect("fenced").get()));
                    break;
                }
                Ok(None) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        let promoted = tokio::task::block_in_place(|| setup.await_promotion());
        seen.note(format!("promoted port {promoted}"));
        let Some((b_at, tb)) = b_grant else {
            seen.check(
                false,
                "the second owner was never granted after the failover",
            );
            return;
        };
        seen.note(format!(
            "second owner granted {} after the crash",
            ms(b_at - crashed)
        ));
        let joined = tokio::time::timeout(Duration::from_secs(40), call).await;
        let Ok(joined) = joined else {
            seen.check(false, "the first holder's call hung");
            return;
        };
        let (result, a_end) = joined.expect("call task");
        seen.note(format!(
            "first holder: {}",
            match &result {
                Ok(()) => "finished".to_string(),
                Err(e) => e.to_string(),
            }
        ));
        seen.check(
            replicated || matches!(result, Err(CoordError::LockLost { .. })),
            format!(
                "first holder told of its loss {} after the crash",
                ms(a_end - crashed)
            ),
        );
        let window = a_end.saturating_duration_since(b_at);
        seen.note(format!("double-holder window {}", ms(window)));
        seen.check(tb > ta, format!("tokens {ta} then {tb}"));
        let w = Witness::open(&witness.url(), ns).await;
        let newer = w.write(1, "second owner", tb).await;
        let stale = w.write(1, "first owner, stale", ta).await;
        seen.check(
            newer == FencedWrite::Accepted,
            format!("second owner's write {newer:?}"),
        );
        seen.check(
            matches!(stale, FencedWrite::Rejected { .. }),
            format!("stale write {stale:?}"),
        );
        seen.check(
            window < Duration::from_secs(11),
            "the window is bounded by the first holder's lease (10 s) + 1 s",
        );
    });
    seen
}

// ---------------------------------------------------------------- load

/// Child processes hammer a few hot keys; the witness log is checked afterwards.
fn hot_keys_processes(client: Client) -> Seen {
    let mut seen = Seen::default();
    let s = sizes();
    let server = RedisServer::start();
    let witness = RedisServer::start();
    let ns = format!("fs-hot-{}", label(client));
    let started = Instant::now();
    let players: Vec<ChildProcess> = (0..s.processes)
        .map(|_| start_player("hammer", &server.url(), client, &ns, Some(&witness)))
        .collect();
    let (mut rejected, mut failed) = (0, 0);
    for p in &players {
        match p.line("DONE", Duration::from_secs(600)) {
            Some(line) => {
                let parts: Vec<usize> = line
                    .split(' ')
                    .skip(1)
                    .filter_map(|v| v.parse().ok())
                    .collect();
                rejected += parts.get(1).copied().unwrap_or(0);
                failed += parts.get(2).copied().unwrap_or(0);
            }
            None => seen.check(false, "a process did not finish"),
        }
    }
    drop(players);
    let took = started.elapsed();
    let log = check_log(&witness, &ns, s.hot_keys);
    let want = s.processes * s.tasks * s.iterations;
    seen.check(
        log.sections == want,
        format!(
            "{} of {want} sections logged in {:.1} s",
            log.sections,
            took.as_secs_f64()
        ),
    );
    seen.check(log.overlaps == 0, format!("{} overlaps", log.overlaps));
    seen.check(
        log.out_of_order == 0,
        format!("{} tokens out of order", log.out_of_order),
    );
    seen.check(rejected == 0, format!("{rejected} fenced writes rejected"));
    seen.check(failed == 0, format!("{failed} calls failed"));
    seen
}

/// The hot-key load on the in-process provider (tasks of this process).
fn hot_keys_memory() -> Seen {
    let mut seen = Seen::default();
    let s = sizes();
    let witness = RedisServer::start();
    let ns = "fs-hot-memory";
    let rt = runtime();
    let started = Instant::now();
    let tally = rt.block_on(async {
        let c = Coordinator::builder()
            .namespace(ns)
            .memory()
            .build()
            .expect("coordinator");
        let w = Witness::open(&witness.url(), ns).await;
        hammer(&c, &w, s.processes * s.tasks, s.iterations, s.hot_keys).await
    });
    let log = check_log(&witness, ns, s.hot_keys);
    seen.check(
        log.sections == tally.done && tally.done == s.processes * s.tasks * s.iterations,
        format!(
            "{} sections in {:.1} s",
            log.sections,
            started.elapsed().as_secs_f64()
        ),
    );
    seen.check(log.overlaps == 0, format!("{} overlaps", log.overlaps));
    seen.check(
        log.out_of_order == 0,
        format!("{} tokens out of order", log.out_of_order),
    );
    seen.check(
        tally.rejected == 0,
        format!("{} fenced writes rejected", tally.rejected),
    );
    seen.check(tally.failed == 0, format!("{} calls failed", tally.failed));
    seen
}

/// `n` waiters on one key: every one served, no two holding at once; hand-off latency from a
/// release being sent to the next grant.
async fn waiters(
    p: Arc<dyn LockProvider>,
    key: &CallKey,
    n: usize,
    seen: &mut Seen,
    queued: impl FnMut() -> bool,
) {
    let holder = OwnerToken::new();
    p.acquire(request(
        key,
        holder,
        Duration::from_secs(600),
        Duration::ZERO,
    ))
    .await
    .expect("acquire")
    .expect("free");
    // Each failed waiter: what it got, and when.
    let failures = Arc::new(std::sync::Mutex::new(Vec::<(String, Instant)>::new()));
    let started = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let (p, key, failures) = (p.clone(), key.to_owned(), failures.clone());
            let started = started.clone();
            tokio::spawn(async move {
                let me = OwnerToken::new();
                started.fetch_add(1, Ordering::SeqCst);
                match p
                    .acquire(request(
                        &key,
                        me,
                        Duration::from_secs(60),
                        Duration::from_secs(1800),
                    ))
                    .await
                {
                    Ok(Some(_)) => {
                        let granted = Instant::now();
                        let releasing = Instant::now();
                        let _ = p.release(&key, me).await;
                        Some((granted, releasing))
                    }
                    other => {
                        let what = match other {
                            Ok(_) => "not granted within its wait".to_owned(),
                            Err(e) => format!("{:?}: {}", e.kind(), e.message()),
                        };
                        failures.lock().unwrap().push((what, Instant::now()));
                        None
                    }
                }
            })
        })
        .collect();
    // Release only once every waiter has made its first attempt, so the hand-offs measure
    // queued waiters being woken, not the burst of first attempts.
    let mut queued = queued;
    let all_queued = until(Duration::from_secs(120), || {
        started.load(Ordering::SeqCst) == n && queued()
    })
    .await;
    seen.check(
        all_queued,
        format!("every waiter queued before the first release: {all_queued}"),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start = Instant::now();
    p.release(key, holder).await.expect("release");
    let mut spans = Vec::with_capacity(n);
    for h in handles {
        if let Some(span) = h.await.expect("waiter task") {
            spans.push(span);
        }
    }
    let total = start.elapsed();
    spans.sort();
    let mut handoffs = Vec::with_capacity(n);
    let mut overlaps = 0;
    let mut previous_release = start;
    for &(granted, releasing) in &spans {
        if granted < previous_release {
            overlaps += 1;
        }
        handoffs.push(granted.saturating_duration_since(previous_release));
        previous_release = releasing;
    }
    // Hand-off #0 starts at the holder's release, sent just after the last first attempt
    // while the client may still be busy with the waiters' follow-up commands: reported on
    // its own. The others are one waiter's release to the next one's grant.
    let first = handoffs.first().copied().unwrap_or_default();
    let mut rest: Vec<Duration> = handoffs.iter().skip(1).copied().collect();
    let slowest_at = rest
        .iter()
        .enumerate()
        .max_by_key(|(_, h)| **h)
        .map_or(0, |(i, _)| i + 1);
    rest.sort();
    seen.check(
        spans.len() == n,
        format!(
            "{} of {n} served ({})",
            spans.len(),
            describe_failures(&failures.lock().unwrap(), start)
        ),
    );
    seen.check(overlaps == 0, format!("{overlaps} overlaps"));
    // A hand-off near a second is the backstop timer, not a wake-up: count them.
    let slow = rest
        .iter()
        .filter(|h| **h > Duration::from_millis(100))
        .count();
    seen.note(format!(
        "total {:.2} s, {:.0} grants/s; first hand-off {}; the other {} hand-offs p50 {} p90 {} p99 {} max {} (#{slowest_at}), {slow} over 100 ms",
        total.as_secs_f64(),
        n as f64 / total.as_secs_f64(),
        ms(first),
        rest.len(),
        ms(quantile(&rest, 0.5)),
        ms(quantile(&rest, 0.9)),
        ms(quantile(&rest, 0.99)),
        ms(quantile(&rest, 1.0)),
    ));
}

/// "none failed", or how many failed with what (first message of each kind), and how many of
/// them before `start`.
fn describe_failures(failures: &[(String, Instant)], start: Instant) -> String {
    if failures.is_empty() {
        return "none failed".into();
    }
    let mut kinds: std::collections::BTreeMap<&str, (usize, &str)> = Default::default();
    for (what, _) in failures {
        let kind = what.split(':').next().unwrap_or(what);
        kinds.entry(kind).or_insert((0, what)).0 += 1;
    }
    let early = failures.iter().filter(|(_, at)| *at < start).count();
    let listed: Vec<String> = kinds
        .values()
        .map(|(count, first)| format!("{count} x {first}"))
        .collect();
    format!(
        "{} failed, {early} of them before the first release: {}",
        failures.len(),
        listed.join(" | ")
    )
}

/// [`waiters`] against a fresh Redis server.
fn waiters_redis(client: Client) -> Seen {
    let mut seen = Seen::default();
    let server = RedisServer::start();
    let rt = runtime();
    rt.block_on(async {
        // The case measures hand-off, not timeouts: a burst of thousands of first attempts
        // queues inside the client, and that queueing counts against the command timeout
        // (with 2 s, fred on two loaded cores timed out thousands of first attempts, and a
        // waiter whose command times out returns the error instead of waiting on).
        let p: Arc<dyn LockProvider> =
            Arc::new(connect(&server.url(), client, Duration::from_secs(15)).await);
        waiters(
            p,
            &call_key("fs-wait", "fs.wait", 1),
            sizes().waiters,
            &mut seen,
            // The first waiter makes a first attempt (`SET .. NX`) and, once subscribed, a
            // retry (`EVALSHA`); a waiter that finds others of its process waiting queues
            // behind them in its first poll, without a command (waiters that started before
            // the first had queued make a first attempt too, covered by the pause after this).
            || server.command_calls().get("evalsha").copied().unwrap_or(0) >= 1,
        )
        .await;
    });
    seen
}

/// [`waiters`] on the in-process provider.
fn waiters_memory() -> Seen {
    let mut seen = Seen::default();
    let rt = runtime();
    rt.block_on(async {
        let c = Coordinator::builder()
            .namespace("fs-wait")
            .memory()
            .build()
            .expect("coordinator");
        waiters(
            c.lock_provider().clone(),
            &call_key("fs-wait", "fs.wait", 1),
            sizes().waiters,
            &mut seen,
            // An in-process first attempt completes within the task's first poll.
            || true,
        )
        .await;
    });
    seen
}

/// Redis `used_memory` growth per fenced lock and per completed record.
fn memory_per_record(client: Client) -> Seen {
    let mut seen = Seen::default();
    let n = sizes().records;
    let server = RedisServer::start();
    let rt = runtime();
    rt.block_on(async {
        let p = Arc::new(connect(&server.url(), client, Duration::from_secs(5)).await);
        // A realistic outcome: a small JSON receipt as the codec would store it.
        let payload: Arc<[u8]> = Arc::from(
            &br#"{"receipt":"rcpt_4f1c2a9e7b","amount_cents":129900,"currency":"EUR","status":"captured","at":"2026-12-03T07:00:00Z"}"#[..],
        );
        let base = used_memory(&server);
        let started = Instant::now();
        let lanes = p.clone();
        let locks_ok = run_chunked(n, move |i| {
            let p = lanes.clone();
            async move {
                let key = call_key("fs-mem", "orders.lock", i as u32);
                let grant = p
                    .acquire(LockRequest { fenced: true, ..request(&key, OwnerToken::new(), Duration::from_secs(3600), Duration::ZERO) })
                    .await;
                matches!(grant, Ok(Some(_)))
            }
        })
        .await;
        seen.check(locks_ok, "every lock granted");
        let after_locks = used_memory(&server);
        let (lanes, stored) = (p.clone(), payload.clone());
        let records_ok = run_chunked(n, move |i| {
            let (p, payload) = (lanes.clone(), stored.clone());
            async move {
                let key = call_key("fs-mem", "orders.charge", i as u32);
                let owner = OwnerToken::new();
                let claimed = matches!(p.claim(claim(&key, owner)).await, Ok(ClaimOutcome::Claimed));
                let stored = p
                    .complete(CompleteRequest {
                        key: &key,
                        owner,
                        payload,
                        retention: Duration::from_secs(3600),
                        fingerprint: Some(Fingerprint([7; 16])),
                    })
                    .await;
                claimed && stored.is_ok_and(|o| o.is_stored())
            }
        })
        .await;
        seen.check(records_ok, "every record stored");
        let after_records = used_memory(&server);
        let took = started.elapsed();
        let per_lock = (after_locks - base) as f64 / n as f64;
        let per_record = (after_records - after_locks) as f64 / n as f64;
        let keys = server.command(&["DBSIZE"]).int().unwrap_or(0);
        seen.check(keys == 3 * n as i64, format!("{keys} keys for {n} fenced locks (lock + fence) and {n} records"));
        seen.check(
            per_lock < 512.0 && per_record < 1024.0,
            format!(
                "{per_lock:.0} B per fenced lock, {per_record:.0} B per completed record ({} B payload); {per_record:.0} MB per 1 M records; built in {:.1} s",
                payload.len(),
                took.as_secs_f64()
            ),
        );
        let sample = p.claim(claim(&call_key("fs-mem", "orders.charge", 7), OwnerToken::new())).await;
        seen.check(
            matches!(&sample, Ok(ClaimOutcome::Completed { payload: got, .. }) if **got == *payload),
            "a stored record replays its payload",
        );
    });
    seen
}

/// Runs `op(i)` for `i` in `0..n`, 64 at a time; true when every one answered true.
async fn run_chunked<F, Fut>(n: usize, op: F) -> bool
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = bool> + Send + 'static,
{
    const LANES: usize = 64;
    let handles: Vec<_> = (0..LANES)
        .map(|lane| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut all = true;
                let mut i = lane;
                while i < n {
                    all &= op(i).await;
                    i += LANES;
                }
                all
            })
        })
        .collect();
    let mut all = true;
    for h in handles {
        all &= h.await.unwrap_or(false);
    }
    all
}

// ---------------------------------------------------------------- the suite

/// Every case of the suite, in the order they run.
fn cases() -> Vec<Case> {
    let s = sizes();
    let mut cases = Vec::new();
    for client in clients() {
        let l = label(client);
        cases.push(case(
            "kill9_holder",
            l,
            "a renewing holder (lease 1 s) killed with SIGKILL is replaced within lease + 1 s",
            move || kill9_holder(client),
        ));
        cases.push(case(
            "sigstop_renewing_holder_past_lease",
            l,
            "a renewing holder frozen past its 1 s lease is replaced within lease + 1 s; resumed, its body is cancelled (LockLost) and the successor keeps the lock",
            move || sigstop_renewed_holder(client),
        ));
        cases.push(case(
            "sigstop_fenced_holder_past_lease",
            l,
            "an unrenewed fenced holder frozen past its lease: the successor's token is newer, the resumed holder's write is rejected, its release frees nothing",
            move || sigstop_unrenewed_holder(client),
        ));
        for fault in [Fault::Pause, Fault::Restart, Fault::ClientKill] {
            let name: &'static str = match fault {
                Fault::Pause => "redis_sigstop_mid_acquire",
                Fault::Restart => "redis_restart_mid_acquire",
                Fault::ClientKill => "redis_client_kill_mid_acquire",
            };
            cases.push(case(
                name,
                l,
                format!("a queued waiter through a Redis {} (1 s): granted within 4 s of healing (and named holder), or a timeout/unavailable error; never a hang or a false \"held for the whole wait\"; the provider recovers", fault.name()),
                move || fault_mid_acquire(client, fault),
            ));
            let (name, expected): (&'static str, &str) = match fault {
                Fault::Pause => (
                    "redis_sigstop_mid_hold",
                    "a renewing hold (lease 3 s) through a 1 s Redis freeze: the body finishes, nobody else gets in",
                ),
                Fault::Restart => (
                    "redis_restart_mid_hold",
                    "a renewing hold (lease 3 s) through a Redis restart without persistence: the lock is forgotten, the body is cancelled (LockLost) within lease + 1 s; the double-holder window is reported",
                ),
                Fault::ClientKill => (
                    "redis_client_kill_mid_hold",
                    "a renewing hold (lease 3 s) whose connections are killed: it reconnects, the body finishes, nobody else gets in",
                ),
            };
            cases.push(case(name, l, expected, move || {
                fault_mid_hold(client, fault)
            }));
            let name: &'static str = match fault {
                Fault::Pause => "redis_sigstop_mid_release",
                Fault::Restart => "redis_restart_mid_release",
                Fault::ClientKill => "redis_client_kill_mid_release",
            };
            cases.push(case(
                name,
                l,
                format!("a release during a Redis {}: the call returns Ok within 3 s, and the lock (lease 8 s) is free within 4 s of healing, not at lease end", fault.name()),
                move || fault_mid_release(client, fault),
            ));
        }
        cases.push(case(
            "slow_server",
            l,
            "with replies 1.5 s late (DEBUG SLEEP) and a 300 ms command timeout: calls fail with Timeout within 1.3 s; a lock that landed late is released within 3 s after, not at its 30 s lease; an idempotent body runs once and its outcome is not lost",
            move || slow_server(client),
        ));
        cases.push(case(
            "full_server",
            l,
            "maxmemory + noeviction, full: acquires and claims fail with OutOfMemory and write nothing; a held lock can still be released; a completion is refused or truly stored; after freeing memory acquires work",
            move || full_server(client),
        ));
        cases.push(case(
            "sentinel_failover_fenced",
            l,
            "master crashes mid-hold (renewing, lease 10 s) before the lock reached the replica: after the failover a second owner is granted with a newer token, the first holder learns of its loss, the stale fenced write is rejected; the double-holder window is measured and stays under lease + 1 s",
            move || sentinel_failover(client),
        ));
        cases.push(case(
            "hot_keys",
            l,
            format!(
                "{} processes x {} tasks x {} sections on {} hot keys: every section logged, 0 overlaps, tokens increasing, 0 fenced writes rejected (independent log on a separate server)",
                s.processes, s.tasks, s.iterations, s.hot_keys
            ),
            move || hot_keys_processes(client),
        ));
        cases.push(case(
            "waiters_one_key",
            l,
            format!("{} waiters on one key: every waiter served, 0 overlaps; time and hand-off percentiles reported", s.waiters),
            move || waiters_redis(client),
        ));
        cases.push(case(
            "memory_per_record",
            l,
            format!("{} fenced locks and {} completed records: used_memory per fenced lock < 512 B, per completed record < 1 KiB (budgets), records replay", s.records, s.records),
            move || memory_per_record(client),
        ));
    }
    cases.push(case(
        "hot_keys",
        "memory",
        format!(
            "{} tasks x {} sections on {} hot keys in one process: 0 overlaps, tokens increasing, 0 fenced writes rejected",
            s.processes * s.tasks,
            s.iterations,
            s.hot_keys
        ),
        hot_keys_memory,
    ));
    cases.push(case(
        "waiters_one_key",
        "memory",
        format!("{} waiters on one key: every waiter served, 0 overlaps; time and hand-off percentiles reported", s.waiters),
        waiters_memory,
    ));
    cases
}

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        runtime().block_on(child(&role));
        return;
    }
    // Panics inside a case are reported on its line; keep stderr for real trouble.
    std::panic::set_hook(Box::new(|_| {}));
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    println!(
        "fault_suite: {} form{}",
        if long_form() { "long" } else { "short" },
        if long_form() {
            ""
        } else {
            " (COORD_FAULT_SUITE=long for the full sizes)"
        }
    );
    let (mut passed, mut failed) = (0, 0);
    let started = Instant::now();
    for c in cases() {
        let full = format!("{} [{}]", c.name, c.label);
        if !filter.is_empty() && !filter.iter().any(|f| full.contains(f.as_str())) {
            continue;
        }
        let t = Instant::now();
        let seen = match std::panic::catch_unwind(AssertUnwindSafe(c.run)) {
            Ok(seen) => seen,
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a panic".into());
                Seen {
                    saw: vec![format!("panicked: {why}")],
                    broken: vec![why],
                }
            }
        };
        let ok = seen.broken.is_empty();
        if ok {
            passed += 1;
        } else {
            failed += 1;
        }
        println!(
            "case {full}: expected {}; saw {} ({:.1} s): {}",
            c.expected,
            seen.saw.join("; "),
            t.elapsed().as_secs_f64(),
            if ok { "PASS" } else { "FAIL" }
        );
        if !ok {
            println!("  broken: {}", seen.broken.join("; "));
        }
    }
    println!("fault_suite: took {:.1} s", started.elapsed().as_secs_f64());
    println!("fault_suite: {passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}
