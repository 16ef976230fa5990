//! Recorded histories under a seeded nemesis, checked as a whole against coord's promises.
//!
//! This binary has its own `main` (`harness = false`) because it pauses, kills and restarts
//! servers and re-runs itself as client processes (`COORD_HISTORY_ROLE=worker`). Per client
//! library compiled in, it runs:
//!
//! 1. **under faults**: one redis-server (append-only file, fsync always) behind an in-test
//!    TCP proxy; two client processes of this binary and the test process itself, each with
//!    several tasks taking fenced locks, making idempotent calls and single-flight calls on a
//!    few hot keys, and the test process's tasks making cached reads of sources a writer
//!    versions at the resource; a seeded schedule of combined faults (proxy delay, blackhole,
//!    hold, half-open and reset; server pause, kill and restart with and without its data, full
//!    memory; client process pause, its clock jumped forward or stalled), every kind at least
//!    once per run. Each process also runs long-hold tasks: in each client process one of long
//!    unrenewed holds and one of long renewing holds; in the test process one of short holds
//!    of the unrenewed key (the successor of a paused holder). The nemesis aims
//!    its pauses: a client pause or clock stall starts while its target is inside a long
//!    unrenewed hold, a server pause just after a renewing hold came in. Every call is
//!    recorded (JSON lines, one file per process, merged with what the protected resource
//!    witnessed), then checked: zero violations; the faults must have bitten (a fenced write
//!    refused at the resource, a renewing hold ended `LockLost`, an idempotent call answered
//!    through a fault); then every hot lock must be free again.
//! 2. **crashes the history can see** (`coord_history::crash`): a renewing hold spanning a
//!    kill and restart of a server with `appendfsync always`, a contender asking for its
//!    lock, and the idempotent keys completed before each kill asked again after it: zero
//!    violations. The control runs a server without persistence (so a restart comes back
//!    empty) and must find the losses (a second execution, and an overlap or a hold that
//!    answered `Ok` after its lock was gone). `COORD_HISTORY_CRASHES=<n>` crashes `n` times
//!    per run (2 by default).
//! 3. **in process**: the same workload on the in-process provider, without faults.
//! 4. **planted bugs**: the same workload through a provider that grants locks without
//!    checking (all holders get token 1), one that replays a fresh answer, and one whose
//!    shared cache keeps entries 30 times their ttl; the checker must report violations for
//!    each, or it is not checking anything.
//! 5. **Sentinel failover** (module `failover`; needs root for network namespaces): the
//!    primary and a minority of five client processes cut off from the replicas, the
//!    Sentinels and the other clients until a replica is promoted, then healed and the old
//!    primary's demotion awaited. Without replica acknowledgement the checker must find
//!    bodies run twice or renewing holds that returned `Ok` while a newer token wrote; with
//!    `replica_acks(1, ..)` and `min-replicas-to-write 1` and two replicas, zero violations
//!    and locks granted on the majority side during the split; one replica with
//!    acknowledgement runs in the long form. Each half of that setting alone, two replicas:
//!    the clients' `replica_acks` alone (servers at their defaults) must give zero violations
//!    and no body run by a cut-off client on a call made after the cut, while the cut-off
//!    primary still takes writes; `min-replicas-to-write` alone (clients without acks) must see
//!    the cut-off primary refuse writes, no body run by a cut-off client on a call made after
//!    that refusal, and no violation but those a call spanning the cut-to-refusal window
//!    explains (how many is printed: the window's losses are expected, not required). One
//!    cycle each in the short form (about 30 s each: the control without acknowledgement with
//!    the last client library, the two-replica case with every one, the two halves with the
//!    first); `COORD_FAILOVER_SECS=<n>` repeats cycles for `n` seconds, every case with every
//!    client library.
//!
//! Every run draws a fresh seed, printed as `seed 0x…`; `COORD_HISTORY_SEED=0x…` replays that
//! run's schedule. The short form (CI) runs the steps that hold every kind of fault once
//! (about 6 s). A long form: `COORD_HISTORY_SECS=1800 COORD_HISTORY_SEED=<n> cargo test -p
//! coord-redis --all-features --test histories`. A failed run prints its seed and the path of
//! the merged history, which `cargo run -p coord-history --bin check -- <path>` re-checks.
//! `COORD_HISTORY_FAULTS=<kind>,..` limits the schedule to some kinds of fault (and then does
//! not require the faults to bite).

#[path = "histories/failover.rs"]
mod failover;
#[path = "support/mod.rs"]
mod support;

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coord_core::handle::CacheScope;
use coord_core::{CoordError, Coordinator};
use coord_history::clock::now_ns;
use coord_history::crash::{CrashFigures, CrashPlan, crash_run};
use coord_history::nemesis::proxy::{Mode, Proxy};
use coord_history::nemesis::schedule::{FaultKind, Rng, Schedule, run_seed, seed_text};
use coord_history::planted::{Planted, PlantedBug};
use coord_history::recorder::{Ending, Recorder};
use coord_history::witness::{WitnessClient, WitnessServer};
use coord_history::workload::{
    AIM_FRESH, Caller, LongHolds, RENEWING_KEY, UNRENEWED_KEY, classify, start_watchdog,
};
use coord_history::{Event, Fault, Op, Promise, Report};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::{RedisServer, Resp};

