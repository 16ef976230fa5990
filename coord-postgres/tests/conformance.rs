//! The provider conformance suite (the cases the in-process and Redis providers pass) against
//! a real PostgreSQL server.

mod support;

async fn fresh_coordinator() -> coord_core::Coordinator {
    support::fresh_coordinator().await
}

coord_conformance::conformance_suite!(fresh_coordinator);

/// The cancellation harness on cold processes (as the Redis run does for both clients): for
/// every layer, a call on a provider that has just connected is dropped after N polls, for
/// every N until it completes on its own, each N on a new provider, so every await of a
/// process's first call (a pool's first connection, a prepared statement, a transaction's
/// `BEGIN`) is a drop point. The suite above sweeps the same layers on one provider, as it
/// comes and warm.
mod cold_cancellation {
    use coord_conformance::cancellation::{Layer, sweep};

    /// How many times each layer is swept: where a call suspends depends on timing (a reply
    /// can be in before the call is polled again), so repeated sweeps meet more of its awaits.
    /// Fewer than the Redis run's 20: every drop point here opens a connection pool.
    const ROUNDS: usize = 3;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn cold_calls_dropped_at_every_await_leave_nothing() {
        for layer in Layer::ALL {
            let (mut calls, mut in_body) = (0, 0);
            for round in 0..ROUNDS {
                let tag = format!("cold{round}");
                let s = sweep(layer, &tag, |_| super::support::fresh_coordinator()).await;
                assert!(s.drop_points > 0, "{layer:?}: no drop point was swept");
                calls += s.drop_points;
                in_body += s.dropped_in_body;
            }
            eprintln!(
                "{layer:?}: {calls} calls dropped ({in_body} in the body) over {ROUNDS} sweeps, 0 keys left blocked"
            );
        }
    }
}
