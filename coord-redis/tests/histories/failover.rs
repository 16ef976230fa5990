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
//!
//! The controller also records, per cycle, which client processes were cut off and what the
//! old primary answered a probe write (`SET failover-probe`, from the hub) during the split:
//! refused with `NOREPLICAS` (when the servers run `min-replicas-to-write`; the moment is
//! recorded) or taken (after the promotion). The test process reads that record beside the
//! history, so that each setting's own mechanism is checked, not only its sum: which bodies
//! cut-off clients ran on calls made after the cut, or after the refusal, and which
//! violations a call spanning the window in which the old primary still took writes explains.

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
    /// `replica_acks(1, ACK_WAIT)` on the clients.
    pub client_acks: bool,
    /// `min-replicas-to-write 1`, `min-replicas-max-lag 2` on the servers.
    pub min_replicas: bool,
}

impl Setting {
    pub fn name(self) -> String {
        format!(
            "{}-replica{}-{}",
            self.replicas,
            if self.replicas == 1 { "" } else { "s" },
            match (self.client_acks, self.min_replicas) {
                (true, true) => "acks",
                (true, false) => "client-acks-only",
                (false, true) => "min-replicas-only",
                (false, false) => "no-acks",
            }
        )
    }
}

/// `min-replicas-max-lag` on the servers when `min_replicas` is set, in seconds.
const MAX_LAG_SECS: &str = "2";
/// The key the controller writes at the old primary to see whether it still takes writes
/// (outside every namespace the clients use).
const PROBE_KEY: &str = "failover-probe";

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
    /// The controller's record of each cycle (cut, heal, the cut-off clients' processes, what
    /// the old primary answered its probe writes), removed with the history.
    pub cycles_file: PathBuf,
    /// Cycles run, and how many of them saw the old primary refuse a probe write during the
    /// split (`NOREPLICAS`) and accept one after the promotion.
    pub cycles: usize,
    pub refusing_cycles: usize,
    pub accepting_cycles: usize,
    /// Mean time from a cut to the old primary's first refused probe write, in milliseconds
    /// (0 when it never refused).
    pub refusal_ms: u64,
    /// Bodies (a lock's `enter` at the resource, an idempotent body's effect) that ran before
    /// the heal for calls of cut-off clients invoked after their cycle's cut: each had its
    /// grant or claim from the old primary alone.
    pub cut_off_bodies_after_cut: usize,
    /// The same for calls invoked after the old primary refused its first probe write.
    pub cut_off_bodies_after_refusal: usize,
    /// Violations none of whose calls spans a window in which the old primary still took
    /// writes after a cut (invoked before the old primary refused a probe, or before it
    /// rejoined as a replica when it never refused, and ended after the cut or never): losses
    /// the cut-off primary's acknowledged writes do not explain.
    pub unexplained_violations: usize,
}

impl Outcomes {
    /// Removes the merged history of a run that passed, unless `COORD_HISTORY_KEEP` is set.
    pub fn discard(&self) {
        if std::env::var_os("COORD_HISTORY_KEEP").is_none() {
            let _ = std::fs::remove_file(&self.history);
            let _ = std::fs::remove_file(&self.cycles_file);
        }
    }
}

/// One failover cycle as the controller saw it.
#[derive(Debug, Clone)]
struct Cycle {
    cut: u64,
    heal: u64,
    /// When the old primary was seen rejoined as a replica (it took writes until then, unless
    /// it refused them).
    rejoined: u64,
    /// When the old primary first answered a probe write with an error (`NOREPLICAS`).
    refused: Option<u64>,
    /// When the old primary took a probe write after the promotion.
    accepted: Option<u64>,
    /// The client processes cut off with the old primary.
    cut_off: Vec<u32>,
}

impl Cycle {
    /// One line of the cycles file.
    fn line(&self) -> String {
        let pids: Vec<String> = self.cut_off.iter().map(u32::to_string).collect();
        format!(
            "cycle {} {} {} {} {} {}",
            self.cut,
            self.heal,
            self.rejoined,
            self.refused.unwrap_or(0),
            self.accepted.unwrap_or(0),
            pids.join(",")
        )
    }

