//! A caller's wait is bounded by its own deadlines, whatever the server does: Redis frozen
//! (SIGSTOP) while a call settles its lease (storing an idempotent outcome, clearing the marker
//! of a failed body, releasing a lock), with a 300 ms command timeout and 30 s leases. The
//! caller must answer within a few command timeouts, say so in its report and in the metrics,
//! and the clean-up must finish in the background once the server thaws.
//!
//! | test | the fault | the caller gets (bound) | after the thaw |
//! |---|---|---|---|
//! | `stalled_completion` | frozen from the body's return (lease 30 s) | `OutcomeNotStored { Backend(Timeout) }` in < 5 s; `settling_in_background()` | the record is stored by the background; a duplicate replays the one run's answer |
//! | `stalled_completion_warm` | same, the completion script cached beforehand | (same) | (same) |
//! | `stalled_abandon` | frozen as a failed body returns | the body's error in < 5 s; `settling_in_background()` | the marker is cleared; a duplicate runs at once |
//! | `stalled_release` | frozen as a locked body returns (lease 30 s) | the body's `Ok` in < 5 s; `settling_in_background()` | the lock is free within seconds, not at the lease's end |
//!
//! Before the bound, the first case held the caller for the whole in-flight lease (about
//! 31 s with a 30 s lease): completion retried until the marker could no longer be ours.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::provider::{BackendErrorKind, LockProvider, OwnerToken};
use coord_core::{
    CallReport, CoordError, Coordinator, NotStoredCause, distributed_lock, idempotent, observe,
};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::{RedisServer, Resp};
use support::*;

per_client!(
    stalled_completion,
    stalled_completion_warm,
    stalled_abandon,
    stalled_release
);

const TIMEOUT: Duration = Duration::from_millis(300);
/// The most a caller may wait here: three command timeouts and their backoff are about 1 s;
/// the rest is margin for a loaded two-core host.
const CALLER_BOUND: Duration = Duration::from_secs(5);
/// How long the server stays frozen: past the caller's bound, well inside the 30 s leases.
const FROZEN: Duration = Duration::from_secs(3);
/// How long the background may take to settle once the server thaws (its backoff is at most
/// 1 s between attempts).
const SETTLE: Duration = Duration::from_secs(10);
const NS: &str = "cd";

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

/// A body that counts its runs and, once, freezes the server just before it returns.
#[derive(Default)]
struct Body {
    runs: AtomicUsize,
    freeze: Mutex<Option<u32>>,
}

impl Body {
    fn freezing(server: &RedisServer) -> Body {
        Body {
            runs: AtomicUsize::new(0),
            freeze: Mutex::new(Some(server.pid().expect("a running server"))),
        }
    }

