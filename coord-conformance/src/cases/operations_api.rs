//! The operations API ([`Operations`](coord_core::provider::Operations)): inspection shows what coord
//! would see, listings page through exactly one operation's live keys, every listed key pastes
//! back, and a forced release frees any holder, wakes a waiter and leaves the fencing counter
//! alone.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_core::provider::{
    BackendErrorKind, Cursor, Fingerprint, ForcedRelease, ListRequest, LockInfo, LockRequest,
    OwnerToken, Page, RecordInfo, RecordStatus, ReleaseOutcome, RenewOutcome, Waiters,
};
use coord_core::{BackendError, CallKey, Coordinator, LossCause};

use super::deadlines::within_3s;
use super::durations::{LONG, PAST_SHORT, SHORT};
use super::requests::{claim_req, complete_req, key, lock_req};

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
/// longer release or renew it (and is told it was forced free, by a provider that remembers),
/// and the next fenced token is still greater than its.
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
    // A provider should remember the forced release (coord's do) and say so; one that does
    // not answers as for any lock that is no longer the owner's.
    let released = p.release(&k, a).await.unwrap();
    assert!(
        matches!(
            released,
            ReleaseOutcome::ForceReleased | ReleaseOutcome::NotHeld
        ),
        "the former holder no longer holds it: {released:?}"
    );
    let renewed = p.renew(&k, a, LONG).await.unwrap();
    assert!(
        matches!(
            renewed,
            RenewOutcome::Lost(LossCause::ForceReleased | LossCause::TakenByOther)
        ),
        "the former holder learns of the loss at its next renewal: {renewed:?}"
    );
    assert_eq!(
        lock_info(&c, &k).await.holder.map(|h| h.owner),
        Some(b),
        "and none of that touches the new holder"
    );
    assert_eq!(
        ops.force_release(&k).await.unwrap(),
        ForcedRelease::Released { owner: b }
    );
    assert_eq!(lock_info(&c, &k).await.holder, None);
    let renewed = p.renew(&k, b, LONG).await.unwrap();
    assert!(
        matches!(
            renewed,
            RenewOutcome::Lost(LossCause::ForceReleased | LossCause::Expired)
        ),
        "{renewed:?}"
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
    assert_eq!(err.kind(), BackendErrorKind::Config, "{err}");
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

/// Inspecting a semaphore and a read-write lock shows every live hold with its owner, lease
/// left and fencing token (the grant's), soonest-ending first, and a waiting writer's claim;
/// what ended or was released is left out. A provider that has not opted in to these reads
/// (they answer a `Config` error) or lacks the capability skips that half of the case: these
/// reads came after the rest of the operations API, so the case is not named `operations_`
/// (the cases a provider without an operations API must fail).
pub async fn inspection_of_semaphores_and_rw_locks_shows_live_holds(c: Coordinator) {
    use coord_core::provider::{Capability, PermitRequest, RwLockRequest, RwMode};
    let ops = c.operations();
    let k = key(&c, "ops-inspect-shared");
    let opted_out = |err: &BackendError| err.kind() == BackendErrorKind::Config;
    if c.supports(Capability::Semaphores) {
        match ops.inspect_semaphore(&k).await {
            Err(err) if opted_out(&err) => {}
            Err(err) => panic!("inspecting a free semaphore at {k}: {err}"),
            Ok(free) => {
                assert!(
                    free.permits.is_empty(),
                    "a semaphore never taken holds nothing"
                );
                let store = c.semaphore_store();
                let (a, b) = (OwnerToken::new(), OwnerToken::new());
                let mut tokens = Vec::new();
                for (owner, lease) in [(a, SHORT), (b, LONG)] {
                    let grant = store
                        .acquire_permit(PermitRequest {
                            key: &k,
                            owner,
                            limit: 2,
                            lease,
                            wait: Duration::ZERO,
                        })
                        .await
                        .unwrap()
                        .expect("a free permit");
                    tokens.push(Some(grant.fencing_token));
                }
                let info = ops.inspect_semaphore(&k).await.unwrap();
                assert_eq!(info.key, k, "the info names the key it was asked for");
                let shown: Vec<_> = info
                    .permits
                    .iter()
                    .map(|p| (p.owner, p.fencing_token))
                    .collect();
                assert_eq!(
                    shown,
                    [(a, tokens[0]), (b, tokens[1])],
                    "every permit with its grant's token, soonest-ending first"
                );
                assert_between(
                    "a permit's lease left",
                    info.permits[1].lease_left,
                    LONG - Duration::from_secs(10),
                    LONG,
                );
                tokio::time::sleep(PAST_SHORT).await;
                let info = ops.inspect_semaphore(&k).await.unwrap();
                let shown: Vec<_> = info.permits.iter().map(|p| p.owner).collect();
                assert_eq!(shown, [b], "a lapsed permit is not shown");
                store.release_permit(&k, b).await.unwrap();
                let info = ops.inspect_semaphore(&k).await.unwrap();
                assert!(info.permits.is_empty(), "a released permit is not shown");
            }
        }
    }
    if c.supports(Capability::ReadWriteLocks) {
        match ops.inspect_rw_lock(&k).await {
            Err(err) if opted_out(&err) => {}
            Err(err) => panic!("inspecting a free read-write lock at {k}: {err}"),
            Ok(free) => {
                assert!(free.is_free(), "a read-write lock never taken is free");
                assert_eq!(free.waiting_writer, None);
                let store = c.rw_lock_store().clone();
                let reader = OwnerToken::new();
                let req = |owner, mode, wait| RwLockRequest {
                    key: &k,
                    owner,
                    mode,
                    lease: LONG,
                    wait,
                    claim: Duration::from_secs(2),
                };
                let read = store
                    .acquire_rw(req(reader, RwMode::Read, Duration::ZERO))
                    .await
                    .unwrap()
                    .expect("a free key admits a reader");
                let writer = OwnerToken::new();
                let waiting = tokio::spawn({
                    let (store, k) = (store.clone(), k.clone());
                    async move {
                        store
                            .acquire_rw(RwLockRequest {
                                key: &k,
                                owner: writer,
                                mode: RwMode::Write,
                                lease: LONG,
                                wait: Duration::from_secs(20),
                                claim: Duration::from_secs(2),
                            })
                            .await
                    }
                });
                let (opsr, kr) = (&ops, &k);
                within_3s("the waiting writer's claim shows", || async move {
                    opsr.inspect_rw_lock(kr)
                        .await
                        .unwrap()
                        .waiting_writer
                        .is_some_and(|claim| claim.owner == writer)
                })
                .await;
                let info = ops.inspect_rw_lock(&k).await.unwrap();
                let readers: Vec<_> = info
                    .readers
                    .iter()
                    .map(|r| (r.owner, r.fencing_token))
                    .collect();
                assert_eq!(readers, [(reader, Some(read.fencing_token))]);
                assert_eq!(info.writer, None, "no writer beside a reader");
                store.release_rw(&k, reader, RwMode::Read).await.unwrap();
                let granted = waiting
                    .await
                    .unwrap()
                    .unwrap()
                    .expect("the writer gets the freed key");
                let info = ops.inspect_rw_lock(&k).await.unwrap();
                assert!(info.readers.is_empty(), "a released reader is not shown");
                let held = info.writer.expect("the writer is shown");
                assert_eq!(
                    (held.owner, held.fencing_token),
                    (writer, Some(granted.fencing_token))
                );
                assert_eq!(
                    info.waiting_writer, None,
                    "a granted writer's claim is gone"
                );
                store.release_rw(&k, writer, RwMode::Write).await.unwrap();
                assert!(ops.inspect_rw_lock(&k).await.unwrap().is_free());
            }
        }
    }
}
