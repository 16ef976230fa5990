//! Semaphores ([`SemaphoreStore`](coord_core::provider::SemaphoreStore), an optional
//! capability): the limit is exact under races, a crashed holder's permit comes back at the end
//! of its lease and not later, every permit has its own increasing fencing token, release and
//! renewal are owner-scoped, a late release frees nobody else's permit, renewal stops at
//! release, a full semaphore refuses a single attempt, each release wakes a waiter without
//! polling, and a wake-up that never comes costs a bounded re-check.
//!
//! On a provider without the capability every case checks the other promise instead: a
//! semaphore is refused with `CoordError::Unsupported` before anything runs (never run
//! unguarded), and a builder that requires the capability refuses to build.
//!
//! Each acquisition takes exactly one permit (there is no multi-permit acquire), so "a waiter
//! for several permits woken for one" cannot happen; the nearest promise, that two releases
//! wake two waiters, is `semaphore_each_release_wakes_a_waiter`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::provider::{
    Capability, LossCause, OwnerToken, PermitRequest, ReleaseOutcome, RenewOutcome,
};
use coord_core::{CallKey, CoordError, Coordinator, distributed_lock, fencing_token};

use super::durations::{LONG, PAST_RENEWED_LEASE, PAST_SHORT, RENEWAL_EVERY, RENEWED_LEASE, SHORT};
use super::requests::key;

/// A permit request of one attempt (`wait` zero) or a wait.
fn permit_req(
    key: &CallKey,
    owner: OwnerToken,
    limit: u32,
    lease: Duration,
    wait: Duration,
) -> PermitRequest<'_> {
    PermitRequest {
        key,
        owner,
        limit,
        lease,
        wait,
    }
}

/// On a provider without semaphores: a semaphore is refused with the typed error, its body
/// never runs, and requiring the capability at build time fails. Returns true when the
/// provider has semaphores (the case goes on).
async fn supported_or_refused(c: &Coordinator) -> bool {
    if c.supports(Capability::Semaphores) {
        return true;
    }
    let k = key(c, "unsupported");
    let ran = AtomicBool::new(false);
    let answer: Result<(), CoordError> = c
        .semaphore(k.clone(), 3)
        .run(|| async {
            ran.store(true, Ordering::SeqCst);
            Ok(())
        })
        .await;
    assert!(
        matches!(
            answer,
            Err(CoordError::Unsupported {
                capability: Capability::Semaphores,
                ..
            })
        ),
        "a provider without semaphores must refuse one with `CoordError::Unsupported`, got {answer:?}"
    );
    assert!(!ran.load(Ordering::SeqCst), "the body ran without a permit");
    let refused = c.semaphore(k, 3).try_acquire().await;
    assert!(
        matches!(refused, Err(CoordError::Unsupported { .. })),
        "`try_acquire` must refuse too, got {refused:?}"
    );
    false
}

