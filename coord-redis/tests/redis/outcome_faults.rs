//! `#[idempotent]` (and the lock's release) under real Redis faults: a frozen server
//! (SIGSTOP), a restart without persistence, and coord's connections killed
//! (`CLIENT KILL TYPE normal`), while the body runs, while its outcome is being stored, and
//! while a claim's reply is on its way. Every case runs with both clients and a 300 ms command
//! timeout; "lease" is the op's `in_flight_lease` (or the lock's `lease`).
//!
//! | Case (test) | What failed | The caller gets | A duplicate afterwards gets | Body runs |
//! |---|---|---|---|---|
//! | 1a `frozen_past_the_lease_fail` | server frozen from the body's return until the background completion gave up (> timeout + lease 2 s); completion script not yet cached, so the completion queued in the frozen socket meets `NOSCRIPT` on thaw | `OutcomeNotStored { cause: Backend(Timeout) }` after three attempts (< 3 s), `settling_in_background()` | `OutcomeUnknown` (`on_abandoned = "fail"`) | 1 |
//! | 1a `frozen_past_the_lease_fail_warm` | same, completion script cached: the completion queued before the freeze executes on thaw, after the caller gave up on it | `OutcomeNotStored { cause: Backend(Timeout) }` | replay of the one run's answer | 1 |
//! | 1a `frozen_past_the_lease_rerun` | as the first, `on_abandoned = "rerun"` | `OutcomeNotStored { cause: Backend(Timeout) }` | runs again (the lease has passed); a third call replays the rerun | 2 (at-least-once) |
//! | 1a `frozen_past_the_lease_rerun_warm` | as the second, `on_abandoned = "rerun"` | `OutcomeNotStored { cause: Backend(Timeout) }` | replay of the one run's answer | 1 |
//! | 1a `frozen_past_the_lease_return_ok` | as the first, `on_store_error = "return_ok"` | `Ok(v)`, `CallReport::outcome_not_stored()` | `OutcomeUnknown` | 1 |
//! | 1b `frozen_briefly_during_completion` | server frozen 500 ms (lease 3 s), inside the caller's three completion attempts from the body's return | `Ok(v)` after the thaw (completion retried) | replay of `v` | 1 |
//! | 1c `restarted_while_the_body_runs` | server restarted without persistence while the body runs: the marker is gone | `Ok(v)` (stored without marker) | replay of `v` | 1 |
//! | 1c `restarted_and_claimed_by_another` | same, and another caller claims, runs and completes before the first body returns | first caller: `OutcomeNotStored { cause: DoubleRun }`; the other: `Ok(w)` | replay of `w` | 2 (one each) |
//! | 1d `connections_killed_at_completion` | coord's connections killed just before the body returns (5 calls) | `Ok(v)` (stored on a new connection) | replay of `v` | 1 each |
//! | 1d `connections_killed_repeatedly_around_completion` | connections killed every 20 ms for 2 s of back-to-back calls | `Ok(v)`, or `Backend` / `OutcomeNotStored` (counts printed) | every `Ok(v)`: replay of `v`; every `OutcomeNotStored`: never a new run | 1 per key at most |
//! | 2 `late_claim_is_cleared` | server frozen while a claim is sent, thawed 800 ms later: the claim executes after its caller gave up | `Backend(Timeout)` | a retry runs the body within ~60 ms of the thaw (lease 10 s); never `OutcomeUnknown` | 1 |
//! | 2 `late_claim_after_the_lease_is_cleared` | same, frozen 2.5 s with a 1 s lease: the claim executes after the background clean-up stopped trying | `Backend(Timeout)` | **fails today**: `InFlight` for a lease after the thaw, then `OutcomeUnknown` (kept for the retention) for a body that never ran | 0 (then 1) |
//! | 3 `lock_release_lost_to_a_killed_connection` | coord's connections killed just before the lock's release | `Ok(v)` | another owner acquires at once, not after the 20 s lease | 1 |
//! | 3 `lock_release_lost_to_a_frozen_server` | server frozen 700 ms from the body's return: the release times out | `Ok(v)` | another owner acquires ~450 ms after the call returned (background release), not after the lease | 1 |
//! | 3 `lock_acquire_lost_to_a_frozen_server` | server frozen 800 ms while an acquire is sent: it executes on thaw, after its caller gave up | `Backend(Timeout)` | another owner acquires soon after the thaw (background release), not after the lease | 0 |
//! | 4 `duplicate_heavy_load_under_connection_kills` | 8 tasks × up to 400 calls over 50 live keys (a fresh 50 every second), connections killed every 200 ms | `Ok`, or typed errors (counts printed) | for every key with an `Ok`: a replay of that first `Ok`; all `Ok`s of a key equal | measured: 1 per key |
//! | 4 `duplicate_heavy_load_under_kills_and_freezes` | same, every eighth fault a 500 ms freeze | as above | as above | measured: 1 per key |

