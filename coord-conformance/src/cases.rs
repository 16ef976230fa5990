//! The cases, one `pub async fn` per promise of the provider contract.
//!
//! Each case takes a fresh [`Coordinator`] (its own namespace, so cases never see each other's
//! keys) and checks one promise, first through the provider traits, then through the
//! attributes themselves. A case passes by returning and fails by panicking with a message
//! that says which promise broke. Call them one by one when bisecting a failure; otherwise run
//! them through [`conformance_suite!`](crate::conformance_suite) or [`run_all`](crate::run_all).
//!
//! Deadlines here are behavioural and generous: "woken by the release, not by a backstop" is
//! checked as "well under the one-second backstop cap", never as a tight latency.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::provider::{
    ClaimOutcome, ClaimRequest, CompleteOutcome, CompleteRequest, Cursor, Fingerprint,
    ForcedRelease, IdempotencyStore, ListRequest, LockInfo, LockRequest, OwnerToken, Page,
    RecordInfo, RecordStatus, ReleaseOutcome, RenewOutcome, Waiters,
};
use coord_core::{
    BackendError, CallKey, CoordError, Coordinator, FencingToken, LossCause, distributed_lock,
    fencing_token, idempotent,
};

const LONG: Duration = Duration::from_secs(30);

fn key(c: &Coordinator, rest: &str) -> CallKey {
    c.key("conformance").part(rest).finish()
}

fn lock_req(key: &CallKey, owner: OwnerToken, lease: Duration, wait: Duration) -> LockRequest<'_> {
    LockRequest {
        key,
        owner,
        lease,
        wait,
        fenced: false,
    }
}

/// Completes `key` for `owner` without a fingerprint and says whether the outcome was stored
/// (`Stored` or `StoredWithoutMarker`), for cases that only care whether the completion landed.
async fn complete_stored(
    store: &dyn IdempotencyStore,
    key: &CallKey,
    owner: OwnerToken,
    payload: Arc<[u8]>,
    retention: Duration,
) -> Result<bool, BackendError> {
    store
        .complete(CompleteRequest {
            key,
            owner,
            payload,
            retention,
            fingerprint: None,
        })
        .await
        .map(CompleteOutcome::is_stored)
}

