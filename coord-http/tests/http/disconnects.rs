//! A client that disconnects at any stage of a request through the `Idempotency-Key` layer
//! (while the key is being claimed, before the handler ran, inside the handler, while the
//! response is read and stored) leaves the key as the docs say: free at once, or replaying the
//! stored response; `409` only for a handler that had started, under `on_abandoned = "fail"`
//! (its outcome is unknown).
//!
//! Each cut-off is a real HTTP client's timeout, from 0 to past the handler's end in 1 ms steps,
//! against a new server over a new coordinator (for Redis, a provider that has just connected:
//! a process's first requests are the ones with the most awaits). After each, the same request
//! is retried until it stops answering `409 in-flight` or a generous bound passes (the lease is
//! 30 s, so a key left blocked cannot pass for one freed).

use crate::support;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::{Coordinator, OnAbandoned};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::RedisServer;
use http::StatusCode;
use support::*;

/// How long the handler takes: the cut-offs run from 0 to past it.
const HANDLER_MS: u64 = 8;
/// The cut-offs: every 100 µs through the first millisecond (the claim, before the handler),
/// then every millisecond to past the handler's end.
fn cutoffs() -> impl Iterator<Item = Duration> {
    let first_ms = (1..10).map(|tenths| Duration::from_micros(tenths * 100));
    first_ms.chain((1..=HANDLER_MS + 8).map(Duration::from_millis))
}
/// How long a dropped request's key may stay in flight before it counts as left blocked.
const SETTLE_LIMIT: Duration = Duration::from_secs(5);

/// Where the request was when the client went away, as the handler's counters tell.
#[derive(Debug, Default)]
struct Stages {
    before_handler: usize,
    inside_handler: usize,
    after_handler: usize,
    answered: usize,
}

async fn sweep<M, MF>(policy: OnAbandoned, mut coordinator: M) -> Stages
where
    M: FnMut() -> MF,
    MF: Future<Output = Coordinator>,
{
    let client = client();
    let mut stages = Stages::default();
    for cutoff in cutoffs() {
        let layer = layer(coordinator().await)
            .in_flight_lease(Duration::from_secs(30))
            .on_abandoned(policy)
            .build();
        let (server, app) = start(layer).await;
        let key = format!("cut-{}", cutoff.as_micros());
        let delay = HANDLER_MS.to_string();
        let first = Req::post(&server, "/charge", &key)
            .header("x-delay-ms", delay.as_bytes())
            .timeout(cutoff)
            .try_send(&client)
            .await;
        let at = |what: &str| format!("{policy:?}, client gone after {cutoff:?}: {what}");
        // Longer than the handler: by now the first request is over, dropped or answered.
        tokio::time::sleep(Duration::from_millis(HANDLER_MS * 4)).await;
        let (runs, finished) = (app.runs(), app.finished());
        match (&first, runs, finished) {
            (Ok(_), _, _) => stages.answered += 1,
            (Err(_), 0, _) => stages.before_handler += 1,
            (Err(_), _, 0) => stages.inside_handler += 1,
            (Err(_), _, _) => stages.after_handler += 1,
        }
        let started = Instant::now();
        let retry = loop {
            let reply = Req::post(&server, "/charge", &key).send(&client).await;
            if reply.status != StatusCode::CONFLICT {
                break reply;
            }
            // Kept only for a handler that started, under "fail": its effects are unknown. (Read
            // now: a refused retry runs nothing, so any run is the first request's, however
            // late a loaded server dispatched it.)
            let may_keep = policy == OnAbandoned::Fail && first.is_err() && app.runs() >= 1;
            let problem = reply.problem();
            if may_keep && (problem == "in-flight" || problem == "outcome-unknown") {
                break reply;
            }
            assert!(
                started.elapsed() < SETTLE_LIMIT,
                "{}",
                at(&format!(
                    "the retry still answers 409 {problem} after {SETTLE_LIMIT:?} (handler runs {runs}, finished {finished})"
                ))
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        if retry.status != StatusCode::CONFLICT {
            assert_eq!(retry.status, StatusCode::CREATED, "{}", at("the retry"));
        }
        if let Ok(reply) = &first {
            assert_eq!(
                reply.status,
                StatusCode::CREATED,
                "{}",
                at("the first reply")
            );
            assert!(
                retry.replayed(),
                "{}",
                at("an answered request must replay")
            );
        }
    }
    stages
}

fn memory() -> std::future::Ready<Coordinator> {
    std::future::ready(memory_coordinator())
}

async fn redis(client: Client) -> Coordinator {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let provider = RedisProvider::builder(RedisServer::shared().url())
        .client(client)
        .connect()
        .await
        .expect("connect to the test server");
    Coordinator::builder()
        .namespace(format!("disc{}", NEXT.fetch_add(1, Ordering::Relaxed)))
        .provider(provider)
        .build()
        .expect("coordinator")
}

async fn both_policies<M, MF>(name: &str, mut coordinator: M)
where
    M: FnMut() -> MF,
    MF: Future<Output = Coordinator>,
{
    for policy in [OnAbandoned::Rerun, OnAbandoned::Fail] {
        let stages = sweep(policy, &mut coordinator).await;
        eprintln!("{name} {policy:?}: {stages:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnects_at_every_stage_memory() {
    both_policies("memory", memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnects_at_every_stage_redis_rs() {
    both_policies("redis_rs", || redis(Client::RedisRs)).await;
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnects_at_every_stage_fred() {
    both_policies("fred", || redis(Client::Fred)).await;
}
