//! The provider's own tests: its answers are the engine's, its listings and cursors.

use super::locks::ReadyWith;
use super::operations::{read_cursor, write_cursor};
use super::*;
use coord_contract::{
    BackendError, BackendErrorKind, ClaimOutcome, ClaimRequest, CompleteOutcome, CompleteRequest,
    Cursor, Fingerprint, ForcedRelease, IdempotencyStore, ListRequest, LockProvider, LockRequest,
    LossCause, Operations, RecordStatus, RenewOutcome, Waiters,
};

const LEASE: Duration = Duration::from_secs(30);
const DAY: Duration = Duration::from_secs(86_400);

#[test]
fn constant_answers_box_without_allocating() {
    let answer = ReadyWith(|| Ok::<_, BackendError>(ReleaseOutcome::Released));
    assert_eq!(
        size_of_val(&answer),
        0,
        "a zero-sized future boxes for free"
    );
}

#[test]
fn cursors_round_trip_and_foreign_ones_are_refused() {
    for after in ["op:1", "op:a b", "op:naïve"] {
        assert_eq!(
            read_cursor(&write_cursor(after)).as_deref(),
            Some(after),
            "{after:?}"
        );
    }
    for foreign in ["", "m.", "m.0", "m.zz", "x.6f70", "m.ff"] {
        let expected = (foreign == "m.").then(String::new);
        assert_eq!(read_cursor(&Cursor::new(foreign)), expected, "{foreign:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn inspecting_a_semaphore_shows_live_permits_and_counted_waiters() {
    use coord_contract::{PermitRequest, SemaphoreStore};
    let provider = Arc::new(MemoryProvider::new());
    let key = CallKey::builder("mp", "sem").part(&1).finish();
    let empty = provider.inspect_semaphore(&key).await.unwrap();
    assert!(empty.permits.is_empty());
    assert_eq!(empty.waiters, Waiters::Counted(0));
    let req = |owner, lease, wait| PermitRequest {
        key: &key,
        owner,
        limit: 2,
        lease,
        wait,
    };
    let (short, long) = (OwnerToken::new(), OwnerToken::new());
    let first = provider
        .acquire_permit(req(short, Duration::from_secs(5), Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let second = provider
        .acquire_permit(req(long, LEASE, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let taken = Instant::now();
    let waiter = tokio::spawn({
        let (provider, key) = (provider.clone(), key.clone());
        async move {
            provider
                .acquire_permit(PermitRequest {
                    key: &key,
                    owner: OwnerToken::new(),
                    limit: 2,
                    lease: LEASE,
                    wait: Duration::from_secs(1),
                })
                .await
        }
    });
    tokio::task::yield_now().await;
    let info = provider.inspect_semaphore(&key).await.unwrap();
    assert_eq!(info.key, key);
    assert_eq!(info.waiters, Waiters::Counted(1));
    let shown: Vec<_> = info
        .permits
        .iter()
        .map(|p| (p.owner, p.lease_left, p.fencing_token))
        .collect();
    assert_eq!(
        shown,
        [
            (short, Duration::from_secs(5), Some(first.fencing_token)),
            (long, LEASE, Some(second.fencing_token)),
        ],
        "soonest-ending first, with each permit's token"
    );
    // The waiter gives up; the short permit's lease ends: neither is shown any more.
    assert!(waiter.await.unwrap().unwrap().is_none());
    tokio::time::sleep_until(taken + Duration::from_secs(6)).await;
    let info = provider.inspect_semaphore(&key).await.unwrap();
    assert_eq!(info.waiters, Waiters::Counted(0));
    assert_eq!(info.permits.len(), 1);
    assert_eq!(info.permits[0].owner, long);
    assert_eq!(info.permits[0].lease_left, LEASE - taken.elapsed());
}

#[tokio::test(start_paused = true)]
async fn inspecting_a_rw_lock_shows_readers_writer_and_claim() {
    use coord_contract::{RwLockRequest, RwLockStore, RwMode};
    let provider = Arc::new(MemoryProvider::new());
    let key = CallKey::builder("mp", "rw").part(&1).finish();
    let free = provider.inspect_rw_lock(&key).await.unwrap();
    assert!(free.is_free());
    assert_eq!(free.waiting_writer, None);
    let reader = OwnerToken::new();
    let read = provider
        .acquire_rw(RwLockRequest {
            key: &key,
            owner: reader,
            mode: RwMode::Read,
            lease: LEASE,
            wait: Duration::ZERO,
            claim: Duration::from_secs(2),
        })
        .await
        .unwrap()
        .unwrap();
    let writer = OwnerToken::new();
    let waiting = tokio::spawn({
        let (provider, key) = (provider.clone(), key.clone());
        async move {
            provider
                .acquire_rw(RwLockRequest {
                    key: &key,
                    owner: writer,
                    mode: RwMode::Write,
                    lease: LEASE,
                    wait: Duration::from_secs(60),
                    claim: Duration::from_secs(2),
                })
                .await
        }
    });
    tokio::task::yield_now().await;
    let info = provider.inspect_rw_lock(&key).await.unwrap();
    assert_eq!(info.readers.len(), 1);
    assert_eq!(info.readers[0].owner, reader);
    assert_eq!(info.readers[0].fencing_token, Some(read.fencing_token));
    assert_eq!(info.writer, None);
    let claim = info.waiting_writer.expect("the waiting writer's claim");
    assert_eq!(claim.owner, writer);
    assert!(claim.claim_left <= Duration::from_secs(2));
    assert_eq!(info.waiters, Waiters::Counted(1));
    provider
        .release_rw(&key, reader, RwMode::Read)
        .await
        .unwrap();
    let granted = waiting.await.unwrap().unwrap().expect("the writer gets in");
    let info = provider.inspect_rw_lock(&key).await.unwrap();
    assert!(info.readers.is_empty());
    let held = info.writer.expect("the writer");
    assert_eq!(held.owner, writer);
    assert_eq!(held.fencing_token, Some(granted.fencing_token));
    assert_eq!(info.waiting_writer, None);
    assert_eq!(info.waiters, Waiters::Counted(0));
    tokio::time::advance(LEASE).await;
    assert!(provider.inspect_rw_lock(&key).await.unwrap().is_free());
}

#[tokio::test]
async fn listing_pages_through_one_operation_only() {
    let provider = MemoryProvider::new();
    let owner = OwnerToken::new();
    let keys: Vec<CallKey> = (0..5)
        .map(|i| CallKey::builder("mp", "jobs").part(&i).finish())
        .chain([
            CallKey::builder("mp", "jobs").finish(),
            CallKey::builder("mp", "jobs::nightly").part(&1).finish(),
            CallKey::builder("mp", "jobsx").part(&1).finish(),
            CallKey::builder("other", "jobs").part(&1).finish(),
        ])
        .collect();
    for key in &keys {
        let req = LockRequest {
            key,
            owner,
            lease: Duration::from_secs(30),
            wait: Duration::ZERO,
            fenced: false,
        };
        provider.acquire(req).await.unwrap().unwrap();
    }
    let op = CallKey::builder("mp", "jobs").finish();
    let mut cursor = None;
    let mut seen = Vec::new();
    loop {
        let req = ListRequest {
            operation: &op,
            cursor: cursor.as_ref(),
            limit: 2,
        };
        let page = provider.list_locks(req).await.unwrap();
        assert!(page.items.len() <= 2);
        seen.extend(page.items);
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let shown: Vec<String> = seen.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        ["jobs", "jobs:0", "jobs:1", "jobs:2", "jobs:3", "jobs:4"]
    );
    assert_eq!(seen[1], keys[0], "a listed key is the key that was locked");
    let bad = ListRequest {
        operation: &op,
        cursor: Some(&Cursor::new("not a cursor")),
        limit: 2,
    };
    let err = provider.list_locks(bad).await.unwrap_err();
    assert_eq!(err.kind(), BackendErrorKind::Config);
}

#[tokio::test]
async fn the_hot_path_answers_are_the_contract_answers() {
    let provider = MemoryProvider::new();
    let key = CallKey::builder("mp", "op").finish();
    let owner = OwnerToken::new();
    let req = LockRequest {
        key: &key,
        owner,
        lease: Duration::from_secs(30),
        wait: Duration::ZERO,
        fenced: false,
    };
    let grant = provider.acquire(req.clone()).await.unwrap().unwrap();
    assert_eq!(grant.fencing_token, None);
    assert!(!grant.contended);
    let other = LockRequest {
        owner: OwnerToken::new(),
        ..req
    };
    assert_eq!(provider.acquire(other).await.unwrap(), None);
    let released = provider.release(&key, owner).await.unwrap();
    assert_eq!(released, ReleaseOutcome::Released);
    let again = provider.release(&key, owner).await.unwrap();
    assert_eq!(again, ReleaseOutcome::NotHeld);
}

#[tokio::test(start_paused = true)]
async fn lock_answers_are_the_engines_own() {
    let provider = MemoryProvider::new();
    let key = CallKey::builder("mp", "op").finish();
    let (first, second) = (OwnerToken::new(), OwnerToken::new());
    let began = Instant::now();
    let fenced = LockRequest {
        key: &key,
        owner: first,
        lease: LEASE,
        wait: Duration::ZERO,
        fenced: true,
    };
    let grant = provider.acquire(fenced).await.unwrap().expect("free");
    assert!(grant.fencing_token.is_some());
    assert!(!grant.contended);
    assert_eq!(grant.lease_began, Some(began), "a fenced grant says when");
    assert_eq!(
        provider.renew(&key, second, LEASE).await.unwrap(),
        RenewOutcome::Lost(LossCause::TakenByOther)
    );
    let info = provider.inspect_lock(&key).await.unwrap();
    let holder = info.holder.expect("held");
    assert_eq!(holder.owner, first);
    assert_eq!(holder.waiters, Waiters::Counted(0));
    assert_eq!(info.fencing_token, grant.fencing_token);
    assert_eq!(
        provider.force_release(&key).await.unwrap(),
        ForcedRelease::Released { owner: first }
    );
    assert_eq!(
        provider.renew(&key, first, LEASE).await.unwrap(),
        RenewOutcome::Lost(LossCause::ForceReleased),
        "the former holder is told its hold was forced free"
    );
    assert_eq!(
        provider.release(&key, first).await.unwrap(),
        ReleaseOutcome::ForceReleased
    );
    assert_eq!(
        provider.renew(&key, second, LEASE).await.unwrap(),
        RenewOutcome::Lost(LossCause::Expired),
        "another owner is not"
    );
    assert_eq!(
        provider.force_release(&key).await.unwrap(),
        ForcedRelease::NotHeld
    );
}

#[tokio::test(start_paused = true)]
async fn record_answers_are_the_engines_own() {
    let provider = MemoryProvider::new();
    let key = CallKey::builder("mp", "op").finish();
    let (first, second) = (OwnerToken::new(), OwnerToken::new());
    let print = Some(Fingerprint([9; 16]));
    let claim = |owner| ClaimRequest {
        key: &key,
        owner,
        in_flight_lease: LEASE,
        fingerprint: print,
        keep_abandoned_for: None,
        transactional: false,
    };
    let complete = |owner| CompleteRequest {
        key: &key,
        owner,
        payload: Arc::from(&b"ok"[..]),
        retention: DAY,
        fingerprint: None,
    };
    assert_eq!(
        provider.claim(claim(first)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert_eq!(
        provider.renew_marker(&key, second, LEASE).await.unwrap(),
        RenewOutcome::Lost(LossCause::TakenByOther)
    );
    assert_eq!(
        provider.complete(complete(second)).await.unwrap(),
        CompleteOutcome::Superseded {
            other: Some(first),
            completed: false
        }
    );
    assert_eq!(
        provider.complete(complete(first)).await.unwrap(),
        CompleteOutcome::Stored
    );
    tokio::time::advance(Duration::from_secs(3)).await;
    assert_eq!(
        provider.claim(claim(second)).await.unwrap(),
        ClaimOutcome::Completed {
            payload: Arc::from(&b"ok"[..]),
            fingerprint: print,
            age: Some(Duration::from_secs(3)),
        },
        "the in-process store always knows a record's age"
    );
    let record = provider.inspect_record(&key).await.unwrap().expect("kept");
    assert_eq!(record.status, RecordStatus::Completed);
    assert_eq!(record.owner, Some(first));
    assert_eq!(record.age, Some(Duration::from_secs(3)));
    assert_eq!(record.payload_bytes, Some(2));
    assert!(record.has_fingerprint);
    assert_eq!(
        provider.renew_marker(&key, first, LEASE).await.unwrap(),
        RenewOutcome::Lost(LossCause::Expired),
        "a completed marker is no longer renewable"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lapsed_transactional_marker_is_absent_even_when_kept() {
    let provider = MemoryProvider::new();
    assert!(provider.transactional_claims());
    let key = CallKey::builder("mp", "tx").finish();
    let (first, second) = (OwnerToken::new(), OwnerToken::new());
    let claim = |owner, transactional| ClaimRequest {
        key: &key,
        owner,
        in_flight_lease: LEASE,
        fingerprint: None,
        keep_abandoned_for: Some(DAY),
        transactional,
    };
    assert_eq!(
        provider.claim(claim(first, true)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    tokio::time::advance(LEASE + Duration::from_millis(1)).await;
    assert_eq!(
        provider.claim(claim(second, true)).await.unwrap(),
        ClaimOutcome::Claimed,
        "the lapsed transactional marker counts as absent, not abandoned"
    );
    tokio::time::advance(LEASE + Duration::from_millis(1)).await;
    assert_eq!(
        provider.claim(claim(first, false)).await.unwrap(),
        ClaimOutcome::Claimed,
        "a lapsed transactional marker is absent to any claim"
    );
    tokio::time::advance(LEASE + Duration::from_millis(1)).await;
    assert_eq!(
        provider.claim(claim(second, false)).await.unwrap(),
        ClaimOutcome::Abandoned { fingerprint: None },
        "the same request without the flag keeps its lapsed marker"
    );
}