use crate::support;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coord_core::provider::{BackendErrorKind, LockProvider, OwnerToken};
use coord_core::report::IdempotencyOutcome;
use coord_core::{
    CallReport, CoordError, Coordinator, NotStoredCause, distributed_lock, idempotent, observe,
};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::{RedisServer, Resp, command_at};
use support::*;

per_client!(
    frozen_past_the_lease_fail,
    frozen_past_the_lease_fail_warm,
    frozen_past_the_lease_rerun,
    frozen_past_the_lease_rerun_warm,
    frozen_past_the_lease_return_ok,
    frozen_briefly_during_completion,
    restarted_while_the_body_runs,
    connections_killed_at_completion,
    connections_killed_repeatedly_around_completion,
    late_claim_is_cleared,
    late_claim_after_the_lease_is_cleared,
    lock_release_lost_to_a_killed_connection,
    lock_release_lost_to_a_frozen_server,
    lock_acquire_lost_to_a_frozen_server,
    duplicate_heavy_load_under_connection_kills,
    duplicate_heavy_load_under_kills_and_freezes,
    restarted_and_claimed_by_another,
);

/// Short, so faults turn into timeouts quickly.
const TIMEOUT: Duration = Duration::from_millis(300);
/// The namespace of every coordinator here (each test has a server of its own).
const NS: &str = "of";
/// No call here may take longer than this, whatever the fault.
const HANG: Duration = Duration::from_secs(20);

/// A provider with the short command timeout, and a coordinator over it.
async fn setup(server: &RedisServer, client: Client) -> (RedisProvider, Coordinator) {
    let provider = RedisProvider::builder(server.url())
        .client(client)
        .command_timeout(TIMEOUT)
        .connect()
        .await
        .expect("connect to the test server");
    let coordinator = Coordinator::builder()
        .namespace(NS)
        .provider(provider.clone())
        .build()
        .expect("coordinator");
    (provider, coordinator)
}

/// What the test bodies do, shared with the test: counts runs, answers differently on every
/// run (so a replay of another run's answer shows), and injects the fault.
#[derive(Default)]
struct Body {
    runs: AtomicUsize,
    /// Runs once, synchronously, just before the body returns: the fault to inject.
    before_return: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// When set, the body announces it runs (`.0`) and waits for `.1` before returning.
    gate: Option<(tokio::sync::Notify, tokio::sync::Notify)>,
    /// Added to every answer, so two bodies' answers differ.
    offset: u64,
}

impl Body {
    fn gated() -> Body {
        Body {
            gate: Some(Default::default()),
            ..Body::default()
        }
    }

    fn inject(&self, fault: impl FnOnce() + Send + 'static) {
        *self.before_return.lock().unwrap() = Some(Box::new(fault));
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    async fn run(&self) -> u64 {
        let n = self.runs.fetch_add(1, Ordering::SeqCst) as u64 + 1;
        if let Some((entered, proceed)) = &self.gate {
            entered.notify_one();
            proceed.notified().await;
        }
        let fault = self.before_return.lock().unwrap().take();
        if let Some(fault) = fault {
            fault();
        }
        n * 100 + self.offset
    }
}

#[idempotent(key_from = "id", coordinator = c, name = "of.fail", in_flight_lease = "2s", on_abandoned = "fail", on_backend_error = "fail_closed")]
async fn fail_op(c: &Coordinator, id: u32, body: &Body) -> Result<u64, CoordError> {
    Ok(body.run().await)
}

#[idempotent(key_from = "id", coordinator = c, name = "of.rerun", in_flight_lease = "2s", on_abandoned = "rerun", on_backend_error = "fail_closed")]
async fn rerun_op(c: &Coordinator, id: u32, body: &Body) -> Result<u64, CoordError> {
    Ok(body.run().await)
}

#[idempotent(key_from = "id", coordinator = c, name = "of.return_ok", in_flight_lease = "2s", on_abandoned = "fail", on_store_error = "return_ok", on_backend_error = "fail_closed")]
async fn return_ok_op(c: &Coordinator, id: u32, body: &Body) -> Result<u64, CoordError> {
    Ok(body.run().await)
}

/// A lease long enough that "freed by the lease" and "freed by coord" are told apart.
#[idempotent(key_from = "id", coordinator = c, name = "of.long", in_flight_lease = "3s", on_abandoned = "fail", on_backend_error = "fail_closed")]
async fn long_op(c: &Coordinator, id: u32, body: &Body) -> Result<u64, CoordError> {
    Ok(body.run().await)
}

#[idempotent(key_from = "id", coordinator = c, name = "of.claim", in_flight_lease = "10s", on_abandoned = "fail", on_backend_error = "fail_closed")]
async fn claim_op(c: &Coordinator, id: u32, body: &Body) -> Result<u64, CoordError> {
    Ok(body.run().await)
}

#[idempotent(key_from = "id", coordinator = c, name = "of.short_claim", in_flight_lease = "1s", on_abandoned = "fail", on_backend_error = "fail_closed")]
async fn short_claim_op(c: &Coordinator, id: u32, body: &Body) -> Result<u64, CoordError> {
    Ok(body.run().await)
}

#[distributed_lock(key_from = "id", coordinator = c, name = "of.lock", lease = "20s", on_backend_error = "fail_closed")]
async fn locked(c: &Coordinator, id: u32, body: &Body) -> Result<u64, CoordError> {
    Ok(body.run().await)
}

/// Runs one call, failing the test if it hangs.
async fn bounded<T>(what: &str, call: impl Future<Output = T>) -> T {
    tokio::time::timeout(HANG, call)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"))
}

/// The server's record for the call `report` describes (its Redis hash), field by field.
fn record(server: &RedisServer, report: &CallReport) -> BTreeMap<String, String> {
    let key = report.key().expect("the report names the key");
    match server.command(&["HGETALL", &format!("{NS}:idem:{{{key}}}")]) {
        Resp::Array(items) => items
            .chunks(2)
            .map(|kv| {
                (
                    kv[0].text().unwrap_or_default(),
                    kv.get(1).and_then(Resp::text).unwrap_or_default(),
                )
            })
            .collect(),
        other => panic!("HGETALL answered {other:?}"),
    }
}

/// Thaws `pid` (a paused `redis-server` of this test) after `after`, from a plain thread:
/// the test's own tasks may be stuck on the frozen server meanwhile.
fn resume_later(pid: u32, after: Duration) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(after);
        signal(pid, libc::SIGCONT);
    })
}

