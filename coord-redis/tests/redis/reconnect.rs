//! The first command after the server dropped coord's connections: `CLIENT KILL` of every
//! normal connection, then at once a call (an `#[idempotent]` claim and completion on a new
//! key), 100 times in a row.
//!
//! A command that provably never left the process (its connection was closed before a byte
//! of it was written) is sent once more on a fresh connection, so the call succeeds; only a
//! command that may have reached the server is reported, as a typed `Unavailable` error.
//!
//! redis-rs: the transport dials its own sockets, counts what they wrote and, before the first
//! write after a connection was idle, peeks for the server's close; a command handed to a
//! connection whose driver is ending (it read the close a moment before) is woken when the
//! socket is dropped rather than left waiting for its reply. The kills here always come
//! between calls, so every such command is the first after idle and is proven unsent: 0
//! failures are required (a command written behind an unanswered one is not looked for, and
//! would be in doubt; no call here has one). fred: the client writes on its own socket, and a command that was handed to a
//! connection that then closed fails whether or not it was written (fred does not say which);
//! a command fred could not route (no connection yet) is proven unsent and sent again, the
//! rest (written, then the connection closed: "Connection closed") are counted and printed,
//! must be typed `Unavailable`, and none may be a command fred could not route (measured: 1 to
//! 4 of 100 on an idle host, up to 17 on a loaded one; 5 to 27 of 100 before unrouted
//! commands were sent again).

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};

use coord_core::provider::BackendErrorKind;
use coord_core::{CoordError, Coordinator, idempotent};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::{RedisServer, Resp, command_at};
use support::*;

per_client!(first_call_after_client_kill);

const ROUNDS: usize = 100;

#[idempotent(key_from = "id", coordinator = c, name = "rc.charge", on_backend_error = "fail_closed")]
async fn charge(c: &Coordinator, id: usize, runs: &AtomicUsize) -> Result<usize, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(id * 10)
}

fn kill_normal_clients(port: u16) -> i64 {
    // The killing connection itself is skipped (SKIPME defaults to yes).
    match command_at(port, &["CLIENT", "KILL", "TYPE", "normal"]) {
        Ok(Resp::Int(killed)) => killed,
        other => panic!("CLIENT KILL answered {other:?}"),
    }
}

async fn first_call_after_client_kill(client: Client) {
    let server = RedisServer::start();
    let provider = RedisProvider::builder(server.url())
        .client(client)
        .connect()
        .await
        .expect("connect to the test server");
    let c = Coordinator::builder()
        .namespace("rc")
        .provider(provider)
        .build()
        .expect("coordinator");
    let runs = AtomicUsize::new(0);
    // Every pooled connection made and in use before the kills start.
    for id in 0..8 {
        assert_eq!(charge(&c, id, &runs).await.unwrap(), id * 10);
    }
    let mut failures = Vec::new();
    let mut killed = 0;
    for round in 0..ROUNDS {
        let id = 1000 + round;
        // A client still reconnecting after the previous round has nothing to kill yet.
        let deadline = std::time::Instant::now() + LONG;
        loop {
            let now_killed = kill_normal_clients(server.port());
            if now_killed > 0 {
                killed += now_killed;
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "coord never reconnected"
            );
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        match charge(&c, id, &runs).await {
            Ok(v) => assert_eq!(v, id * 10),
            Err(err) => failures.push((round, err)),
        }
    }
    println!(
        "first call after CLIENT KILL ({client:?}): {} of {ROUNDS} failed; {killed} connections killed; failures: {failures:?}",
        failures.len()
    );
    assert!(
        killed >= ROUNDS as i64,
        "each round killed coord's connections"
    );
    for (round, err) in &failures {
        assert!(
            matches!(err, CoordError::Backend(e) if e.kind() == BackendErrorKind::Unavailable),
            "round {round}: only an ambiguous command is reported, as Unavailable: {err:?}"
        );
    }
    // redis-rs connections prove which commands never left; fred's cannot (see above).
    #[cfg(feature = "redis-client")]
    let proven = client == Client::RedisRs;
    #[cfg(not(feature = "redis-client"))]
    let proven = false;
    if proven {
        assert!(
            failures.is_empty(),
            "no command that never left the process may fail: {failures:?}"
        );
    } else {
        // How many commands fred had already handed to a connection when the kill reached
        // it depends on scheduling (1 to 4 of 100 on an idle host, up to 17 beside five other
        // tests and two builds): the count cannot tell a regression from a busy host. What
        // can: a command fred could not route is proven unsent and must have been sent
        // again, so no failure may be one of those.
        for (round, err) in &failures {
            let text = format!("{err:?}");
            assert!(
                !text.contains("route") && !text.contains("not sent"),
                "round {round}: a command fred never wrote was reported instead of sent again: {err:?}"
            );
        }
        assert!(
            failures.len() <= ROUNDS / 2,
            "fred: {} of {ROUNDS} first calls failed",
            failures.len()
        );
    }
    // Every call that failed left its key free (its claim was cleared) or replays: a retry
    // answers, and no body ran twice.
    for (round, _) in &failures {
        let id = 1000 + round;
        let deadline = std::time::Instant::now() + LONG;
        loop {
            match charge(&c, id, &runs).await {
                Ok(v) => break assert_eq!(v, id * 10),
                // A claim that may have landed is cleared in the background meanwhile.
                Err(CoordError::InFlight { .. }) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                Err(err) => panic!("retry of round {round}: {err:?}"),
            }
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        8 + ROUNDS,
        "every key's body ran once"
    );
}