/// A held lock refuses a single attempt by someone else, and is free again after release.
pub async fn lock_single_attempt_refused_when_held(c: Coordinator) {
    let p = c.lock_provider();
    let k = key(&c, "single");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    let grant = p
        .acquire(lock_req(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap();
    assert!(grant.is_some(), "a free lock is granted");
    let refused = p
        .acquire(lock_req(&k, b, LONG, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(refused, None, "a held lock refuses a single attempt");
    assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::Released);
    let again = p
        .acquire(lock_req(&k, b, LONG, Duration::ZERO))
        .await
        .unwrap();
    assert!(again.is_some(), "released lock is free");
    p.release(&k, b).await.unwrap();
}

/// Release frees only the owner's lock and is idempotent.
pub async fn lock_release_is_owner_scoped_and_idempotent(c: Coordinator) {
    let p = c.lock_provider();
    let k = key(&c, "owner-scoped");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    p.acquire(lock_req(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(p.release(&k, b).await.unwrap(), ReleaseOutcome::NotHeld);
    let still = p
        .acquire(lock_req(&k, b, LONG, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(still, None, "a stranger's release must not free the lock");
    assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::NotHeld);
}

/// A holder that outlives its lease loses the lock: the next caller gets it, and the old
/// holder's release reports `NotHeld` without freeing the new holder.
pub async fn lock_expired_holder_is_replaced(c: Coordinator) {
    let p = c.lock_provider();
    let k = key(&c, "expiry");
    let (a, b, d) = (OwnerToken::new(), OwnerToken::new(), OwnerToken::new());
    p.acquire(lock_req(&k, a, Duration::from_millis(200), Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let started = Instant::now();
    let grant = p
        .acquire(lock_req(&k, b, LONG, Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(
        grant.is_some(),
        "the lapsed lease frees the lock for a waiter"
    );
    assert!(
        started.elapsed() < Duration::from_millis(200) + Duration::from_secs(2),
        "replaced within lease + margin, took {:?}",
        started.elapsed()
    );
    assert_eq!(
        p.release(&k, a).await.unwrap(),
        ReleaseOutcome::NotHeld,
        "the lapsed holder's release reports it"
    );
    let refused = p
        .acquire(lock_req(&k, d, LONG, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(
        refused, None,
        "the lapsed holder's release freed the new holder"
    );
    assert_eq!(p.release(&k, b).await.unwrap(), ReleaseOutcome::Released);
}

/// A waiter is woken by the release, long before any backstop would fire.
pub async fn lock_waiter_is_woken_by_release(c: Coordinator) {
    let p = c.lock_provider().clone();
    let k = key(&c, "wake");
    let a = OwnerToken::new();
    p.acquire(lock_req(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let waiter = tokio::spawn({
        let (p, k) = (p.clone(), k.clone());
        async move {
            let b = OwnerToken::new();
            let grant = p
                .acquire(lock_req(&k, b, LONG, Duration::from_secs(20)))
                .await
                .unwrap();
            (grant, Instant::now(), b)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    p.release(&k, a).await.unwrap();
    let (grant, granted_at, b) = waiter.await.unwrap();
    let grant = grant.expect("the waiter gets the lock");
    assert!(
        grant.contended,
        "a grant after waiting is reported as contended"
    );
    let handoff = granted_at.saturating_duration_since(released_at);
    assert!(
        handoff < Duration::from_millis(700),
        "woken by the release, not a backstop: hand-off took {handoff:?}"
    );
    p.release(&k, b).await.unwrap();
}

/// One release wakes one waiter: of two waiters, the second stays waiting.
pub async fn lock_release_wakes_one_waiter(c: Coordinator) {
    let p = c.lock_provider().clone();
    let k = key(&c, "wake-one");
    let a = OwnerToken::new();
    p.acquire(lock_req(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let granted = Arc::new(AtomicUsize::new(0));
    let spawn_waiter = |wait: Duration| {
        let (p, k, granted) = (p.clone(), k.clone(), granted.clone());
        tokio::spawn(async move {
            let me = OwnerToken::new();
            let grant = p.acquire(lock_req(&k, me, LONG, wait)).await.unwrap();
            if grant.is_some() {
                granted.fetch_add(1, Ordering::SeqCst);
            }
            grant.map(|_| me)
        })
    };
    let first = spawn_waiter(Duration::from_secs(20));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = spawn_waiter(Duration::from_secs(2));
    tokio::time::sleep(Duration::from_millis(200)).await;
    p.release(&k, a).await.unwrap();
    let winner = first.await.unwrap().expect("the first waiter is woken");
    let loser = second.await.unwrap();
    assert!(
        loser.is_none(),
        "the second waiter must still be waiting: one release, one wake"
    );
    assert_eq!(granted.load(Ordering::SeqCst), 1);
    p.release(&k, winner).await.unwrap();
}

/// Fenced acquisitions mint strictly increasing tokens; unfenced ones mint none.
pub async fn lock_fencing_tokens_increase_only_when_fenced(c: Coordinator) {
    let p = c.lock_provider();
    let k = key(&c, "fence");
    let mut last: Option<FencingToken> = None;
    for _ in 0..5 {
        let me = OwnerToken::new();
        let grant = p
            .acquire(LockRequest {
                fenced: true,
                ..lock_req(&k, me, LONG, Duration::ZERO)
            })
            .await
            .unwrap()
            .unwrap();
        let token = grant.fencing_token.expect("a fenced grant carries a token");
        if let Some(last) = last {
            assert!(token > last, "tokens must increase: {last} then {token}");
        }
        last = Some(token);
        p.release(&k, me).await.unwrap();
    }
    let me = OwnerToken::new();
    let unfenced = p
        .acquire(lock_req(&k, me, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        unfenced.fencing_token, None,
        "no token is made up for unfenced locks"
    );
    p.release(&k, me).await.unwrap();
}

/// Renewal extends the owner's lease and reports `Lost` for anyone else.
pub async fn lock_renew_is_owner_scoped(c: Coordinator) {
    let p = c.lock_provider();
    let k = key(&c, "renew");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    p.acquire(lock_req(&k, a, Duration::from_millis(400), Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        p.renew(&k, b, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::TakenByOther)
    );
    assert_eq!(p.renew(&k, a, LONG).await.unwrap(), RenewOutcome::Renewed);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let refused = p
        .acquire(lock_req(&k, b, LONG, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(refused, None, "the renewed lease outlives the original one");
    p.release(&k, a).await.unwrap();
    assert_eq!(
        p.renew(&k, a, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::Expired),
        "after its release the key is free: nobody took it"
    );
}

/// Claim creates an in-flight marker or returns the record; the fingerprint is kept in every
/// state; only the owner completes.
pub async fn idempotency_claim_complete_replay(c: Coordinator) {
    let s = c.idempotency_store();
    let k = key(&c, "claim");
    let fp = Some(Fingerprint([9; 16]));
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    let req = |owner| ClaimRequest {
        key: &k,
        owner,
        in_flight_lease: LONG,
        fingerprint: fp,
        keep_abandoned_for: None,
    };
    assert_eq!(s.claim(req(a)).await.unwrap(), ClaimOutcome::Claimed);
    match s.claim(req(b)).await.unwrap() {
        ClaimOutcome::InFlight {
            fingerprint,
            remaining,
        } => {
            assert_eq!(fingerprint, fp, "the marker keeps the fingerprint");
            assert!(remaining > Duration::ZERO && remaining <= LONG);
        }
        other => panic!("expected in flight, got {other:?}"),
    }
    let payload: Arc<[u8]> = Arc::from(&b"{\"ok\":1}"[..]);
    assert!(
        !complete_stored(&**s, &k, b, payload.clone(), LONG)
            .await
            .unwrap()
    );
    assert!(
        complete_stored(&**s, &k, a, payload.clone(), LONG)
            .await
            .unwrap()
    );
    match s.claim(req(b)).await.unwrap() {
        ClaimOutcome::Completed {
            payload: stored,
            fingerprint,
            ..
        } => {
            assert_eq!(&*stored, &*payload);
            assert_eq!(fingerprint, fp, "completion keeps the fingerprint");
        }
        other => panic!("expected completed, got {other:?}"),
    }
    assert!(
        !s.abandon(&k, a).await.unwrap(),
        "a completed record is not abandoned"
    );
}

/// Abandon removes only the owner's marker; a lapsed marker can be claimed again and its old
/// owner can no longer complete.
pub async fn idempotency_abandon_and_lapse(c: Coordinator) {
    let s = c.idempotency_store();
    let k = key(&c, "abandon");
    let (a, b, d) = (OwnerToken::new(), OwnerToken::new(), OwnerToken::new());
    let req = |owner, lease| ClaimRequest {
        key: &k,
        owner,
        in_flight_lease: lease,
        fingerprint: None,
        keep_abandoned_for: None,
    };
    assert_eq!(s.claim(req(a, LONG)).await.unwrap(), ClaimOutcome::Claimed);
    assert!(!s.abandon(&k, b).await.unwrap());
    assert!(s.abandon(&k, a).await.unwrap());
    assert_eq!(
        s.claim(req(b, Duration::from_millis(200))).await.unwrap(),
        ClaimOutcome::Claimed
    );
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(s.claim(req(d, LONG)).await.unwrap(), ClaimOutcome::Claimed);
    let late: Arc<[u8]> = Arc::from(&b"1"[..]);
    assert!(
        !complete_stored(&**s, &k, b, late, LONG).await.unwrap(),
        "a lapsed owner cannot complete"
    );
    assert!(s.abandon(&k, d).await.unwrap());
}

/// With `keep_abandoned_for`, a marker that lapses without completion stays as an abandoned
/// record: claims report it (with its fingerprint), its late owner can still complete, and
/// `purge` clears it.
pub async fn idempotency_abandoned_marker_is_kept_on_request(c: Coordinator) {
    let s = c.idempotency_store();
    let k = key(&c, "kept");
    let fp = Some(Fingerprint([4; 16]));
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    let req = |owner, lease| ClaimRequest {
        key: &k,
        owner,
        in_flight_lease: lease,
        fingerprint: fp,
        keep_abandoned_for: Some(LONG),
    };
    assert_eq!(
        s.claim(req(a, Duration::from_millis(200))).await.unwrap(),
        ClaimOutcome::Claimed
    );
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(
        s.claim(req(b, LONG)).await.unwrap(),
        ClaimOutcome::Abandoned { fingerprint: fp },
        "the lapsed marker is reported, not claimed over"
    );
    assert!(
        !complete_stored(&**s, &k, b, Arc::from(&b"x"[..]), LONG)
            .await
            .unwrap()
    );
    assert!(
        complete_stored(&**s, &k, a, Arc::from(&b"late"[..]), LONG)
            .await
            .unwrap(),
        "the late owner resolves the unknown by completing"
    );
    assert!(matches!(
        s.claim(req(b, LONG)).await.unwrap(),
        ClaimOutcome::Completed { .. }
    ));
    assert!(s.purge(&k).await.unwrap());
    assert!(!s.purge(&k).await.unwrap(), "nothing left to purge");
    assert_eq!(s.claim(req(b, LONG)).await.unwrap(), ClaimOutcome::Claimed);
    assert!(s.abandon(&k, b).await.unwrap());
}

/// `wait_settled` returns at once without a marker, and is woken by completion.
pub async fn idempotency_wait_settled_wakes_on_completion(c: Coordinator) {
    let s = c.idempotency_store().clone();
    let k = key(&c, "settle");
    let started = Instant::now();
    s.wait_settled(&k, Duration::from_secs(10)).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "no marker: no wait"
    );

    let a = OwnerToken::new();
    s.claim(ClaimRequest {
        key: &k,
        owner: a,
        in_flight_lease: LONG,
        fingerprint: None,
        keep_abandoned_for: None,
    })
    .await
    .unwrap();
    let waiter = tokio::spawn({
        let (s, k) = (s.clone(), k.clone());
        async move {
            s.wait_settled(&k, Duration::from_secs(20)).await.unwrap();
            Instant::now()
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let completed_at = Instant::now();
    complete_stored(&*s, &k, a, Arc::from(&b"1"[..]), LONG)
        .await
        .unwrap();
    let woke = waiter.await.unwrap();
    let delay = woke.saturating_duration_since(completed_at);
    assert!(
        delay < Duration::from_secs(2),
        "woken by completion, took {delay:?}"
    );
}

// ---- Completion, resent commands and lost holds under the contract ----

/// A lease the cases below let lapse, and a sleep that is surely past it on the backend's
/// clock (generous: a loaded machine must not make a case flaky).
const SHORT: Duration = Duration::from_millis(200);
const PAST_SHORT: Duration = Duration::from_millis(700);

fn claim_req(
    key: &CallKey,
    owner: OwnerToken,
    in_flight_lease: Duration,
    fingerprint: Option<Fingerprint>,
    keep_abandoned_for: Option<Duration>,
) -> ClaimRequest<'_> {
    ClaimRequest {
        key,
        owner,
        in_flight_lease,
        fingerprint,
        keep_abandoned_for,
    }
}

fn complete_req<'a>(
    key: &'a CallKey,
    owner: OwnerToken,
    payload: &Arc<[u8]>,
    fingerprint: Option<Fingerprint>,
) -> CompleteRequest<'a> {
    CompleteRequest {
        key,
        owner,
        payload: payload.clone(),
        retention: LONG,
        fingerprint,
    }
}

/// Reads the record at `key` as a stranger would, expecting a completed one.
async fn completed_record(
    c: &Coordinator,
    key: &CallKey,
    why: &str,
) -> (Arc<[u8]>, Option<Fingerprint>) {
    let stranger = OwnerToken::new();
    match c
        .idempotency_store()
        .claim(claim_req(key, stranger, LONG, None, None))
        .await
        .unwrap()
    {
        ClaimOutcome::Completed {
            payload,
            fingerprint,
            ..
        } => (payload, fingerprint),
        other => panic!("{why}: expected a completed record, got {other:?}"),
    }
}

/// Asserts a `Superseded` answer naming `winner` (when the backend records the owner).
fn assert_superseded(outcome: CompleteOutcome, winner: OwnerToken, completed: bool, why: &str) {
    match outcome {
        CompleteOutcome::Superseded {
            other,
            completed: found,
        } => {
            assert!(
                other.is_none() || other == Some(winner),
                "{why}: superseded by {other:?}, but {winner} holds the key"
            );
            assert_eq!(found, completed, "{why}: whether the other owner completed");
        }
        other => panic!("{why}: expected Superseded, got {other:?}"),
    }
}

/// The owner's completion of its live marker is `Stored` and keeps the claim's fingerprint
/// (not the request's); resending it answers `Stored` again and changes nothing.
pub async fn idempotency_completion_by_the_owner_is_stored_and_resendable(c: Coordinator) {
    let s = c.idempotency_store();
    let k = key(&c, "complete-own");
    let claimed_fp = Some(Fingerprint([1; 16]));
    let request_fp = Some(Fingerprint([2; 16]));
    let a = OwnerToken::new();
    assert_eq!(
        s.claim(claim_req(&k, a, LONG, claimed_fp, None))
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    let payload: Arc<[u8]> = Arc::from(&b"receipt-1"[..]);
    assert_eq!(
        s.complete(complete_req(&k, a, &payload, request_fp))
            .await
            .unwrap(),
        CompleteOutcome::Stored
    );
    assert_eq!(
        s.complete(complete_req(&k, a, &payload, request_fp))
            .await
            .unwrap(),
        CompleteOutcome::Stored,
        "a resent completion by the same owner is Stored again"
    );
    let (stored, fingerprint) = completed_record(&c, &k, "after completion").await;
    assert_eq!(&*stored, &*payload);
    assert_eq!(
        fingerprint, claimed_fp,
        "completing a marker keeps the fingerprint given at claim time"
    );
}

/// A marker that lapsed (not kept) and that nobody claimed since: the late completion creates
/// the record with the request's fingerprint, so a duplicate replays it; a resend of that
/// completion answers `Stored`.
pub async fn idempotency_completion_after_the_marker_lapsed_is_stored_without_it(c: Coordinator) {
    let s = c.idempotency_store();
    let k = key(&c, "complete-lapsed");
    let fp = Some(Fingerprint([3; 16]));
    let a = OwnerToken::new();
    assert_eq!(
        s.claim(claim_req(&k, a, SHORT, fp, None)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    tokio::time::sleep(PAST_SHORT).await;
    let payload: Arc<[u8]> = Arc::from(&b"late but alone"[..]);
    assert_eq!(
        s.complete(complete_req(&k, a, &payload, fp)).await.unwrap(),
        CompleteOutcome::StoredWithoutMarker,
        "no record is left and nobody claimed: the outcome is stored all the same"
    );
    let (stored, fingerprint) = completed_record(&c, &k, "after a late completion").await;
    assert_eq!(&*stored, &*payload, "a duplicate replays the late outcome");
    assert_eq!(
        fingerprint, fp,
        "the created record carries the request's fingerprint"
    );
    assert_eq!(
        s.complete(complete_req(&k, a, &payload, fp)).await.unwrap(),
        CompleteOutcome::Stored,
        "resending the completion that created the record"
    );
}

/// Another caller claimed after our marker lapsed: our late completion changes nothing and
/// says so, before and after that caller completes.
pub async fn idempotency_late_completion_after_another_claim_is_superseded(c: Coordinator) {
    let s = c.idempotency_store();
    let k = key(&c, "complete-superseded");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    assert_eq!(
        s.claim(claim_req(&k, a, SHORT, None, None)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(
        s.claim(claim_req(&k, b, LONG, None, None)).await.unwrap(),
        ClaimOutcome::Claimed,
        "the lapsed marker frees the key"
    );
    let late: Arc<[u8]> = Arc::from(&b"from a"[..]);
    let outcome = s.complete(complete_req(&k, a, &late, None)).await.unwrap();
    assert_superseded(outcome, b, false, "late completion while b runs");
    assert!(
        matches!(
            s.claim(claim_req(&k, OwnerToken::new(), LONG, None, None))
                .await
                .unwrap(),
            ClaimOutcome::InFlight { .. }
        ),
        "the superseded completion must leave b's marker in place"
    );
    let winner: Arc<[u8]> = Arc::from(&b"from b"[..]);
    assert_eq!(
        s.complete(complete_req(&k, b, &winner, None))
            .await
            .unwrap(),
        CompleteOutcome::Stored
    );
    let outcome = s.complete(complete_req(&k, a, &late, None)).await.unwrap();
    assert_superseded(outcome, b, true, "late completion after b completed");
    let (stored, _) = completed_record(&c, &k, "after both completions").await;
    assert_eq!(&*stored, &*winner, "b's outcome stays");
}

/// A purged marker is a missing record: its owner's completion creates the record.
pub async fn idempotency_completion_after_purge_is_stored_without_marker(c: Coordinator) {
    let s = c.idempotency_store();
    let k = key(&c, "complete-purged");
    let fp = Some(Fingerprint([5; 16]));
    let a = OwnerToken::new();
    assert_eq!(
        s.claim(claim_req(&k, a, LONG, fp, None)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert!(s.purge(&k).await.unwrap(), "the marker was there");
    let payload: Arc<[u8]> = Arc::from(&b"after purge"[..]);
    assert_eq!(
        s.complete(complete_req(&k, a, &payload, fp)).await.unwrap(),
        CompleteOutcome::StoredWithoutMarker
    );
    let (stored, fingerprint) = completed_record(&c, &k, "after purge and completion").await;
    assert_eq!(&*stored, &*payload);
    assert_eq!(fingerprint, fp);
}

/// A claim resent by the owner of the live marker answers `Claimed`; everyone else still sees
/// the one marker in flight, which the owner can still abandon.
pub async fn idempotency_claim_resent_by_its_owner_is_claimed(c: Coordinator) {
    let s = c.idempotency_store();
    let k = key(&c, "claim-resend");
    let fp = Some(Fingerprint([6; 16]));
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    assert_eq!(
        s.claim(claim_req(&k, a, LONG, fp, None)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert_eq!(
        s.claim(claim_req(&k, a, LONG, fp, None)).await.unwrap(),
        ClaimOutcome::Claimed,
        "the owner's resent claim"
    );
    match s.claim(claim_req(&k, b, LONG, None, None)).await.unwrap() {
        ClaimOutcome::InFlight {
            fingerprint,
            remaining,
        } => {
            assert_eq!(fingerprint, fp);
            assert!(remaining > Duration::ZERO && remaining <= LONG);
        }
        other => panic!("another owner must still see the marker in flight, got {other:?}"),
    }
    assert!(s.abandon(&k, a).await.unwrap(), "still a's marker");
    assert_eq!(
        s.claim(claim_req(&k, b, LONG, None, None)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert!(s.abandon(&k, b).await.unwrap());
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
    let (first, report) = coord_core::observe(charge_once(&c, "aged-1", 7, runs.clone())).await;
    first.unwrap();
    assert_eq!(report.replay_age, None, "a call that ran replays nothing");
    tokio::time::sleep(PAUSE).await;
    let (again, report) = coord_core::observe(charge_once(&c, "aged-1", 7, runs.clone())).await;
    again.unwrap();
    assert!(report.replayed(), "the duplicate replays");
    let age = report
        .replay_age
        .expect("a replay reports the record's age");
    assert!(
        age + SLACK >= PAUSE && age < LONG,
        "the replay answers with an outcome stored {PAUSE:?} ago or a little more, got {age:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A lost lock says why: `Expired` when the key is free (lapsed, released, never held),
/// `TakenByOther` when another owner holds it now.
pub async fn lock_renew_reports_why_the_lock_was_lost(c: Coordinator) {
    let p = c.lock_provider();
    let k = key(&c, "renew-cause");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    assert_eq!(
        p.renew(&k, a, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::Expired),
        "a key never held"
    );
    p.acquire(lock_req(&k, a, SHORT, Duration::ZERO))
        .await
        .unwrap()
        .expect("free lock");
    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(
        p.renew(&k, a, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::Expired),
        "the lease lapsed and nobody took the key"
    );
    p.acquire(lock_req(&k, b, LONG, Duration::ZERO))
        .await
        .unwrap()
        .expect("the lapsed lock is free");
    assert_eq!(
        p.renew(&k, a, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::TakenByOther)
    );
    assert_eq!(p.renew(&k, b, LONG).await.unwrap(), RenewOutcome::Renewed);
    assert_eq!(p.release(&k, b).await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(
        p.renew(&k, b, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::Expired),
        "released"
    );
}

/// A lost in-flight marker says why: `TakenByOther` when another owner's marker is there,
/// `Expired` when ours lapsed, was completed, or there is nothing.
pub async fn idempotency_renew_marker_reports_why_the_marker_was_lost(c: Coordinator) {
    let s = c.idempotency_store();
    let k = key(&c, "renew-marker-cause");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    assert_eq!(
        s.renew_marker(&k, a, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::Expired),
        "nothing claimed"
    );
    s.claim(claim_req(&k, a, SHORT, None, None)).await.unwrap();
    assert_eq!(
        s.renew_marker(&k, a, LONG).await.unwrap(),
        RenewOutcome::Renewed
    );
    assert_eq!(
        s.renew_marker(&k, b, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::TakenByOther)
    );
    tokio::time::sleep(PAST_SHORT).await;
    assert!(
        matches!(
            s.claim(claim_req(&k, b, LONG, None, None)).await.unwrap(),
            ClaimOutcome::InFlight { .. }
        ),
        "the renewed marker outlives its first lease"
    );
    assert_eq!(
        s.renew_marker(&k, a, SHORT).await.unwrap(),
        RenewOutcome::Renewed
    );
    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(
        s.renew_marker(&k, a, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::Expired),
        "the marker lapsed and nobody claimed"
    );
    assert_eq!(
        s.claim(claim_req(&k, b, LONG, None, None)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert_eq!(
        s.renew_marker(&k, a, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::TakenByOther)
    );
    let payload: Arc<[u8]> = Arc::from(&b"done"[..]);
    assert_eq!(
        s.complete(complete_req(&k, b, &payload, None))
            .await
            .unwrap(),
        CompleteOutcome::Stored
    );
    assert_eq!(
        s.renew_marker(&k, b, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::Expired),
        "a completed marker is no longer in flight"
    );
}

// ---- Hostile durations: nothing panics, hangs or deadlocks ----

/// Durations no provider may choke on: zero, below any backend's resolution, past Redis's
/// `PX` limit, and the largest a `Duration` holds.
const EXTREMES: [Duration; 4] = [
    Duration::ZERO,
    Duration::from_micros(1),
    Duration::from_millis(u64::MAX),
    Duration::MAX,
];

/// A duration long enough that state made with it is still there when checked.
fn is_huge(d: Duration) -> bool {
    d >= LONG
}

/// Runs `fut` on its own task and fails the case if it has not finished within 10 s: a
/// provider that deadlocks a key must fail the suite, not hang it (and a deadlock may block
/// the thread it happens on, so the timer must run elsewhere).
async fn bounded<T: Send + 'static>(
    what: &str,
    fut: impl Future<Output = T> + Send + 'static,
) -> T {
    match tokio::time::timeout(Duration::from_secs(10), tokio::spawn(fut)).await {
        Ok(joined) => joined.unwrap_or_else(|e| panic!("{what}: the call panicked: {e}")),
        Err(_) => panic!("{what}: no answer within 10 s (a deadlocked key?)"),
    }
}

/// Polls `check` until it holds, for at most 3 s: for state made with a zero or 1 µs
/// duration, which a backend may round up to its resolution.
async fn within_3s<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(3);
    while !check().await {
        assert!(Instant::now() < deadline, "not within 3 s: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Leases and renewals of zero, 1 µs, `u64::MAX` ms and `Duration::MAX` are accepted: a tiny
/// lease frees the lock (at once, or within the backend's resolution), a huge one holds it.
pub async fn lock_extreme_leases_are_accepted(c: Coordinator) {
    let p = c.lock_provider().clone();
    for (i, d) in EXTREMES.into_iter().enumerate() {
        let k = key(&c, &format!("extreme-lease-{i}"));
        let a = OwnerToken::new();
        let grant = {
            let (p, k) = (p.clone(), k.clone());
            bounded("acquire with an extreme lease", async move {
                p.acquire(LockRequest {
                    fenced: true,
                    ..lock_req(&k, a, d, Duration::ZERO)
                })
                .await
            })
            .await
        };
        let grant = grant
            .unwrap_or_else(|e| panic!("lease {d:?}: {e}"))
            .unwrap_or_else(|| panic!("lease {d:?}: a free lock is granted"));
        assert!(grant.fencing_token.is_some());
        if is_huge(d) {
            let b = OwnerToken::new();
            assert_eq!(
                p.acquire(lock_req(&k, b, LONG, Duration::ZERO))
                    .await
                    .unwrap(),
                None,
                "lease {d:?} holds the lock"
            );
            assert_eq!(p.renew(&k, a, d).await.unwrap(), RenewOutcome::Renewed);
            assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::Released);
        } else {
            let b = OwnerToken::new();
            within_3s(&format!("a lease of {d:?} frees the lock"), || {
                let (p, k) = (p.clone(), k.clone());
                async move {
                    p.acquire(lock_req(&k, b, LONG, Duration::ZERO))
                        .await
                        .unwrap()
                        .is_some()
                }
            })
            .await;
            // Renewing with a tiny lease is accepted too, and the lock frees again.
            assert_eq!(p.renew(&k, b, d).await.unwrap(), RenewOutcome::Renewed);
            let e = OwnerToken::new();
            within_3s(&format!("a renewal of {d:?} frees the lock"), || {
                let (p, k) = (p.clone(), k.clone());
                async move {
                    p.acquire(lock_req(&k, e, LONG, Duration::ZERO))
                        .await
                        .unwrap()
                        .is_some()
                }
            })
            .await;
            assert_eq!(p.release(&k, e).await.unwrap(), ReleaseOutcome::Released);
        }
    }
}

/// Waits of zero and 1 µs on a held lock are refused promptly; waits of `u64::MAX` ms and
/// `Duration::MAX` wait (they do not return early) and are granted when the holder releases.
pub async fn lock_extreme_waits_wait_until_granted(c: Coordinator) {
    let p = c.lock_provider().clone();
    for (i, d) in EXTREMES.into_iter().enumerate() {
        let k = key(&c, &format!("extreme-wait-{i}"));
        let a = OwnerToken::new();
        p.acquire(lock_req(&k, a, LONG, Duration::ZERO))
            .await
            .unwrap()
            .expect("free lock");
        if !is_huge(d) {
            let b = OwnerToken::new();
            let refused = {
                let (p, k) = (p.clone(), k.clone());
                bounded("a tiny wait", async move {
                    p.acquire(lock_req(&k, b, LONG, d)).await
                })
                .await
            };
            assert_eq!(refused.unwrap(), None, "wait {d:?} on a held lock");
            p.release(&k, b).await.unwrap();
            p.release(&k, a).await.unwrap();
            continue;
        }
        let waiter = tokio::spawn({
            let (p, k) = (p.clone(), k.clone());
            async move {
                let b = OwnerToken::new();
                let grant = p.acquire(lock_req(&k, b, LONG, d)).await;
                (grant, b, Instant::now())
            }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        if waiter.is_finished() {
            let early = waiter.await;
            panic!("a wait of {d:?} returned before the lock was released: {early:?}");
        }
        let released_at = Instant::now();
        assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::Released);
        let (grant, b, granted_at) = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .unwrap_or_else(|_| panic!("a wait of {d:?} was not granted after the release"))
            .unwrap();
        let grant = grant.unwrap().expect("granted, not refused");
        assert!(grant.contended);
        assert!(
            granted_at.saturating_duration_since(released_at) < Duration::from_secs(5),
            "woken by the release"
        );
        assert_eq!(p.release(&k, b).await.unwrap(), ReleaseOutcome::Released);
    }
}

/// A `Duration::MAX` waiter cancelled mid-wait (and released by token, as the runtime does)
/// leaves the key working: the holder's release frees it for the next caller, exclusion still
/// holds, and no call on the key hangs.
pub async fn lock_cancelled_forever_waiter_leaves_the_key_working(c: Coordinator) {
    let p = c.lock_provider().clone();
    let k = key(&c, "cancelled-forever");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    p.acquire(lock_req(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .expect("free lock");
    let cancelled = {
        let (p, k) = (p.clone(), k.clone());
        bounded("a cancelled Duration::MAX wait", async move {
            let started = Instant::now();
            let waited = tokio::time::timeout(
                Duration::from_millis(400),
                p.acquire(lock_req(&k, b, LONG, Duration::MAX)),
            )
            .await;
            (waited, started.elapsed())
        })
        .await
    };
    assert!(
        cancelled.0.is_err(),
        "a Duration::MAX wait on a held lock returned: {:?}",
        cancelled.0
    );
    assert!(cancelled.1 >= Duration::from_millis(400));
    // The runtime's follow-up for a cancelled acquire.
    let released = {
        let (p, k) = (p.clone(), k.clone());
        bounded("release of the cancelled waiter", async move {
            p.release(&k, b).await
        })
        .await
    };
    assert_eq!(released.unwrap(), ReleaseOutcome::NotHeld);
    let released = {
        let (p, k) = (p.clone(), k.clone());
        bounded(
            "the holder's release",
            async move { p.release(&k, a).await },
        )
        .await
    };
    assert_eq!(released.unwrap(), ReleaseOutcome::Released);
    let d = OwnerToken::new();
    let next = {
        let (p, k) = (p.clone(), k.clone());
        bounded("the next caller", async move {
            p.acquire(lock_req(&k, d, LONG, Duration::from_secs(5)))
                .await
        })
        .await
    };
    assert!(
        next.unwrap().is_some(),
        "the key is free for the next caller"
    );
    let e = OwnerToken::new();
    let refused = {
        let (p, k) = (p.clone(), k.clone());
        bounded("a caller while the key is held", async move {
            p.acquire(lock_req(&k, e, LONG, Duration::from_millis(300)))
                .await
        })
        .await
    };
    assert_eq!(refused.unwrap(), None, "exclusion still holds");
    assert_eq!(p.release(&k, d).await.unwrap(), ReleaseOutcome::Released);
}

/// In-flight leases, keep periods and retentions of zero, 1 µs, `u64::MAX` ms and
/// `Duration::MAX` are accepted by every idempotency call: tiny ones expire (at once, or
/// within the backend's resolution), huge ones last.
pub async fn idempotency_extreme_durations_are_accepted(c: Coordinator) {
    let s = c.idempotency_store().clone();
    for (i, d) in EXTREMES.into_iter().enumerate() {
        let k = key(&c, &format!("extreme-record-{i}"));
        let (a, b) = (OwnerToken::new(), OwnerToken::new());
        let fp = Some(Fingerprint([i as u8; 16]));
        let claimed = {
            let (s, k) = (s.clone(), k.clone());
            bounded("claim with extreme durations", async move {
                s.claim(claim_req(&k, a, d, fp, Some(d))).await
            })
            .await
        };
        assert_eq!(
            claimed.unwrap_or_else(|e| panic!("lease {d:?}: {e}")),
            ClaimOutcome::Claimed
        );
        let renewed = s.renew_marker(&k, a, d).await.unwrap();
        if is_huge(d) {
            assert_eq!(renewed, RenewOutcome::Renewed, "lease {d:?}");
            match s.claim(claim_req(&k, b, LONG, None, None)).await.unwrap() {
                ClaimOutcome::InFlight { remaining, .. } => assert!(remaining > LONG),
                other => panic!("lease {d:?}: expected in flight, got {other:?}"),
            }
        } else {
            assert!(
                matches!(
                    renewed,
                    RenewOutcome::Renewed | RenewOutcome::Lost(LossCause::Expired)
                ),
                "lease {d:?}: renewed, or already lapsed; got {renewed:?}"
            );
        }
        let payload: Arc<[u8]> = Arc::from(&b"outcome"[..]);
        let stored = s
            .complete(CompleteRequest {
                retention: d,
                ..complete_req(&k, a, &payload, fp)
            })
            .await
            .unwrap();
        assert!(stored.is_stored(), "retention {d:?}: got {stored:?}");
        let settled = {
            let (s, k) = (s.clone(), k.clone());
            bounded("wait_settled with nothing in flight", async move {
                s.wait_settled(&k, d).await
            })
            .await
        };
        settled.unwrap();
        if is_huge(d) {
            let (replayed, _) = completed_record(&c, &k, "a huge retention").await;
            assert_eq!(&*replayed, &*payload);
            assert!(s.purge(&k).await.unwrap());
        } else {
            within_3s(&format!("a retention of {d:?} expires"), || {
                let (s, k) = (s.clone(), k.clone());
                async move {
                    s.claim(claim_req(&k, b, LONG, None, None)).await.unwrap()
                        == ClaimOutcome::Claimed
                }
            })
            .await;
            assert!(s.abandon(&k, b).await.unwrap());
        }
    }
}

/// `wait_settled` with a timeout of `u64::MAX` ms or `Duration::MAX` waits until the marker
/// settles (it does not return early), a cancelled one leaves the key working, and a
/// completion wakes the next one.
pub async fn idempotency_forever_wait_settled_waits_until_settled(c: Coordinator) {
    let s = c.idempotency_store().clone();
    for (i, d) in EXTREMES.into_iter().filter(|d| is_huge(*d)).enumerate() {
        let k = key(&c, &format!("forever-settle-{i}"));
        let a = OwnerToken::new();
        s.claim(claim_req(&k, a, LONG, None, None)).await.unwrap();
        let cancelled =
            tokio::time::timeout(Duration::from_millis(400), s.wait_settled(&k, d)).await;
        assert!(
            cancelled.is_err(),
            "wait_settled({d:?}) returned with the marker in flight"
        );
        let waiter = tokio::spawn({
            let (s, k) = (s.clone(), k.clone());
            async move {
                s.wait_settled(&k, d).await.unwrap();
                Instant::now()
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        if waiter.is_finished() {
            let early = waiter.await;
            panic!("wait_settled({d:?}) returned with the marker in flight: {early:?}");
        }
        let completed_at = Instant::now();
        let payload: Arc<[u8]> = Arc::from(&b"settled"[..]);
        assert_eq!(
            s.complete(complete_req(&k, a, &payload, None))
                .await
                .unwrap(),
            CompleteOutcome::Stored
        );
        let woke = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .unwrap_or_else(|_| panic!("wait_settled({d:?}) not woken by the completion"))
            .unwrap();
        assert!(woke.saturating_duration_since(completed_at) < Duration::from_secs(5));
    }
}

// ---- The same promises through the attributes ----

#[distributed_lock(key_from = "slot", lease = "30s", wait = "30s", fenced = true, coordinator = coord)]
async fn exclusive_section(
    coord: &Coordinator,
    slot: u32,
    inside: Arc<AtomicUsize>,
    overlaps: Arc<AtomicUsize>,
    tokens: Arc<std::sync::Mutex<Vec<u64>>>,
) -> Result<(), CoordError> {
    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
        overlaps.fetch_add(1, Ordering::SeqCst);
    }
    let token = fencing_token().expect("fenced lock exposes its token");
    tokens.lock().unwrap().push(token.get());
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_micros(200)).await;
    inside.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

/// 64 tasks hammering one lock never overlap, and see strictly increasing fencing tokens in
/// the order they held it.
pub async fn attribute_lock_excludes_and_fences(c: Coordinator) {
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (c, inside, overlaps, tokens) =
            (c.clone(), inside.clone(), overlaps.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                exclusive_section(&c, 7, inside.clone(), overlaps.clone(), tokens.clone())
                    .await
                    .expect("every task gets the lock within its wait");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two holders were inside at once"
    );
    let tokens = tokens.lock().unwrap();
    assert_eq!(tokens.len(), 256);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens must increase in holder order"
    );
}

#[idempotent(key_from = "request", fingerprint = ["amount"], wait = "20s", coordinator = coord)]
async fn charge_once(
    coord: &Coordinator,
    request: &str,
    amount: u64,
    runs: Arc<AtomicU64>,
) -> Result<String, CoordError> {
    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(format!("receipt-{amount}-run-{n}"))
}

/// Sequential and concurrent duplicates run the body once and all get the same result; a
/// reuse of the key with another amount is refused.
pub async fn attribute_idempotent_duplicates_run_once(c: Coordinator) {
    let runs = Arc::new(AtomicU64::new(0));
    let first = charge_once(&c, "req-1", 100, runs.clone()).await.unwrap();
    let again = charge_once(&c, "req-1", 100, runs.clone()).await.unwrap();
    assert_eq!(first, again, "a sequential duplicate replays");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let concurrent = futures_join_all((0..16).map(|_| {
        let (c, runs) = (c.clone(), runs.clone());
        async move { charge_once(&c, "req-2", 5, runs).await }
    }))
    .await;
    let results: Vec<String> = concurrent.into_iter().map(|r| r.unwrap()).collect();
    assert!(
        results.windows(2).all(|w| w[0] == w[1]),
        "all duplicates share one result"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "16 concurrent duplicates ran once"
    );

    let reused = charge_once(&c, "req-1", 999, runs.clone()).await;
    assert!(
        matches!(reused, Err(CoordError::KeyReused { .. })),
        "a different amount under the same key is refused, got {reused:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[idempotent(key_from = "request", coordinator = coord)]
async fn flaky(
    coord: &Coordinator,
    request: u32,
    fail: bool,
    runs: Arc<AtomicU64>,
) -> Result<u32, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    if fail {
        Err(CoordError::InFlight {
            key: CallKey::builder("conformance", "a-user-error-standing-in").finish(),
        })
    } else {
        Ok(request)
    }
}

/// An `Err` leaves no trace: the next call runs.
pub async fn attribute_idempotent_errors_are_not_remembered(c: Coordinator) {
    let runs = Arc::new(AtomicU64::new(0));
    assert!(flaky(&c, 1, true, runs.clone()).await.is_err());
    assert_eq!(flaky(&c, 1, false, runs.clone()).await.unwrap(), 1);
    assert_eq!(
        flaky(&c, 1, true, runs.clone()).await.unwrap(),
        1,
        "now replayed"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[distributed_lock(key_from = "slot", wait = "0s", coordinator = coord)]
async fn hold_until(
    coord: &Coordinator,
    slot: u32,
    entered: Arc<AtomicBool>,
    release: Arc<tokio::sync::Notify>,
) -> Result<(), CoordError> {
    entered.store(true, Ordering::SeqCst);
    release.notified().await;
    Ok(())
}

/// A caller that cannot acquire within `wait` gets `LockNotAcquired` and its body never runs;
/// a cancelled holder's lock is released promptly.
pub async fn attribute_lock_refusal_and_cancellation(c: Coordinator) {
    let entered = Arc::new(AtomicBool::new(false));
    let gate = Arc::new(tokio::sync::Notify::new());
    let holder = tokio::spawn({
        let (c, entered, gate) = (c.clone(), entered.clone(), gate.clone());
        async move { hold_until(&c, 1, entered, gate).await }
    });
    while !entered.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let second_entered = Arc::new(AtomicBool::new(false));
    let refused = hold_until(&c, 1, second_entered.clone(), gate.clone()).await;
    assert!(
        matches!(refused, Err(CoordError::LockNotAcquired { .. })),
        "got {refused:?}"
    );
    assert!(
        !second_entered.load(Ordering::SeqCst),
        "the refused body must not run"
    );

    holder.abort();
    let _ = holder.await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let probe = OwnerToken::new();
        let k = key_of(&c, concat!(module_path!(), "::hold_until"), 1);
        let got = c
            .lock_provider()
            .acquire(lock_req(&k, probe, LONG, Duration::ZERO))
            .await
            .unwrap();
        if got.is_some() {
            c.lock_provider().release(&k, probe).await.unwrap();
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cancelled holder's lock was not released promptly (lease is 30 s)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn key_of(c: &Coordinator, op: &str, part: u32) -> CallKey {
    c.key(op).part(&part).finish()
}

async fn futures_join_all<F: Future + Send + 'static>(
    futs: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("task panicked"));
    }
    out
}

// --- operations API --------------------------------------------------------------------------

/// Inspects the lock at `key`, failing the case on an error.
async fn lock_info(c: &Coordinator, key: &CallKey) -> LockInfo {
    c.operations()
        .inspect_lock(key)
        .await
        .unwrap_or_else(|e| panic!("inspecting the lock at {key}: {e}"))
}

/// Inspects the record at `key`, failing the case on an error.
async fn record_info(c: &Coordinator, key: &CallKey) -> Option<RecordInfo> {
    c.operations()
        .inspect_record(key)
        .await
        .unwrap_or_else(|e| panic!("inspecting the record at {key}: {e}"))
}

/// `d` is in `(lo, hi]`: a remaining time read a moment after it was set to `hi`.
fn assert_between(what: &str, d: Duration, lo: Duration, hi: Duration) {
    assert!(
        d > lo && d <= hi,
        "{what}: {d:?} is not in ({lo:?}, {hi:?}]"
    );
}

/// Inspecting a lock shows who holds it, the lease left, its waiters and the fencing token of a
/// fenced holder; a free, released or lapsed lock has no holder, and an unfenced lock on a
/// fresh key has no token.
pub async fn operations_inspect_lock_shows_holder_lease_waiters_and_token(c: Coordinator) {
    let p = c.lock_provider().clone();
    let k = key(&c, "ops-inspect");
    assert_eq!(
        lock_info(&c, &k).await.holder,
        None,
        "a lock never taken is free"
    );
    let a = OwnerToken::new();
    let grant = p
        .acquire(LockRequest {
            fenced: true,
            ..lock_req(&k, a, LONG, Duration::ZERO)
        })
        .await
        .unwrap()
        .expect("a free lock is granted");
    let info = lock_info(&c, &k).await;
    assert_eq!(info.key, k, "the info names the key it was asked for");
    let holder = info.holder.expect("the lock is held");
    assert_eq!(holder.owner, a, "the holder is the owner that acquired");
    assert_between(
        "lease left",
        holder.lease_left,
        LONG - Duration::from_secs(10),
        LONG,
    );
    assert_eq!(
        info.fencing_token, grant.fencing_token,
        "a fenced holder's token is shown"
    );
    let waiter = tokio::spawn({
        let (p, k) = (p.clone(), k.clone());
        async move {
            let b = OwnerToken::new();
            let grant = p
                .acquire(lock_req(&k, b, LONG, Duration::from_secs(20)))
                .await
                .unwrap();
            grant.map(|_| b)
        }
    });
    let (cr, kr) = (&c, &k);
    within_3s("a waiter shows in the holder's info", || async move {
        let holder = lock_info(cr, kr).await.holder.expect("still held");
        assert_eq!(holder.owner, a, "waiting does not change the holder");
        matches!(
            holder.waiters,
            Waiters::Counted(1..) | Waiters::Flagged(true)
        )
    })
    .await;
    p.release(&k, a).await.unwrap();
    let b = waiter
        .await
        .unwrap()
        .expect("the waiter gets the released lock");
    within_3s("the waiter shows as the new holder", || async move {
        lock_info(cr, kr).await.holder.map(|h| h.owner) == Some(b)
    })
    .await;
    p.release(&k, b).await.unwrap();
    assert_eq!(
        lock_info(&c, &k).await.holder,
        None,
        "a released lock is free"
    );

    let lapsing = key(&c, "ops-inspect-lapse");
    p.acquire(lock_req(&lapsing, a, SHORT, Duration::ZERO))
        .await
        .unwrap()
        .expect("granted");
    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(
        lock_info(&c, &lapsing).await.holder,
        None,
        "a lock whose lease ran out is free"
    );
    let unfenced = key(&c, "ops-inspect-unfenced");
    p.acquire(lock_req(&unfenced, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .expect("granted");
    let info = lock_info(&c, &unfenced).await;
    assert_eq!(info.holder.map(|h| h.owner), Some(a));
    assert_eq!(
        info.fencing_token, None,
        "no token is made up for an unfenced lock on a fresh key"
    );
    p.release(&unfenced, a).await.unwrap();
}

/// Forcing a lock free frees it whoever holds it and wakes a waiter; the former holder can no
/// longer release or renew it, and the next fenced token is still greater than its.
pub async fn operations_force_release_frees_any_holder_and_wakes_a_waiter(c: Coordinator) {
    let p = c.lock_provider().clone();
    let ops = c.operations().clone();
    let k = key(&c, "ops-force");
    assert_eq!(
        ops.force_release(&k).await.unwrap(),
        ForcedRelease::NotHeld,
        "a free lock is not held"
    );
    let a = OwnerToken::new();
    let first = p
        .acquire(LockRequest {
            fenced: true,
            ..lock_req(&k, a, LONG, Duration::ZERO)
        })
        .await
        .unwrap()
        .expect("granted");
    let waiter = tokio::spawn({
        let (p, k) = (p.clone(), k.clone());
        async move {
            let b = OwnerToken::new();
            let grant = p
                .acquire(LockRequest {
                    fenced: true,
                    ..lock_req(&k, b, LONG, Duration::from_secs(20))
                })
                .await
                .unwrap();
            (grant, Instant::now(), b)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let forced_at = Instant::now();
    assert_eq!(
        ops.force_release(&k).await.unwrap(),
        ForcedRelease::Released { owner: a },
        "the answer names the former holder"
    );
    let (grant, granted_at, b) = waiter.await.unwrap();
    let grant = grant.expect("the waiter gets the forced lock");
    assert!(
        granted_at.saturating_duration_since(forced_at) < Duration::from_secs(3),
        "the waiter is woken promptly"
    );
    assert!(
        grant.fencing_token > first.fencing_token,
        "the fencing counter is left alone: {:?} then {:?}",
        first.fencing_token,
        grant.fencing_token
    );
    assert_eq!(
        p.release(&k, a).await.unwrap(),
        ReleaseOutcome::NotHeld,
        "the former holder no longer holds it"
    );
    assert_eq!(
        p.renew(&k, a, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::TakenByOther),
        "the former holder learns of the loss at its next renewal"
    );
    assert_eq!(
        ops.force_release(&k).await.unwrap(),
        ForcedRelease::Released { owner: b }
    );
    assert_eq!(lock_info(&c, &k).await.holder, None);
    assert_eq!(
        p.renew(&k, b, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::Expired)
    );
}

/// Inspecting a record shows its state (in flight, abandoned, completed), owner, age, lease
/// and retention left, payload size and whether a fingerprint is stored; no record, or a
/// lapsed one, is `None`.
pub async fn operations_inspect_record_in_each_state(c: Coordinator) {
    let s = c.idempotency_store();
    let k = key(&c, "ops-record");
    assert_eq!(record_info(&c, &k).await, None, "no record yet");
    let a = OwnerToken::new();
    let fp = Some(Fingerprint([9; 16]));
    s.claim(claim_req(&k, a, LONG, fp, None)).await.unwrap();
    let info = record_info(&c, &k).await.expect("a marker in flight");
    assert_eq!(info.key, k);
    assert_eq!(info.status, RecordStatus::InFlight);
    assert_eq!(info.owner, Some(a));
    let lease_left = info.lease_left.expect("a marker in flight has a lease");
    assert_between(
        "lease left",
        lease_left,
        LONG - Duration::from_secs(10),
        LONG,
    );
    assert_between(
        "expires in",
        info.expires_in,
        LONG - Duration::from_secs(10),
        LONG,
    );
    assert_eq!(info.payload_bytes, None, "a marker has no payload");
    assert!(info.has_fingerprint);
    let age = info.age.expect("a record coord just wrote knows its age");
    assert!(
        age < Duration::from_secs(10),
        "age of a fresh marker: {age:?}"
    );

    let payload: Arc<[u8]> = Arc::from(&b"12345"[..]);
    assert!(
        s.complete(complete_req(&k, a, &payload, None))
            .await
            .unwrap()
            .is_stored()
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let info = record_info(&c, &k).await.expect("a completed record");
    assert_eq!(info.status, RecordStatus::Completed);
    assert_eq!(info.owner, Some(a), "the owner whose completion stored it");
    assert_eq!(info.payload_bytes, Some(5));
    assert_eq!(info.lease_left, None, "a completed record has no lease");
    assert!(info.has_fingerprint, "the claim's fingerprint is kept");
    assert_between(
        "retention left",
        info.expires_in,
        LONG - Duration::from_secs(10),
        LONG,
    );
    let age = info.age.expect("age");
    assert!(
        age >= Duration::from_millis(300) && age < Duration::from_secs(10),
        "the age counts from the completion: {age:?}"
    );

    let kept = key(&c, "ops-record-kept");
    s.claim(claim_req(&kept, a, SHORT, None, Some(LONG)))
        .await
        .unwrap();
    tokio::time::sleep(PAST_SHORT).await;
    let info = record_info(&c, &kept).await.expect("a kept marker");
    assert_eq!(info.status, RecordStatus::Abandoned);
    assert_eq!(info.owner, Some(a));
    assert_eq!(info.lease_left, None, "an abandoned marker's lease is over");
    assert!(!info.has_fingerprint);
    assert_between(
        "keep left",
        info.expires_in,
        LONG - Duration::from_secs(10),
        LONG,
    );

    let lapsing = key(&c, "ops-record-lapse");
    s.claim(claim_req(&lapsing, a, SHORT, None, None))
        .await
        .unwrap();
    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(
        record_info(&c, &lapsing).await,
        None,
        "a marker past its lease and not kept is no record"
    );
}

/// Pages through a listing with `list`, checking each page's bound, and returns every key seen.
async fn list_all<F, Fut>(what: &str, limit: usize, mut list: F) -> Vec<CallKey>
where
    F: FnMut(Option<Cursor>) -> Fut,
    Fut: Future<Output = Result<Page<CallKey>, BackendError>>,
{
    let mut cursor = None;
    let mut seen = Vec::new();
    for _ in 0..10_000 {
        let page = list(cursor.take())
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            page.items.len() <= limit,
            "{what}: a page of {} keys, more than the limit {limit}",
            page.items.len()
        );
        seen.extend(page.items);
        match page.next {
            Some(next) => cursor = Some(next),
            None => return seen,
        }
    }
    panic!("{what}: the listing never ended");
}

/// Listing the locks or records of one operation pages through exactly that operation's live
/// keys in this namespace (not a free lock, a lapsed record, another operation whose name
/// starts the same, nor another namespace), each at most once per page bound, and every listed
/// key pasted back in its shown form is the same key.
pub async fn operations_list_pages_through_the_keys_of_one_operation(c: Coordinator) {
    let p = c.lock_provider();
    let s = c.idempotency_store();
    let ops = c.operations().clone();
    let a = OwnerToken::new();
    let of_op: Vec<CallKey> = (0..7)
        .map(|i| c.key("jobs").part(&i).finish())
        .chain([
            c.key("jobs").finish(),
            c.key("jobs").part("with space").part(&1).finish(),
        ])
        .collect();
    let others = [
        c.key("jobs::nightly").part(&1).finish(),
        c.key("jobsx").part(&1).finish(),
        CallKey::builder(&format!("{}-other", c.namespace()), "jobs")
            .part(&1)
            .finish(),
    ];
    for k in of_op.iter().chain(&others) {
        p.acquire(lock_req(k, a, LONG, Duration::ZERO))
            .await
            .unwrap()
            .expect("granted");
        s.claim(claim_req(k, a, LONG, None, None)).await.unwrap();
    }
    let released = c.key("jobs").part("released").finish();
    p.acquire(lock_req(&released, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .expect("granted");
    p.release(&released, a).await.unwrap();
    let lapsed = c.key("jobs").part("lapsed").finish();
    s.claim(claim_req(&lapsed, a, SHORT, None, None))
        .await
        .unwrap();
    tokio::time::sleep(PAST_SHORT).await;

    let op = c.key("jobs").finish();
    let mut expected: Vec<&CallKey> = of_op.iter().collect();
    expected.sort();
    for (what, locks) in [("listing locks", true), ("listing records", false)] {
        let seen = list_all(what, 3, |cursor| {
            let (ops, op) = (ops.clone(), op.clone());
            async move {
                let req = ListRequest {
                    operation: &op,
                    cursor: cursor.as_ref(),
                    limit: 3,
                };
                if locks {
                    ops.list_locks(req).await
                } else {
                    ops.list_records(req).await
                }
            }
        })
        .await;
        let mut unique: Vec<&CallKey> = seen.iter().collect();
        unique.sort();
        unique.dedup();
        assert_eq!(unique, expected, "{what}: exactly the live keys of `jobs`");
        for listed in &seen {
            let pasted = c
                .operator()
                .key(&listed.to_string())
                .unwrap_or_else(|e| panic!("{what}: `{listed}` cannot be pasted back: {e}"));
            assert_eq!(&pasted, listed, "{what}: `{listed}` pasted back");
        }
    }
    let one = ops
        .list_locks(ListRequest {
            operation: &op,
            cursor: None,
            limit: 0,
        })
        .await
        .unwrap();
    assert!(one.items.len() <= 1, "a limit of 0 is taken as 1");
    let err = ops
        .list_locks(ListRequest {
            operation: &op,
            cursor: Some(&Cursor::new("not-a-cursor-of-this-provider")),
            limit: 3,
        })
        .await
        .expect_err("a cursor the provider did not make is refused");
    assert_eq!(
        err.kind(),
        coord_core::provider::BackendErrorKind::Config,
        "{err}"
    );
}

/// Through the coordinator's operator handle, keys pasted in their shown form are inspected,
/// forced free and purged, and what they point at changes accordingly.
pub async fn operations_operator_acts_on_pasted_keys(c: Coordinator) {
    let p = c.lock_provider();
    let s = c.idempotency_store();
    let k = c.key("payments.charge").part("order 7").finish();
    let a = OwnerToken::new();
    p.acquire(lock_req(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .expect("granted");
    s.claim(claim_req(&k, a, LONG, None, Some(LONG)))
        .await
        .unwrap();
    let operator = c.operator();
    let pasted = operator
        .key(&k.to_string())
        .expect("a printed key is accepted");
    assert_eq!(pasted, k);
    assert!(
        operator.key("op:{x}").is_err(),
        "what coord never prints is refused"
    );
    let lock = operator.lock(&pasted).await.unwrap();
    assert_eq!(lock.holder.map(|h| h.owner), Some(a));
    let record = operator.record(&pasted).await.unwrap().expect("a record");
    assert_eq!(record.status, RecordStatus::InFlight);
    assert_eq!(
        operator.release_lock(&pasted, "conformance").await.unwrap(),
        ForcedRelease::Released { owner: a }
    );
    assert_eq!(operator.lock(&pasted).await.unwrap().holder, None);
    assert!(operator.purge_record(&pasted, "conformance").await.unwrap());
    assert_eq!(operator.record(&pasted).await.unwrap(), None);
    assert!(
        !operator.purge_record(&pasted, "conformance").await.unwrap(),
        "nothing left to purge"
    );
    let listed = operator.locks("payments.charge", None, 10).await.unwrap();
    assert!(
        listed.items.is_empty() && listed.next.is_none(),
        "{listed:?}"
    );
}

/// A flight claim (cluster-scope single-flight): one leader at a time, resendable by it, and
/// renewed and given up only by it.
pub async fn flight_claim_is_exclusive_and_owner_scoped(c: Coordinator) {
    use coord_core::provider::FlightClaim;
    let store = c.flight_store();
    let k = key(&c, "flight-claim");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    assert_eq!(
        store.flight_claim(&k, a, LONG).await.unwrap(),
        FlightClaim::Claimed,
        "a free key is claimed"
    );
    match store.flight_claim(&k, b, LONG).await.unwrap() {
        FlightClaim::Joined { leader, lease_left } => {
            assert_eq!(leader, a, "a second claimant learns who leads");
            assert!(
                lease_left > Duration::from_secs(20) && lease_left <= LONG,
                "the leader's lease left: {lease_left:?}"
            );
        }
        other => panic!("a held flight was claimed twice: {other:?}"),
    }
    assert_eq!(
        store.flight_claim(&k, a, LONG).await.unwrap(),
        FlightClaim::Claimed,
        "a claim resent by the leader answers Claimed again"
    );
    assert!(
        !store.flight_renew(&k, b, LONG).await.unwrap(),
        "renew is owner-scoped"
    );
    assert!(
        store.flight_renew(&k, a, LONG).await.unwrap(),
        "the leader renews"
    );
    assert!(
        !store.flight_abandon(&k, b).await.unwrap(),
        "abandon is owner-scoped"
    );
    assert!(
        store.flight_abandon(&k, a).await.unwrap(),
        "the leader gives it up"
    );
    assert!(
        !store.flight_renew(&k, a, LONG).await.unwrap(),
        "given up: nothing to renew"
    );
    assert_eq!(
        store.flight_claim(&k, b, LONG).await.unwrap(),
        FlightClaim::Claimed,
        "an abandoned flight is free"
    );
}

/// A finished flight wakes its waiters with the outcome (also one that starts waiting after
/// the finish), only the leader's finish is taken, a resent finish answers true again, and the
/// outcome is kept for the hand-over time only: the claim is gone at once.
pub async fn flight_finish_hands_over_and_is_fenced(c: Coordinator) {
    use coord_core::provider::{FlightClaim, FlightWait};
    let store = c.flight_store().clone();
    let k = key(&c, "flight-finish");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    assert_eq!(
        store.flight_claim(&k, a, LONG).await.unwrap(),
        FlightClaim::Claimed
    );
    let waiter = {
        let (store, k) = (store.clone(), k.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let got = store.flight_wait(&k, a, LONG).await.unwrap();
            (got, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !store.flight_finish(&k, b, b"theirs", LONG).await.unwrap(),
        "only the leader hands over"
    );
    assert!(store.flight_finish(&k, a, b"outcome", LONG).await.unwrap());
    let (got, waited) = waiter.await.unwrap();
    assert_eq!(got, FlightWait::Finished(b"outcome".to_vec()));
    assert!(
        waited < Duration::from_secs(5),
        "woken by the finish: {waited:?}"
    );
    assert_eq!(
        store.flight_wait(&k, a, LONG).await.unwrap(),
        FlightWait::Finished(b"outcome".to_vec()),
        "a follower arriving after the finish still reads the hand-over"
    );
    assert!(
        store.flight_finish(&k, a, b"outcome", LONG).await.unwrap(),
        "a resent finish answers true"
    );
    assert_eq!(
        store.flight_claim(&k, b, LONG).await.unwrap(),
        FlightClaim::Claimed,
        "the claim is gone with the finish: a new call leads a new flight"
    );
    assert_eq!(
        store
            .flight_wait(&k, b, Duration::from_millis(100))
            .await
            .unwrap(),
        FlightWait::Expired,
        "the new flight's waiters do not see the old outcome"
    );

    // The hand-over lasts its time only.
    let k2 = key(&c, "flight-hand-over");
    assert_eq!(
        store.flight_claim(&k2, a, LONG).await.unwrap(),
        FlightClaim::Claimed
    );
    assert!(
        store
            .flight_finish(&k2, a, b"brief", Duration::from_millis(200))
            .await
            .unwrap()
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        store.flight_wait(&k2, a, LONG).await.unwrap(),
        FlightWait::Vacant,
        "nothing is remembered after the hand-over time"
    );
}

/// An abandoned flight wakes its waiters at once (as vacant); a lapsed one is vacant at its
/// lease's end, and its leader's late finish is refused; a waiter of a live leader times out.
pub async fn flight_abandon_and_lapse_make_the_flight_vacant(c: Coordinator) {
    use coord_core::provider::{FlightClaim, FlightWait};
    let store = c.flight_store().clone();
    let k = key(&c, "flight-abandon");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    assert_eq!(
        store.flight_claim(&k, a, LONG).await.unwrap(),
        FlightClaim::Claimed
    );
    assert_eq!(
        store
            .flight_wait(&k, a, Duration::from_millis(200))
            .await
            .unwrap(),
        FlightWait::Expired,
        "a live leader's waiter times out"
    );
    assert_eq!(
        store.flight_wait(&k, b, LONG).await.unwrap(),
        FlightWait::Vacant,
        "waiting on a generation that does not lead is vacant at once"
    );
    let waiter = {
        let (store, k) = (store.clone(), k.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            (
                store.flight_wait(&k, a, LONG).await.unwrap(),
                started.elapsed(),
            )
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(store.flight_abandon(&k, a).await.unwrap());
    let (got, waited) = waiter.await.unwrap();
    assert_eq!(got, FlightWait::Vacant);
    assert!(
        waited < Duration::from_secs(5),
        "woken by the abandon: {waited:?}"
    );

    let k2 = key(&c, "flight-lapse");
    let short = Duration::from_millis(400);
    assert_eq!(
        store.flight_claim(&k2, a, short).await.unwrap(),
        FlightClaim::Claimed
    );
    let started = Instant::now();
    assert_eq!(
        store.flight_wait(&k2, a, LONG).await.unwrap(),
        FlightWait::Vacant
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(5),
        "a lapsed leader is noticed at its lease's end: {waited:?}"
    );
    assert!(
        !store.flight_finish(&k2, a, b"late", LONG).await.unwrap(),
        "a finish after the lease lapsed is refused"
    );
    assert_eq!(
        store.flight_claim(&k2, b, LONG).await.unwrap(),
        FlightClaim::Claimed
    );
}

#[coord_core::single_flight(key_from = "part", scope = "cluster", lease = "5s", coordinator = c)]
async fn cluster_refresh(
    c: &Coordinator,
    part: u32,
    runs: Arc<AtomicUsize>,
) -> Result<u32, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(part * 2)
}

/// `#[single_flight(scope = "cluster")]` over the provider: concurrent calls share one run,
/// a later call runs again, and a flight whose leader went silent is taken over after its
/// lease.
pub async fn attribute_cluster_single_flight_runs_once_and_takes_over(c: Coordinator) {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut calls = Vec::new();
    for _ in 0..16 {
        let (c, runs) = (c.clone(), runs.clone());
        calls.push(tokio::spawn(
            async move { cluster_refresh(&c, 21, runs).await },
        ));
    }
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap(), 42);
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "concurrent calls share one run"
    );
    assert_eq!(cluster_refresh(&c, 21, runs.clone()).await.unwrap(), 42);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "nothing is remembered after the flight"
    );

    // A leader elsewhere that claimed and went silent.
    let k = c
        .key(concat!(module_path!(), "::cluster_refresh"))
        .part(&7u32)
        .finish();
    let silent = OwnerToken::new();
    c.flight_store()
        .flight_claim(&k, silent, Duration::from_millis(500))
        .await
        .unwrap();
    let started = Instant::now();
    assert_eq!(cluster_refresh(&c, 7, runs.clone()).await.unwrap(), 14);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(350) && waited < Duration::from_secs(10),
        "taken over after the silent leader's lease: {waited:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}