fn signal(pid: u32, sig: libc::c_int) {
    // `pid` is a redis-server this test started and still owns (its handle is alive until the
    // test ends), so it names that process.
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(rc, 0, "signalling redis-server {pid} failed");
}

fn kill_normal_clients(port: u16) {
    // The killing connection itself is skipped (SKIPME defaults to yes).
    match command_at(port, &["CLIENT", "KILL", "TYPE", "normal"]) {
        Ok(Resp::Int(_)) => {}
        other => panic!("CLIENT KILL answered {other:?}"),
    }
}

fn is_not_stored_timeout(result: &Result<u64, CoordError>) -> bool {
    matches!(
        result,
        Err(CoordError::OutcomeNotStored { cause: NotStoredCause::Backend(err), .. })
            if matches!(err.kind(), BackendErrorKind::Timeout | BackendErrorKind::Unavailable)
    )
}

// ---------------------------------------------------------------------------------------------
// 1a. The server freezes as the body returns and stays frozen past completion's last try.

/// Freezes the server from inside the body, runs the call until completion gives up, and
/// returns its result and report, the record right after the thaw, and the thaw instant.
async fn frozen_past_the_lease<F, Fut>(
    server: &RedisServer,
    body: &Body,
    call: F,
) -> (
    Result<u64, CoordError>,
    CallReport,
    BTreeMap<String, String>,
)
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<u64, CoordError>>,
{
    let pid = server.pid().unwrap();
    body.inject(move || signal(pid, libc::SIGSTOP));
    let started = Instant::now();
    let (result, report) = bounded("the call", observe(call())).await;
    let took = started.elapsed();
    // The caller waits for three completion attempts (a command timeout each, and backoff),
    // then answers while the rest goes on in the background.
    assert!(
        took < Duration::from_secs(3),
        "the caller is answered within its own deadlines: {took:?}"
    );
    assert!(report.settling_in_background(), "{report:?}");
    // The background keeps trying for at most one lease (2 s) after the first failure; the
    // last attempt then ends within a backoff (<= 1 s) and a command timeout. The server stays
    // frozen until it gave up.
    tokio::time::sleep_until((started + Duration::from_millis(4500)).into()).await;
    server.resume();
    assert_eq!(body.runs(), 1);
    // Let the server work off what was queued while it was frozen.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let record = record(server, &report);
    (result, report, record)
}

/// Which op a 1a case calls.
#[derive(Clone, Copy, Debug)]
enum Op {
    Fail,
    Rerun,
    ReturnOk,
}

async fn call(op: Op, c: &Coordinator, id: u32, body: &Body) -> Result<u64, CoordError> {
    match op {
        Op::Fail => fail_op(c, id, body).await,
        Op::Rerun => rerun_op(c, id, body).await,
        Op::ReturnOk => return_ok_op(c, id, body).await,
    }
}

