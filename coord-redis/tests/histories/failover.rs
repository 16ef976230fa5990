//! The Sentinel failover nemesis: a primary, one or two replicas and three Sentinels, each in
//! a network namespace of its own, and client processes each in one of theirs; the current
//! primary is cut off, together with a minority of the clients, from the replicas, the
//! Sentinels and the other clients (blackhole routes on both sides); the Sentinels promote a
//! replica; after a while the partition heals and the old primary rejoins as a replica (its
//! demotion awaited). Every call is recorded and the merged history checked.
//!
//! Three processes take part besides the servers:
//!
//! - the test process (the machine's own namespace) creates the namespaces, runs the
//!   controller, then checks the history it returns and judges the figures;
//! - the controller (this binary again, `COORD_HISTORY_ROLE=failover-run`) runs in the hub,
//!   which reaches every host and is never cut: it starts the servers, the Sentinels, the
//!   protected resource (on a Unix socket, which every namespace reaches) and the clients,
//!   and drives the partitions;
//! - the clients (`failover-worker`), each with one task contending a fenced, renewing lock on
//!   two keys and one task calling an idempotent operation with `on_abandoned = Fail` on fresh
//!   keys shared by all clients.
//!
//! A lock body writes `enter` and `exit` at the resource and does not act on a refusal: what
//! is judged is what the lock promised its holder (that it held throughout, when it returned
//! `Ok`), not what fencing saved.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use coord_core::{CoordError, Coordinator, OnAbandoned, fencing_token};
use coord_history::clock::now_ns;
use coord_history::nemesis::schedule::Rng;
use coord_history::recorder::{Ending, Recorder};
use coord_history::witness::{WitnessClient, WitnessServer};
use coord_history::{EffectKind, Event, Fault, Op, Outcome, Phase, Promise, Report};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::{LanServer, Resp, TestLan};

use crate::{classify, client_name, client_named, runtime};

pub(crate) const ROLE_RUN: &str = "failover-run";
pub(crate) const ROLE_WORKER: &str = "failover-worker";

const MASTER: &str = "coordmaster";
/// Client processes; the two after the cycle's first are cut off with the primary.
const CLIENTS: usize = 5;
const MINORITY: usize = 2;
const LEASE: Duration = Duration::from_secs(2);
const RENEW: Duration = Duration::from_millis(500);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a granting write waits for its replica acknowledgement.
const ACK_WAIT: Duration = Duration::from_millis(500);
const IN_FLIGHT: Duration = Duration::from_secs(2);
/// The idempotent keys change this often (every client calls the same few at a time).
const KEY_WINDOW_NS: u64 = 700_000_000;
/// How long the split lasts after the Sentinels promoted a replica.
const SPLIT_AFTER_PROMOTION: Duration = Duration::from_secs(3);
/// Quiet time before each cut and after the last cycle.
const CALM: Duration = Duration::from_millis(1500);

/// What a run is set up with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Setting {
    /// Replicas of the primary (1 or 2).
    pub replicas: usize,
    /// `replica_acks(1, ..)` on the clients and `min-replicas-to-write 1`,
    /// `min-replicas-max-lag 2` on the servers.
    pub acks: bool,
}

impl Setting {
    pub fn name(self) -> String {
        format!(
            "{}-replica{}-{}",
            self.replicas,
            if self.replicas == 1 { "" } else { "s" },
            if self.acks { "acks" } else { "no-acks" }
        )
    }
}

// Host layout: servers first, then the Sentinels' host, then the clients.
fn sentinel_host(setting: Setting) -> usize {
    setting.replicas + 1
}

fn client_host(setting: Setting, client: usize) -> usize {
    setting.replicas + 2 + client
}

fn hosts(setting: Setting) -> usize {
    setting.replicas + 2 + CLIENTS
}