    fn parse(line: &str) -> Option<Cycle> {
        let mut f = line.strip_prefix("cycle ")?.split(' ');
        let mut num = || f.next()?.parse::<u64>().ok();
        let (cut, heal, rejoined) = (num()?, num()?, num()?);
        let (refused, accepted) = (num()?, num()?);
        let cut_off = f
            .next()?
            .split(',')
            .map(|p| p.parse().ok())
            .collect::<Option<Vec<u32>>>()?;
        Some(Cycle {
            cut,
            heal,
            rejoined,
            refused: Some(refused).filter(|t| *t != 0),
            accepted: Some(accepted).filter(|t| *t != 0),
            cut_off,
        })
    }
}

/// The cycles file: a `workers` line with every client process's id, then one line a cycle.
fn read_cycles(path: &std::path::Path) -> (Vec<u32>, Vec<Cycle>) {
    let text = std::fs::read_to_string(path).expect("the controller wrote its cycles");
    let mut workers = Vec::new();
    let mut cycles = Vec::new();
    for line in text.lines() {
        if let Some(pids) = line.strip_prefix("workers ") {
            workers = pids.split(',').filter_map(|p| p.parse().ok()).collect();
        } else {
            cycles.push(Cycle::parse(line).unwrap_or_else(|| panic!("a cycle line: {line}")));
        }
    }
    (workers, cycles)
}

/// What the cycles say about the calls of cut-off clients and the violations.
struct Sides {
    bodies_after_cut: usize,
    bodies_after_refusal: usize,
    unexplained_violations: usize,
}

fn sides(events: &[Event], report: &Report, workers: &[u32], cycles: &[Cycle]) -> Sides {
    let mut invoked = std::collections::HashMap::new();
    let mut completed = std::collections::HashMap::new();
    for e in events {
        match e {
            Event::Invoke(i) => {
                // The clients' histories name their own process ids; the controller names the
                // processes it started (`ip netns exec` execs, keeping the id). Were they to
                // differ, no call would be counted as cut off and the checks below would pass
                // for nothing.
                assert!(
                    workers.contains(&i.pid),
                    "call {} is from process {}, not one of the clients started ({workers:?})",
                    i.call,
                    i.pid
                );
                invoked.insert(i.call, i.at);
            }
            Event::Complete(c) => {
                completed.insert(c.call, c.at);
            }
            _ => {}
        }
    }
    // A body ran at `at` for `call`: counted when the call is a cut-off client's, invoked after
    // `from` of its cycle (the cut, or the refusal) and the body ran before the heal.
    let body_after = |call: coord_history::CallId, at: u64, from: fn(&Cycle) -> Option<u64>| {
        let Some(&start) = invoked.get(&call) else {
            return false;
        };
        cycles.iter().any(|c| {
            c.cut_off.contains(&call.pid())
                && from(c).is_some_and(|from| start >= from)
                && at < c.heal
        })
    };
    let mut bodies_after_cut = 0;
    let mut bodies_after_refusal = 0;
    for e in events {
        let (call, at) = match e {
            Event::Resource(w) if w.phase == Phase::Enter => (w.call, w.at),
            Event::Effect(x) if x.kind == EffectKind::Body => (x.call, x.at),
            _ => continue,
        };
        if body_after(call, at, |c| Some(c.cut)) {
            bodies_after_cut += 1;
        }
        if body_after(call, at, |c| c.refused) {
            bodies_after_refusal += 1;
        }
    }
    // A call spans a window of writes the old primary took alone when it was invoked before
    // the old primary refused (before it rejoined, if it never did) and had not ended by the
    // cut.
    let spans_window = |call: &coord_history::CallId| {
        let Some(&start) = invoked.get(call) else {
            return false;
        };
        let end = completed.get(call).copied().unwrap_or(u64::MAX);
        cycles
            .iter()
            .any(|c| start < c.refused.unwrap_or(c.rejoined) && end >= c.cut)
    };
    let unexplained_violations = report
        .violations
        .iter()
        .filter(|v| {
            !v.events.iter().any(|e| {
                let call = match e {
                    Event::Invoke(i) => i.call,
                    Event::Complete(c) => c.call,
                    Event::Resource(w) => w.call,
                    Event::Effect(x) => x.call,
                    _ => return false,
                };
                spans_window(&call)
            })
        })
        .count();
    Sides {
        bodies_after_cut,
        bodies_after_refusal,
        unexplained_violations,
    }
}