/// Case 1a for `op`. `warm`: one call completed before, so the server has the completion
/// script cached and the completion sent just before the freeze executes on thaw (its reply
/// long since given up on); cold, that first completion is by SHA, meets `NOSCRIPT` on thaw
/// and changes nothing.
async fn frozen_past_the_lease_case(client: Client, op: Op, warm: bool) {
    let server = RedisServer::start();
    let (_p, c) = setup(&server, client).await;
    if warm {
        assert_eq!(call(op, &c, 0, &Body::default()).await.unwrap(), 100);
    }
    let body = Body::default();
    let (result, report, stored) =
        frozen_past_the_lease(&server, &body, || call(op, &c, 1, &body)).await;
    match op {
        Op::Fail | Op::Rerun => assert!(
            is_not_stored_timeout(&result),
            "the caller learns its outcome was not stored: {result:?}"
        ),
        Op::ReturnOk => {
            assert_eq!(result.unwrap(), 100, "return_ok hands the body's Ok over");
            assert!(
                report.outcome_not_stored(),
                "...and says it is not stored: {report:?}"
            );
        }
    }
    let state = stored.get("st").map(String::as_str);
    let (again, dup) = bounded("the duplicate", observe(call(op, &c, 1, &body))).await;
    println!(
        "1a {op:?} warm={warm} ({client:?}): record after thaw {stored:?}, duplicate {again:?} {:?}",
        dup.idempotency()
    );
    if warm {
        // The caller was told "not stored", yet the completion it sent first landed late:
        // the record holds the one run's answer and a duplicate replays it.
        assert_eq!(state, Some("c"), "the late completion landed: {stored:?}");
        assert_eq!(again.unwrap(), 100, "the replay is the one run's answer");
        assert!(dup.replayed());
        assert_eq!(body.runs(), 1);
        return;
    }
    match op {
        Op::Fail | Op::ReturnOk => {
            // The marker was left; its lease has ended on the server's clock.
            assert_eq!(state, Some("i"), "the marker is left: {stored:?}");
            assert!(
                matches!(again, Err(CoordError::OutcomeUnknown { .. })),
                "on_abandoned = fail: got {again:?}"
            );
            assert_eq!(body.runs(), 1, "on_abandoned = fail never runs it again");
        }
        Op::Rerun => {
            assert!(stored.is_empty(), "the marker lapsed: {stored:?}");
            assert_eq!(again.unwrap(), 200, "the duplicate runs again");
            assert_eq!(dup.idempotency(), Some(IdempotencyOutcome::Executed));
            assert_eq!(body.runs(), 2, "at-least-once: the body ran twice");
            let (third, report) = bounded("the third call", observe(call(op, &c, 1, &body))).await;
            assert_eq!(third.unwrap(), 200, "the rerun's outcome is stored");
            assert!(report.replayed());
        }
    }
}

async fn frozen_past_the_lease_fail(client: Client) {
    frozen_past_the_lease_case(client, Op::Fail, false).await;
}

async fn frozen_past_the_lease_fail_warm(client: Client) {
    frozen_past_the_lease_case(client, Op::Fail, true).await;
}

async fn frozen_past_the_lease_rerun(client: Client) {
    frozen_past_the_lease_case(client, Op::Rerun, false).await;
}

async fn frozen_past_the_lease_rerun_warm(client: Client) {
    frozen_past_the_lease_case(client, Op::Rerun, true).await;
}

async fn frozen_past_the_lease_return_ok(client: Client) {
    frozen_past_the_lease_case(client, Op::ReturnOk, false).await;
}

// ---------------------------------------------------------------------------------------------
// 1b. A freeze shorter than the lease during completion: completion retries and succeeds.

async fn frozen_briefly_during_completion(client: Client) {
    let server = RedisServer::start();
    let (_p, c) = setup(&server, client).await;
    let body = Body::default();
    let pid = server.pid().unwrap();
    let thaw = Arc::new(Mutex::new(None));
    let handle = thaw.clone();
    body.inject(move || {
        signal(pid, libc::SIGSTOP);
        *handle.lock().unwrap() = Some(resume_later(pid, Duration::from_millis(500)));
    });
    let started = Instant::now();
    let (result, report) = bounded("the call", observe(long_op(&c, 1, &body))).await;
    let took = started.elapsed();
    thaw.lock()
        .unwrap()
        .take()
        .expect("injected")
        .join()
        .unwrap();
    assert_eq!(
        result.unwrap(),
        100,
        "completion retried past the freeze ({report:?})"
    );
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(4),
        "the caller waited for the thaw, not for the lease: {took:?}"
    );
    let (again, report) = bounded("the duplicate", observe(long_op(&c, 1, &body))).await;
    assert_eq!(again.unwrap(), 100);
    assert!(report.replayed(), "{report:?}");
    assert_eq!(body.runs(), 1);
}

// ---------------------------------------------------------------------------------------------
// 1c. A restart without persistence while the body runs: the marker is gone at completion.