#[distributed_lock(key_from = "slot", permits = 3, lease = "30s", wait = "30s", coordinator = coord)]
async fn limited_section(
    coord: &Coordinator,
    slot: u32,
    inside: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    tokens: Arc<std::sync::Mutex<Vec<u64>>>,
) -> Result<(), CoordError> {
    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
    most.fetch_max(now, Ordering::SeqCst);
    let token = fencing_token().expect("every permit carries a fencing token");
    tokens.lock().unwrap().push(token.get());
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    inside.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

/// 32 tasks racing for a 3-permit semaphore, through the attribute and the handle: a witness
/// counter of the holders inside never exceeds 3 (and reaches it), every permit's token is
/// distinct, and nothing is left held afterwards.
pub async fn semaphore_limit_is_exact_under_races(c: Coordinator) {
    if !supported_or_refused(&c).await {
        return;
    }
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for task in 0..32 {
        let (c, inside, most, tokens) = (c.clone(), inside.clone(), most.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                if task % 2 == 0 {
                    limited_section(&c, 9, inside.clone(), most.clone(), tokens.clone())
                        .await
                        .expect("every task gets a permit within its wait");
                    continue;
                }
                // The handle form, on the key the attribute builds.
                let k = c
                    .key(concat!(module_path!(), "::limited_section"))
                    .part(&9u32)
                    .finish();
                let permit = c
                    .semaphore(k, 3)
                    .wait(LONG)
                    .acquire()
                    .await
                    .expect("every task gets a permit within its wait");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let token = permit.fencing_token().expect("a held permit has its token");
                tokens.lock().unwrap().push(token.get());
                tokio::time::sleep(Duration::from_millis(1)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                assert!(permit.release().await.unwrap(), "the permit was still ours");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= 3,
        "{most} holders of a 3-permit semaphore were inside at once"
    );
    assert_eq!(
        most, 3,
        "32 racing tasks never filled the 3 permits: the limit is too strict"
    );
    let mut tokens = tokens.lock().unwrap().clone();
    let all = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(
        tokens.len(),
        all,
        "two permits carried the same fencing token"
    );
    let k = c
        .key(concat!(module_path!(), "::limited_section"))
        .part(&9u32)
        .finish();
    let p = c.semaphore_store();
    let owners: Vec<_> = (0..3).map(|_| OwnerToken::new()).collect();
    for owner in &owners {
        assert!(
            p.acquire_permit(permit_req(&k, *owner, 3, LONG, Duration::ZERO))
                .await
                .unwrap()
                .is_some(),
            "a permit was left held after every task released"
        );
    }
    for owner in owners {
        p.release_permit(&k, owner).await.unwrap();
    }
}

/// A holder that never releases (it crashed) keeps its permit until its lease ends by the
/// store's clock, and not later: a single attempt is refused before, a waiter gets it soon
/// after, well before any backstop cap, and the crashed holder's late renewal and release
/// change nothing.
pub async fn semaphore_crashed_holder_permit_returns_after_its_lease(c: Coordinator) {
    if !supported_or_refused(&c).await {
        return;
    }
    let p = c.semaphore_store();
    let k = key(&c, "sem-crash");
    let (crashed, b) = (OwnerToken::new(), OwnerToken::new());
    let started = Instant::now();
    p.acquire_permit(permit_req(&k, crashed, 1, SHORT, Duration::ZERO))
        .await
        .unwrap()
        .expect("a free semaphore grants a permit");
    assert_eq!(
        p.acquire_permit(permit_req(&k, b, 1, LONG, Duration::ZERO))
            .await
            .unwrap(),
        None,
        "a full semaphore refuses a single attempt"
    );
    let grant = p
        .acquire_permit(permit_req(&k, b, 1, LONG, Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("the crashed holder's permit comes back at the end of its lease");
    let took = started.elapsed();
    assert!(
        took >= SHORT / 2,
        "the permit came back after {took:?}, before its {SHORT:?} lease could have ended"
    );
    assert!(
        took < SHORT + Duration::from_secs(2),
        "the permit came back only after {took:?}: later than its {SHORT:?} lease plus a margin"
    );
    assert!(grant.contended, "the grant came after waiting");
    assert_eq!(
        p.renew_permit(&k, crashed, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::Expired),
        "the crashed holder's late renewal revives nothing"
    );
    assert_eq!(
        p.release_permit(&k, crashed).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
    assert_eq!(
        p.release_permit(&k, b).await.unwrap(),
        ReleaseOutcome::Released,
        "the crashed holder's late calls left the new holder's permit alone"
    );
}

/// Every grant carries a fencing token greater than every token minted before it for the key,
/// whoever holds the other permits, including after a permit lapsed and was taken again; a
/// resent acquire by a holder answers its own permit (the same token), not a second one.
pub async fn semaphore_fencing_tokens_increase(c: Coordinator) {
    if !supported_or_refused(&c).await {
        return;
    }
    let p = c.semaphore_store();
    let k = key(&c, "sem-fence");
    let owners: Vec<_> = (0..5).map(|_| OwnerToken::new()).collect();
    let take = |owner, lease| p.acquire_permit(permit_req(&k, owner, 2, lease, Duration::ZERO));
    // Long leases while the order of grants is checked: a short one could lapse on a slow
    // host before the full semaphore is asked again, and free a permit the case says is held.
    let t0 = take(owners[0], LONG).await.unwrap().unwrap().fencing_token;
    let t1 = take(owners[1], LONG).await.unwrap().unwrap().fencing_token;
    assert!(t1 > t0, "tokens must increase: {t0} then {t1}");
    let again = take(owners[0], LONG).await.unwrap().unwrap().fencing_token;
    assert_eq!(
        again, t0,
        "a resent acquire answers the holder's own permit"
    );
    assert_eq!(
        take(owners[2], LONG).await.unwrap(),
        None,
        "the resend took no second permit"
    );
    p.release_permit(&k, owners[0]).await.unwrap();
    let t2 = take(owners[2], LONG).await.unwrap().unwrap().fencing_token;
    assert!(t2 > t1, "tokens must increase: {t1} then {t2}");
    // Then a permit that lapses: its slot taken again mints a greater token still.
    p.release_permit(&k, owners[1]).await.unwrap();
    let t3 = take(owners[3], SHORT).await.unwrap().unwrap().fencing_token;
    assert!(t3 > t2, "tokens must increase: {t2} then {t3}");
    tokio::time::sleep(PAST_SHORT).await;
    let t4 = take(owners[4], LONG).await.unwrap().unwrap().fencing_token;
    assert!(
        t4 > t3,
        "tokens must increase after a lapse: {t3} then {t4}"
    );
    for owner in owners {
        p.release_permit(&k, owner).await.unwrap();
    }
}

/// Only a permit's owner releases or renews it: a stranger's release answers `NotHeld` and
/// frees nothing, its renewal answers `Lost(Expired)`; the owner's release frees the permit
/// once (a resend answers `NotHeld`).
pub async fn semaphore_release_and_renew_are_owner_scoped(c: Coordinator) {
    if !supported_or_refused(&c).await {
        return;
    }
    let p = c.semaphore_store();
    let k = key(&c, "sem-owner");
    let (holder, stranger, third) = (OwnerToken::new(), OwnerToken::new(), OwnerToken::new());
    p.acquire_permit(permit_req(&k, holder, 1, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        p.release_permit(&k, stranger).await.unwrap(),
        ReleaseOutcome::NotHeld,
        "a release by a non-owner is refused"
    );
    assert_eq!(
        p.renew_permit(&k, stranger, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::Expired),
        "a renewal by a non-owner is refused"
    );
    assert_eq!(
        p.acquire_permit(permit_req(&k, third, 1, LONG, Duration::ZERO))
            .await
            .unwrap(),
        None,
        "the non-owner's release freed the holder's permit"
    );
    assert_eq!(
        p.renew_permit(&k, holder, LONG).await.unwrap(),
        RenewOutcome::Renewed
    );
    assert_eq!(
        p.release_permit(&k, holder).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        p.release_permit(&k, holder).await.unwrap(),
        ReleaseOutcome::NotHeld,
        "a resent release changes nothing"
    );
}

/// `try_acquire` on a full semaphore is `Ok(None)` at once (and `acquire` without a wait is
/// `LockNotAcquired`); once a permit is released, `try_acquire` gets it.
pub async fn semaphore_try_acquire_when_full(c: Coordinator) {
    if !supported_or_refused(&c).await {
        return;
    }
    let k = key(&c, "sem-full");
    let first = c
        .semaphore(k.clone(), 2)
        .lease(LONG)
        .acquire()
        .await
        .unwrap();
    let second = c.semaphore(k.clone(), 2).try_acquire().await.unwrap();
    assert!(second.is_some(), "the second of two permits is free");
    let started = Instant::now();
    let third = c.semaphore(k.clone(), 2).try_acquire().await.unwrap();
    assert!(third.is_none(), "a full semaphore refuses `try_acquire`");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "`try_acquire` on a full semaphore waited"
    );
    let refused = c.semaphore(k.clone(), 2).acquire().await;
    assert!(
        matches!(refused, Err(CoordError::LockNotAcquired { .. })),
        "`acquire` without a wait on a full semaphore is `LockNotAcquired`, got {refused:?}"
    );
    assert!(first.release().await.unwrap());
    let again = c.semaphore(k.clone(), 2).try_acquire().await.unwrap();
    assert!(
        again.is_some(),
        "a released permit is free for `try_acquire`"
    );
    drop((second, again));
}

/// Two permits released one after the other wake two waiters, each well before any backstop:
/// each waiter asks for one permit and is woken when one is free.
pub async fn semaphore_each_release_wakes_a_waiter(c: Coordinator) {
    if !supported_or_refused(&c).await {
        return;
    }
    let p = c.semaphore_store().clone();
    let k = key(&c, "sem-wake");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    for owner in [a, b] {
        p.acquire_permit(permit_req(&k, owner, 2, LONG, Duration::ZERO))
            .await
            .unwrap()
            .unwrap();
    }
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let (p, k) = (p.clone(), k.clone());
            tokio::spawn(async move {
                let owner = OwnerToken::new();
                let grant = p
                    .acquire_permit(permit_req(&k, owner, 2, LONG, LONG))
                    .await
                    .unwrap();
                (owner, grant, Instant::now())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    assert_eq!(
        p.release_permit(&k, a).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        p.release_permit(&k, b).await.unwrap(),
        ReleaseOutcome::Released
    );
    for waiter in waiters {
        let (owner, grant, at) = waiter.await.unwrap();
        assert!(grant.is_some(), "each released permit goes to a waiter");
        let took = at.saturating_duration_since(released_at);
        assert!(
            took < Duration::from_millis(900),
            "a waiter was granted {took:?} after the releases: not woken by them"
        );
        p.release_permit(&k, owner).await.unwrap();
    }
}

/// Regression (a peer's bug): a permit released after its lease ended must not free another
/// holder's place. `a`'s permit lapses, `b` takes the only permit, then `a`'s late release
/// answers `NotHeld` and the semaphore stays full.
pub async fn permit_released_after_it_expired_does_not_free_another(c: Coordinator) {
    if !supported_or_refused(&c).await {
        return;
    }
    let p = c.semaphore_store();
    let k = key(&c, "sem-late-release");
    let (a, b, d) = (OwnerToken::new(), OwnerToken::new(), OwnerToken::new());
    p.acquire_permit(permit_req(&k, a, 1, SHORT, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(PAST_SHORT).await;
    p.acquire_permit(permit_req(&k, b, 1, LONG, Duration::ZERO))
        .await
        .unwrap()
        .expect("a lapsed permit frees its place");
    assert_eq!(
        p.release_permit(&k, a).await.unwrap(),
        ReleaseOutcome::NotHeld,
        "the late release of an expired permit is not a release"
    );
    assert_eq!(
        p.acquire_permit(permit_req(&k, d, 1, LONG, Duration::ZERO))
            .await
            .unwrap(),
        None,
        "the late release of an expired permit freed another holder's place"
    );
    assert_eq!(
        p.release_permit(&k, b).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// Regression (a peer's bug): a wake-up that never comes (the holder died without releasing,
/// so no release is announced) costs a waiter a bounded re-check at the end of the holder's
/// lease, never its whole wait.
pub async fn missed_release_notification_is_recovered_by_recheck(c: Coordinator) {
    if !supported_or_refused(&c).await {
        return;
    }
    let p = c.semaphore_store();
    let k = key(&c, "sem-recheck");
    let (silent, waiter) = (OwnerToken::new(), OwnerToken::new());
    p.acquire_permit(permit_req(
        &k,
        silent,
        1,
        Duration::from_millis(500),
        Duration::ZERO,
    ))
    .await
    .unwrap()
    .unwrap();
    let started = Instant::now();
    let grant = p
        .acquire_permit(permit_req(&k, waiter, 1, LONG, LONG))
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        grant.is_some(),
        "the waiter must get the permit within its wait"
    );
    assert!(
        took < Duration::from_millis(500) + Duration::from_secs(2),
        "with no release announced, the waiter took {took:?}: its re-check is not bounded by the holder's lease"
    );
    p.release_permit(&k, waiter).await.unwrap();
}

/// Regression (a peer's bug): renewal must not outlive release. A renewing permit is renewed
/// while held (it outlives its lease), and the moment `release` returns no renewal is
/// registered; the permit is free for the next caller at once and stays free.
pub async fn renewal_does_not_outlive_release(c: Coordinator) {
    if !supported_or_refused(&c).await {
        return;
    }
    let k = key(&c, "sem-renew");
    let before = c.active_renewals();
    let permit = c
        .semaphore(k.clone(), 1)
        .lease(RENEWED_LEASE)
        .renew(RENEWAL_EVERY)
        .acquire()
        .await
        .unwrap();
    assert_eq!(
        c.active_renewals(),
        before + 1,
        "the permit is being renewed"
    );
    tokio::time::sleep(PAST_RENEWED_LEASE).await;
    assert!(permit.is_held(), "renewal kept the permit past its lease");
    let token = permit.fencing_token().expect("a held permit has its token");
    assert!(
        permit.release().await.unwrap(),
        "the renewed permit was still ours"
    );
    assert_eq!(
        c.active_renewals(),
        before,
        "a renewal outlived the release"
    );
    let next = c
        .semaphore(k.clone(), 1)
        .lease(LONG)
        .try_acquire()
        .await
        .unwrap()
        .expect("the released permit is free at once");
    assert!(next.fencing_token().unwrap() > token);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(next.is_held());
    assert!(next.release().await.unwrap());
}
