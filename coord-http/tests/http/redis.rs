//! The layer's semantics against a real `redis-server` (started by the tests on a free
//! loopback port), with each Redis client compiled in: every case of `support/cases.rs`, two
//! servers sharing one Redis, and Redis unreachable or killed mid-request.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::{Coordinator, OnBackendError};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::RedisServer;
use http::StatusCode;
use support::*;

/// Short, so a dead server turns into an error quickly.
const TIMEOUT: Duration = Duration::from_millis(300);

/// A coordinator over `server` with `client`, in a namespace no other test uses.
async fn coordinator(server: &RedisServer, client: Client, namespace: &str) -> Coordinator {
    let provider = RedisProvider::builder(server.url())
        .client(client)
        .command_timeout(TIMEOUT)
        .connect()
        .await
        .expect("connect to the test server");
    Coordinator::builder()
        .namespace(namespace)
        .provider(provider)
        .build()
        .expect("coordinator")
}

fn fresh_namespace() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("http{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Declares, for each enabled client, one test per case on the shared server.
macro_rules! redis_cases {
    ($($case:ident),* $(,)?) => {
        mod redis_rs {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let ns = fresh_namespace();
                    cases::$case(coordinator(RedisServer::shared(), Client::RedisRs, &ns).await).await;
                }
            )*
        }
        #[cfg(feature = "fred")]
        mod fred {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let ns = fresh_namespace();
                    cases::$case(coordinator(RedisServer::shared(), Client::Fred, &ns).await).await;
                }
            )*
        }
    };
}

redis_cases!(
    replays_exactly,
    quoted_and_bare_forms_share_a_key,
    missing_key,
    invalid_keys,
    reused_key_for_another_request,
    in_flight_duplicate_is_409,
    duplicate_waits_and_replays,
    waiter_runs_when_the_first_fails,
    failures_are_not_remembered,
    client_errors_remembered_when_configured,
    binary_body_and_custom_headers,
    oversized_response_is_unreplayable,
    oversized_response_forgotten,
    request_body_over_the_limit,
    panic_frees_the_key,
    panic_under_fail_is_outcome_unknown,
    client_disconnect_frees_the_key,
    tenants_do_not_share_keys,
    unguarded_methods_pass_through,
    principals_one_after_the_other,
    principals_at_the_same_time,
    single_principal_shares_keys,
);

/// Declares one test per enabled client for each `async fn case(Client)`.
macro_rules! per_client {
    ($($case:ident),* $(,)?) => {
        mod per_client_redis_rs {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(coord_redis::Client::RedisRs).await;
                }
            )*
        }
        #[cfg(feature = "fred")]
        mod per_client_fred {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(coord_redis::Client::Fred).await;
                }
            )*
        }
    };
}

per_client!(
    stampede_across_two_instances,
    redis_down_fails_closed,
    redis_down_fails_open,
    redis_killed_mid_request,
);

/// Two instances (each its own provider, connections and handler counter) sharing one Redis:
/// 50 concurrent identical requests run the handler once.
async fn stampede_across_two_instances(client: Client) {
    let ns = fresh_namespace();
    let server = RedisServer::shared();
    let first = coordinator(server, client, &ns).await;
    let second = coordinator(server, client, &ns).await;
    cases::concurrent_duplicates_across_two_servers(first, second).await;
}

/// Redis unreachable, fail closed: 503 with Retry-After within the command timeout, nothing
/// runs; after a restart, the request runs.
async fn redis_down_fails_closed(client: Client) {
    let mut redis = RedisServer::start();
    let coord = coordinator(&redis, client, "down").await;
    let (server, app) = start(layer(coord).build()).await;
    let http = support::client();
    redis.kill();
    let started = Instant::now();
    let reply = Req::post(&server, "/charge", "k").send(&http).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.problem(), "backend-unavailable");
    assert_eq!(reply.retry_after(), Some(1));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(app.runs(), 0);
    redis.restart();
    let started = Instant::now();
    let reply = loop {
        let reply = Req::post(&server, "/charge", "k").send(&http).await;
        if reply.status != StatusCode::SERVICE_UNAVAILABLE || started.elapsed() > LONG {
            break reply;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_eq!(app.runs(), 1);
}

/// Redis unreachable, fail open: the handler runs unguarded and is counted.
async fn redis_down_fails_open(client: Client) {
    let mut redis = RedisServer::start();
    let coord = coordinator(&redis, client, "open").await;
    let layer = layer(coord)
        .on_backend_error(OnBackendError::FailOpen)
        .build();
    let (server, app) = start(layer.clone()).await;
    let http = support::client();
    redis.kill();
    for run in 1..=2 {
        let reply = Req::post(&server, "/charge", "k").send(&http).await;
        assert_eq!(reply.status, StatusCode::CREATED);
        assert_eq!(reply.run(), Some(run));
    }
    assert_eq!(layer.metrics().failed_open(), 2);
    assert_eq!(app.runs(), 2);
}

/// Redis killed while the handler runs: the client still gets the handler's response (after
/// completion gave up, bounded by the lease), counted as not stored; duplicates get 503 while
/// Redis is down; after it comes back empty, the key runs again (the record was lost with it).
async fn redis_killed_mid_request(client: Client) {
    let mut redis = RedisServer::start();
    let coord = coordinator(&redis, client, "killed").await;
    let layer = layer(coord).in_flight_lease(Duration::from_secs(1)).build();
    let (server, app) = start(layer.clone()).await;
    let http = support::client();
    let started = Instant::now();
    let pending = Req::post(&server, "/charge", "k")
        .header("x-delay-ms", b"400")
        .spawn(&http);
    eventually("the handler started", || app.runs() == 1).await;
    redis.kill();
    let reply = pending.await.unwrap();
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_eq!(reply.run(), Some(1));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(layer.metrics().not_stored(), 1);
    let during = Req::post(&server, "/charge", "k").send(&http).await;
    assert_eq!(during.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(during.problem(), "backend-unavailable");
    redis.restart();
    let started = Instant::now();
    let after = loop {
        let reply = Req::post(&server, "/charge", "k").send(&http).await;
        if reply.status != StatusCode::SERVICE_UNAVAILABLE || started.elapsed() > LONG {
            break reply;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(after.status, StatusCode::CREATED);
    assert!(!after.replayed());
    assert_eq!(app.runs(), 2);
}