async fn restarted_while_the_body_runs(client: Client) {
    let mut server = RedisServer::start();
    let (_p, c) = setup(&server, client).await;
    let body = Arc::new(Body::gated());
    let call = tokio::spawn({
        let (c, body) = (c.clone(), body.clone());
        async move { observe(long_op(&c, 1, &body)).await }
    });
    let (entered, proceed) = body.gate.as_ref().unwrap();
    bounded("the body to start", entered.notified()).await;
    tokio::task::block_in_place(|| server.restart());
    proceed.notify_one();
    let (result, report) = bounded("the call", call).await.unwrap();
    assert_eq!(
        result.unwrap(),
        100,
        "stored without the marker ({report:?})"
    );
    let (again, report) = bounded("the duplicate", observe(long_op(&c, 1, &body))).await;
    assert_eq!(again.unwrap(), 100);
    assert!(report.replayed(), "{report:?}");
    assert_eq!(body.runs(), 1);
}

/// The restart loses the marker, and another caller claims and completes the key before the
/// first body returns: the first completion finds the other owner's record, so its caller is
/// told the body ran twice; the other's answer is the one replayed.
async fn restarted_and_claimed_by_another(client: Client) {
    let mut server = RedisServer::start();
    let (_p, c) = setup(&server, client).await;
    let first = Arc::new(Body::gated());
    let call = tokio::spawn({
        let (c, first) = (c.clone(), first.clone());
        async move { observe(long_op(&c, 1, &first)).await }
    });
    let (entered, proceed) = first.gate.as_ref().unwrap();
    bounded("the body to start", entered.notified()).await;
    tokio::task::block_in_place(|| server.restart());
    let second = Body {
        offset: 7,
        ..Body::default()
    };
    let (other, report) = bounded("the other caller", observe(long_op(&c, 1, &second))).await;
    assert_eq!(
        other.unwrap(),
        107,
        "the marker is gone: the other caller runs"
    );
    assert_eq!(report.idempotency(), Some(IdempotencyOutcome::Executed));
    proceed.notify_one();
    let (result, report) = bounded("the call", call).await.unwrap();
    assert!(
        matches!(
            result,
            Err(CoordError::OutcomeNotStored {
                cause: NotStoredCause::DoubleRun { .. },
                ..
            })
        ),
        "the first caller learns the body ran twice: {result:?} ({report:?})"
    );
    let (again, report) = bounded("a duplicate", observe(long_op(&c, 1, &first))).await;
    assert_eq!(again.unwrap(), 107, "the stored answer is the other's");
    assert!(report.replayed());
    assert_eq!((first.runs(), second.runs()), (1, 1));
}

// ---------------------------------------------------------------------------------------------
// 1d. coord's connections killed at completion.

async fn connections_killed_at_completion(client: Client) {
    let server = RedisServer::start();
    let (_p, c) = setup(&server, client).await;
    let body = Body::default();
    let port = server.port();
    for id in 1..=5 {
        body.inject(move || kill_normal_clients(port));
        let runs_before = body.runs();
        let (result, report) = bounded("the call", observe(long_op(&c, id, &body))).await;
        let first = result.unwrap_or_else(|e| panic!("call {id}: {e:?} ({report:?})"));
        let (again, report) = bounded("the duplicate", observe(long_op(&c, id, &body))).await;
        assert_eq!(again.unwrap(), first, "call {id}");
        assert!(report.replayed(), "call {id}: {report:?}");
        assert_eq!(body.runs(), runs_before + 1, "call {id} ran once");
    }
}

/// Kills coord's connections every `every` on a plain thread until the returned flag is set.
fn killer(port: u16, every: Duration) -> (Arc<AtomicBool>, std::thread::JoinHandle<usize>) {
    faults(port, None, every)
}

/// Like [`killer`], and with `freeze = Some(pid)` also freezes that server for [`FREEZE`]
/// instead of every eighth kill. Answers the number of kills.
fn faults(
    port: u16,
    freeze: Option<u32>,
    every: Duration,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<usize>) {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::spawn(move || {
        let mut kills = 0;
        let mut round = 0;
        while !flag.load(Ordering::SeqCst) {
            round += 1;
            match freeze {
                Some(pid) if round % 8 == 0 => {
                    signal(pid, libc::SIGSTOP);
                    std::thread::sleep(FREEZE);
                    signal(pid, libc::SIGCONT);
                }
                _ => {
                    kill_normal_clients(port);
                    kills += 1;
                }
            }
            std::thread::sleep(every);
        }
        kills
    });
    (stop, thread)
}

/// How long the load's freezes last: past the command timeout, well within the lease.
const FREEZE: Duration = Duration::from_millis(500);

/// How long case 1d's storm lasts.
const STORM_FOR: Duration = Duration::from_secs(2);