    fn run(&self) -> u64 {
        let n = self.runs.fetch_add(1, Ordering::SeqCst) as u64 + 1;
        if let Some(pid) = self.freeze.lock().unwrap().take() {
            signal(pid, libc::SIGSTOP);
        }
        n * 100
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    // `pid` is a redis-server this test started and still owns.
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(rc, 0, "signalling redis-server {pid} failed");
}

#[derive(Debug)]
enum AppError {
    #[allow(dead_code)] // shown through `Debug` in failure messages
    Coord(CoordError),
    Refused,
}

impl From<CoordError> for AppError {
    fn from(err: CoordError) -> Self {
        AppError::Coord(err)
    }
}

#[idempotent(key_from = "id", coordinator = c, name = "cd.charge", in_flight_lease = "30s", on_abandoned = "fail", on_backend_error = "fail_closed")]
async fn charge(c: &Coordinator, id: u32, body: &Body) -> Result<u64, CoordError> {
    Ok(body.run())
}

#[idempotent(key_from = "id", coordinator = c, name = "cd.refuse", in_flight_lease = "30s", on_abandoned = "rerun", on_backend_error = "fail_closed")]
async fn refuse(c: &Coordinator, id: u32, body: &Body) -> Result<u64, AppError> {
    body.run();
    Err(AppError::Refused)
}

#[distributed_lock(key_from = "id", coordinator = c, name = "cd.lock", lease = "30s", on_backend_error = "fail_closed")]
async fn locked(c: &Coordinator, id: u32, body: &Body) -> Result<u64, CoordError> {
    Ok(body.run())
}

/// Runs `call` while the server freezes inside it, and checks the caller's bound. Returns the
/// result, the report, how long the caller waited, and when the call started.
async fn frozen_call<T>(call: impl Future<Output = T>) -> (T, CallReport, Duration, Instant) {
    let started = Instant::now();
    let (result, report) = tokio::time::timeout(Duration::from_secs(60), observe(call))
        .await
        .expect("the call hung for a minute");
    let took = started.elapsed();
    assert!(
        took < CALLER_BOUND,
        "the caller waits for its own deadlines (3 x {TIMEOUT:?} and backoff), not for the server: it waited {took:?}"
    );
    assert!(
        report.settling_in_background(),
        "the report says the clean-up goes on in the background: {report:?}"
    );
    (result, report, took, started)
}

/// Keeps the server frozen until `FROZEN` after `started`, then thaws it.
async fn thaw_at(server: &RedisServer, started: Instant) {
    tokio::time::sleep_until((started + FROZEN).into()).await;
    server.resume();
}

/// The server's record for the call `report` describes, field by field.
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

async fn stalled_completion_case(client: Client, warm: bool) {
    let server = RedisServer::start();
    let (_p, c) = setup(&server, client).await;
    if warm {
        assert_eq!(charge(&c, 0, &Body::default()).await.unwrap(), 100);
    }
    let body = Body::freezing(&server);
    let (result, report, took, started) = frozen_call(charge(&c, 1, &body)).await;
    println!(
        "stalled completion ({client:?}, warm {warm}): the caller answered after {took:?}: {result:?}"
    );
    assert!(
        matches!(
            &result,
            Err(CoordError::OutcomeNotStored { cause: NotStoredCause::Backend(err), .. })
                if matches!(err.kind(), BackendErrorKind::Timeout | BackendErrorKind::Unavailable)
        ),
        "the caller learns its outcome is not stored (yet): {result:?}"
    );
    assert!(report.outcome_not_stored(), "{report:?}");
    assert_eq!(c.metrics().settling_in_background(), 1);
    assert_eq!(c.metrics().outcomes_not_stored(), 1);
    thaw_at(&server, started).await;
    // The background completion lands once the server answers again.
    let thawed = Instant::now();
    until("the record stored in the background", SETTLE, || {
        record(&server, &report).get("st").map(String::as_str) == Some("c")
    })
    .await;
    println!(
        "stalled completion ({client:?}, warm {warm}): stored {:?} after the thaw",
        thawed.elapsed()
    );
    let (again, dup) = observe(charge(&c, 1, &body)).await;
    assert_eq!(
        again.unwrap(),
        100,
        "the duplicate replays the one run's answer"
    );
    assert!(dup.replayed(), "{dup:?}");
    assert!(!dup.settling_in_background(), "{dup:?}");
    assert_eq!(body.runs(), 1, "the body ran once");
}

async fn stalled_completion(client: Client) {
    stalled_completion_case(client, false).await;
}

async fn stalled_completion_warm(client: Client) {
    stalled_completion_case(client, true).await;
}

async fn stalled_abandon(client: Client) {
    let server = RedisServer::start();
    let (_p, c) = setup(&server, client).await;
    let body = Body::freezing(&server);
    let (result, report, took, started) = frozen_call(refuse(&c, 1, &body)).await;
    println!("stalled abandon ({client:?}): the caller answered after {took:?}: {result:?}");
    assert!(
        matches!(result, Err(AppError::Refused)),
        "the body's own error: {result:?}"
    );
    assert_eq!(c.metrics().settling_in_background(), 1);
    thaw_at(&server, started).await;
    let thawed = Instant::now();
    until("the marker cleared in the background", SETTLE, || {
        record(&server, &report).is_empty()
    })
    .await;
    println!(
        "stalled abandon ({client:?}): cleared {:?} after the thaw",
        thawed.elapsed()
    );
    let (again, dup) = observe(refuse(&c, 1, &body)).await;
    assert!(matches!(again, Err(AppError::Refused)), "{again:?}");
    assert!(!dup.settling_in_background(), "{dup:?}");
    assert_eq!(
        body.runs(),
        2,
        "a failed body's key is free: the duplicate runs"
    );
}

async fn stalled_release(client: Client) {
    let server = RedisServer::start();
    let (provider, c) = setup(&server, client).await;
    let body = Body::freezing(&server);
    let (result, report, took, started) = frozen_call(locked(&c, 1, &body)).await;
    println!("stalled release ({client:?}): the caller answered after {took:?}: {result:?}");
    assert_eq!(result.unwrap(), 100, "the body's outcome stands");
    assert_eq!(c.metrics().settling_in_background(), 1);
    let key = report.key().expect("the report names the key").clone();
    thaw_at(&server, started).await;
    let thawed = Instant::now();
    // Another owner gets the lock within seconds of the thaw, not at the 30 s lease's end.
    let other = OwnerToken::new();
    let grant = provider
        .acquire(lock(&key, other, Duration::from_secs(5), SETTLE))
        .await
        .expect("acquire after the thaw");
    assert!(grant.is_some(), "the lock is free after the thaw");
    let freed = thawed.elapsed();
    println!("stalled release ({client:?}): another owner held the lock {freed:?} after the thaw");
    assert!(
        freed < SETTLE,
        "released in the background, not by the lease: {freed:?}"
    );
}