const ROLE: &str = "COORD_HISTORY_ROLE";
const LEASE: Duration = Duration::from_secs(1);
const IN_FLIGHT: Duration = Duration::from_secs(2);
const TASKS: u32 = 3;
const PROCESSES: usize = 2;
/// Cached reads: the shared entry's ttl, and the local copy's.
const CACHE_TTL: Duration = Duration::from_millis(500);
const CACHE_LOCAL_TTL: Duration = Duration::from_millis(150);
/// What a cached read's staleness bound allows beyond the ttl: the time between the body's
/// read of the source and its return, which is the caller's code, not the cache's, plus
/// scheduling on a loaded machine. Only processes the nemesis never pauses make cached reads.
const CACHE_MARGIN: Duration = Duration::from_millis(500);
/// The cached sources, and how often the writer moves each to a new version.
const SOURCES: [&str; 2] = ["cv0", "cv1"];
const SOURCE_EVERY: Duration = Duration::from_millis(100);
/// How far [`FaultKind::ClockJump`] moves a client process's clock: past every lease.
const CLOCK_JUMP: Duration = Duration::from_secs(3);
/// The longest [`FaultKind::ClockStall`]: past the lock lease, short of what an in-flight
/// marker (2 s, renewed every third of it) survives, as for a client pause.
const CLOCK_STALL_MAX: Duration = Duration::from_millis(1_200);
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
/// hold before a client pause or clock stall, after asking that process to take such holds
/// ([`aimed_holds`]): generous, since on a loaded host a process that has just come out of
/// another fault may need seconds to get the lock; and how much longer a run lasts for it.
const AIM_CLIENT: Duration = Duration::from_secs(10);
/// How long a client process asked for holds (`hold` on its stdin) takes them, one after
/// another: past [`AIM_CLIENT`], so it is still at it whenever the nemesis looks.
const AIMED_HOLDING: Duration = Duration::from_secs(12);
/// How much longer than its schedule and aims a run lasts, for the time faults take to start
/// and heal beyond their steps (a restart's recovery, a pause's checks).
const SLACK: Duration = Duration::from_secs(2);
/// The lease of a crash run's locks: far longer than a restart of redis-server takes, so that
/// a server that kept its data still has the lock when back; and its renewal (a third of it)
/// far later than a spanning body ends on Redis (well under a second), so that in the control
/// the holder does not learn of the loss first and answers `Ok`, which the checker must flag.
const CRASH_LEASE: Duration = Duration::from_secs(10);

/// Which calls a worker makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mix {
    /// Locks, idempotent calls, single-flight calls and cached reads.
    All,
    /// All but cached reads: the client processes, which the nemesis pauses and whose clocks
    /// it moves. A pause between the body's read of the source and its return would age the
    /// version read before the cache ever saw it.
    Worker,
    Locks,
    Idempotent,
    Cache,
}

fn client_named(name: &str) -> Client {
    match name {
        #[cfg(feature = "fred")]
        "fred" => Client::Fred,
        _ => support::clients()[0],
    }
}

fn client_name(client: Client) -> &'static str {
    match client {
        #[cfg(feature = "fred")]
        Client::Fred => "fred",
        _ => "redis-rs",
    }
}

/// `Fail`: certainly no effect. `Info`: unknown.
/// One worker task: calls until `until`, recording each.
async fn work(
    coord: Coordinator,
    rec: Recorder,
    witness: SocketAddr,
    client: u32,
    until: Instant,
    seed: u64,
    mix: Mix,
) {
    let witness = WitnessClient::connect(witness)
        .await
        .expect("the witness listens on loopback");
    let mut rng = Rng::new(seed ^ (u64::from(std::process::id()) << 16) ^ u64::from(client));
    while Instant::now() < until {
        let pick = rng.between(0, 9);
        let op = match mix {
            Mix::Locks => Op::Lock,
            Mix::Idempotent => Op::Idempotent,
            Mix::Cache => Op::CacheRead,
            Mix::All | Mix::Worker if pick < 4 => Op::Lock,
            Mix::All | Mix::Worker if pick < 7 => Op::Idempotent,
            Mix::All if pick < 9 => Op::CacheRead,
            Mix::All | Mix::Worker => Op::SingleFlight,
        };
        let generation = witness.generation().await;
        let caller = Caller {
            coord: &coord,
            rec: &rec,
            witness: &witness,
            client,
        };
        match op {
            Op::Lock => {
                // Keys carry the data generation: a restart without data starts new ones.
                let name = format!("lk{}-g{generation}", rng.between(0, 1));
                let hold = Duration::from_millis(rng.between(5, 40));
                caller.fenced_hold(&name, LEASE, hold).await
            }
            Op::Idempotent => {
                // A sliding window of three hot keys, shared by every process (one clock).
                let window = now_ns() / 700_000_000;
                let name = format!("id{window}-{}-g{generation}", rng.between(0, 2));
                caller.idempotent(&name, IN_FLIGHT).await
            }
            Op::CacheRead => cache_call(&coord, &rec, &witness, client, &mut rng).await,
            _ => {
                let name = format!("sf{}", rng.between(0, 1));
                caller.single_flight(&name).await
            }
        }
    }
}

/// One long-hold task ([`LongHolds`]) of a process, numbered `client`, until `until`, on keys of the current data
/// generation: what the nemesis aims its pauses at.
async fn long_holds(
    coord: Coordinator,
    rec: Recorder,
    witness: SocketAddr,
    until: Instant,
    seed: u64,
    role: LongHolds,
    client: u32,
) {
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
        let suffix = format!("-g{}", witness.generation().await);
        caller.long_hold(role, LEASE, &suffix, &mut rng).await;
    }
}

/// Asked for by the nemesis (`hold` on a client process's stdin) before it pauses that process
/// or stalls its clock: long unrenewed holds are to be taken at once.
static HOLD_ASKED: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// The task of a client process that takes long unrenewed holds of [`UNRENEWED_KEY`] when the
/// nemesis asks (`hold`), one after another for [`AIMED_HOLDING`], so that the pause the nemesis
/// aims at this process finds it inside one, however the other long-hold task fares (it may be
/// waiting out a fault, or keep losing the key to the other holders). The nemesis waits until
/// this process is inside a hold, with a generous deadline, before it starts the pause.
async fn aimed_holds(
    coord: Coordinator,
    rec: Recorder,
    witness: SocketAddr,
    until: Instant,
    seed: u64,
    client: u32,
) {
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
            let suffix = format!("-g{}", witness.generation().await);
            caller
                .long_hold(LongHolds::Unrenewed, LEASE, &suffix, &mut rng)
                .await;
        }
    }
}