/// How long the cycles run: `COORD_FAILOVER_SECS`, or one cycle (the short form).
fn run_secs() -> u64 {
    std::env::var("COORD_FAILOVER_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Whether the long form was asked for (`COORD_FAILOVER_SECS` set).
pub(crate) fn long_form() -> bool {
    run_secs() > 0
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"))
}

// ---------------------------------------------------------------- the figures

/// A run's checked history and what the test judges besides the promises.
pub(crate) struct Outcomes {
    pub report: Report,
    /// Lock calls that succeeded between a promotion and the heal that followed it: the
    /// majority side's availability during the split.
    pub locks_ok_in_split: usize,
    pub idempotent_ok_in_split: usize,
    /// Failed or unknown lock and idempotent calls per minute of history.
    pub errors_per_minute: f64,
    /// Failed or unknown lock calls, and idempotent calls.
    pub lock_errors: usize,
    pub idempotent_errors: usize,
    /// Mean time from a cut to the promotion, and from a heal to the old primary's rejoining
    /// as a replica, in milliseconds.
    pub promotion_ms: u64,
    pub rejoin_ms: u64,
    /// The merged history, for `check` (the case removes it when it passes).
    pub history: PathBuf,
}

impl Outcomes {
    /// Removes the merged history of a run that passed, unless `COORD_HISTORY_KEEP` is set.
    pub fn discard(&self) {
        if std::env::var_os("COORD_HISTORY_KEEP").is_none() {
            let _ = std::fs::remove_file(&self.history);
        }
    }
}

fn figures(events: &[Event], report: Report, history: PathBuf) -> Outcomes {
    // Split windows: from each observed promotion to the next heal.
    let mut promotions: Vec<u64> = Vec::new();
    let mut heals: Vec<u64> = Vec::new();
    let mut cuts: Vec<u64> = Vec::new();
    let mut rejoins: Vec<u64> = Vec::new();
    for e in events {
        if let Event::Fault(f) = e {
            match (f.fault.as_str(), f.start) {
                ("sentinel-promotion", true) => promotions.push(f.at),
                ("primary-partition", true) => cuts.push(f.at),
                ("primary-partition", false) => heals.push(f.at),
                ("old-primary-rejoined", true) => rejoins.push(f.at),
                _ => {}
            }
        }
    }
    // Each is recorded in order, one per cycle, by the one controller thread.
    let mean_ms = |from: &[u64], to: &[u64]| {
        let pairs: Vec<u64> = from
            .iter()
            .zip(to)
            .map(|(a, b)| b.saturating_sub(*a))
            .collect();
        if pairs.is_empty() {
            0
        } else {
            pairs.iter().sum::<u64>() / pairs.len() as u64 / 1_000_000
        }
    };
    let promotion_ms = mean_ms(&cuts, &promotions);
    let rejoin_ms = mean_ms(&heals, &rejoins);
    let windows: Vec<(u64, u64)> = promotions
        .iter()
        .filter_map(|&p| Some((p, *heals.iter().filter(|&&h| h > p).min()?)))
        .collect();
    let invokes: std::collections::HashMap<_, _> = events
        .iter()
        .filter_map(|e| match e {
            Event::Invoke(i) => Some((i.call, i.at)),
            _ => None,
        })
        .collect();
    let mut locks_ok_in_split = 0;
    let mut idempotent_ok_in_split = 0;
    let mut errors = 0usize;
    let mut lock_errors = 0usize;
    let mut idempotent_errors = 0usize;
    for e in events {
        let Event::Complete(c) = e else { continue };
        if c.outcome != Outcome::Ok {
            errors += 1;
            match c.op {
                Op::Lock => lock_errors += 1,
                Op::Idempotent => idempotent_errors += 1,
                _ => {}
            }
            continue;
        }
        let Some(&start) = invokes.get(&c.call) else {
            continue;
        };
        if windows.iter().any(|&(p, h)| start >= p && c.at <= h) {
            match c.op {
                Op::Lock => locks_ok_in_split += 1,
                Op::Idempotent => idempotent_ok_in_split += 1,
                _ => {}
            }
        }
    }
    let minutes = report.span as f64 / 60e9;
    Outcomes {
        report,
        locks_ok_in_split,
        idempotent_ok_in_split,
        lock_errors,
        idempotent_errors,
        promotion_ms,
        rejoin_ms,
        errors_per_minute: if minutes > 0.0 {
            errors as f64 / minutes
        } else {
            0.0
        },
        history,
    }
}

// ---------------------------------------------------------------- the test process

/// Runs the nemesis for `client` under `setting` and returns the checked history: creates
/// the namespaces, runs the controller in the hub, checks what it recorded.
pub(crate) fn run(client: Client, setting: Setting) -> Outcomes {
    let name = client_name(client);
    let lan = TestLan::create(hosts(setting));
    let started = Instant::now();
    let history = std::env::temp_dir().join(format!(
        "coord-history-failover-{name}-{}-{}.jsonl",
        setting.name(),
        std::process::id()
    ));
    let mut controller =
        TestLan::command_in(&lan.hub(), std::env::current_exe().expect("own path"))
            .env(crate::ROLE, ROLE_RUN)
            .env("COORD_FAILOVER_LAN", lan.prefix())
            .env("COORD_FAILOVER_REPLICAS", setting.replicas.to_string())
            .env("COORD_FAILOVER_ACKS", if setting.acks { "1" } else { "0" })
            .env("COORD_HISTORY_CLIENT", name)
            .env("COORD_HISTORY_OUT", &history)
            .env("COORD_FAILOVER_SECS_RUN", run_secs().to_string())
            .env("COORD_HISTORY_SEED_CHILD", crate::seed().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run the controller in the hub namespace");
    // Generous: each cycle awaits a promotion (seconds) and a demotion (Sentinel checks its
    // instances every 10 s), on a loaded host.
    let deadline = started + Duration::from_secs(run_secs() + 300);
    let status = loop {
        if let Some(status) = controller.try_wait().expect("wait for the controller") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = controller.kill();
            let _ = controller.wait();
            panic!("the failover controller did not finish in time");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        status.success(),
        "the failover controller failed ({status}); see its output above"
    );
    let events = coord_history::read_jsonl(&history).expect("the controller wrote the history");
    let report = coord_history::check(&events);
    let outcomes = figures(&events, report, history.clone());
    let r = &outcomes.report;
    println!(
        "histories/{name}/failover {} (seed {:#x}, {:.1} s, history {}): {} faults {:?}; {} \
         calls {:?}, outcomes {:?}; violations: at-most-once {}, same-answer {}, \
         held-throughout {}, no-overlap {}, tokens-grow {}; resource writes {} admitted / {} \
         refused; errors {:.0}/min ({} lock, {} idempotent); double-holder window {} ms; ok \
         during splits: {} lock, {} idempotent; mean cut to promotion {} ms, heal to rejoin {} \
         ms",
        setting.name(),
        crate::seed(),
        started.elapsed().as_secs_f64(),
        history.display(),
        r.total_faults(),
        r.faults,
        r.total_calls(),
        r.calls,
        r.outcomes,
        r.count(Promise::AtMostOnce),
        r.count(Promise::SameAnswer),
        r.count(Promise::HeldThroughout),
        r.count(Promise::NoOverlap),
        r.count(Promise::TokensGrow),
        r.writes_accepted,
        r.writes_refused,
        outcomes.errors_per_minute,
        outcomes.lock_errors,
        outcomes.idempotent_errors,
        r.double_holder / 1_000_000,
        outcomes.locks_ok_in_split,
        outcomes.idempotent_ok_in_split,
        outcomes.promotion_ms,
        outcomes.rejoin_ms,
    );
    if let Some(v) = r.violations.first() {
        print!("  for example: {v}");
    }
    assert!(
        r.faults.get("primary-partition").copied().unwrap_or(0) >= 1
            && r.faults.get("sentinel-promotion").copied().unwrap_or(0) >= 1
            && r.faults.get("old-primary-rejoined").copied().unwrap_or(0) >= 1,
        "no full failover cycle was recorded: {r}"
    );
    for op in ["lock", "idempotent"] {
        assert!(
            r.calls.get(op).copied().unwrap_or(0) >= 20,
            "too few {op} calls to judge anything: {r}"
        );
    }
    drop(lan);
    outcomes
}

// ---------------------------------------------------------------- the controller

struct Workers(Vec<(Child, PathBuf)>);

impl Drop for Workers {
    fn drop(&mut self) {
        for (child, out) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(out);
        }
    }
}

fn info(server: &LanServer, field: &str) -> Option<String> {
    server.info_field("replication", field)
}

fn poll(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The master every Sentinel names, when they agree.
fn named_master(sentinels: &[LanServer]) -> Option<Ipv4Addr> {
    let mut named = None;
    for s in sentinels {
        let Ok(Resp::Array(addr)) = s.command(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER])
        else {
            return None;
        };
        let ip: Ipv4Addr = addr.first()?.text()?.parse().ok()?;
        if named.is_some_and(|n| n != ip) {
            return None;
        }
        named = Some(ip);
    }
    named
}

fn fault(rec: &Recorder, fault: &str, start: bool) {
    rec.push(Event::Fault(Fault {
        at: now_ns(),
        fault: fault.into(),
        start,
        data_loss: false,
    }));
}

/// The controller, in the hub namespace.
pub(crate) fn controller() {
    let replicas: usize = var("COORD_FAILOVER_REPLICAS").parse().expect("replicas");
    let acks = var("COORD_FAILOVER_ACKS") == "1";
    let setting = Setting { replicas, acks };
    let lan = TestLan::attach(&var("COORD_FAILOVER_LAN"), hosts(setting));
    let client = var("COORD_HISTORY_CLIENT");
    let out = PathBuf::from(var("COORD_HISTORY_OUT"));
    let secs: u64 = var("COORD_FAILOVER_SECS_RUN").parse().expect("secs");
    let seed: u64 = var("COORD_HISTORY_SEED_CHILD").parse().expect("seed");

    let mut server_args = vec!["--appendonly", "yes", "--appendfsync", "always"];
    if acks {
        server_args.extend([
            "--min-replicas-to-write",
            "1",
            "--min-replicas-max-lag",
            "2",
        ]);
    }
    let primary_ip = lan.ip(0).to_string();
    let mut servers = vec![LanServer::start(&lan, 0, 6379, &server_args)];
    for host in 1..=replicas {
        let mut args = server_args.clone();
        args.extend(["--replicaof", primary_ip.as_str(), "6379"]);
        servers.push(LanServer::start(&lan, host, 6379, &args));
    }
    poll("the replicas to sync", Duration::from_secs(30), || {
        servers[1..]
            .iter()
            .all(|r| info(r, "master_link_status").as_deref() == Some("up"))
    });
    let sentinels: Vec<LanServer> = (0..3)
        .map(|i| {
            LanServer::start_sentinel(
                &lan,
                sentinel_host(setting),
                26379 + i,
                MASTER,
                servers[0].addr(),
                2,
                Duration::from_secs(1),
            )
        })
        .collect();
    poll(
        "the Sentinels to know the replicas and each other",
        Duration::from_secs(60),
        || {
            sentinels.iter().all(|s| {
                let count = |what: &str| match s.command(&["SENTINEL", what, MASTER]) {
                    Ok(Resp::Array(items)) => items.len(),
                    _ => 0,
                };
                count("REPLICAS") == replicas && count("SENTINELS") == 2
            })
        },
    );
    let sentinel_urls: Vec<String> = sentinels
        .iter()
        .map(|s| format!("redis://{}", s.addr()))
        .collect();

    let witness = WitnessServer::start();
    let socket =
        std::env::temp_dir().join(format!("coord-history-witness-{}.sock", std::process::id()));
    witness
        .listen_unix(&socket)
        .expect("listen on a Unix socket");
    let stop = std::env::temp_dir().join(format!("coord-history-stop-{}", std::process::id()));
    let _ = std::fs::remove_file(&stop);
    let exe = std::env::current_exe().expect("own path");
    let workers = Workers(
        (0..CLIENTS)
            .map(|c| {
                let worker_out = out.with_extension(format!("client{c}.jsonl"));
                let child = TestLan::command_in(&lan.host(client_host(setting, c)), &exe)
                    .env(crate::ROLE, ROLE_WORKER)
                    .env("COORD_FAILOVER_SENTINELS", sentinel_urls.join(","))
                    .env("COORD_FAILOVER_ACKS", if acks { "1" } else { "0" })
                    .env("COORD_FAILOVER_WITNESS", &socket)
                    .env("COORD_FAILOVER_STOP", &stop)
                    .env("COORD_HISTORY_CLIENT", &client)
                    .env("COORD_HISTORY_NS", format!("failover-{client}"))
                    .env("COORD_HISTORY_SEED_CHILD", (seed + c as u64).to_string())
                    .env("COORD_HISTORY_OUT", &worker_out)
                    .env("RUST_LOG", "off")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .expect("run a client process in its namespace");
                (child, worker_out)
            })
            .collect(),
    );

    // The first cut only once every client is calling (processes start slowly on a loaded
    // host): the history must hold calls from before the failover too.
    poll(
        "the clients to start calling",
        Duration::from_secs(60),
        || {
            let callers: std::collections::HashSet<u32> = witness
                .events()
                .iter()
                .filter_map(|e| match e {
                    Event::Effect(x) => Some(x.call.pid()),
                    _ => None,
                })
                .collect();
            callers.len() >= CLIENTS
        },
    );
    let rec = Recorder::new();
    let started = Instant::now();
    let mut cycle = 0;
    loop {
        std::thread::sleep(CALM);
        let old = named_master(&sentinels).expect("the Sentinels agree on the master");
        let old_host = (0..=replicas)
            .find(|&h| lan.ip(h) == old)
            .expect("the master is one of the servers");
        let minority: Vec<usize> = (0..MINORITY)
            .map(|i| client_host(setting, (cycle * MINORITY + i) % CLIENTS))
            .collect();
        let mut cut_off = vec![old_host];
        cut_off.extend(&minority);
        let others: Vec<usize> = (0..hosts(setting))
            .filter(|h| !cut_off.contains(h))
            .collect();
        fault(&rec, "primary-partition", true);
        lan.cut(&cut_off, &others);
        poll(
            "the Sentinels to promote a replica",
            Duration::from_secs(60),
            || {
                named_master(&sentinels).is_some_and(|m| {
                    m != old
                        && servers
                            .iter()
                            .find(|s| *s.addr().ip() == m)
                            .is_some_and(|s| info(s, "role").as_deref() == Some("master"))
                })
            },
        );
        fault(&rec, "sentinel-promotion", true);
        let promoted = now_ns();
        std::thread::sleep(SPLIT_AFTER_PROMOTION);
        if replicas >= 2 {
            // Two replicas must keep the majority side available: the split lasts until two
            // of its holds ran their bodies to the end after the promotion (a grant on the
            // cut-off side fails its replica acknowledgement before the body runs), plus a
            // moment for those calls to return before the heal.
            poll(
                "the majority side to complete holds during the split",
                Duration::from_secs(60),
                || {
                    witness
                        .events()
                        .iter()
                        .filter(|e| {
                            matches!(e, Event::Resource(w)
                                if w.phase == Phase::Exit && w.accepted && w.at > promoted)
                        })
                        .count()
                        >= 2
                },
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        lan.heal();
        fault(&rec, "primary-partition", false);
        let old_server = &servers[old_host];
        poll(
            "the old primary to rejoin as a replica",
            Duration::from_secs(120),
            || {
                info(old_server, "role").as_deref() == Some("slave")
                    && info(old_server, "master_link_status").as_deref() == Some("up")
            },
        );
        fault(&rec, "old-primary-rejoined", true);
        cycle += 1;
        if started.elapsed() >= Duration::from_secs(secs) {
            break;
        }
    }
    // Calls after the old primary rejoined belong in the history too.
    std::thread::sleep(2 * CALM);
    std::fs::write(&stop, b"stop").expect("write the stop file");
    let mut workers = workers;
    let mut events = rec.events();
    for (child, worker_out) in &mut workers.0 {
        let deadline = Instant::now() + Duration::from_secs(60);
        while child.try_wait().expect("wait for a client").is_none() {
            assert!(
                Instant::now() < deadline,
                "a client process did not stop within 60 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut theirs = coord_history::read_jsonl(worker_out)
            .unwrap_or_else(|e| panic!("a client process wrote no readable history: {e}"));
        events.append(&mut theirs);
    }
    events.extend(witness.events());
    coord_history::write_jsonl(&out, &events).expect("write the merged history");
    let _ = std::fs::remove_file(&stop);
    let _ = std::fs::remove_file(&socket);
    drop(sentinels);
    drop(servers);
    println!("failover controller: {cycle} cycles");
}

// ---------------------------------------------------------------- the clients

/// A client process, in its own namespace.
pub(crate) fn worker() {
    let client = client_named(&var("COORD_HISTORY_CLIENT"));
    let sentinels: Vec<String> = var("COORD_FAILOVER_SENTINELS")
        .split(',')
        .map(str::to_owned)
        .collect();
    let acks = var("COORD_FAILOVER_ACKS") == "1";
    let witness = PathBuf::from(var("COORD_FAILOVER_WITNESS"));
    let stop = PathBuf::from(var("COORD_FAILOVER_STOP"));
    let ns = var("COORD_HISTORY_NS");
    let seed: u64 = var("COORD_HISTORY_SEED_CHILD").parse().expect("seed");
    let out = PathBuf::from(var("COORD_HISTORY_OUT"));
    let rec = Recorder::new();
    runtime().block_on(async {
        let mut builder = RedisProvider::sentinel(MASTER, sentinels)
            .client(client)
            .command_timeout(COMMAND_TIMEOUT);
        if acks {
            builder = builder.replica_acks(1, ACK_WAIT);
        }
        let provider = builder
            .connect()
            .await
            .unwrap_or_else(|e| panic!("connect through the Sentinels: {e}"));
        let coord = Coordinator::builder()
            .namespace(ns)
            .provider(provider)
            .build()
            .expect("coordinator");
        let locks = tokio::spawn(lock_task(
            coord.clone(),
            rec.clone(),
            witness.clone(),
            stop.clone(),
            seed,
        ));
        let idem = tokio::spawn(idempotent_task(
            coord,
            rec.clone(),
            witness,
            stop.clone(),
            seed,
        ));
        // A call stuck long after the stop is left out as never completed (unknown outcome).
        while !stop.exists() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let grace = Duration::from_secs(20);
        let _ = tokio::time::timeout(grace, locks).await;
        let _ = tokio::time::timeout(grace, idem).await;
    });
    rec.write_to(&out).expect("write the history");
    // Calls stuck past the grace must not keep the process alive.
    std::process::exit(0);
}

async fn lock_task(coord: Coordinator, rec: Recorder, witness: PathBuf, stop: PathBuf, seed: u64) {
    let witness = WitnessClient::connect_unix(&witness)
        .await
        .expect("the witness listens on its Unix socket");
    let mut rng = Rng::new(seed ^ 0x10c4);
    while !stop.exists() {
        let name = format!("lk{}", rng.between(0, 1));
        let hold = Duration::from_millis(rng.between(100, 1500));
        let invoked = rec.invoke_renewing_lock(0, &name, RENEW);
        let call = invoked.call;
        let seen = AtomicU64::new(0);
        let key = coord.key("failover.lock").part(name.as_str()).finish();
        let witness = &witness;
        let result: Result<u64, CoordError> = coord
            .lock(key)
            .lease(LEASE)
            .renew(RENEW)
            .wait(Duration::from_secs(1))
            .fenced()
            .run(|| async {
                let token = fencing_token().expect("a fenced hold has a token").get();
                seen.store(token, Ordering::Relaxed);
                witness.fenced_write(&name, token, call, Phase::Enter).await;
                tokio::time::sleep(hold).await;
                witness.fenced_write(&name, token, call, Phase::Exit).await;
                Ok(token)
            })
            .await;
        let ending = match result {
            Ok(token) => Ending::ok(None, Some(token)),
            Err(err) => {
                let (outcome, kind) = classify(&err);
                let mut ending = Ending::failed(outcome, kind);
                ending.token = Some(seen.load(Ordering::Relaxed)).filter(|t| *t != 0);
                ending
            }
        };
        rec.complete(&invoked, ending);
        tokio::time::sleep(Duration::from_millis(rng.between(20, 120))).await;
    }
}

async fn idempotent_task(
    coord: Coordinator,
    rec: Recorder,
    witness: PathBuf,
    stop: PathBuf,
    seed: u64,
) {
    let witness = WitnessClient::connect_unix(&witness)
        .await
        .expect("the witness listens on its Unix socket");
    let mut rng = Rng::new(seed ^ 0x1de4);
    while !stop.exists() {
        // A sliding window of three fresh keys, shared by every client (one clock).
        let window = now_ns() / KEY_WINDOW_NS;
        let name = format!("charge{window}-{}", rng.between(0, 2));
        let (invoked, proposal) =
            rec.invoke_proposing(1, Op::Idempotent, &name, |call| format!("answer-of-{call}"));
        let key = coord.key("failover.charge").part(name.as_str()).finish();
        let witness = &witness;
        let result: Result<String, CoordError> = coord
            .idempotent(key)
            .in_flight_lease(IN_FLIGHT)
            .on_abandoned(OnAbandoned::Fail)
            .wait(Duration::from_secs(2))
            .retention(Duration::from_secs(600))
            .run(|| async {
                witness.effect(&name, invoked.call, EffectKind::Body).await;
                tokio::time::sleep(Duration::from_millis(10)).await;
                Ok(proposal.clone())
            })
            .await;
        let ending = match result {
            Ok(answer) => Ending::ok(Some(answer), None),
            Err(err) => {
                let (outcome, kind) = classify(&err);
                Ending::failed(outcome, kind)
            }
        };
        rec.complete(&invoked, ending);
        tokio::time::sleep(Duration::from_millis(rng.between(50, 250))).await;
    }
}