async fn connections_killed_repeatedly_around_completion(client: Client) {
    let server = RedisServer::start();
    let (_p, c) = setup(&server, client).await;
    let body = Body::default();
    let (stop, thread) = killer(server.port(), Duration::from_millis(20));
    let mut told_ok = Vec::new();
    let mut not_stored = Vec::new();
    let mut errors = BTreeMap::<String, usize>::new();
    let started = Instant::now();
    let mut calls = 0;
    while started.elapsed() < STORM_FOR {
        calls += 1;
        let id = calls;
        let (result, _) = bounded("the call", observe(long_op(&c, id, &body))).await;
        match result {
            Ok(v) => told_ok.push((id, v)),
            Err(e) => {
                assert!(
                    matches!(
                        e,
                        CoordError::OutcomeNotStored { .. } | CoordError::Backend(_)
                    ),
                    "call {id}: only typed store or backend errors, got {e:?}"
                );
                if matches!(e, CoordError::OutcomeNotStored { .. }) {
                    not_stored.push(id);
                }
                *errors.entry(kind(&e)).or_default() += 1;
            }
        }
    }
    stop.store(true, Ordering::SeqCst);
    let kills = thread.join().unwrap();
    for (id, v) in &told_ok {
        let (again, report) = bounded("the duplicate", observe(long_op(&c, *id, &body))).await;
        assert_eq!(
            again.as_ref().ok(),
            Some(v),
            "call {id} was told Ok({v}): a duplicate must replay it ({again:?}, {report:?})"
        );
        assert!(report.replayed(), "call {id}: {report:?}");
    }
    // A body whose outcome was not stored is never run again under on_abandoned = fail (a
    // duplicate gets InFlight, OutcomeUnknown, or the replay of a completion that landed late).
    let runs = body.runs();
    for id in &not_stored {
        let (again, report) = bounded("the duplicate", observe(long_op(&c, *id, &body))).await;
        assert_ne!(
            report.idempotency(),
            Some(IdempotencyOutcome::Executed),
            "call {id} ran again: {again:?}"
        );
    }
    assert_eq!(body.runs(), runs);
    println!(
        "1d storm ({client:?}): {kills} kills, {} of {calls} calls Ok, errors {errors:?}, runs {}",
        told_ok.len(),
        body.runs()
    );
}

// ---------------------------------------------------------------------------------------------
// 2. A claim that times out but executes late.

/// Which op a case-2 run calls: a 10 s lease, or a 1 s one (shorter than the freeze).
async fn claim_call(short: bool, c: &Coordinator, id: u32, body: &Body) -> Result<u64, CoordError> {
    if short {
        short_claim_op(c, id, body).await
    } else {
        claim_op(c, id, body).await
    }
}

