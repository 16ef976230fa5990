//! A stalled holder never returns `Ok` from a renewing lock it lost, with the in-process
//! provider (the Redis runs are in `coord-redis/tests/redis/stalls.rs`; the single-call cases for
//! every provider are the conformance kit's `stalls` module).
//!
//! * `renewing_holds_that_returned_ok_held_throughout`: three "processes" (threads, each with a
//!   current-thread runtime and a coordinator of its own over one shared provider) take turns
//!   on one renewing fenced lock, and every third call blocks its runtime 2 s past the 1 s
//!   lease. No call that returned `Ok` may have seen a newer token write to the resource
//!   between its own first and last write. The run is `coord_history::paused_holders`, which
//!   the Redis tests make too.
//! * `a_renewing_hold_in_a_sigstopped_process_ends_in_lock_lost`: this test binary, run again
//!   as a child, is stopped with SIGSTOP for 2 s while its renewing hold's body awaits, and
//!   continued: the call ends in `LockLost { cause: Expired }`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use coord_core::memory::MemoryProvider;
use coord_core::{CoordError, Coordinator, distributed_lock, is_held};
use coord_history::paused_holders;

const STALL: Duration = Duration::from_secs(2);

#[test]
fn renewing_holds_that_returned_ok_held_throughout() {
    let provider = Arc::new(MemoryProvider::new());
    paused_holders::run_and_check(move || {
        let provider = provider.clone();
        async move {
            Coordinator::builder()
                .namespace("history")
                .provider(provider)
                .build()
                .unwrap()
        }
    });
}

/// Set in the child's environment: run the child's part.
const CHILD: &str = "COORD_TEST_SIGSTOP_CHILD";
const TEST_NAME: &str = "a_renewing_hold_in_a_sigstopped_process_ends_in_lock_lost";

#[distributed_lock(key_from = "id", coordinator = coord, name = "stalls.sigstop", lease = "1s", wait = "0s", renew = true)]
async fn stopped_section(coord: &Coordinator, id: u32) -> Result<bool, CoordError> {
    println!("child: in body");
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(is_held())
}

#[test]
fn a_renewing_hold_in_a_sigstopped_process_ends_in_lock_lost() {
    if std::env::var_os(CHILD).is_some() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let outcome = runtime.block_on(async {
            let c = Coordinator::builder().memory().build().unwrap();
            stopped_section(&c, 1).await
        });
        match outcome {
            Err(CoordError::LockLost { cause, .. }) => println!("child: outcome lock_lost {cause}"),
            other => println!("child: outcome {other:?}"),
        }
        return;
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .stdout(Stdio::piped())
        .spawn()
        .expect("run this test binary as the child");
    let pid = child.id().to_string();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut output = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let in_body = line.contains("child: in body");
        output.push(line);
        if in_body {
            break;
        }
    }
    // 50 ms into the body's 500 ms await, stop the whole process past its 1 s lease.
    std::thread::sleep(Duration::from_millis(50));
    let signal = |sig: &str| {
        let status = Command::new("kill").args([sig, &pid]).status().unwrap();
        assert!(status.success(), "kill {sig} {pid}");
    };
    signal("-STOP");
    std::thread::sleep(STALL);
    signal("-CONT");
    output.extend(lines.map(|l| l.unwrap()));
    let status = child.wait().unwrap();
    assert!(status.success(), "the child ran: {output:?}");
    let outcome = output
        .iter()
        .find_map(|l| l.strip_prefix("child: outcome "))
        .unwrap_or_else(|| panic!("the child said how its call ended: {output:?}"));
    assert_eq!(
        outcome,
        format!("lock_lost {}", coord_core::LossCause::Expired),
        "a renewing hold whose process was stopped past its lease ends in LockLost (Expired)"
    );
}

#[coord_core::idempotent(key_from = "id", coordinator = coord, name = "stalls.marker", in_flight_lease = "1s", renew = true)]
async fn marked_work(coord: &Coordinator, id: u32) -> Result<u32, CoordError> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(id)
}

/// An `#[idempotent]` call renewing its in-flight marker, whose runtime is blocked 2 s past the
/// marker's 1 s lease while the body awaits, ends in `LockLost { cause: Expired }`: a
/// duplicate may have run meanwhile, so the body's outcome is not stored as if it ran alone.
#[test]
fn a_renewing_marker_stalled_past_its_lease_ends_in_lock_lost() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let outcome = runtime.block_on(async {
        let c = Coordinator::builder().memory().build().unwrap();
        tokio::spawn(async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            std::thread::sleep(STALL);
        });
        marked_work(&c, 1).await
    });
    match outcome {
        Err(CoordError::LockLost { cause, .. }) => {
            assert_eq!(cause, coord_core::LossCause::Expired);
        }
        other => panic!("a marker stalled past its lease must end in LockLost, got {other:?}"),
    }
}
