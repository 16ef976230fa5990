//! Faults: unreachable, frozen, killed and restarted servers; values coord did not write.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_core::BackendError;
use coord_core::provider::{
    BackendErrorKind, ClaimOutcome, IdempotencyStore, LockProvider, OwnerToken, PermitRequest,
    ReleaseOutcome, SemaphoreStore,
};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::RedisServer;
use support::*;

per_client!(
    connect_failure_names_the_address_but_no_password,
    wrong_password_is_reported_without_it,
    frozen_server_gives_timeouts_within_the_command_timeout,
    waiting_acquire_outlasts_a_client_pause,
    waiting_permit_outlasts_a_client_pause,
    timed_out_acquire_in_a_pause_grants_nothing_later,
    killed_server_fails_fast_and_restart_recovers,
    foreign_values_at_lock_keys_are_corrupt,
    foreign_values_at_record_keys_are_corrupt,
    scripts_are_sent_again_after_the_cache_is_flushed,
);

const TIMEOUT: Duration = Duration::from_millis(400);

/// The bound a failing call must meet: the command timeout, plus the NOSCRIPT fallback and
/// scheduling slack.
const BOUND: Duration = Duration::from_millis(2000);

async fn tight(server: &RedisServer, client: Client) -> RedisProvider {
    RedisProvider::builder(server.url())
        .client(client)
        .command_timeout(TIMEOUT)
        .connect()
        .await
        .unwrap()
}

fn assert_unreachable(err: &BackendError, what: &str) {
    assert!(
        matches!(
            err.kind(),
            BackendErrorKind::Timeout | BackendErrorKind::Unavailable
        ),
        "{what}: expected a timeout or unavailability, got {err:?}"
    );
}

/// Runs `op`, checking it fails as unreachable within [`BOUND`].
async fn fails_in_time<T: std::fmt::Debug>(
    what: &str,
    op: impl Future<Output = Result<T, BackendError>>,
) {
    let started = Instant::now();
    let result = tokio::time::timeout(BOUND * 3, op)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"));
    let took = started.elapsed();
    let err = result.expect_err(what);
    assert_unreachable(&err, what);
    assert!(took < BOUND, "{what} took {took:?}");
}

fn dead_port() -> u16 {
    // Bound and released: nothing listens there now.
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn connect_failure_names_the_address_but_no_password(client: Client) {
    let port = dead_port();
    let url = format!("redis://admin:hunter2-secret@127.0.0.1:{port}/0");
    let started = Instant::now();
    let err = RedisProvider::builder(&url)
        .client(client)
        .command_timeout(TIMEOUT)
        .connect()
        .await
        .expect_err("nothing listens there");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_unreachable(&err, "connect");
    let shown = format!("{err} {err:?}");
    assert!(
        shown.contains(&format!("127.0.0.1:{port}")),
        "names the address: {shown}"
    );
    assert!(!shown.contains("hunter2"), "leaks the password: {shown}");

    let err = RedisProvider::connect("http://127.0.0.1:1")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), BackendErrorKind::Config);
}