/// Freezes the server while a claim is sent and thaws it `frozen_for` later (the claim then
/// executes), then retries until the body runs: it must within `free_within` of the thaw, and
/// a retry must never be told `OutcomeUnknown` (the body never ran).
async fn late_claim_case(client: Client, short: bool, frozen_for: Duration, free_within: Duration) {
    let server = RedisServer::start();
    let (_p, c) = setup(&server, client).await;
    let body = Body::default();
    // Warm up: scripts loaded, connections open.
    assert_eq!(claim_call(short, &c, 0, &body).await.unwrap(), 100);

    server.pause();
    let frozen = Instant::now();
    let (result, _) = bounded("the claim", observe(claim_call(short, &c, 1, &body))).await;
    assert!(
        matches!(&result, Err(CoordError::Backend(err)) if err.kind() == BackendErrorKind::Timeout),
        "the claim's reply did not come in time: {result:?}"
    );
    // Frozen a while longer, so the background clean-up fails a few times too.
    tokio::time::sleep(frozen_for.saturating_sub(frozen.elapsed())).await;
    server.resume();
    let thawed = Instant::now();
    assert_eq!(body.runs(), 1, "only the warm-up ran");

    // The claim executes now; the owner-checked clean-up must clear it.
    let mut seen = BTreeMap::<String, usize>::new();
    let value = loop {
        let (result, report) = bounded("a retry", observe(claim_call(short, &c, 1, &body))).await;
        match result {
            Ok(v) => {
                assert_eq!(report.idempotency(), Some(IdempotencyOutcome::Executed));
                break v;
            }
            Err(e @ (CoordError::InFlight { .. } | CoordError::Backend(_))) => {
                *seen.entry(kind(&e)).or_default() += 1;
            }
            Err(e) => panic!(
                "{:?} after the thaw, a retry of a call whose body never ran got {e:?} \
                 (before that: {seen:?})",
                thawed.elapsed()
            ),
        }
        assert!(
            thawed.elapsed() < free_within,
            "the late claim still blocks the key {:?} after the thaw: {seen:?}",
            thawed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!(
        "2 ({client:?}, frozen {frozen_for:?}): key free {:?} after the thaw; before that {seen:?}",
        thawed.elapsed()
    );
    assert_eq!(value, 200);
    assert_eq!(body.runs(), 2, "the retry ran the body once");
    let (again, report) = bounded("the duplicate", observe(claim_call(short, &c, 1, &body))).await;
    assert_eq!(again.unwrap(), 200);
    assert!(report.replayed());
}

/// Frozen 800 ms, lease 10 s: the key is free within 2 s of the thaw, not after the lease.
async fn late_claim_is_cleared(client: Client) {
    late_claim_case(
        client,
        false,
        Duration::from_millis(800),
        Duration::from_secs(2),
    )
    .await;
}

/// Frozen 2.5 s, longer than the claim's 1 s lease: the claim executes after the background
/// clean-up has stopped trying (it tries for one lease after the failed claim), and its lease
/// starts on execution. The key must still be free for a retry within a few seconds, and never
/// answer `OutcomeUnknown`, since the body never ran.
async fn late_claim_after_the_lease_is_cleared(client: Client) {
    late_claim_case(
        client,
        true,
        Duration::from_millis(2500),
        Duration::from_secs(4),
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// 3. The lock's release lost.

/// Runs `locked` with `fault` injected, then checks another owner gets the lock within
/// `within` of the call's return (the lease is 20 s).
async fn release_lost(
    p: &RedisProvider,
    c: &Coordinator,
    fault: impl FnOnce() + Send + 'static,
    within: Duration,
) {
    let body = Body::default();
    body.inject(fault);
    let (result, report) = bounded("the locked call", observe(locked(c, 1, &body))).await;
    assert_eq!(result.unwrap(), 100, "{report:?}");
    let returned = Instant::now();
    let key = kk(&format!(
        "{NS}:{}",
        report.key().cloned().expect("the report names the key")
    ));
    let other = OwnerToken::new();
    loop {
        // Refused (still held) or failed (the server still frozen): try again shortly.
        if let Ok(Some(_)) = p.acquire(lock(&key, other, LONG, Duration::ZERO)).await {
            break;
        }
        assert!(
            returned.elapsed() < within,
            "the lock is still held {:?} after the call returned (lease 20 s)",
            returned.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("3: lock free {:?} after the call", returned.elapsed());
    assert_eq!(body.runs(), 1);
}

async fn lock_release_lost_to_a_killed_connection(client: Client) {
    let server = RedisServer::start();
    let (p, c) = setup(&server, client).await;
    let port = server.port();
    release_lost(
        &p,
        &c,
        move || kill_normal_clients(port),
        Duration::from_secs(3),
    )
    .await;
}

async fn lock_release_lost_to_a_frozen_server(client: Client) {
    let server = RedisServer::start();
    let (p, c) = setup(&server, client).await;
    let pid = server.pid().unwrap();
    let thaw = Arc::new(Mutex::new(None));
    let handle = thaw.clone();
    release_lost(
        &p,
        &c,
        move || {
            signal(pid, libc::SIGSTOP);
            *handle.lock().unwrap() = Some(resume_later(pid, Duration::from_millis(700)));
        },
        Duration::from_secs(4),
    )
    .await;
    thaw.lock()
        .unwrap()
        .take()
        .expect("injected")
        .join()
        .unwrap();
}

/// The acquire's reply is lost (server frozen 800 ms while it is sent); the acquire executes
/// on thaw, and the background release frees the lock long before its 20 s lease.
async fn lock_acquire_lost_to_a_frozen_server(client: Client) {
    let server = RedisServer::start();
    let (p, c) = setup(&server, client).await;
    let body = Body::default();
    // Warm up: scripts loaded, connections open.
    assert_eq!(locked(&c, 0, &body).await.unwrap(), 100);

    server.pause();
    let frozen = Instant::now();
    let (result, report) = bounded("the locked call", observe(locked(&c, 1, &body))).await;
    assert!(
        matches!(&result, Err(CoordError::Backend(err)) if err.kind() == BackendErrorKind::Timeout),
        "the acquire's reply did not come in time: {result:?}"
    );
    tokio::time::sleep(Duration::from_millis(800).saturating_sub(frozen.elapsed())).await;
    server.resume();
    let thawed = Instant::now();
    let key = kk(&format!(
        "{NS}:{}",
        report.key().cloned().expect("the report names the key")
    ));
    let other = OwnerToken::new();
    loop {
        if let Ok(Some(_)) = p.acquire(lock(&key, other, LONG, Duration::ZERO)).await {
            break;
        }
        assert!(
            thawed.elapsed() < Duration::from_secs(3),
            "the lock is still held {:?} after the thaw (lease 20 s)",
            thawed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "3 acquire ({client:?}): lock free {:?} after the thaw",
        thawed.elapsed()
    );
    assert_eq!(body.runs(), 1, "only the warm-up ran");
}

// ---------------------------------------------------------------------------------------------
// 4. Duplicate-heavy load under repeated connection kills.

#[idempotent(key_from = "id", coordinator = c, name = "of.load", in_flight_lease = "3s", wait = "2s", on_backend_error = "fail_closed")]
async fn load_op(c: &Coordinator, id: u32, next: &AtomicU64) -> Result<u64, CoordError> {
    tokio::time::sleep(Duration::from_millis(2)).await;
    // Every run answers differently: two runs of one key both told Ok would show.
    Ok(next.fetch_add(1, Ordering::SeqCst) + 1)
}

/// A label for an error kind, for the counts.
fn kind(e: &CoordError) -> String {
    match e {
        CoordError::Backend(err) => format!("Backend({:?})", err.kind()),
        CoordError::OutcomeNotStored { cause, .. } => match cause {
            NotStoredCause::Backend(err) => format!("OutcomeNotStored(Backend({:?}))", err.kind()),
            NotStoredCause::DoubleRun { .. } => "OutcomeNotStored(DoubleRun)".to_owned(),
            other => format!("OutcomeNotStored({other})"),
        },
        CoordError::InFlight { .. } => "InFlight".to_owned(),
        CoordError::OutcomeUnknown { .. } => "OutcomeUnknown".to_owned(),
        CoordError::LockLost { .. } => "LockLost".to_owned(),
        other => format!("{other:?}"),
    }
}

const TASKS: usize = 8;
const CALLS_PER_TASK: usize = 400;
const LIVE_KEYS: u32 = 50;
const LOAD_FOR: Duration = Duration::from_secs(8);

async fn duplicate_heavy_load_under_connection_kills(client: Client) {
    duplicate_heavy_load(client, false).await;
}

async fn duplicate_heavy_load_under_kills_and_freezes(client: Client) {
    duplicate_heavy_load(client, true).await;
}

/// Case 4; with `freezes`, every eighth fault is a 500 ms freeze instead of a kill.
async fn duplicate_heavy_load(client: Client, freezes: bool) {
    let server = RedisServer::start();
    let (_p, c) = setup(&server, client).await;
    let next = Arc::new(AtomicU64::new(0));
    let told_ok = Arc::new(Mutex::new(HashMap::<u32, Vec<u64>>::new()));
    let errors = Arc::new(Mutex::new(BTreeMap::<String, usize>::new()));
    let freeze = freezes.then(|| server.pid().unwrap());
    let (stop, thread) = faults(server.port(), freeze, Duration::from_millis(200));
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (c, next, told_ok, errors) =
                (c.clone(), next.clone(), told_ok.clone(), errors.clone());
            tokio::spawn(async move {
                let mut calls = 0;
                let mut seed = 0x9e37_79b9_u32.wrapping_mul(t as u32 + 1);
                while calls < CALLS_PER_TASK && started.elapsed() < LOAD_FOR {
                    seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    // 50 live keys, a fresh set every second: duplicates of running and of
                    // completed calls alike.
                    let epoch = (started.elapsed().as_millis() / 1000) as u32;
                    let id = epoch * LIVE_KEYS + (seed >> 16) % LIVE_KEYS;
                    let result = bounded("a load call", load_op(&c, id, &next)).await;
                    match result {
                        Ok(v) => told_ok.lock().unwrap().entry(id).or_default().push(v),
                        Err(e) => *errors.lock().unwrap().entry(kind(&e)).or_default() += 1,
                    }
                    calls += 1;
                    // Spread the calls over the whole period.
                    tokio::time::sleep(Duration::from_millis(8)).await;
                }
                calls
            })
        })
        .collect();
    let mut calls = 0;
    for task in tasks {
        calls += task.await.unwrap();
    }
    let load_took = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let kills = thread.join().unwrap();
    let runs_during_load = next.load(Ordering::SeqCst);

    // Faults stopped: every key told Ok must replay that Ok, and only that.
    let told_ok = std::mem::take(&mut *told_ok.lock().unwrap());
    let mut oks = 0;
    let mut mismatched = Vec::new();
    let mut lost = Vec::new();
    for (id, values) in &told_ok {
        oks += values.len();
        if values.iter().any(|v| *v != values[0]) {
            mismatched.push((*id, values.clone()));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        let (replay, report) = loop {
            let (result, report) = bounded("a final call", observe(load_op(&c, *id, &next))).await;
            match result {
                Err(CoordError::InFlight { .. } | CoordError::Backend(_))
                    if Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                other => break (other, report),
            }
        };
        if replay.as_ref().ok() != Some(&values[0]) || !report.replayed() {
            lost.push((*id, values[0], replay, report.idempotency()));
        }
    }
    let errors = std::mem::take(&mut *errors.lock().unwrap());
    println!(
        "4 load ({client:?}, freezes {freezes}): {calls} calls in {load_took:?}, {kills} kills, {} keys told Ok, \
         {oks} Ok answers, {runs_during_load} body runs, errors {errors:?}, lost {}, \
         two answers {}",
        told_ok.len(),
        lost.len(),
        mismatched.len()
    );
    assert!(
        mismatched.is_empty(),
        "keys told Ok with different answers: {mismatched:?}"
    );
    assert!(
        lost.is_empty(),
        "keys told Ok whose outcome does not replay: {lost:?}"
    );
    assert!(kills >= 15, "the faults ran throughout: {kills} kills");
    assert!(
        oks > calls / 2,
        "the load mostly succeeds despite the kills: {oks} of {calls}"
    );
}