/// A cached read of a versioned source (two tiers: a local copy, and the shared entry in
/// Redis); its staleness bound is the ttl plus [`CACHE_MARGIN`].
async fn cache_call(
    coord: &Coordinator,
    rec: &Recorder,
    witness: &WitnessClient,
    client: u32,
    rng: &mut Rng,
) {
    let name = SOURCES[rng.between(0, SOURCES.len() as u64 - 1) as usize];
    let bound = u64::try_from((CACHE_TTL + CACHE_MARGIN).as_nanos()).expect("a short bound");
    let invoked = rec.invoke(client, Op::CacheRead, name, None, Some(bound));
    let key = coord.key("hist.cache").part(name).finish();
    let result: Result<u64, CoordError> = coord
        .cached(key)
        .ttl(CACHE_TTL)
        .scope(CacheScope::TwoTier)
        .local_ttl(CACHE_LOCAL_TTL)
        .run(|| async { Ok(witness.read_version(name).await) })
        .await;
    let ending = match result {
        Ok(version) => Ending::ok(Some(version.to_string()), None),
        Err(err) => {
            // A read changes nothing the checker judges (the source is the resource's, and
            // only answered reads are held to their bound): a failed one certainly had no
            // effect.
            let (_, kind) = classify(&err);
            Ending::failed(coord_history::Outcome::Fail, kind)
        }
    };
    rec.complete(&invoked, ending);
}

/// The writer of the cached sources: a new version of each every [`SOURCE_EVERY`] until
/// `until`.
async fn write_sources(witness: SocketAddr, until: Instant) {
    let witness = WitnessClient::connect(witness)
        .await
        .expect("the witness listens on loopback");
    while Instant::now() < until {
        for name in SOURCES {
            witness.bump_version(name).await;
        }
        tokio::time::sleep(SOURCE_EVERY).await;
    }
}

// ---------------------------------------------------------------- processes

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

async fn coordinator(url: &str, client: Client, ns: &str) -> Coordinator {
    let provider = RedisProvider::builder(url)
        .client(client)
        .command_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to the test server through the proxy at {url}: {e}"));
    Coordinator::builder()
        .namespace(ns)
        .provider(provider)
        .build()
        .expect("coordinator")
}

/// Runs `TASKS` workers on `coord` until `until`, then gives stragglers `grace`.
async fn run_workers(
    coord: Coordinator,
    rec: Recorder,
    witness: SocketAddr,
    until: Instant,
    seed: u64,
    mix: Mix,
) {
    let writer =
        matches!(mix, Mix::All | Mix::Cache).then(|| tokio::spawn(write_sources(witness, until)));
    let long: &[LongHolds] = match mix {
        Mix::All => &[LongHolds::Successor],
        Mix::Worker => &[LongHolds::Unrenewed, LongHolds::Renewing],
        _ => &[],
    };
    let long: Vec<_> = long
        .iter()
        .enumerate()
        .map(|(i, &role)| {
            let client = TASKS + i as u32;
            tokio::spawn(long_holds(
                coord.clone(),
                rec.clone(),
                witness,
                until,
                seed,
                role,
                client,
            ))
        })
        .collect();
    // The client processes (the ones the nemesis pauses) also take holds when asked.
    let aimed = (mix == Mix::Worker).then(|| {
        let client = TASKS + long.len() as u32;
        tokio::spawn(aimed_holds(
            coord.clone(),
            rec.clone(),
            witness,
            until,
            seed,
            client,
        ))
    });
    let tasks: Vec<_> = (0..TASKS)
        .map(|client| {
            tokio::spawn(work(
                coord.clone(),
                rec.clone(),
                witness,
                client,
                until,
                seed,
                mix,
            ))
        })
        .collect();
    let grace = until + Duration::from_secs(20);
    let mut panicked = 0;
    for t in tasks {
        // A call stuck past the grace is left out as never completed (unknown outcome).
        let left = grace.saturating_duration_since(Instant::now());
        if let Ok(Err(err)) = tokio::time::timeout(left, t).await {
            panicked += usize::from(err.is_panic());
        }
    }
    if let Some(writer) = writer {
        writer.abort();
    }
    for long in long.into_iter().chain(aimed) {
        let left = grace.saturating_duration_since(Instant::now());
        if let Ok(Err(err)) = tokio::time::timeout(left, long).await {
            panicked += usize::from(err.is_panic());
        }
    }
    // A panicked task is a harness bug whose call would only show as never completed: it
    // fails the run (in a client process, before the history is written, which the test
    // then reports).
    assert_eq!(
        panicked, 0,
        "{panicked} worker task(s) panicked (seed {seed})"
    );
}

fn child() {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let url = var("COORD_HISTORY_URL");
    let witness: SocketAddr = var("COORD_HISTORY_WITNESS").parse().expect("address");
    let client = client_named(&var("COORD_HISTORY_CLIENT"));
    let ns = var("COORD_HISTORY_NS");
    let millis: u64 = var("COORD_HISTORY_MILLIS").parse().expect("millis");
    let seed: u64 = var("COORD_HISTORY_SEED_CHILD").parse().expect("seed");
    let out = var("COORD_HISTORY_OUT");
    let rec = Recorder::new();
    start_watchdog();
    listen_for_clock_commands();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    rt.block_on(async {
        tokio::spawn(drive_clock());
        let coord = coordinator(&url, client, &ns).await;
        let until = Instant::now() + Duration::from_millis(millis);
        run_workers(coord, rec.clone(), witness, until, seed, Mix::Worker).await;
    });
    rec.write_to(std::path::Path::new(&out))
        .expect("write the history");
    println!("DONE");
    // Calls stuck past the grace must not keep the process alive.
    std::process::exit(0);
}

// ---------------------------------------------------------------- a client process's clock

/// What the test asked of this client process's clock, not yet applied: milliseconds to jump
/// forward, and whether the clock stands still.
static CLOCK_JUMP_MS: AtomicU64 = AtomicU64::new(0);
static CLOCK_STALLED: AtomicBool = AtomicBool::new(false);
/// How often the injected clock catches up with the real one.
const CLOCK_TICK: Duration = Duration::from_millis(2);

