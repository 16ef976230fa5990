//! Faults of a real PostgreSQL server while coord works, each asserting what the caller gets,
//! what a duplicate (or the next caller) gets afterwards, and how many times the body ran.
//! Every case starts a server of its own; coord runs with a 300 ms command timeout.
//!
//! | Case (test) | What failed | The caller gets | A duplicate / the next caller gets | Body runs |
//! |---|---|---|---|---|
//! | `terminated_while_waiting_for_a_lock` | the waiter's pooled and listening connections terminated (`pg_terminate_backend`) while it waits | the lock, within ~1 s of the release (listener remade; re-check) | — | 1 |
//! | `terminated_while_holding_a_renewed_lock` | the holder's connections terminated three times during a renewed hold (lease 1 s) | `Ok(v)`: renewals go on over new connections, the hold is never lost | the lock at once after the call | 1 |
//! | `terminated_at_completion` | coord's connections terminated just before the body returns (5 keys) | `Ok(v)` (stored over a new connection) | replay of `v` | 1 each |
//! | `paused_briefly_during_completion` | server frozen (SIGSTOP) 500 ms from the body's return (lease 3 s), inside the caller's three completion attempts | `Ok(v)` after the thaw (completion retried) | replay of `v` | 1 |
//! | `paused_past_the_lease_during_completion` | server frozen 2.5 s from the body's return (lease 1 s, warm connection) | `OutcomeNotStored { cause: Backend(Timeout) }` | replay of `v`: the completion sent before the freeze ran on thaw | 1 |
//! | `paused_during_completion_with_a_long_lease_bounds_the_caller` | server frozen 3 s from the body's return (lease 30 s) | `OutcomeNotStored { cause: Backend(Timeout) }` within 5 s (three command timeouts), `settling_in_background()` | replay of `v` once the background completion lands after the thaw | 1 |
//! | `late_claim_does_nothing` | server frozen 1.5 s while a claim is sent: it executes after its not-after time | `Timeout` | no marker at the key (the statement ran and wrote nothing) | 0 |
//! | `acquire_lost_to_a_frozen_server_is_released` | server frozen 800 ms while an acquire is sent (lease 20 s) | `Backend(Timeout)` | the lock soon after the thaw (background release), not after the lease | 0 |
//! | `killed_and_restarted_while_the_body_runs` | server killed (SIGKILL) and restarted while the body runs | `Ok(v)`: the marker was committed, the completion finds it | replay of `v` | 1 |
//! | `statement_timeout_ends_a_blocked_statement` | another session holds the key's row lock, so coord's statements block | `Backend(Timeout)`; the server cancelled the statement (nothing left waiting) | the body runs once the row is free | 0, then 1 |
//! | `waiting_acquire_outlasts_looks_that_timed_out` | another session holds the lock's row 1.2 s, so the waiter's looks time out (control: a single attempt gets `Timeout`) | the lock (wait 10 s) once the row is free; a wait that ends inside the stall: `Backend(Timeout)` saying its looks got no answer | another owner gets the key at once after the stall: nothing left held | — |
//! | `connection_limit_exhausted` | every connection slot taken by other sessions | a new provider: `Unavailable` naming the limit; a warm provider: `Ok` over its open connection, `Backend(Unavailable)` for calls that need another | once slots are free, everything works; no key ran twice | ≤ 1 per key |
//! | `read_only_server` | `default_transaction_read_only` on, then off | `Backend(Unavailable)` before the body; during completion (500 ms): `Ok(v)` after it is writable again | replay of `v` | 0, then 1 |

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coord_core::provider::{
    BackendErrorKind, ClaimRequest, IdempotencyStore, Operations, OwnerToken,
};
use coord_core::{CoordError, Coordinator, NotStoredCause, distributed_lock, idempotent, observe};
use coord_postgres::PostgresProvider;
use coord_postgres_testing::{PostgresServer, ServerOptions};

/// Short, so faults turn into timeouts quickly.
const TIMEOUT: Duration = Duration::from_millis(300);
/// No call here may take longer than this, whatever the fault.
const HANG: Duration = Duration::from_secs(20);

/// A server of the test's own, migrated.
async fn server_with(options: ServerOptions) -> PostgresServer {
    let server = tokio::task::spawn_blocking(move || PostgresServer::start_configured(options))
        .await
        .unwrap();
    PostgresProvider::migrate(&server.url())
        .await
        .expect("migrate");
    server
}

async fn server() -> PostgresServer {
    server_with(ServerOptions::new()).await
}

