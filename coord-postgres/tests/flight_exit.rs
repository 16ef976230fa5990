//! PostgreSQL: a cluster single-flight leader whose process exits right after its callers are
//! answered (a batch job, a command line tool: a `main` that returns without
//! `Coordinator::shutdown`) still hands its outcome over. The run and what it asserts are
//! `coord_history::exiting_leader`'s, shared with Redis.
//!
//! The PostgreSQL provider cannot see when a statement has left the process, so its leader
//! answers once the hand-over statement is answered (the default of
//! `FlightStore::flight_finish_noting_sent`). Against the earlier code, where the leader
//! answered before its hand-over was even sent, this test failed: run once against it, the
//! body ran 4 times and the slowest process answered 30.4 s after the start.
//!
//! This test binary has its own `main` (`harness = false`): run without `COORD_TEST_ROLE` it
//! starts a PostgreSQL server and runs the scenario, which re-runs this same binary as child
//! processes with `COORD_TEST_ROLE` set. It ends with the line `flight_exit: N passed, M failed`
//! and a non-zero exit status when anything failed.

use coord_core::Coordinator;
use coord_history::child_process::run_scenarios;
use coord_history::exiting_leader;
use coord_postgres::PostgresProvider;
use coord_postgres_testing::PostgresServer;

const NAMESPACE: &str = "xflight-exit";

fn main() {
    if std::env::var(exiting_leader::ROLE_VAR).is_ok() {
        exiting_leader::run_child(|| async {
            let url = std::env::var("COORD_TEST_URL").expect("COORD_TEST_URL");
            let provider = PostgresProvider::builder(&url)
                .pool_size(4)
                .connect()
                .await
                .expect("connect");
            Coordinator::builder()
                .namespace(NAMESPACE)
                .provider(provider)
                .build()
                .expect("coordinator")
        });
        return;
    }
    let server = PostgresServer::start();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(PostgresProvider::migrate(&server.url()))
        .expect("migrate");
    run_scenarios(
        "flight_exit",
        &server,
        &[(
            "exiting_leader_still_hands_over",
            |server: &PostgresServer| {
                exiting_leader::exiting_leader_still_hands_over(|child| {
                    child.env("COORD_TEST_URL", server.url());
                })
            },
        )],
    );
}