async fn wrong_password_is_reported_without_it(client: Client) {
    let server = RedisServer::start_with(&["--requirepass", "the-right-one"]);
    let url = format!("redis://:wrong-guess-xyz@127.0.0.1:{}", server.port());
    let err = RedisProvider::builder(&url)
        .client(client)
        .command_timeout(TIMEOUT)
        .connect()
        .await
        .expect_err("the password is wrong");
    let shown = format!("{err} {err:?}");
    assert!(
        !shown.contains("wrong-guess-xyz"),
        "leaks the password: {shown}"
    );
    assert!(
        shown.contains(&format!("127.0.0.1:{}", server.port())),
        "{shown}"
    );

    // With the right one, it works.
    let url = format!("redis://:the-right-one@127.0.0.1:{}", server.port());
    let p = RedisProvider::builder(&url)
        .client(client)
        .connect()
        .await
        .unwrap();
    let k = key("auth");
    let a = OwnerToken::new();
    p.acquire(lock(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    assert!(!format!("{p:?}").contains("the-right-one"));
}

async fn frozen_server_gives_timeouts_within_the_command_timeout(client: Client) {
    let server = RedisServer::start();
    let p = tight(&server, client).await;
    let k = key("frozen");
    let a = OwnerToken::new();
    // Warm up: scripts cached, subscriber connected.
    p.acquire(lock(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let refused = p
        .acquire(lock(&k, OwnerToken::new(), LONG, Duration::from_millis(50)))
        .await
        .unwrap();
    assert_eq!(refused, None);
    p.release(&k, a).await.unwrap();

    server.pause();
    let b = OwnerToken::new();
    fails_in_time("acquire", p.acquire(lock(&k, b, LONG, Duration::ZERO))).await;
    // A waiting acquire looks again within its wait (see
    // `waiting_acquire_outlasts_a_client_pause`): a short wait, then the timeout.
    fails_in_time(
        "waiting acquire",
        p.acquire(lock(&k, b, LONG, Duration::from_millis(500))),
    )
    .await;
    fails_in_time(
        "fenced acquire",
        p.acquire(fenced(&k, b, LONG, Duration::ZERO)),
    )
    .await;
    fails_in_time("release", p.release(&k, b)).await;
    fails_in_time("renew", p.renew(&k, b, LONG)).await;
    fails_in_time("claim", p.claim(claim(&k, b, LONG))).await;
    fails_in_time(
        "complete",
        complete_stored(&p, &k, b, Arc::from(&b"x"[..]), LONG),
    )
    .await;
    fails_in_time("abandon", p.abandon(&k, b)).await;
    fails_in_time("wait_settled", p.wait_settled(&k, LONG)).await;
    server.resume();

    // Thawed, it answers again.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match p.acquire(lock(&k, b, LONG, Duration::ZERO)).await {
            Ok(Some(_)) => break,
            Ok(None) => panic!("nobody holds the lock"),
            Err(err) => {
                assert_unreachable(&err, "acquire after resume");
                assert!(
                    Instant::now() < deadline,
                    "still failing after resume: {err}"
                );
            }
        }
    }
    assert_eq!(p.release(&k, b).await.unwrap(), ReleaseOutcome::Released);
}

/// The semaphore's waiting acquire in the same pause as the lock's (below): the control, a
/// single attempt on a key of its own, fails with `Timeout` (the pause bites); the waiting
/// acquire (wait 10 s, one permit) gets its permit once the pause ends; one whose wait ends
/// inside the pause answers `Timeout` saying its looks got no answer, and what its commands
/// did on thaw is its owner's to release: released, the permit is free.
async fn waiting_permit_outlasts_a_client_pause(client: Client) {
    let server = RedisServer::start();
    let p = tight(&server, client).await;
    let (k, control) = (key("paused-permit"), key("paused-permit-once"));
    let permit = |key, owner, wait| PermitRequest {
        key,
        owner,
        limit: 1,
        lease: LONG,
        wait,
    };
    // Warm up: scripts cached, subscriber connected.
    let a = OwnerToken::new();
    p.acquire_permit(permit(&k, a, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let refused = p
        .acquire_permit(permit(&k, OwnerToken::new(), Duration::from_millis(50)))
        .await
        .unwrap();
    assert!(refused.is_none(), "the only permit is held");
    p.release_permit(&k, a).await.unwrap();

    let pause = Duration::from_millis(1_600);
    let pause_ms = pause.as_millis().to_string();
    server.command(&["CLIENT", "PAUSE", &pause_ms, "WRITE"]);
    let paused_at = Instant::now();
    let once = p
        .acquire_permit(permit(&control, OwnerToken::new(), Duration::ZERO))
        .await;
    match &once {
        Err(err) => assert_eq!(err.kind(), BackendErrorKind::Timeout, "{err}"),
        Ok(v) => panic!("the control must time out in the pause: {v:?}"),
    }
    assert!(
        paused_at.elapsed() < pause - TIMEOUT,
        "the pause ended too soon"
    );
    let b = OwnerToken::new();
    let grant = tokio::time::timeout(
        BOUND * 10,
        p.acquire_permit(permit(&k, b, Duration::from_secs(10))),
    )
    .await
    .expect("the waiting acquire hung")
    .expect("the waiter gets the permit once the pause ends, within its wait");
    assert!(grant.is_some(), "nobody else holds the permit");
    assert!(
        paused_at.elapsed() >= pause,
        "granted only after the pause: {:?}",
        paused_at.elapsed()
    );
    assert_eq!(
        p.release_permit(&k, b).await.unwrap(),
        ReleaseOutcome::Released
    );

    server.command(&["CLIENT", "PAUSE", &pause_ms, "WRITE"]);
    let c = OwnerToken::new();
    let short = p.acquire_permit(permit(&k, c, TIMEOUT * 2)).await;
    match &short {
        Err(err) => {
            assert_eq!(err.kind(), BackendErrorKind::Timeout, "{err}");
            assert!(err.message().contains("got no answer in time"), "{err}");
        }
        Ok(v) => panic!("a wait ended by unanswered looks must say so: {v:?}"),
    }
    server.command(&["CLIENT", "UNPAUSE"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let _ = p.release_permit(&k, c).await;
        if let Ok(Some(_)) = p
            .acquire_permit(permit(&k, OwnerToken::new(), Duration::ZERO))
            .await
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the permit stayed held after its owner's release"
        );
    }
}

/// `CLIENT PAUSE .. WRITE` for 1.6 s (four command timeouts) holds every write, so an acquire's
/// commands time out; the control, a single attempt (`wait` 0, on a key of its own), fails
/// with `Timeout`, which a waiting acquire used to return as soon as one of its looks timed
/// out. The waiting acquire (wait 10 s) gets the lock once the pause ends, within its wait:
/// its commands that ran late, on thaw, were its own grant and resends of it. A wait that ends
/// inside a pause answers `Timeout` saying its looks got no answer, never a refusal.
async fn waiting_acquire_outlasts_a_client_pause(client: Client) {
    let server = RedisServer::start();
    let p = tight(&server, client).await;
    let (k, control) = (key("paused-wait"), key("paused-once"));
    // Warm up: scripts cached, subscriber connected.
    let a = OwnerToken::new();
    p.acquire(lock(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let refused = p
        .acquire(lock(&k, OwnerToken::new(), LONG, Duration::from_millis(50)))
        .await
        .unwrap();
    assert_eq!(refused, None);
    p.release(&k, a).await.unwrap();

    let pause = Duration::from_millis(1_600);
    let pause_ms = pause.as_millis().to_string();
    server.command(&["CLIENT", "PAUSE", &pause_ms, "WRITE"]);
    let paused_at = Instant::now();
    let once = p
        .acquire(lock(&control, OwnerToken::new(), LONG, Duration::ZERO))
        .await;
    match &once {
        Err(err) => assert_eq!(err.kind(), BackendErrorKind::Timeout, "{err}"),
        Ok(v) => panic!("the control must time out in the pause: {v:?}"),
    }
    // Still inside the pause: the waiting acquire's first commands time out too.
    assert!(
        paused_at.elapsed() < pause - TIMEOUT,
        "the pause ended too soon"
    );
    let b = OwnerToken::new();
    let grant = tokio::time::timeout(
        BOUND * 10,
        p.acquire(lock(&k, b, LONG, Duration::from_secs(10))),
    )
    .await
    .expect("the waiting acquire hung")
    .expect("the waiter gets the lock once the pause ends, within its wait");
    assert!(grant.is_some(), "nobody else holds the lock");
    assert!(
        paused_at.elapsed() >= pause,
        "granted only after the pause: {:?}",
        paused_at.elapsed()
    );
    assert!(
        paused_at.elapsed() < pause + BOUND,
        "granted soon after the pause: {:?}",
        paused_at.elapsed()
    );
    assert_eq!(p.release(&k, b).await.unwrap(), ReleaseOutcome::Released);

    // A wait that ends inside the pause.
    server.command(&["CLIENT", "PAUSE", &pause_ms, "WRITE"]);
    let c = OwnerToken::new();
    let short = p.acquire(lock(&k, c, LONG, TIMEOUT * 2)).await;
    match &short {
        Err(err) => {
            assert_eq!(err.kind(), BackendErrorKind::Timeout, "{err}");
            assert!(err.message().contains("got no answer in time"), "{err}");
        }
        Ok(v) => panic!("a wait ended by unanswered looks must say so: {v:?}"),
    }
    // What its commands did once the pause ended is the owner's to release (the runtime
    // does so on this error); released, the key is free.
    server.command(&["CLIENT", "UNPAUSE"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let _ = p.release(&k, c).await;
        if let Ok(Some(_)) = p
            .acquire(lock(&k, OwnerToken::new(), LONG, Duration::ZERO))
            .await
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the key stayed held after its owner's release"
        );
    }
}

/// An acquire sent into a paused server (`CLIENT PAUSE .. WRITE` for four command timeouts)
/// times out. Whether its grant could land after the runtime's release found nothing (as a
/// commit behind a gone synchronous standby does on PostgreSQL) is what is looked at: it does
/// not land at all. The acquire is fenced and the probes are not, so the key's fence counter
/// would exist had the grant run; it does not, with either client: the client drops a
/// connection whose command timed out, and the server drops a paused client's queued commands
/// when it disconnects. The key is free right after the pause, long before its 30 s lease,
/// both with the runtime's release and with the control's, which stops at its first answer
/// (`PlantedBug::UnansweredReleaseStopsAtNothing`).
async fn timed_out_acquire_in_a_pause_grants_nothing_later(client: Client) {
    use coord_core::{CoordError, Coordinator};
    use coord_history::planted::{Planted, PlantedBug};
    let server = RedisServer::start();
    let p = tight(&server, client).await;
    let lease = Duration::from_secs(30);
    let fixed = Coordinator::builder()
        .namespace("paused")
        .provider(p.clone())
        .build()
        .unwrap();
    let control = Coordinator::builder()
        .namespace("paused")
        .provider(Planted::new(
            p.clone(),
            PlantedBug::UnansweredReleaseStopsAtNothing,
        ))
        .build()
        .unwrap();
    for (name, coord) in [("fixed", &fixed), ("control", &control)] {
        let k = coord.key("paused.late").part(name).finish();
        // Warm up: scripts cached.
        let warm = OwnerToken::new();
        let other = coord.key("paused.warm").part(name).finish();
        p.acquire(fenced(&other, warm, LONG, Duration::ZERO))
            .await
            .unwrap()
            .unwrap();
        p.release(&other, warm).await.unwrap();
        let fence_of = |key: &coord_core::CallKey| {
            server.command(&["EXISTS", &redis_key(key, "fence")])
                == coord_redis_testing::Resp::Int(1)
        };
        assert!(
            fence_of(&other),
            "a fenced grant makes the counter this test looks at"
        );

        let pause = Duration::from_millis(1_600);
        server.command(&["CLIENT", "PAUSE", &pause.as_millis().to_string(), "WRITE"]);
        let paused_at = Instant::now();
        let refused = coord.lock(k.clone()).lease(lease).fenced().acquire().await;
        assert!(
            matches!(refused, Err(CoordError::Backend(ref e)) if e.kind() == BackendErrorKind::Timeout),
            "{name}: an acquire inside the pause: {refused:?}"
        );
        assert!(
            paused_at.elapsed() < pause,
            "{name}: the pause ended too soon"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        let probe = OwnerToken::new();
        while !matches!(
            p.acquire(lock(&k, probe, LONG, Duration::ZERO)).await,
            Ok(Some(_))
        ) {
            assert!(
                Instant::now() < deadline,
                "{name}: the key stayed held after the pause (its lease is {lease:?})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            !fence_of(&k),
            "{client:?} {name}: the timed-out grant never ran (no token was minted for it)"
        );
        assert!(
            paused_at.elapsed() < lease / 2,
            "{name}: released, not lapsed: {:?}",
            paused_at.elapsed()
        );
        assert_eq!(
            p.release(&k, probe).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
}

async fn killed_server_fails_fast_and_restart_recovers(client: Client) {
    let mut server = RedisServer::start();
    let p = tight(&server, client).await;
    let k = key("killed");
    let a = OwnerToken::new();
    p.acquire(lock(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let refused = p
        .acquire(lock(&k, OwnerToken::new(), LONG, Duration::from_millis(50)))
        .await
        .unwrap();
    assert_eq!(refused, None, "the subscriber connection is up");

    server.kill();
    let b = OwnerToken::new();
    fails_in_time("acquire", p.acquire(lock(&k, b, LONG, Duration::ZERO))).await;
    fails_in_time("release", p.release(&k, a)).await;
    fails_in_time("claim", p.claim(claim(&k, b, LONG))).await;
    // A waiting acquire looks again within its wait when a look times out (see
    // `waiting_acquire_outlasts_a_client_pause`; fred reports a dead server as a timeout
    // while it reconnects, redis-rs as refused): a short wait, then an error.
    fails_in_time(
        "waiting acquire",
        p.acquire(lock(&k, b, LONG, Duration::from_millis(500))),
    )
    .await;

    server.restart();
    // The data went with the old process (and so did the cached scripts).
    let mut attempts = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    let grant = loop {
        attempts += 1;
        match p.acquire(fenced(&k, b, LONG, Duration::ZERO)).await {
            Ok(grant) => break grant,
            Err(err) => {
                assert_unreachable(&err, "acquire after restart");
                assert!(
                    Instant::now() < deadline,
                    "no reconnect after restart: {err}"
                );
            }
        }
    };
    assert_eq!(attempts, 1, "the first call after the restart works");
    assert!(
        grant
            .expect("the restarted server is empty")
            .fencing_token
            .is_some()
    );
    assert_eq!(
        p.claim(claim(&k, a, LONG)).await.unwrap(),
        ClaimOutcome::Claimed
    );

    // The subscriber reconnected too: a release wakes a waiter again.
    let waiter = spawn_acquire(
        &p,
        lock(&k, OwnerToken::new(), LONG, Duration::from_secs(20)),
    );
    let channel = redis_key(&k, "lock");
    until("the waiter to subscribe", Duration::from_secs(10), || {
        subscribers(&server, &channel) == 1
    })
    .await;
    let released_at = Instant::now();
    assert_eq!(p.release(&k, b).await.unwrap(), ReleaseOutcome::Released);
    let Acquired { grant, at, .. } = waiter.await.unwrap();
    assert!(grant.is_some());
    let handoff = at.saturating_duration_since(released_at);
    assert!(
        handoff < Duration::from_millis(700),
        "woken by the release: {handoff:?}"
    );
}

fn assert_corrupt<T: std::fmt::Debug>(result: Result<T, BackendError>, what: &str) {
    match result {
        Err(err) => assert_eq!(err.kind(), BackendErrorKind::Corrupt, "{what}: {err:?}"),
        Ok(v) => panic!("{what}: expected a corrupt-state error, got {v:?}"),
    }
}

async fn foreign_values_at_lock_keys_are_corrupt(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let a = OwnerToken::new();

    let k = key("list-at-lock");
    server.command(&["RPUSH", &redis_key(&k, "lock"), "x"]);
    assert_corrupt(
        p.acquire(lock(&k, a, LONG, Duration::ZERO)).await,
        "acquire",
    );
    assert_corrupt(
        p.acquire(lock(&k, a, LONG, Duration::from_secs(1))).await,
        "waiting acquire",
    );
    assert_corrupt(
        p.acquire(fenced(&k, a, LONG, Duration::ZERO)).await,
        "fenced acquire",
    );
    assert_corrupt(p.release(&k, a).await, "release");
    assert_corrupt(p.renew(&k, a, LONG).await, "renew");

    let k = key("garbage-at-lock");
    server.command(&["SET", &redis_key(&k, "lock"), "not a token"]);
    assert_corrupt(
        p.acquire(lock(&k, a, LONG, Duration::ZERO)).await,
        "acquire",
    );
    assert_corrupt(
        p.acquire(fenced(&k, a, LONG, Duration::ZERO)).await,
        "fenced acquire",
    );
    assert_corrupt(p.release(&k, a).await, "release of garbage");

    let k = key("garbage-fence");
    server.command(&["SET", &redis_key(&k, "fence"), "eleven"]);
    assert_corrupt(
        p.acquire(fenced(&k, a, LONG, Duration::ZERO)).await,
        "fenced acquire",
    );
    assert_eq!(
        server.command(&["EXISTS", &redis_key(&k, "lock")]),
        coord_redis_testing::Resp::Int(0),
        "a failed fenced acquire changes nothing"
    );
    server.command(&["HSET", &redis_key(&k, "fence"), "f", "v"]);
    assert_corrupt(
        p.acquire(fenced(&k, a, LONG, Duration::ZERO)).await,
        "fenced acquire",
    );
}

async fn foreign_values_at_record_keys_are_corrupt(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let a = OwnerToken::new();
    let payload: Arc<[u8]> = Arc::from(&b"p"[..]);

    let k = key("list-at-record");
    server.command(&["RPUSH", &redis_key(&k, "idem"), "x"]);
    assert_corrupt(p.claim(claim(&k, a, LONG)).await, "claim");
    assert_corrupt(
        complete_stored(&p, &k, a, payload.clone(), LONG).await,
        "complete",
    );
    assert_corrupt(p.abandon(&k, a).await, "abandon");
    assert_corrupt(p.wait_settled(&k, LONG).await, "wait_settled");

    let k = key("string-at-record");
    server.command(&["SET", &redis_key(&k, "idem"), "x"]);
    assert_corrupt(p.claim(claim(&k, a, LONG)).await, "claim");

    for (name, fields) in [
        ("unknown-state", vec!["st", "zzz", "fp", ""]),
        ("no-state", vec!["fp", ""]),
        ("completed-without-payload", vec!["st", "c", "fp", ""]),
        ("short-fingerprint", vec!["st", "i", "fp", "abc"]),
        ("no-fingerprint", vec!["st", "i", "own", "x"]),
    ] {
        let k = key(name);
        let record = redis_key(&k, "idem");
        let mut args = vec!["HSET", record.as_str()];
        args.extend(fields);
        server.command(&args);
        assert_corrupt(p.claim(claim(&k, a, LONG)).await, name);
    }

    let k = key("garbage-state-wait");
    server.command(&["HSET", &redis_key(&k, "idem"), "st", "?"]);
    assert_corrupt(p.wait_settled(&k, LONG).await, "wait_settled");
}

async fn scripts_are_sent_again_after_the_cache_is_flushed(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("noscript");
    let a = OwnerToken::new();
    p.acquire(fenced(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    p.release(&k, a).await.unwrap();
    assert_eq!(
        server.command(&["SCRIPT", "FLUSH"]),
        coord_redis_testing::Resp::Simple("OK".into())
    );
    let monitor = coord_redis_testing::Monitor::start(&server);
    let grant = p
        .acquire(fenced(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap();
    assert!(grant.unwrap().fencing_token.is_some());
    // By SHA first; the server no longer knows it (NOSCRIPT), so the source goes once.
    assert_eq!(monitor.client_commands(), ["evalsha", "eval"]);
    assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(monitor.client_commands(), ["evalsha", "eval"]);
    // Cached again: by SHA only.
    p.acquire(fenced(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(monitor.client_commands(), ["evalsha"]);
}