/// Reads clock commands from stdin (`jump <ms>`, `stall`, `resume`), one a line, and the
/// nemesis's `hold` (take long holds now: [`aimed_holds`]).
fn listen_for_clock_commands() {
    std::thread::spawn(|| {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { return };
            match line.split_whitespace().collect::<Vec<_>>().as_slice() {
                ["jump", ms] => {
                    CLOCK_JUMP_MS.fetch_add(ms.parse().unwrap_or(0), Ordering::AcqRel);
                }
                ["stall"] => CLOCK_STALLED.store(true, Ordering::Release),
                ["resume"] => CLOCK_STALLED.store(false, Ordering::Release),
                ["hold"] => HOLD_ASKED.notify_one(),
                _ => {}
            }
        }
    });
}

/// The injected clock of a client process. Its runtime starts with tokio's clock paused, which
/// is the clock coord's lease deadlines, renewals, waits and the clients' command timeouts are
/// measured on; this task moves it on with the real time every [`CLOCK_TICK`], plus any jump
/// asked for, and not at all while stalled. (Caller deadlines and the provider's estimate of
/// the server's clock read `std::time::Instant` and are not moved: RELIABILITY.md says what
/// this covers.)
async fn drive_clock() {
    // A blocking task outstanding for the whole run keeps tokio from moving a paused clock on
    // its own when the runtime is idle (auto-advance): only this task moves it.
    let (_keep, kept) = std::sync::mpsc::channel::<()>();
    let _inhibit = tokio::task::spawn_blocking(move || {
        let _ = kept.recv();
    });
    let mut last = Instant::now();
    loop {
        let _ = tokio::task::spawn_blocking(|| std::thread::sleep(CLOCK_TICK)).await;
        let now = Instant::now();
        let real = now - last;
        last = now;
        let jump = Duration::from_millis(CLOCK_JUMP_MS.swap(0, Ordering::AcqRel));
        let step = if CLOCK_STALLED.load(Ordering::Acquire) {
            jump
        } else {
            real + jump
        };
        if !step.is_zero() {
            tokio::time::advance(step).await;
        }
    }
}

struct Worker {
    child: Child,
    out: std::path::PathBuf,
    /// The client process's stdin, where its clock takes commands.
    clock: Mutex<Option<std::process::ChildStdin>>,
}

