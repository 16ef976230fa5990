//! Redis: a cluster single-flight leader whose process exits right after its callers are
//! answered (a batch job, a command line tool: a `main` that returns without
//! `Coordinator::shutdown`) still hands its outcome over. The run and what it asserts are
//! `coord_history::exiting_leader`'s, shared with PostgreSQL.
//!
//! Against the earlier code, where the leader answered before its hand-over request had even
//! left the process, this test failed: run once against it (the wait for the send taken out of
//! `coord-core/src/runtime/cluster_flight.rs`), the body ran 4 times and the slowest process
//! answered 30.3 s after the start.
//!
//! This test binary has its own `main` (`harness = false`): run without `COORD_TEST_ROLE` it
//! starts a redis-server and runs the scenario, which re-runs this same binary as child
//! processes with `COORD_TEST_ROLE` set. It ends with the line `flight_exit: N passed, M failed`
//! and a non-zero exit status when anything failed.

use coord_core::Coordinator;
use coord_history::child_process::run_scenarios;
use coord_history::exiting_leader;
use coord_redis::RedisProvider;
use coord_redis_testing::RedisServer;

const NAMESPACE: &str = "xflight-exit";

fn main() {
    if std::env::var(exiting_leader::ROLE_VAR).is_ok() {
        exiting_leader::run_child(|| async {
            let url = std::env::var("COORD_TEST_URL").expect("COORD_TEST_URL");
            let provider = RedisProvider::connect(&url).await.expect("connect");
            Coordinator::builder()
                .namespace(NAMESPACE)
                .provider(provider)
                .build()
                .expect("coordinator")
        });
        return;
    }
    let server = RedisServer::start();
    run_scenarios(
        "flight_exit",
        &server,
        &[("exiting_leader_still_hands_over", |server: &RedisServer| {
            exiting_leader::exiting_leader_still_hands_over(|child| {
                child.env("COORD_TEST_URL", server.url());
            })
        })],
    );
}
