//! Record age: a claim that finds a completed record says how long ago it was stored, and a
//! replay through the attribute reports it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use coord_core::provider::{ClaimOutcome, OwnerToken};
use coord_core::{CoordError, Coordinator, idempotent};

use super::durations::LONG;
use super::records::complete_stored;
use super::requests::{claim_req, key};

/// A call whose duplicates replay its first outcome; `runs` counts the bodies that ran.
#[idempotent(key_from = "request", wait = "20s", coordinator = coord)]
async fn receipt(
    coord: &Coordinator,
    request: &str,
    runs: Arc<AtomicU64>,
) -> Result<String, CoordError> {
    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(format!("receipt-{request}-run-{n}"))
}

/// A claim that finds a completed record says how long ago it was stored, and a replay
/// through the attribute reports that age in its [`CallReport`](coord_core::CallReport).
pub async fn idempotency_replay_reports_the_record_age(c: Coordinator) {
    const PAUSE: Duration = Duration::from_millis(400);
    let s = c.idempotency_store();
    let k = key(&c, "replay-age");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    assert_eq!(
        s.claim(claim_req(&k, a, LONG, None, None)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    let before_store = Instant::now();
    assert!(
        complete_stored(&**s, &k, a, Arc::from(&b"aged"[..]), LONG)
            .await
            .unwrap()
    );
    tokio::time::sleep(PAUSE).await;
    let age = match s.claim(claim_req(&k, b, LONG, None, None)).await.unwrap() {
        ClaimOutcome::Completed { age, .. } => age.expect("a record coord stored has a known age"),
        other => panic!("expected completed, got {other:?}"),
    };
    // At least the pause, at most the time since the completion was sent, each give or take
    // a little: a backend's clock may count whole milliseconds, and is not this process's.
    const SLACK: Duration = Duration::from_millis(25);
    assert!(
        age + SLACK >= PAUSE && age <= before_store.elapsed() + SLACK,
        "the record was stored {PAUSE:?} ago or a little more, the claim says {age:?}"
    );

    let runs = Arc::new(AtomicU64::new(0));
    let (first, report) = coord_core::observe(receipt(&c, "aged-1", runs.clone())).await;
    first.unwrap();
    assert_eq!(report.replay_age(), None, "a call that ran replays nothing");
    tokio::time::sleep(PAUSE).await;
    let (again, report) = coord_core::observe(receipt(&c, "aged-1", runs.clone())).await;
    again.unwrap();
    assert!(report.replayed(), "the duplicate replays");
    let age = report
        .replay_age()
        .expect("a replay reports the record's age");
    assert!(
        age + SLACK >= PAUSE && age < LONG,
        "the replay answers with an outcome stored {PAUSE:?} ago or a little more, got {age:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