impl Worker {
    /// Sends one clock command (`jump <ms>`, `stall`, `resume`).
    fn tell_clock(&self, command: &str) {
        if let Some(stdin) = self.clock.lock().unwrap().as_mut() {
            // A client process that already ended reads no more commands: nothing to move.
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

struct Target {
    server: Mutex<RedisServer>,
    data_dir: String,
    proxy: Arc<Proxy>,
    workers: Vec<Worker>,
    witness: Arc<WitnessServer>,
}

fn fault_event(kind: FaultKind, start: bool) -> Event {
    Event::Fault(Fault {
        at: now_ns(),
        fault: kind.name().into(),
        start,
        data_loss: start && kind.data_loss(),
    })
}

/// Fills the server's memory: `maxmemory` 64 KB below what it uses now, evicting nothing, so
/// that every command that may add to memory is refused with `OOM` until healed, while
/// deletes (releases, clean-ups) still run. (At or just above what it uses, most steps passed
/// with a refusal or two: the workload's keys come and go, its data hardly grows in a step.)
fn fill_memory(server: &RedisServer) {
    let info = server
        .command(&["INFO", "memory"])
        .text()
        .unwrap_or_default();
    let used = info
        .lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .and_then(|n| n.trim().parse::<u64>().ok());
    let used = used.expect("INFO memory names used_memory");
    server.command(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    server.command(&[
        "CONFIG",
        "SET",
        "maxmemory",
        &used.saturating_sub(64 * 1024).max(1).to_string(),
    ]);
}

fn worker_of<'t>(target: &'t Target, step: &coord_history::nemesis::schedule::Step) -> &'t Worker {
    &target.workers[(step.target % target.workers.len() as u64) as usize]
}

fn apply(target: &Target, step: &coord_history::nemesis::schedule::Step, kind: FaultKind) {
    let mut server = target.server.lock().unwrap();
    match kind {
        FaultKind::ProxyDelay => target.proxy.set(Mode::Delay(step.delay)),
        FaultKind::ProxyBlackhole => target.proxy.set(Mode::Blackhole),
        FaultKind::ProxyHold => target.proxy.set(Mode::Hold),
        FaultKind::ProxyHalfOpen => target.proxy.set(Mode::HalfOpen),
        FaultKind::ProxyReset => target.proxy.set(Mode::Reset),
        FaultKind::ServerPause => server.pause(),
        FaultKind::ServerKillRestart => server.kill(),
        FaultKind::ServerKillWipe => {
            server.kill();
            target.witness.bump_generation();
            let dir = std::path::Path::new(&target.data_dir);
            let _ = std::fs::remove_dir_all(dir.join("appendonlydir"));
            let _ = std::fs::remove_file(dir.join("dump.rdb"));
        }
        FaultKind::ClientPause => worker_of(target, step).signal(libc::SIGSTOP),
        FaultKind::ClockJump => {
            worker_of(target, step).tell_clock(&format!("jump {}", CLOCK_JUMP.as_millis()));
        }
        FaultKind::ClockStall => worker_of(target, step).tell_clock("stall"),
        FaultKind::ServerFull => fill_memory(&server),
    }
}

fn heal(target: &Target, step: &coord_history::nemesis::schedule::Step, kind: FaultKind) {
    let mut server = target.server.lock().unwrap();
    match kind {
        FaultKind::ProxyDelay
        | FaultKind::ProxyBlackhole
        | FaultKind::ProxyHold
        | FaultKind::ProxyHalfOpen
        | FaultKind::ProxyReset => target.proxy.set(Mode::Pass),
        FaultKind::ServerPause => server.resume(),
        FaultKind::ServerKillRestart | FaultKind::ServerKillWipe => server.restart(),
        FaultKind::ClientPause => worker_of(target, step).signal(libc::SIGCONT),
        // A jump is not undone: the clock goes on from where it landed.
        FaultKind::ClockJump => {}
        FaultKind::ClockStall => worker_of(target, step).tell_clock("resume"),
        FaultKind::ServerFull => {
            server.command(&["CONFIG", "SET", "maxmemory", "0"]);
        }
    }
}

/// Waits, until `latest` at most, until the holds `step`'s pauses are aimed at are there: for a
/// client pause or clock stall, its target process inside a long unrenewed hold; for a server
/// pause, a renewing hold that came in within [`AIM_FRESH`]. Returns whether they were.
fn aim(target: &Target, step: &coord_history::nemesis::schedule::Step, latest: Instant) -> bool {
    let client = step
        .faults
        .iter()
        .any(|k| matches!(k, FaultKind::ClientPause | FaultKind::ClockStall))
        .then(|| worker_of(target, step).child.id());
    let server = step.faults.contains(&FaultKind::ServerPause);
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

/// Runs `schedule` against `target` until `until`, recording every fault.
fn nemesis(target: &Target, schedule: &Schedule, rec: &Recorder, until: Instant) {
    let covering = schedule.covering;
    let mut aim_left = AIM_BUDGET;
    let mut client_aim_left = AIM_CLIENT;
    for (i, step) in schedule.steps.iter().enumerate() {
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
            .iter()
            .any(|k| matches!(k, FaultKind::ClientPause | FaultKind::ClockStall));
        // A client pause or clock stall is not left to find a hold by chance: its target is
        // asked to take long holds now, and is waited for (generously) until inside one.
        if at_client {
            worker_of(target, step).tell_clock("hold");
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
        for &kind in &step.faults {
            rec.push(fault_event(kind, true));
            apply(target, step, kind);
        }
        // A clock stall ends early, at its cap, while the step's other faults go on.
        let stall = step
            .faults
            .contains(&FaultKind::ClockStall)
            .then(|| step.hold.min(CLOCK_STALL_MAX));
        if let Some(stall) = stall {
            std::thread::sleep(stall);
            heal(target, step, FaultKind::ClockStall);
            rec.push(fault_event(FaultKind::ClockStall, false));
        }
        std::thread::sleep(step.hold - stall.unwrap_or_default());
        for &kind in step.faults.iter().rev() {
            if kind != FaultKind::ClockStall {
                heal(target, step, kind);
                rec.push(fault_event(kind, false));
            }
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

/// `COORD_HISTORY_FAULTS=<name>,<name>` limits the schedule to those kinds (names as recorded:
/// `server-full`, `clock-jump`, ...); every kind by default.
fn fault_kinds() -> Vec<FaultKind> {
    let Ok(names) = std::env::var("COORD_HISTORY_FAULTS") else {
        return FaultKind::ALL.to_vec();
    };
    let kinds: Vec<FaultKind> = FaultKind::ALL
        .into_iter()
        .filter(|k| names.split(',').any(|n| n.trim() == k.name()))
        .collect();
    assert!(
        !kinds.is_empty(),
        "COORD_HISTORY_FAULTS={names} names no fault kind; kinds: {:?}",
        FaultKind::ALL.map(FaultKind::name)
    );
    kinds
}

fn save(events: &[Event], name: &str) -> std::path::PathBuf {
    let path =
        std::env::temp_dir().join(format!("coord-history-{name}-{}.jsonl", std::process::id()));
    coord_history::write_jsonl(&path, events).expect("write the merged history");
    path
}

/// Client processes and in-process tasks under the seeded schedule: zero violations.
fn under_faults(client: Client) -> Report {
    let seed = seed();
    let kinds = fault_kinds();
    // Every kind of fault at least once, the client pause in a step of its own (a fault on the
    // network or the server in the same step would keep the successor from the lapsed lock).
    let mut schedule = Schedule::covering(
        seed,
        Duration::from_millis(fault_millis()),
        &kinds,
        &[FaultKind::ClientPause],
        &[FaultKind::ServerPause],
        (250, 700),
        (150, 400),
    );
    schedule.hold_at_least(&[FaultKind::ClientPause, FaultKind::ServerPause], PAUSE);
    let millis = u64::try_from((schedule.length() + AIM_BUDGET + AIM_CLIENT + SLACK).as_millis())
        .expect("short");
    let name = client_name(client);
    println!("histories/{name}/under-faults: seed {}", seed_text(seed));
    let server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let data_dir = match server.command(&["CONFIG", "GET", "dir"]) {
        Resp::Array(items) => items[1].text().expect("the server's directory"),
        other => panic!("CONFIG GET dir answered {other:?}"),
    };
    let upstream: SocketAddr = format!("127.0.0.1:{}", server.port()).parse().unwrap();
    let rt = runtime();
    let proxy = Arc::new(
        rt.block_on(Proxy::start(upstream))
            .expect("start the proxy"),
    );
    let witness = Arc::new(WitnessServer::start());
    let ns = format!("hist-{name}");
    let workers: Vec<Worker> = (0..PROCESSES)
        .map(|i| {
            let out = std::env::temp_dir().join(format!(
                "coord-history-{name}-{}-child{i}.jsonl",
                std::process::id()
            ));
            let child = Command::new(std::env::current_exe().expect("own path"))
                .env(ROLE, "worker")
                .env("COORD_HISTORY_URL", proxy.redis_url())
                .env("COORD_HISTORY_WITNESS", witness.addr().to_string())
                .env("COORD_HISTORY_CLIENT", name)
                .env("COORD_HISTORY_NS", &ns)
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
            let clock = Mutex::new(child.stdin.take());
            Worker { child, out, clock }
        })
        .collect();
    let rec = Recorder::new();
    let until = Instant::now() + Duration::from_millis(millis);
    let target = Target {
        server: Mutex::new(server),
        data_dir,
        proxy: proxy.clone(),
        workers,
        witness: witness.clone(),
    };
    let started = Instant::now();
    std::thread::scope(|scope| {
        let nemesis_rec = rec.clone();
        let target = &target;
        let schedule = &schedule;
        scope.spawn(move || nemesis(target, schedule, &nemesis_rec, until));
        rt.block_on(async {
            let coord = coordinator(&proxy.redis_url(), client, &ns).await;
            run_workers(coord, rec.clone(), witness.addr(), until, seed, Mix::All).await;
        });
    });
    // Everything healed (the nemesis heals each step before it ends); collect the children.
    let mut events = rec.events();
    let mut target = target;
    for w in &mut target.workers {
        let deadline = Instant::now() + Duration::from_secs(40);
        let status = loop {
            if let Some(status) = w.child.try_wait().expect("wait") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "a client process did not finish within 40 s of the run's end (seed {seed:#x})"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut theirs = coord_history::read_jsonl(&w.out).unwrap_or_else(|e| {
            panic!("the client process ({status}) wrote no readable history ({e}); seed {seed:#x}")
        });
        events.append(&mut theirs);
    }
    events.extend(witness.events());
    let path = save(&events, name);
    // Nothing is left blocked once every fault is healed: each hot lock of the last generation
    // is granted within a few leases, and a fresh idempotent call stores its outcome.
    let generation = witness.generation();
    rt.block_on(async {
        let coord = coordinator(&proxy.redis_url(), client, &ns).await;
        for i in 0..2 {
            let part = format!("lk{i}-g{generation}");
            let key = coord.key("hist.lock").part(part.as_str()).finish();
            let held: Result<(), CoordError> = coord
                .lock(key)
                .lease(LEASE)
                .wait(LEASE * 3)
                .fenced()
                .run(|| async { Ok(()) })
                .await;
            assert!(
                held.is_ok(),
                "lock {part} still blocked after every fault healed: {held:?} (seed {seed:#x}; history {})",
                path.display()
            );
        }
        let key = coord.key("hist.idem").part("after-heal").finish();
        let stored: Result<String, CoordError> = coord
            .idempotent(key)
            .in_flight_lease(IN_FLIGHT)
            .wait(Duration::from_secs(3))
            .run(|| async { Ok("stored".to_owned()) })
            .await;
        assert!(
            stored.is_ok(),
            "an idempotent call failed after every fault healed: {stored:?} (seed {seed:#x})"
        );
    });
    let report = coord_history::check(&events);
    let seed = seed_text(seed);
    println!(
        "histories/{name}/under-faults (seed {seed}, {:.1} s, history {}): {report}",
        started.elapsed().as_secs_f64(),
        path.display()
    );
    for line in report.bite_lines() {
        println!("  {line}");
    }
    println!("  {}", report.bite_summary());
    assert!(
        report.violations.is_empty(),
        "{} violations under faults with {name} (seed {seed}); the history is {}",
        report.violations.len(),
        path.display()
    );
    for op in ["lock", "idempotent", "single_flight", "cache_read"] {
        assert!(
            report.calls.get(op).copied().unwrap_or(0) >= 10,
            "too few {op} calls to judge anything: {report}"
        );
    }
    assert!(
        report.writes_accepted > 0 && report.effects > 0 && report.source_writes > 0,
        "{report}"
    );
    for kind in &kinds {
        assert!(
            report.faults.contains_key(kind.name()),
            "the schedule holds {} but it was never injected (seed {seed}): {report}",
            kind.name()
        );
    }
    // A run restricted to some kinds may have nothing that can bite so; a whole run must.
    if kinds.len() == FaultKind::ALL.len()
        && let Err(missing) = report.faults_bit()
    {
        panic!(
            "{missing} (seed {seed}; {}; history {})",
            report.bite_summary(),
            path.display()
        );
    }
    let _ = std::fs::remove_file(&path);
    report
}

/// Lock holds spanning a server kill and restart, and completed keys asked again after each
/// ([`coord_history::crash`]): with `persistent` (append-only file, `appendfsync always`)
/// zero violations; without (no persistence, nothing saved: the restarted server is empty),
/// the control, whose losses the checker must find (the test asserts which).
fn crash_case(client: Client, persistent: bool) -> (Report, CrashFigures) {
    let name = client_name(client);
    let label = if persistent {
        "persistent"
    } else {
        "without-data"
    };
    let args: &[&str] = if persistent {
        &["--appendonly", "yes", "--appendfsync", "always"]
    } else {
        &["--appendonly", "no", "--save", ""]
    };
    let server = Arc::new(Mutex::new(RedisServer::start_with(args)));
    let url = server.lock().unwrap().url();
    let witness = WitnessServer::start();
    let rec = Recorder::new();
    let plan = CrashPlan {
        cycles: crash_cycles(),
        lease: CRASH_LEASE,
        keys_before_crash: 5,
        fault: if persistent {
            FaultKind::ServerKillRestart.name().into()
        } else {
            "server-kill-restart-without-data".into()
        },
    };
    let started = Instant::now();
    let figures = runtime().block_on(async {
        let coord = coordinator(&url, client, &format!("crash-{name}-{label}")).await;
        let crashed = server.clone();
        let crash = Arc::new(move || crashed.lock().unwrap().restart());
        crash_run(&coord, &rec, witness.addr(), &plan, crash).await
    });
    let mut events = rec.events();
    events.extend(witness.events());
    let report = coord_history::check(&events);
    let path = save(&events, &format!("crash-{name}-{label}"));
    println!(
        "histories/{name}/crash-{label} ({:.1} s, history {}): {figures}; violations {:?}",
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

/// Kill-and-restart cycles of a crash run: `COORD_HISTORY_CRASHES`, else 2 (a redis-server restart takes milliseconds).
fn crash_cycles() -> usize {
    std::env::var("COORD_HISTORY_CRASHES")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(2)
}

/// How many violations of each promise a report holds.
fn violations_by_promise(report: &Report) -> std::collections::BTreeMap<Promise, usize> {
    let mut out = std::collections::BTreeMap::new();
    for v in &report.violations {
        *out.entry(v.promise).or_default() += 1;
    }
    out
}

/// The workload through a provider with `bug` planted, with fencing checked at the resource:
/// the checker must report it.
fn planted(client: Client, bug: PlantedBug, mix: Mix) -> Report {
    let name = client_name(client);
    let server = RedisServer::start();
    let witness = WitnessServer::start();
    let rec = Recorder::new();
    let rt = runtime();
    rt.block_on(async {
        let provider = RedisProvider::builder(server.url())
            .client(client)
            .connect()
            .await
            .expect("connect to the test server");
        let coord = Coordinator::builder()
            .namespace(format!("planted-{name}"))
            .provider(Planted::new(provider, bug))
            .build()
            .expect("coordinator");
        let until = Instant::now() + Duration::from_millis(2_500);
        run_workers(coord, rec.clone(), witness.addr(), until, seed(), mix).await;
    });
    let mut events = rec.events();
    events.extend(witness.events());
    let report = coord_history::check(&events);
    println!(
        "histories/{name}/planted {bug:?}: {} calls, {} violations {:?}",
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

/// The same workload on the in-process provider (one process, no faults): zero violations.
fn in_process() -> Report {
    let witness = WitnessServer::start();
    let rec = Recorder::new();
    runtime().block_on(async {
        let coord = Coordinator::builder()
            .namespace("hist-memory")
            .memory()
            .build()
            .expect("coordinator");
        let until = Instant::now() + Duration::from_millis(2_500);
        run_workers(coord, rec.clone(), witness.addr(), until, seed(), Mix::All).await;
    });
    let mut events = rec.events();
    events.extend(witness.events());
    let report = coord_history::check(&events);
    println!("histories/memory: {report}");
    assert!(
        report.violations.is_empty(),
        "in-process provider: {report}"
    );
    assert!(
        report.total_calls() > 100,
        "too few calls to judge: {report}"
    );
    report
}

fn main() {
    match std::env::var(ROLE).as_deref() {
        Ok(failover::ROLE_RUN) => return failover::controller(),
        Ok(failover::ROLE_WORKER) => return failover::worker(),
        Ok(_) => return child(),
        Err(_) => {}
    }
    start_watchdog();
    let started = Instant::now();
    let mut passed = 0;
    let mut failed = Vec::new();
    // `COORD_HISTORY_ONLY=<text>` runs only the cases whose name contains it.
    let only = std::env::var("COORD_HISTORY_ONLY").unwrap_or_default();
    let mut case = |name: String, f: &dyn Fn()| {
        if !name.contains(&only) {
            return;
        }
        println!("histories/{name} ...");
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(()) => passed += 1,
            Err(_) => failed.push(name),
        }
    };
    for client in support::clients() {
        let name = client_name(client);
        case(format!("{name}/under_faults_zero_violations"), &|| {
            under_faults(client);
        });
        case(format!("{name}/crash_persistent_zero_violations"), &|| {
            let (report, figures) = crash_case(client, true);
            assert!(
                report.violations.is_empty(),
                "a server with fsync-always persistence lost a lock or a record in a crash: {figures}; {report}"
            );
            assert!(
                figures.replayed_same == figures.asked_again,
                "a key asked again after a crash did not replay its first answer: {figures}"
            );
        });
        case(
            format!("{name}/crash_without_data_control_finds_losses"),
            &|| {
                let (report, figures) = crash_case(client, false);
                let locks = report.count(Promise::TokensGrow)
                    + report.count(Promise::NoOverlap)
                    + report.count(Promise::HeldThroughout);
                assert!(
                    report.count(Promise::AtMostOnce) > 0 && locks > 0,
                    "restarted without its data, the server lost locks and records the checker did not find: {figures}; {report}"
                );
                println!(
                    "  control found: {} second executions, {} lock losses ({:?})",
                    report.count(Promise::AtMostOnce),
                    locks,
                    violations_by_promise(&report)
                );
            },
        );
        case(
            format!("{name}/planted_grant_without_check_is_caught"),
            &|| {
                let report = planted(client, PlantedBug::GrantWithoutCheck, Mix::Locks);
                assert!(
                    report.count(Promise::NoOverlap) > 0 && report.count(Promise::TokensGrow) > 0,
                    "the checker missed locks granted without checking: {report}"
                );
            },
        );
        case(
            format!("{name}/planted_cache_beyond_ttl_is_caught"),
            &|| {
                let report = planted(client, PlantedBug::CacheBeyondTtl, Mix::Cache);
                assert!(
                    report.count(Promise::CacheFresh) > 0,
                    "the checker missed a cache serving beyond its ttl: {report}"
                );
            },
        );
        case(
            format!("{name}/planted_fresh_answer_on_replay_is_caught"),
            &|| {
                let report = planted(client, PlantedBug::FreshAnswerOnReplay, Mix::Idempotent);
                assert!(
                    report.count(Promise::AtMostOnce) > 0 && report.count(Promise::SameAnswer) > 0,
                    "the checker missed replays answering fresh: {report}"
                );
            },
        );
    }
    let clients = support::clients();
    for (nth, &client) in clients.iter().enumerate() {
        let name = client_name(client);
        // The control (without acknowledgement the checker finds losses) needs one client
        // library: the short form runs it with the last one (the halves below take the first),
        // the long form with every one.
        let without_acks =
            format!("{name}/failover_without_replica_acks_loses_what_was_acknowledged");
        if nth + 1 == clients.len() || failover::long_form() || only.contains(without_acks.as_str())
        {
            case(without_acks, &|| {
                let setting = failover::Setting {
                    replicas: 1,
                    client_acks: false,
                    min_replicas: false,
                };
                let run = failover::run(client, setting);
                let r = &run.report;
                // The proof the checker sees what a failover loses: bodies run twice, or
                // renewing holds that returned Ok while a newer token wrote.
                assert!(
                    r.count(Promise::AtMostOnce) + r.count(Promise::HeldThroughout) > 0,
                    "without replica acknowledgement the failover lost nothing: {r}"
                );
                // The control of the count the acknowledged settings assert zero of: without
                // acknowledgement, cut-off clients do run bodies on the old primary's grants.
                assert!(
                    run.cut_off_bodies_after_cut > 0,
                    "no cut-off client ran a body after the cut: the sides are not told apart"
                );
                // Every loss comes from the old primary taking writes alone, from the cut
                // until it rejoined as a replica.
                assert_eq!(
                    run.unexplained_violations, 0,
                    "violations the cut-off primary's writes do not explain: {r}"
                );
                run.discard();
            });
        } else if without_acks.contains(&only) {
            println!("histories/{without_acks}: long form only (COORD_FAILOVER_SECS)");
        }
        // One replica with acknowledgement spends most of each cycle refusing writes (the
        // new primary has no replica until the old one rejoins): the same promises as the
        // two-replica case, so the short form leaves it to the long form, or to a filter
        // naming it.
        let one_replica_acks = format!("{name}/failover_with_replica_acks_zero_violations");
        if failover::long_form() || only.contains(one_replica_acks.as_str()) {
            case(one_replica_acks, &|| {
                let setting = failover::Setting {
                    replicas: 1,
                    client_acks: true,
                    min_replicas: true,
                };
                let run = failover::run(client, setting);
                assert!(
                    run.report.violations.is_empty(),
                    "violations with replica acknowledgement: {}",
                    run.report
                );
                run.discard();
            });
        } else if one_replica_acks.contains(&only) {
            println!("histories/{one_replica_acks}: long form only (COORD_FAILOVER_SECS)");
        }
        case(
            format!("{name}/failover_two_replicas_majority_stays_available"),
            &|| {
                let setting = failover::Setting {
                    replicas: 2,
                    client_acks: true,
                    min_replicas: true,
                };
                let run = failover::run(client, setting);
                assert!(
                    run.report.violations.is_empty(),
                    "violations with replica acknowledgement: {}",
                    run.report
                );
                assert!(
                    run.locks_ok_in_split > 0,
                    "with two replicas the majority side took no lock during the split: {}",
                    run.report
                );
                run.discard();
            },
        );
    }
    // The two halves of the acknowledged setting, each alone, two replicas as in its short
    // case: the short form runs each once (with the first client library), the long form with
    // every client library.
    for (nth, client) in support::clients().into_iter().enumerate() {
        let name = client_name(client);
        let client_acks_alone = format!("{name}/failover_client_acks_alone_keep_every_promise");
        let min_replicas_alone =
            format!("{name}/failover_min_replicas_alone_loses_only_before_the_lag");
        if !(nth == 0 || failover::long_form()) {
            for case_name in [&client_acks_alone, &min_replicas_alone] {
                if case_name.contains(&only) {
                    println!("histories/{case_name}: long form only (COORD_FAILOVER_SECS)");
                }
            }
            continue;
        }
        // `replica_acks(1, ..)` on the clients, the servers at their defaults. Expected: zero
        // violations. The cut-off primary goes on taking writes (its probe is taken after the
        // promotion), but a cut-off client's grant or claim there gets no replica's
        // acknowledgement within the `WAIT`, so it is refused before the body runs, and its
        // holders' renewals fail, so they stop within the lease the new primary counts; what
        // a caller was told succeeded is on the replica that is promoted.
        case(client_acks_alone, &|| {
            let setting = failover::Setting {
                replicas: 2,
                client_acks: true,
                min_replicas: false,
            };
            let run = failover::run(client, setting);
            let r = &run.report;
            assert!(
                r.violations.is_empty(),
                "violations with the clients' replica acknowledgement alone: {r}"
            );
            assert_eq!(
                run.accepting_cycles, run.cycles,
                "the servers at their defaults: the cut-off primary takes writes during the split"
            );
            assert_eq!(
                run.cut_off_bodies_after_cut, 0,
                "a cut-off client ran a body on a grant or claim no replica acknowledged"
            );
            assert!(
                run.locks_ok_in_split > 0,
                "with two replicas the majority side took no lock during the split: {r}"
            );
            run.discard();
        });
        // `min-replicas-to-write 1`, `min-replicas-max-lag 2` on the servers, clients without
        // acknowledgement. Expected: the cut-off primary refuses writes (`NOREPLICAS`) once
        // its replicas' last acknowledgement is older than the lag, so no cut-off client runs
        // a body on a call made after that; but what it acknowledged from the cut until then
        // never reached the promoted replica, so violations may be found, and every one must
        // involve a call that spans that window (a grant, claim or renewal the old primary
        // took alone). How many there were is printed, not asserted: it depends on whether a
        // cut-off client was holding or claiming when the cut came.
        case(min_replicas_alone, &|| {
            let setting = failover::Setting {
                replicas: 2,
                client_acks: false,
                min_replicas: true,
            };
            let run = failover::run(client, setting);
            let r = &run.report;
            assert_eq!(
                run.refusing_cycles, run.cycles,
                "the cut-off primary did not refuse writes after min-replicas-max-lag: {r}"
            );
            assert_eq!(
                run.accepting_cycles, 0,
                "the cut-off primary took a write after the promotion: {r}"
            );
            assert_eq!(
                run.cut_off_bodies_after_refusal, 0,
                "a cut-off client ran a body on a call made after its primary refused writes"
            );
            assert_eq!(
                run.unexplained_violations, 0,
                "violations the cut-off primary's window does not explain: {r}"
            );
            assert!(
                run.locks_ok_in_split > 0,
                "with two replicas the majority side took no lock during the split: {r}"
            );
            println!(
                "  min-replicas alone lost: {} violations ({:?}); {} cut-off bodies after the \
                 cut, none after the refusal",
                r.violations.len(),
                violations_by_promise(r),
                run.cut_off_bodies_after_cut
            );
            run.discard();
        });
    }
    case("memory/zero_violations".into(), &|| {
        in_process();
    });
    println!(
        "histories: {passed} passed, {} failed in {:.1} s{}",
        failed.len(),
        started.elapsed().as_secs_f64(),
        if failed.is_empty() {
            String::new()
        } else {
            format!(" ({})", failed.join(", "))
        }
    );
    if !failed.is_empty() {
        std::process::exit(1);
    }
}