/// A provider named `app` (its connections' `application_name`) with the short timeout.
async fn provider(url: &str, app: &str, pool: usize) -> PostgresProvider {
    PostgresProvider::builder(url)
        .command_timeout(TIMEOUT)
        .application_name(app)
        .pool_size(pool)
        .connect()
        .await
        .expect("connect to the test server")
}

fn coordinator(provider: &PostgresProvider) -> Coordinator {
    Coordinator::builder()
        .namespace("faults")
        .provider(provider.clone())
        .build()
        .expect("coordinator")
}

/// Runs one call, failing the test if it hangs.
async fn bounded<T>(what: &str, call: impl Future<Output = T>) -> T {
    tokio::time::timeout(HANG, call)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"))
}

/// The body of the idempotent operations: counts its runs, answers differently on each run,
/// and runs the injected fault just before it returns.
#[derive(Default)]
struct Body {
    runs: AtomicUsize,
    before_return: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    gate: Option<(tokio::sync::Notify, tokio::sync::Notify)>,
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
            // The fault talks to the server synchronously (psql, signals).
            tokio::task::block_in_place(fault);
        }
        n * 100
    }
}

#[idempotent(key_from = "id", coordinator = c, name = "pg.leased", in_flight_lease = "30s", on_abandoned = "fail", on_backend_error = "fail_closed")]
async fn thirty_second_lease_op(c: &Coordinator, id: u32, body: &Body) -> Result<u64, CoordError> {
    Ok(body.run().await)
}

#[idempotent(key_from = "id", coordinator = c, name = "pg.long", in_flight_lease = "3s", on_abandoned = "fail", on_backend_error = "fail_closed")]
async fn long_op(c: &Coordinator, id: u32, body: &Body) -> Result<u64, CoordError> {
    Ok(body.run().await)
}

#[idempotent(key_from = "id", coordinator = c, name = "pg.short", in_flight_lease = "1s", on_abandoned = "fail", on_backend_error = "fail_closed")]
async fn short_op(c: &Coordinator, id: u32, body: &Body) -> Result<u64, CoordError> {
    Ok(body.run().await)
}

/// Held for `hold` (more than twice its 2 s lease, so it lasts only if renewals land), while its
/// sessions are ended three times, 800 ms apart: each renewal after a cut is made on a new
/// connection. (A 1 s lease left a loaded host too little time to reconnect.)
#[distributed_lock(key_from = "id", coordinator = c, name = "pg.renewed", lease = "2s", renew = true, on_backend_error = "fail_closed")]
async fn renewed(
    c: &Coordinator,
    id: u32,
    hold: Duration,
    terminate: &(dyn Fn() + Sync),
) -> Result<u64, CoordError> {
    let started = Instant::now();
    let mut terminated = 0;
    while started.elapsed() < hold {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if terminated < 3 && started.elapsed() > Duration::from_millis(800 * (terminated + 1)) {
            tokio::task::block_in_place(terminate);
            terminated += 1;
        }
    }
    Ok(7)
}

/// A claim with a long lease, kept when abandoned (so a marker left behind would show).
fn req(key: &coord_core::CallKey) -> ClaimRequest<'_> {
    ClaimRequest {
        key,
        owner: OwnerToken::new(),
        in_flight_lease: Duration::from_secs(30),
        fingerprint: None,
        keep_abandoned_for: Some(Duration::from_secs(60)),
        transactional: false,
    }
}

// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn terminated_while_waiting_for_a_lock() {
    let server = server().await;
    // Both sides' statements get 2 s: after the cut, the waiter's next look is made on a new
    // session, which a loaded host took longer than 300 ms to open, and the holder's first
    // acquire opens its pool's first session (which once took over 300 ms on CI with every
    // other binary running). What is tested is that the waiter is woken (by the notification
    // or the re-check), not how fast a session opens.
    let holder_provider = PostgresProvider::builder(server.url())
        .command_timeout(Duration::from_secs(2))
        .application_name("holder")
        .pool_size(2)
        .connect()
        .await
        .expect("connect to the test server");
    let holder = coordinator(&holder_provider);
    let waiter_provider = PostgresProvider::builder(server.url())
        .command_timeout(Duration::from_secs(2))
        .application_name("waiter")
        .pool_size(2)
        .connect()
        .await
        .expect("connect to the test server");
    let waiter = coordinator(&waiter_provider);
    let key = holder.key("pg.wait").part("1").finish();
    let guard = holder
        .lock(key.clone())
        .lease(Duration::from_secs(20))
        .acquire()
        .await
        .expect("free");
    let waiting = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        async move {
            let guard = waiter
                .lock(key)
                .lease(Duration::from_secs(20))
                .wait(Duration::from_secs(15))
                .acquire()
                .await;
            (guard, Instant::now())
        }
    });
    // Once it listens and its look has marked the holder as waited for (the look answered:
    // the waiter is between looks, not in one), cut every connection it has. A cut that
    // caught a look in flight would test something else: that look's error ends the wait.
    let marked_by = Instant::now() + Duration::from_secs(30);
    while server
        .sql("SELECT count(*) FROM coord.locks WHERE waited")
        .trim()
        != "1"
    {
        assert!(Instant::now() < marked_by, "the waiter marks the holder");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(waiter_provider.listener_connections(), 1);
    let cut =
        server.terminate_connections("waiter") + server.terminate_connections("waiter-listener");
    assert!(cut >= 2, "the pool's and the listener's connections: {cut}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released_at = Instant::now();
    assert!(guard.release().await.expect("release"));
    let (granted, granted_at) = bounded("the waiter", waiting).await.unwrap();
    let guard = granted.expect("the waiter gets the lock");
    let after = granted_at.saturating_duration_since(released_at);
    assert!(
        after < Duration::from_secs(3),
        "woken by the notification or the re-check, not the lease: {after:?}"
    );
    assert!(
        waiter_provider.listener_connections() >= 2,
        "the listening connection was made again"
    );
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn terminated_while_holding_a_renewed_lock() {
    let server = Arc::new(server().await);
    let provider = provider(&server.url(), "renewer", 2).await;
    let c = coordinator(&provider);
    let cutter = server.clone();
    let terminate = move || {
        cutter.terminate_connections("renewer");
    };
    let result = bounded(
        "the renewed hold",
        renewed(&c, 1, Duration::from_millis(5000), &terminate),
    )
    .await;
    assert_eq!(result.expect("the hold survives terminated connections"), 7);
    // Released at the end: another owner takes it at once.
    let other = coordinator(&provider);
    let key = other.key("pg.renewed").part(&1u32).finish();
    assert!(other.lock(key).try_acquire().await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn terminated_at_completion() {
    let server = Arc::new(server().await);
    let provider = provider(&server.url(), "completer", 2).await;
    let c = coordinator(&provider);
    for id in 1..=5 {
        let body = Body::default();
        let cutter = server.clone();
        body.inject(move || {
            assert!(cutter.terminate_connections("completer") >= 1);
        });
        // The claim goes first, over the connections the previous round's cut left behind: on
        // a loaded host it can miss its 300 ms bound while a new session is made. Such a call
        // ran nothing (the body's count says so) and is retried, as a client would.
        let mut tries = 0;
        let (result, report) = loop {
            let runs_before = body.runs();
            let (result, report) = bounded("the call", observe(long_op(&c, id, &body))).await;
            tries += 1;
            let ran_nothing = body.runs() == runs_before && tries < 5;
            match &result {
                Err(CoordError::Backend(err))
                    if ran_nothing
                        && matches!(
                            err.kind(),
                            BackendErrorKind::Timeout | BackendErrorKind::Unavailable
                        ) => {}
                // A claim whose reply was lost is cleaned up by owner in the background.
                Err(CoordError::InFlight { .. }) if ran_nothing => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                _ => break (result, report),
            }
        };
        assert_eq!(
            result.unwrap(),
            100,
            "stored over a new connection ({report:?})"
        );
        // The duplicate too may have to open a session (the cut took the pool's others) and
        // miss the bound on a loaded host; retried the same way. It must replay, never run.
        let mut tries = 0;
        let (again, report) = loop {
            let (again, report) = bounded("the duplicate", observe(long_op(&c, id, &body))).await;
            tries += 1;
            match &again {
                Err(CoordError::Backend(err))
                    if tries < 5
                        && matches!(
                            err.kind(),
                            BackendErrorKind::Timeout | BackendErrorKind::Unavailable
                        ) => {}
                _ => break (again, report),
            }
        };
        assert_eq!(again.unwrap(), 100);
        assert!(report.replayed(), "{report:?}");
        assert_eq!(body.runs(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paused_briefly_during_completion() {
    let server = server().await;
    let provider = provider(&server.url(), "coord", 2).await;
    let c = coordinator(&provider);
    let body = Body::default();
    let server = Arc::new(server);
    let thaw = Arc::new(Mutex::new(None));
    let (handle, paused) = (thaw.clone(), server.clone());
    body.inject(move || {
        paused.pause();
        let resumer = paused.clone();
        *handle.lock().unwrap() = Some(std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(500));
            resumer.resume();
        }));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paused_past_the_lease_during_completion() {
    let server = Arc::new(server().await);
    // One pooled connection, warmed by a first call: the completion's statement is prepared
    // there, so it is sent whole before the freeze.
    let provider = provider(&server.url(), "coord", 1).await;
    let c = coordinator(&provider);
    let warm = Body::default();
    assert_eq!(short_op(&c, 1, &warm).await.unwrap(), 100);
    let body = Body::default();
    let paused = server.clone();
    let thaw = Arc::new(Mutex::new(None));
    let handle = thaw.clone();
    body.inject(move || {
        paused.pause();
        let resumer = paused.clone();
        *handle.lock().unwrap() = Some(std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2500));
            resumer.resume();
        }));
    });
    let (result, report) = bounded("the call", observe(short_op(&c, 2, &body))).await;
    assert!(
        matches!(
            &result,
            Err(CoordError::OutcomeNotStored { cause: NotStoredCause::Backend(err), .. })
                if err.kind() == BackendErrorKind::Timeout
        ),
        "the caller is told the outcome may not be stored: {result:?} ({report:?})"
    );
    thaw.lock()
        .unwrap()
        .take()
        .expect("injected")
        .join()
        .unwrap();
    // The duplicate, as a client retries: the first statements after a thaw can miss the
    // 300 ms command timeout on a loaded host (the pool's connection is made again), and a
    // claim whose answer was lost leaves the key in flight until its owner's clean-up.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (again, report) = loop {
        let (again, report) = bounded("the duplicate", observe(short_op(&c, 2, &body))).await;
        let retry = match &again {
            Err(CoordError::Backend(err)) => err.kind() == BackendErrorKind::Timeout,
            Err(CoordError::InFlight { .. }) => true,
            _ => false,
        };
        if !retry || Instant::now() >= deadline {
            break (again, report);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        again.expect("the completion sent before the freeze ran on thaw"),
        100,
        "{report:?}"
    );
    assert!(report.replayed(), "{report:?}");
    assert_eq!(body.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn late_claim_does_nothing() {
    let server = Arc::new(server().await);
    let provider = provider(&server.url(), "coord", 1).await;
    let c = coordinator(&provider);
    let key = c.key("pg.late").part(&1u32).finish();
    // Warm the one connection: the claim's statement is prepared there.
    let warm = c.key("pg.late").part(&0u32).finish();
    provider.claim(req(&warm)).await.expect("warm-up claim");
    server.pause();
    let resumer = server.clone();
    let thaw = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        resumer.resume();
    });
    let err = provider
        .claim(req(&key))
        .await
        .expect_err("the server is frozen");
    assert_eq!(err.kind(), BackendErrorKind::Timeout, "{err:?}");
    thaw.join().unwrap();
    // The statement ran on thaw (its connection was closed under it, but the server had it
    // whole), after its not-after time: it wrote nothing. No clean-up was asked for here.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        provider.inspect_record(&key).await.unwrap(),
        None,
        "a claim executed after its caller gave up leaves no marker"
    );
    assert_eq!(
        server.sql("SELECT count(*) FROM coord.records"),
        "1",
        "only the warm-up's marker"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acquire_lost_to_a_frozen_server_is_released() {
    let server = Arc::new(server().await);
    let provider = provider(&server.url(), "coord", 1).await;
    let c = coordinator(&provider);
    let key = c.key("pg.frozen").part(&1u32).finish();
    // Warm the connection with the acquire's statement.
    let warm = c.key("pg.frozen").part(&0u32).finish();
    drop(c.lock(warm).acquire().await.unwrap());
    server.pause();
    let resumer = server.clone();
    let thaw = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(800));
        resumer.resume();
    });
    let result = c
        .lock(key.clone())
        .lease(Duration::from_secs(20))
        .acquire()
        .await;
    assert!(
        matches!(&result, Err(CoordError::Backend(err)) if err.kind() == BackendErrorKind::Timeout),
        "{result:?}"
    );
    thaw.join().unwrap();
    let thawed = Instant::now();
    let other = coordinator(&provider);
    let guard = bounded(
        "another owner",
        other.lock(key).wait(Duration::from_secs(15)).acquire(),
    )
    .await
    .expect("another owner gets the lock");
    assert!(
        thawed.elapsed() < Duration::from_secs(5),
        "freed by the background release, not the 20 s lease: {:?}",
        thawed.elapsed()
    );
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_and_restarted_while_the_body_runs() {
    let server = Arc::new(Mutex::new(server().await));
    let url = server.lock().unwrap().url();
    let provider = provider(&url, "coord", 2).await;
    let c = coordinator(&provider);
    let body = Arc::new(Body::gated());
    let call = tokio::spawn({
        let (c, body) = (c.clone(), body.clone());
        async move { observe(long_op(&c, 1, &body)).await }
    });
    let (entered, proceed) = body.gate.as_ref().unwrap();
    bounded("the body to start", entered.notified()).await;
    let restarter = server.clone();
    tokio::task::spawn_blocking(move || restarter.lock().unwrap().restart())
        .await
        .unwrap();
    proceed.notify_one();
    let (result, report) = bounded("the call", call).await.unwrap();
    assert_eq!(
        result.unwrap(),
        100,
        "the committed marker survived the crash; completion found it ({report:?})"
    );
    let (again, report) = bounded("the duplicate", observe(long_op(&c, 1, &body))).await;
    assert_eq!(again.unwrap(), 100);
    assert!(report.replayed(), "{report:?}");
    assert_eq!(body.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn statement_timeout_ends_a_blocked_statement() {
    let server = server().await;
    let provider = provider(&server.url(), "blocked", 2).await;
    let c = coordinator(&provider);
    let body = Body::default();
    // Another session holds the row the claim must write.
    let (blocker, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let key = c.key("pg.long").part(&1u32).finish();
    blocker
        .batch_execute(&format!(
            "BEGIN; INSERT INTO coord.records (key, state, owner, written_at, lease_ends_at, expires_at) \
             VALUES ('{}', 'in_flight', gen_random_uuid(), now(), now() - interval '1 hour', now() - interval '1 hour') \
             ON CONFLICT DO NOTHING; SELECT 1 FROM coord.records WHERE key = '{}' FOR UPDATE;",
            key.qualified(),
            key.qualified()
        ))
        .await
        .unwrap();
    let started = Instant::now();
    let result = bounded("the blocked call", long_op(&c, 1, &body)).await;
    assert!(
        matches!(&result, Err(CoordError::Backend(err)) if err.kind() == BackendErrorKind::Timeout),
        "{result:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(body.runs(), 0, "the body never ran");
    // The server ended the statement: nothing of coord's still waits for the row.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let waiting = server.sql(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'blocked' \
         AND wait_event_type = 'Lock'",
    );
    assert_eq!(
        waiting, "0",
        "a blocked statement outlived the command timeout"
    );
    blocker.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        bounded("the retry", long_op(&c, 1, &body)).await.unwrap(),
        100
    );
    assert_eq!(body.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connection_limit_exhausted() {
    // 8 slots, 3 of them for superusers: 5 for the application's role.
    let server = server_with(ServerOptions::new().max_connections(8)).await;
    server.sql(
        "CREATE ROLE app LOGIN; GRANT USAGE ON SCHEMA coord TO app; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA coord TO app; \
         GRANT USAGE ON ALL SEQUENCES IN SCHEMA coord TO app",
    );
    let url = format!("postgres://app@127.0.0.1:{}/postgres", server.port());
    let warm = provider(&url, "warm", 3).await;
    let c = coordinator(&warm);
    // Its one open connection (from connecting) stays; fill every other slot.
    let mut fillers = Vec::new();
    loop {
        match tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
            Ok((client, connection)) => {
                tokio::spawn(connection);
                fillers.push(client);
            }
            Err(err) => {
                assert!(
                    err.to_string().contains("too many") || err.as_db_error().is_some(),
                    "{err}"
                );
                break;
            }
        }
        assert!(fillers.len() < 10, "the limit was not reached");
    }
    let err = PostgresProvider::builder(&url)
        .command_timeout(TIMEOUT)
        .connect()
        .await
        .expect_err("no slot for a new provider");
    let err = coord_core::BackendError::from(err);
    assert_eq!(err.kind(), BackendErrorKind::Unavailable, "{err:?}");
    assert!(err.message().contains("53300"), "names the limit: {err}");

    // The warm provider: one call at a time, its open connection keeps serving.
    for id in 0..3u32 {
        let body = Body::default();
        assert_eq!(
            bounded("a call at the limit", long_op(&c, id, &body))
                .await
                .unwrap(),
            100
        );
    }
    // Several at once: a call that needs another connection fails as unavailable (before its
    // body, or at completion); none runs a key twice.
    let bodies: Vec<Arc<Body>> = (10..16).map(|_| Arc::new(Body::default())).collect();
    let calls: Vec<_> = bodies
        .iter()
        .enumerate()
        .map(|(i, body)| {
            let (c, body) = (c.clone(), body.clone());
            tokio::spawn(async move { long_op(&c, 10 + i as u32, &body).await })
        })
        .collect();
    let mut outcomes = Vec::new();
    for call in calls {
        let outcome = bounded("a call at the limit", call).await.unwrap();
        match &outcome {
            Ok(100) => {}
            Err(CoordError::Backend(err))
            | Err(CoordError::OutcomeNotStored {
                cause: NotStoredCause::Backend(err),
                ..
            }) => {
                assert_eq!(err.kind(), BackendErrorKind::Unavailable, "{err:?}")
            }
            other => panic!("unexpected: {other:?}"),
        }
        outcomes.push(outcome);
    }
    drop(fillers);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (i, (body, first)) in bodies.iter().zip(&outcomes).enumerate() {
        let again = bounded("after the limit", long_op(&c, 10 + i as u32, body)).await;
        match first {
            // Stored: replayed. Refused before the body: runs now, once.
            Ok(_) | Err(CoordError::Backend(_)) => assert_eq!(again.unwrap(), 100),
            // Not stored: the marker says the outcome is unknown, unless the completion
            // landed after all; never a second run.
            _ => assert!(
                matches!(again, Ok(100) | Err(CoordError::OutcomeUnknown { .. })),
                "{again:?}"
            ),
        }
        assert_eq!(body.runs(), 1, "key {i} ran once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn read_only_server() {
    let server = Arc::new(server().await);
    let provider = provider(&server.url(), "coord", 2).await;
    let c = coordinator(&provider);
    let body = Body::default();
    tokio::task::block_in_place(|| server.set_read_only(true));
    let refused = bounded("a call on a read-only server", long_op(&c, 1, &body)).await;
    assert!(
        matches!(&refused, Err(CoordError::Backend(err)) if err.kind() == BackendErrorKind::Unavailable),
        "{refused:?}"
    );
    assert_eq!(body.runs(), 0, "refused before the body");
    let key = c.key("pg.ro").part(&1u32).finish();
    let lock = c.lock(key.clone()).try_acquire().await;
    assert!(
        matches!(&lock, Err(CoordError::Backend(err)) if err.kind() == BackendErrorKind::Unavailable),
        "{lock:?}"
    );
    tokio::task::block_in_place(|| server.set_read_only(false));

    // Read-only for 500 ms from the body's return (lease 3 s): completion is retried. The
    // caller keeps trying for at least 750 ms; when the switch back (a configuration reload)
    // took longer than that on a loaded host, the caller may be told `OutcomeNotStored` while
    // the background attempts go on within the lease, and the duplicate must still replay.
    let switch = server.clone();
    let window: Arc<Mutex<(Option<Instant>, Option<Instant>)>> = Arc::default();
    let times = window.clone();
    body.inject(move || {
        switch.set_read_only(true);
        times.lock().unwrap().0 = Some(Instant::now());
        let (back, times) = (switch.clone(), times.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(500));
            back.set_read_only(false);
            times.lock().unwrap().1 = Some(Instant::now());
        });
    });
    let (result, report) = bounded("the call", observe(long_op(&c, 1, &body))).await;
    let read_only_for = {
        let (from, to) = *window.lock().unwrap();
        to.zip(from).map(|(to, from)| to - from)
    };
    match (&result, read_only_for) {
        (Ok(v), _) => assert_eq!(*v, 100, "{report:?}"),
        // Read-only longer than the caller's own attempts last (or still read-only).
        (Err(CoordError::OutcomeNotStored { .. }), d)
            if d.is_none_or(|d| d > Duration::from_millis(700)) => {}
        (other, d) => panic!("read-only for {d:?}: the caller got {other:?}: {report:?}"),
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let again = loop {
        let (again, report) = bounded("the duplicate", observe(long_op(&c, 1, &body))).await;
        match again {
            Ok(v) => {
                assert!(report.replayed(), "{report:?}");
                break v;
            }
            // The background completion has not landed yet.
            Err(CoordError::InFlight { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(other) => panic!("the duplicate got {other:?}"),
        }
    };
    assert_eq!(again, 100);
    assert_eq!(body.runs(), 1);
}

/// The server frozen from the body's return for 3 s, with a 30 s in-flight lease: the caller
/// waits for three completion attempts (a command timeout each), not for the lease, and is told
/// its outcome is not stored (yet); the completion goes on in the background and lands after
/// the thaw, so a duplicate replays the one run's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paused_during_completion_with_a_long_lease_bounds_the_caller() {
    let server = Arc::new(server().await);
    let provider = provider(&server.url(), "coord", 2).await;
    let c = coordinator(&provider);
    let body = Body::default();
    let paused = server.clone();
    let thaw = Arc::new(Mutex::new(None));
    let handle = thaw.clone();
    body.inject(move || {
        paused.pause();
        let resumer = paused.clone();
        *handle.lock().unwrap() = Some(std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(3));
            resumer.resume();
        }));
    });
    let started = Instant::now();
    let (result, report) = bounded("the call", observe(thirty_second_lease_op(&c, 1, &body))).await;
    let took = started.elapsed();
    println!(
        "paused during completion, lease 30 s: the caller answered after {took:?}: {result:?}"
    );
    assert!(
        took < Duration::from_secs(5),
        "the caller waits for its own deadlines (3 x {TIMEOUT:?} and backoff), not for the server: {took:?}"
    );
    assert!(
        matches!(
            &result,
            Err(CoordError::OutcomeNotStored { cause: NotStoredCause::Backend(err), .. })
                if matches!(err.kind(), BackendErrorKind::Timeout | BackendErrorKind::Unavailable)
        ),
        "the caller is told the outcome is not stored: {result:?} ({report:?})"
    );
    assert!(report.settling_in_background(), "{report:?}");
    assert_eq!(c.metrics().settling_in_background(), 1);
    thaw.lock()
        .unwrap()
        .take()
        .expect("injected")
        .join()
        .unwrap();
    let thawed = Instant::now();
    // The background completion lands once the server answers; until then a duplicate finds
    // the marker in flight.
    let again = loop {
        let (again, dup) = bounded(
            "the duplicate",
            observe(thirty_second_lease_op(&c, 1, &body)),
        )
        .await;
        match again {
            Err(CoordError::InFlight { .. }) if thawed.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => {
                assert!(dup.replayed(), "{other:?} {dup:?}");
                break other;
            }
        }
    };
    println!(
        "paused during completion, lease 30 s: replayed {:?} after the thaw",
        thawed.elapsed()
    );
    assert_eq!(
        again.unwrap(),
        100,
        "the duplicate replays the one run's answer"
    );
    assert_eq!(body.runs(), 1);
}

/// A session of the test's own that holds the row lock of `key`'s lock row (inserted lapsed,
/// so that it is free as far as coord is concerned) until `release` is sent: every statement
/// coord sends for the key blocks, and is ended by the command timeout.
async fn hold_lock_row(url: &str, key: &coord_core::CallKey) -> tokio_postgres::Client {
    let (blocker, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    blocker
        .batch_execute(&format!(
            "BEGIN; INSERT INTO coord.locks (key, owner, fence, expires_at, waited) \
             VALUES ('{k}', gen_random_uuid(), NULL, now() - interval '1 hour', false) \
             ON CONFLICT DO NOTHING; SELECT 1 FROM coord.locks WHERE key = '{k}' FOR UPDATE;",
            k = key.qualified()
        ))
        .await
        .unwrap();
    blocker
}

/// Another session holding a semaphore key's row locked (its transaction left open), so every
/// permit acquire on `key` waits on it until the session rolls back.
async fn hold_semaphore_row(url: &str, key: &coord_core::CallKey) -> tokio_postgres::Client {
    let (blocker, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    blocker
        .batch_execute(&format!(
            "BEGIN; INSERT INTO coord.semaphores (key, expires_at) \
             VALUES ('{k}', now() + interval '1 hour') ON CONFLICT DO NOTHING; \
             SELECT 1 FROM coord.semaphores WHERE key = '{k}' FOR UPDATE;",
            k = key.qualified()
        ))
        .await
        .unwrap();
    blocker
}

/// The semaphore's waiting acquire outlasts looks that timed out, as the lock's does (below):
/// a single attempt in the stall is a `Timeout` (the control: the stall bites), a waiting one
/// gets its permit once the key's row is free, and one whose wait ends inside the stall says
/// its looks got no answer and leaves no permit behind (limit 1: another owner gets it as
/// soon as the row is free, not at the 30 s lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_permit_outlasts_looks_that_timed_out() {
    let server = server().await;
    let provider = provider(&server.url(), "waiting", 3).await;
    let c = coordinator(&provider);
    let key = c.key("pg.slow-permit").part(&1u32).finish();

    let blocker = hold_semaphore_row(&server.url(), &key).await;
    let single = bounded(
        "the single attempt",
        c.semaphore(key.clone(), 1).try_acquire(),
    )
    .await;
    assert!(
        matches!(&single, Err(CoordError::Backend(err)) if err.kind() == BackendErrorKind::Timeout),
        "the stall times a look out: {single:?}"
    );

    let freed = tokio::spawn(async move {
        tokio::time::sleep(TIMEOUT * 4).await;
        blocker.batch_execute("ROLLBACK").await.unwrap();
        Instant::now()
    });
    let started = Instant::now();
    let permit = bounded(
        "the waiting acquire",
        c.semaphore(key.clone(), 1)
            .wait(Duration::from_secs(10))
            .acquire(),
    )
    .await
    .expect("the waiter gets a permit once the server answers again, within its wait");
    let freed_at = freed.await.unwrap();
    assert!(
        started.elapsed() >= TIMEOUT * 4,
        "granted only after the stall: {:?}",
        started.elapsed()
    );
    assert!(
        freed_at.elapsed() < Duration::from_secs(3),
        "granted soon after the stall ended: {:?}",
        freed_at.elapsed()
    );
    assert!(permit.release().await.unwrap(), "the grant was real");

    let blocker = hold_semaphore_row(&server.url(), &key).await;
    let short = bounded(
        "the short wait",
        c.semaphore(key.clone(), 1)
            .lease(Duration::from_secs(30))
            .wait(TIMEOUT * 3)
            .acquire(),
    )
    .await;
    match &short {
        Err(CoordError::Backend(err)) => {
            assert_eq!(err.kind(), BackendErrorKind::Timeout, "{err}");
            assert!(err.message().contains("got no answer in time"), "{err}");
        }
        other => panic!("a wait ended by unanswered looks must say so: {other:?}"),
    }
    blocker.batch_execute("ROLLBACK").await.unwrap();
    let released = Instant::now();
    let other = coordinator(&provider);
    let permit = bounded(
        "another owner",
        other
            .semaphore(key, 1)
            .wait(Duration::from_secs(15))
            .acquire(),
    )
    .await
    .expect("another owner gets the permit");
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "no permit was left held by the timed-out waiter (its lease is 30 s): {:?}",
        released.elapsed()
    );
    drop(permit);
}

/// A waiting acquire (`wait = 10 s`) whose looks time out while the lock's row is locked by
/// another session for 1.2 s (four command timeouts): it gets the lock once the row is free,
/// within its wait. The control, a single attempt (`wait = 0`) in the same stall, fails with
/// `Timeout`: the stall does time looks out, which the waiting acquire used to return as its
/// error. A wait that ends inside the stall answers `Timeout` saying that its looks got no
/// answer (never a plain refusal), and leaves no lock held by its owner: another owner takes
/// the key as soon as the row is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_acquire_outlasts_looks_that_timed_out() {
    let server = server().await;
    let provider = provider(&server.url(), "waiting", 3).await;
    let c = coordinator(&provider);
    let key = c.key("pg.slow").part(&1u32).finish();

    // The control: one attempt in the stall is a timeout.
    let blocker = hold_lock_row(&server.url(), &key).await;
    let single = bounded("the single attempt", c.lock(key.clone()).try_acquire()).await;
    assert!(
        matches!(&single, Err(CoordError::Backend(err)) if err.kind() == BackendErrorKind::Timeout),
        "the stall times a look out: {single:?}"
    );

    // The waiting acquire, in the same kind of stall, ended while it waits.
    let freed = tokio::spawn(async move {
        tokio::time::sleep(TIMEOUT * 4).await;
        blocker.batch_execute("ROLLBACK").await.unwrap();
        Instant::now()
    });
    let started = Instant::now();
    let guard = bounded(
        "the waiting acquire",
        c.lock(key.clone()).wait(Duration::from_secs(10)).acquire(),
    )
    .await
    .expect("the waiter gets the lock once the server answers again, within its wait");
    let freed_at = freed.await.unwrap();
    assert!(
        started.elapsed() >= TIMEOUT * 4,
        "granted only after the stall: {:?}",
        started.elapsed()
    );
    assert!(
        freed_at.elapsed() < Duration::from_secs(3),
        "granted soon after the stall ended: {:?}",
        freed_at.elapsed()
    );
    assert!(guard.release().await.unwrap(), "the grant was real");

    // A wait that ends inside the stall: a timeout that says so, and no lock left behind.
    let blocker = hold_lock_row(&server.url(), &key).await;
    let short = bounded(
        "the short wait",
        c.lock(key.clone())
            .lease(Duration::from_secs(30))
            .wait(TIMEOUT * 3)
            .acquire(),
    )
    .await;
    match &short {
        Err(CoordError::Backend(err)) => {
            assert_eq!(err.kind(), BackendErrorKind::Timeout, "{err}");
            assert!(err.message().contains("got no answer in time"), "{err}");
        }
        other => panic!("a wait ended by unanswered looks must say so: {other:?}"),
    }
    blocker.batch_execute("ROLLBACK").await.unwrap();
    let released = Instant::now();
    let other = coordinator(&provider);
    let guard = bounded(
        "another owner",
        other.lock(key).wait(Duration::from_secs(15)).acquire(),
    )
    .await
    .expect("another owner gets the lock");
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "no lock was left held by the timed-out waiter (its lease is 30 s): {:?}",
        released.elapsed()
    );
    drop(guard);
}