fn figures(events: &[Event], report: Report, history: PathBuf, cycles_file: PathBuf) -> Outcomes {
    let (workers, cycles) = read_cycles(&cycles_file);
    let sides = sides(events, &report, &workers, &cycles);
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
        cycles: cycles.len(),
        refusing_cycles: cycles.iter().filter(|c| c.refused.is_some()).count(),
        accepting_cycles: cycles.iter().filter(|c| c.accepted.is_some()).count(),
        refusal_ms: {
            let waits: Vec<u64> = cycles
                .iter()
                .filter_map(|c| Some(c.refused?.saturating_sub(c.cut)))
                .collect();
            if waits.is_empty() {
                0
            } else {
                waits.iter().sum::<u64>() / waits.len() as u64 / 1_000_000
            }
        },
        cut_off_bodies_after_cut: sides.bodies_after_cut,
        cut_off_bodies_after_refusal: sides.bodies_after_refusal,
        unexplained_violations: sides.unexplained_violations,
        cycles_file,
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
            .env("COORD_FAILOVER_ACKS", flag(setting.client_acks))
            .env("COORD_FAILOVER_MIN_REPLICAS", flag(setting.min_replicas))
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
    let outcomes = figures(&events, report, history.clone(), cycles_path(&history));
    let r = &outcomes.report;
    println!(
        "histories/{name}/failover {} (seed {:#x}, {:.1} s, history {}): {} faults {:?}; {} \
         calls {:?}, outcomes {:?}; violations: at-most-once {}, same-answer {}, \
         held-throughout {}, no-overlap {}, tokens-grow {}; resource writes {} admitted / {} \
         refused; errors {:.0}/min ({} lock, {} idempotent); double-holder window {} ms; ok \
         during splits: {} lock, {} idempotent; mean cut to promotion {} ms, heal to rejoin {} \
         ms; old primary refused a probe write in {} (mean {} ms after the cut) and took one \
         after the promotion in {} of {} cycles; cut-off bodies after the cut {}, after the refusal {}; violations \
         unexplained by the cut-off primary's writes {}",
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
        outcomes.refusing_cycles,
        outcomes.refusal_ms,
        outcomes.accepting_cycles,
        outcomes.cycles,
        outcomes.cut_off_bodies_after_cut,
        outcomes.cut_off_bodies_after_refusal,
        outcomes.unexplained_violations,
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

fn flag(on: bool) -> &'static str {
    if on { "1" } else { "0" }
}

/// Where the controller writes its cycles, beside the history.
fn cycles_path(history: &std::path::Path) -> PathBuf {
    history.with_extension("cycles")
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

/// A write at `server`: `Some(true)` taken, `Some(false)` refused with an error
/// (`NOREPLICAS`), `None` when it did not answer.
fn probe(server: &LanServer) -> Option<bool> {
    match server.command(&["SET", PROBE_KEY, "x"]) {
        Ok(Resp::Simple(ok)) if ok == "OK" => Some(true),
        Ok(Resp::Error(e)) if e.starts_with("NOREPLICAS") => Some(false),
        _ => None,
    }
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
    let min_replicas = var("COORD_FAILOVER_MIN_REPLICAS") == "1";
    let setting = Setting {
        replicas,
        client_acks: acks,
        min_replicas,
    };
    let lan = TestLan::attach(&var("COORD_FAILOVER_LAN"), hosts(setting));
    let client = var("COORD_HISTORY_CLIENT");
    let out = PathBuf::from(var("COORD_HISTORY_OUT"));
    let secs: u64 = var("COORD_FAILOVER_SECS_RUN").parse().expect("secs");
    let seed: u64 = var("COORD_HISTORY_SEED_CHILD").parse().expect("seed");

    let mut server_args = vec!["--appendonly", "yes", "--appendfsync", "always"];
    if min_replicas {
        server_args.extend([
            "--min-replicas-to-write",
            "1",
            "--min-replicas-max-lag",
            MAX_LAG_SECS,
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
                    .env("COORD_FAILOVER_ACKS", flag(acks))
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
    let worker_pids: Vec<u32> = workers.0.iter().map(|(child, _)| child.id()).collect();
    let mut cycles: Vec<Cycle> = Vec::new();
    let rec = Recorder::new();
    let started = Instant::now();
    let mut cycle = 0;
    loop {
        std::thread::sleep(CALM);
        let old = named_master(&sentinels).expect("the Sentinels agree on the master");
        let old_host = (0..=replicas)
            .find(|&h| lan.ip(h) == old)
            .expect("the master is one of the servers");
        let minority_clients: Vec<usize> = (0..MINORITY)
            .map(|i| (cycle * MINORITY + i) % CLIENTS)
            .collect();
        let minority: Vec<usize> = minority_clients
            .iter()
            .map(|&c| client_host(setting, c))
            .collect();
        let mut cut_off = vec![old_host];
        cut_off.extend(&minority);
        let others: Vec<usize> = (0..hosts(setting))
            .filter(|h| !cut_off.contains(h))
            .collect();
        fault(&rec, "primary-partition", true);
        lan.cut(&cut_off, &others);
        let cut = now_ns();
        let old_server = &servers[old_host];
        // With `min-replicas-to-write`, the old primary is watched for the moment it starts
        // refusing writes, while the promotion is awaited.
        let mut refused = None;
        let look_for_refusal = |refused: &mut Option<u64>| {
            if min_replicas && refused.is_none() && probe(old_server) == Some(false) {
                *refused = Some(now_ns());
            }
        };
        poll(
            "the Sentinels to promote a replica",
            Duration::from_secs(60),
            || {
                look_for_refusal(&mut refused);
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
        if min_replicas {
            // No replica acknowledges the cut-off primary any more: it refuses once the last
            // acknowledgement is `min-replicas-max-lag` old (acknowledgements come every
            // second). Given far longer here; a primary that never refuses is what the case
            // reports.
            let deadline = Instant::now() + Duration::from_secs(20);
            while refused.is_none() && Instant::now() < deadline {
                look_for_refusal(&mut refused);
                std::thread::sleep(Duration::from_millis(50));
            }
        }
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
        // Whether the old primary, still cut off, takes a write once a replica was promoted:
        // at the servers' defaults it does (only the clients' `WAIT` then refuses a grant).
        let accepted = {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match probe(old_server) {
                    Some(true) => break Some(now_ns()),
                    Some(false) => break None,
                    None if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    None => break None,
                }
            }
        };
        let heal = now_ns();
        lan.heal();
        fault(&rec, "primary-partition", false);
        poll(
            "the old primary to rejoin as a replica",
            Duration::from_secs(120),
            || {
                info(old_server, "role").as_deref() == Some("slave")
                    && info(old_server, "master_link_status").as_deref() == Some("up")
            },
        );
        fault(&rec, "old-primary-rejoined", true);
        cycles.push(Cycle {
            cut,
            heal,
            rejoined: now_ns(),
            refused,
            accepted,
            cut_off: minority_clients.iter().map(|&c| worker_pids[c]).collect(),
        });
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
    let pids: Vec<String> = worker_pids.iter().map(u32::to_string).collect();
    let mut lines = vec![format!("workers {}", pids.join(","))];
    lines.extend(cycles.iter().map(Cycle::line));
    std::fs::write(cycles_path(&out), lines.join("\n") + "\n").expect("write the cycles");
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
