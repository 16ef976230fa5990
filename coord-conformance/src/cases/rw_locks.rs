//! Read-write locks ([`RwLockStore`](coord_core::provider::RwLockStore), an optional
//! capability): readers share a key and a writer holds it alone (under races too), a waiting
//! writer keeps new readers out, crashed readers, writers and waiting writers free the key at
//! the end of their lease or claim and not later, fencing tokens increase across both modes,
//! release and renewal are owner- and mode-scoped (a read release never deletes a write hold),
//! renewal stops at release, and a read holder asking to write is refused at once.
//!
//! On a provider without the capability every case checks the other promise instead: a
//! read-write lock is refused with `CoordError::Unsupported` before anything runs, and a
//! builder that requires the capability refuses to build.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::provider::{
    Capability, OwnerToken, ReleaseOutcome, RenewOutcome, RwGrant, RwLockRequest, RwMode,
};
use coord_core::{CallKey, CoordError, Coordinator, distributed_lock, fencing_token};

use super::durations::{LONG, PAST_RENEWED_LEASE, PAST_SHORT, RENEWAL_EVERY, RENEWED_LEASE, SHORT};
use super::requests::key;

/// A request of one attempt (`wait` zero) or a wait, with a claim of [`SHORT`].
fn rw_req(
    key: &CallKey,
    owner: OwnerToken,
    mode: RwMode,
    lease: Duration,
    wait: Duration,
) -> RwLockRequest<'_> {
    RwLockRequest {
        key,
        owner,
        mode,
        lease,
        wait,
        claim: SHORT,
    }
}

/// One attempt at a hold.
async fn attempt(c: &Coordinator, k: &CallKey, owner: OwnerToken, mode: RwMode) -> Option<RwGrant> {
    c.rw_lock_store()
        .acquire_rw(rw_req(k, owner, mode, LONG, Duration::ZERO))
        .await
        .unwrap()
}

/// On a provider without read-write locks: one is refused with the typed error, its body never
/// runs, and requiring the capability at build time fails. Returns true when the provider has
/// read-write locks (the case goes on).
async fn supported_or_refused(c: &Coordinator) -> bool {
    if c.supports(Capability::ReadWriteLocks) {
        return true;
    }
    let k = key(c, "rw-unsupported");
    let ran = AtomicBool::new(false);
    let answer: Result<(), CoordError> = c
        .rw_lock(k.clone())
        .run_write(|| async {
            ran.store(true, Ordering::SeqCst);
            Ok(())
        })
        .await;
    assert!(
        matches!(
            answer,
            Err(CoordError::Unsupported {
                capability: Capability::ReadWriteLocks,
                ..
            })
        ),
        "a provider without read-write locks must refuse one with `CoordError::Unsupported`, got {answer:?}"
    );
    assert!(!ran.load(Ordering::SeqCst), "the body ran without a hold");
    let refused = c.rw_lock(k).try_read().await;
    assert!(
        matches!(refused, Err(CoordError::Unsupported { .. })),
        "`try_read` must refuse too, got {refused:?}"
    );
    false
}

/// The witness of who is inside: readers and writers counted as they enter and leave.
#[derive(Default)]
struct Witness {
    readers: AtomicUsize,
    writers: AtomicUsize,
    most_readers: AtomicUsize,
    broken: AtomicBool,
}

impl Witness {
    fn enter(&self, mode: RwMode) {
        match mode {
            RwMode::Read => {
                let now = self.readers.fetch_add(1, Ordering::SeqCst) + 1;
                self.most_readers.fetch_max(now, Ordering::SeqCst);
                if self.writers.load(Ordering::SeqCst) > 0 {
                    self.broken.store(true, Ordering::SeqCst);
                }
            }
            RwMode::Write => {
                let writers = self.writers.fetch_add(1, Ordering::SeqCst) + 1;
                if writers > 1 || self.readers.load(Ordering::SeqCst) > 0 {
                    self.broken.store(true, Ordering::SeqCst);
                }
            }
        }
    }

    fn leave(&self, mode: RwMode) {
        match mode {
            RwMode::Read => self.readers.fetch_sub(1, Ordering::SeqCst),
            RwMode::Write => self.writers.fetch_sub(1, Ordering::SeqCst),
        };
    }
}

#[distributed_lock(key_from = "book", name = "conformance.rw_book", mode = "read", lease = "30s", wait = "30s", coordinator = coord)]
async fn read_book(
    coord: &Coordinator,
    book: u32,
    witness: Arc<Witness>,
) -> Result<(), CoordError> {
    witness.enter(RwMode::Read);
    assert!(fencing_token().is_some(), "every read hold carries a token");
    tokio::time::sleep(Duration::from_millis(2)).await;
    witness.leave(RwMode::Read);
    Ok(())
}

#[distributed_lock(key_from = "book", name = "conformance.rw_book", mode = "write", lease = "30s", wait = "30s", coordinator = coord)]
async fn write_book(
    coord: &Coordinator,
    book: u32,
    witness: Arc<Witness>,
) -> Result<(), CoordError> {
    witness.enter(RwMode::Write);
    assert!(
        fencing_token().is_some(),
        "every write hold carries a token"
    );
    tokio::time::sleep(Duration::from_millis(1)).await;
    witness.leave(RwMode::Write);
    Ok(())
}

/// Readers share the key, a writer holds it alone: first step by step through the store (two
/// readers in at once, a writer refused while they are, then alone, keeping readers and
/// writers out), then 24 tasks racing through the attribute and the handle with a witness of
/// who is inside: never a writer beside anyone.
pub async fn rw_readers_share_and_a_writer_is_alone(c: Coordinator) {
    if !supported_or_refused(&c).await {
        return;
    }
    let p = c.rw_lock_store();
    let k = key(&c, "rw-share");
    let (r1, r2, w1, w2) = (
        OwnerToken::new(),
        OwnerToken::new(),
        OwnerToken::new(),
        OwnerToken::new(),
    );
    assert!(
        attempt(&c, &k, r1, RwMode::Read).await.is_some(),
        "a free key grants a reader"
    );
    assert!(
        attempt(&c, &k, r2, RwMode::Read).await.is_some(),
        "readers share the key"
    );
    assert!(
        attempt(&c, &k, w1, RwMode::Write).await.is_none(),
        "a writer got in beside readers"
    );
    assert_eq!(
        p.release_rw(&k, r1, RwMode::Read).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert!(
        attempt(&c, &k, w1, RwMode::Write).await.is_none(),
        "a writer got in beside a reader"
    );
    assert_eq!(
        p.release_rw(&k, r2, RwMode::Read).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert!(
        attempt(&c, &k, w1, RwMode::Write).await.is_some(),
        "a free key grants a writer"
    );
    assert!(
        attempt(&c, &k, r1, RwMode::Read).await.is_none(),
        "a reader got in beside a writer"
    );
    assert!(
        attempt(&c, &k, w2, RwMode::Write).await.is_none(),
        "two writers held the key"
    );
    assert_eq!(
        p.release_rw(&k, w1, RwMode::Write).await.unwrap(),
        ReleaseOutcome::Released
    );

    let witness = Arc::new(Witness::default());
    let mut tasks = Vec::new();
    for task in 0..24u32 {
        let (c, witness) = (c.clone(), witness.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..3u32 {
                match (task + round) % 4 {
                    0 => write_book(&c, 5, witness.clone())
                        .await
                        .expect("a writer got in within its wait"),
                    1 => read_book(&c, 5, witness.clone())
                        .await
                        .expect("a reader got in within its wait"),
                    // The handle form, on the key the attributes build.
                    n => {
                        let mode = if n == 2 { RwMode::Read } else { RwMode::Write };
                        let rw = c.rw_lock(book_key(&c)).wait(LONG);
                        let guard = match mode {
                            RwMode::Read => rw.read().await,
                            RwMode::Write => rw.write().await,
                        }
                        .expect("every task gets in within its wait");
                        witness.enter(mode);
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        witness.leave(mode);
                        assert!(guard.release().await.unwrap(), "the hold was still ours");
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(
        !witness.broken.load(Ordering::SeqCst),
        "a writer was inside together with a reader or another writer"
    );
    assert!(
        attempt(&c, &book_key(&c), OwnerToken::new(), RwMode::Write)
            .await
            .is_some(),
        "a hold was left behind after every task released"
    );
}

/// The key the attributes `read_book` and `write_book` share (one operation name for both:
/// a read-write lock is named by its key).
fn book_key(c: &Coordinator) -> CallKey {
    c.key("conformance.rw_book").part(&5u32).finish()
}

/// Writer preference: a writer waiting behind a reader keeps new readers out (their single
/// attempts are refused) until it gets in; the reader's release lets the writer in at once,
/// woken well before any re-check cap; readers get in again once the writer releases.
pub async fn rw_waiting_writer_keeps_new_readers_out(c: Coordinator) {
    if !supported_or_refused(&c).await {
        return;
    }
    let p = c.rw_lock_store().clone();
    let k = key(&c, "rw-prefer");
    let (reader, writer) = (OwnerToken::new(), OwnerToken::new());
    assert!(attempt(&c, &k, reader, RwMode::Read).await.is_some());
    let waiting = tokio::spawn({
        let (p, k) = (p.clone(), k.clone());
        async move {
            let req = RwLockRequest {
                key: &k,
                owner: writer,
                mode: RwMode::Write,
                lease: LONG,
                wait: LONG,
                claim: LONG,
            };
            let granted = p.acquire_rw(req).await.unwrap();
            (granted, Instant::now())
        }
    });
    wait_until_readers_are_refused(&c, &k).await;
    // The claim holds for as long as the writer waits, not just once.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        attempt(&c, &k, OwnerToken::new(), RwMode::Read)
            .await
            .is_none(),
        "a new reader got in while a writer waited"
    );
    let released_at = Instant::now();
    assert_eq!(
        p.release_rw(&k, reader, RwMode::Read).await.unwrap(),
        ReleaseOutcome::Released
    );
    let (granted, at) = waiting.await.unwrap();
    granted.expect("the waiting writer got in once the reader left");
    assert!(
        at.duration_since(released_at) < Duration::from_millis(900),
        "the waiting writer was not woken by the release (it took {:?})",
        at.duration_since(released_at)
    );
    assert!(
        attempt(&c, &k, OwnerToken::new(), RwMode::Read)
            .await
            .is_none()
    );
    assert_eq!(
        p.release_rw(&k, writer, RwMode::Write).await.unwrap(),
        ReleaseOutcome::Released
    );
    let after = OwnerToken::new();
    assert!(
        attempt(&c, &k, after, RwMode::Read).await.is_some(),
        "readers stayed out after the writer released"
    );
    p.release_rw(&k, after, RwMode::Read).await.unwrap();
}

/// Tries single reads until one is refused (a waiting writer's claim is in place), releasing
/// the ones that got in; fails after a generous deadline.
async fn wait_until_readers_are_refused(c: &Coordinator, k: &CallKey) {
    let p = c.rw_lock_store();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let probe = OwnerToken::new();
        match attempt(c, k, probe, RwMode::Read).await {
            None => return,
            Some(_) => {
                p.release_rw(k, probe, RwMode::Read).await.unwrap();
            }
        }
        assert!(
            Instant::now() < until,
            "a waiting writer never kept new readers out"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Crashed holders free the key at the end of their lease and not later: a reader's and a
/// writer's hold (a single attempt refused before, granted after), and a waiting writer's
/// claim (a writer that vanished while waiting holds readers back for at most its claim). The
/// crashed holders' late renewals and releases change nothing.
pub async fn rw_crashed_holders_and_waiting_writer_expire(c: Coordinator) {
    if !supported_or_refused(&c).await {
        return;
    }
    let p = c.rw_lock_store().clone();
    let k = key(&c, "rw-crash");

    // A crashed reader.
    let crashed = OwnerToken::new();
    p.acquire_rw(rw_req(&k, crashed, RwMode::Read, SHORT, Duration::ZERO))
        .await
        .unwrap()
        .expect("a free key grants a reader");
    assert!(
        attempt(&c, &k, OwnerToken::new(), RwMode::Write)
            .await
            .is_none()
    );
    tokio::time::sleep(PAST_SHORT).await;
    let writer = OwnerToken::new();
    assert!(
        attempt(&c, &k, writer, RwMode::Write).await.is_some(),
        "a crashed reader's hold outlived its lease"
    );
    assert_eq!(
        p.renew_rw(&k, crashed, RwMode::Read, LONG).await.unwrap(),
        RenewOutcome::Lost(coord_core::LossCause::Expired),
        "a crashed reader's late renewal revived its hold"
    );
    assert_eq!(
        p.release_rw(&k, crashed, RwMode::Read).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
    assert!(
        attempt(&c, &k, OwnerToken::new(), RwMode::Read)
            .await
            .is_none(),
        "the writer's hold was freed by a late read release"
    );
    p.release_rw(&k, writer, RwMode::Write).await.unwrap();

    // A crashed writer.
    let crashed = OwnerToken::new();
    p.acquire_rw(rw_req(&k, crashed, RwMode::Write, SHORT, Duration::ZERO))
        .await
        .unwrap()
        .expect("a free key grants a writer");
    assert!(
        attempt(&c, &k, OwnerToken::new(), RwMode::Read)
            .await
            .is_none()
    );
    tokio::time::sleep(PAST_SHORT).await;
    let reader = OwnerToken::new();
    assert!(
        attempt(&c, &k, reader, RwMode::Read).await.is_some(),
        "a crashed writer's hold outlived its lease"
    );
    assert_eq!(
        p.release_rw(&k, crashed, RwMode::Write).await.unwrap(),
        ReleaseOutcome::NotHeld
    );

    // A crashed waiting writer: its claim (SHORT) keeps readers out, then ends on its own.
    let vanished = tokio::spawn({
        let (p, k) = (p.clone(), k.clone());
        async move {
            let _ = p
                .acquire_rw(rw_req(&k, OwnerToken::new(), RwMode::Write, LONG, LONG))
                .await;
        }
    });
    wait_until_readers_are_refused(&c, &k).await;
    vanished.abort();
    let _ = vanished.await;
    let dropped_at = Instant::now();
    let late = OwnerToken::new();
    p.acquire_rw(rw_req(&k, late, RwMode::Read, LONG, LONG))
        .await
        .unwrap()
        .expect("a vanished waiting writer kept readers out for good");
    assert!(
        dropped_at.elapsed() < SHORT + Duration::from_millis(1500),
        "a vanished waiting writer kept readers out for {:?}, past its claim of {SHORT:?}",
        dropped_at.elapsed()
    );
    p.release_rw(&k, late, RwMode::Read).await.unwrap();
    p.release_rw(&k, reader, RwMode::Read).await.unwrap();
}

/// Fencing tokens come from one counter per key, across modes: every grant's token is greater
/// than every earlier one, whichever mode each had; so a resource that remembers the highest
/// token it saw refuses the write of a writer whose lease ran out while a reader got in.
pub async fn rw_fencing_tokens_increase_across_modes(c: Coordinator) {
    if !supported_or_refused(&c).await {
        return;
    }
    let p = c.rw_lock_store();
    let k = key(&c, "rw-fence");
    let mut last = 0u64;
    for (round, mode) in [
        RwMode::Read,
        RwMode::Read,
        RwMode::Write,
        RwMode::Read,
        RwMode::Write,
    ]
    .into_iter()
    .enumerate()
    {
        let owner = OwnerToken::new();
        let grant = attempt(&c, &k, owner, mode)
            .await
            .expect("a free key grants the hold");
        let token = grant.fencing_token.get();
        assert!(
            token > last,
            "round {round}: a {mode} token {token} is not greater than the one before ({last})"
        );
        last = token;
        p.release_rw(&k, owner, mode).await.unwrap();
    }

    // A stale writer is refused by a resource that checks tokens.
    let stale = OwnerToken::new();
    let stale_token = p
        .acquire_rw(rw_req(&k, stale, RwMode::Write, SHORT, Duration::ZERO))
        .await
        .unwrap()
        .expect("a free key grants a writer")
        .fencing_token;
    tokio::time::sleep(PAST_SHORT).await;
    let reader = OwnerToken::new();
    let reader_token = attempt(&c, &k, reader, RwMode::Read)
        .await
        .expect("the stale writer's lease ended")
        .fencing_token;
    let highest_seen = reader_token;
    assert!(
        stale_token < highest_seen,
        "a stale writer's token ({stale_token:?}) is not below a later reader's ({reader_token:?})"
    );
    p.release_rw(&k, reader, RwMode::Read).await.unwrap();
}

/// Regression for a peer's bug (a read unlock deleted the write hold): release and renewal
/// touch only the owner's hold of the mode named. A read release, by the writer's own owner
/// or anyone else, leaves the write hold in place; a write release by another owner too; and
/// a reader's release leaves the other readers' holds.
pub async fn read_release_does_not_delete_a_write_hold(c: Coordinator) {
    if !supported_or_refused(&c).await {
        return;
    }
    let p = c.rw_lock_store();
    let k = key(&c, "rw-scope");
    let (writer, other) = (OwnerToken::new(), OwnerToken::new());
    attempt(&c, &k, writer, RwMode::Write)
        .await
        .expect("a free key grants a writer");
    for owner in [writer, other] {
        assert_eq!(
            p.release_rw(&k, owner, RwMode::Read).await.unwrap(),
            ReleaseOutcome::NotHeld,
            "a read release answered as if it freed something"
        );
    }
    assert_eq!(
        p.release_rw(&k, other, RwMode::Write).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
    assert!(
        attempt(&c, &k, other, RwMode::Read).await.is_none(),
        "a read release deleted the write hold"
    );
    assert!(
        matches!(
            p.renew_rw(&k, other, RwMode::Write, LONG).await.unwrap(),
            RenewOutcome::Lost(_)
        ),
        "another owner renewed the write hold"
    );
    assert!(
        matches!(
            p.renew_rw(&k, writer, RwMode::Read, LONG).await.unwrap(),
            RenewOutcome::Lost(_)
        ),
        "a read renewal found a hold the owner has only for writing"
    );
    assert_eq!(
        p.renew_rw(&k, writer, RwMode::Write, LONG).await.unwrap(),
        RenewOutcome::Renewed
    );
    assert_eq!(
        p.release_rw(&k, writer, RwMode::Write).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        p.release_rw(&k, writer, RwMode::Write).await.unwrap(),
        ReleaseOutcome::NotHeld,
        "a second release is a no-op"
    );

    // Readers: one's release (or a write release by its owner) leaves the other's hold.
    let (r1, r2) = (OwnerToken::new(), OwnerToken::new());
    attempt(&c, &k, r1, RwMode::Read).await.unwrap();
    attempt(&c, &k, r2, RwMode::Read).await.unwrap();
    assert_eq!(
        p.release_rw(&k, r1, RwMode::Write).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
    assert_eq!(
        p.release_rw(&k, r1, RwMode::Read).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert!(
        attempt(&c, &k, OwnerToken::new(), RwMode::Write)
            .await
            .is_none(),
        "one reader's release freed the other reader's hold"
    );
    assert_eq!(
        p.renew_rw(&k, r2, RwMode::Read, LONG).await.unwrap(),
        RenewOutcome::Renewed
    );
    assert_eq!(
        p.release_rw(&k, r2, RwMode::Read).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// Renewal keeps a hold past its lease while held and stops when it is released (no renewal
/// outlives the release, in either mode): the next holder keeps the key undisturbed.
pub async fn rw_renewal_stops_at_release(c: Coordinator) {
    if !supported_or_refused(&c).await {
        return;
    }
    let k = key(&c, "rw-renew");
    for mode in [RwMode::Read, RwMode::Write] {
        let before = c.active_renewals();
        let rw = c
            .rw_lock(k.clone())
            .lease(RENEWED_LEASE)
            .renew(RENEWAL_EVERY);
        let guard = match mode {
            RwMode::Read => rw.read().await,
            RwMode::Write => rw.write().await,
        }
        .unwrap();
        assert_eq!(guard.mode(), mode);
        assert_eq!(c.active_renewals(), before + 1, "the hold is being renewed");
        tokio::time::sleep(PAST_RENEWED_LEASE).await;
        assert!(
            guard.is_held(),
            "renewal kept the {mode} hold past its lease"
        );
        let token = guard.fencing_token().expect("a held hold has its token");
        assert!(
            guard.release().await.unwrap(),
            "the renewed hold was still ours"
        );
        assert_eq!(
            c.active_renewals(),
            before,
            "a renewal outlived the release"
        );
        let next = c
            .rw_lock(k.clone())
            .lease(LONG)
            .try_write()
            .await
            .unwrap()
            .expect("the released key is free at once");
        assert!(next.fencing_token().unwrap() > token);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(next.is_held());
        assert!(next.release().await.unwrap());
    }
}

#[distributed_lock(key_from = "book", name = "conformance.rw_upgrade", mode = "write", wait = "30s", coordinator = coord)]
async fn write_section(coord: &Coordinator, book: u32) -> Result<(), CoordError> {
    Ok(())
}

/// Reads, and inside the read asks to write the same key: answers what the write said.
#[distributed_lock(key_from = "book", name = "conformance.rw_upgrade", mode = "read", coordinator = coord)]
async fn read_then_write(
    coord: &Coordinator,
    book: u32,
) -> Result<Result<(), CoordError>, CoordError> {
    Ok(write_section(coord, book).await)
}

/// No upgrade: a task holding a key for reading that asks to write it is refused at once
/// with `CoordError::LockUpgrade` (not after its 30 s wait), and keeps its read hold; a second
/// read of the same key in the same task is `CoordError::Reentrant`. Through the handle and
/// the attribute.
pub async fn rw_upgrade_is_refused_at_once(c: Coordinator) {
    if !supported_or_refused(&c).await {
        return;
    }
    let k = c.key("conformance.rw_upgrade").part(&7u32).finish();
    let started = Instant::now();
    let inner: Result<Result<(), CoordError>, CoordError> = c
        .rw_lock(k.clone())
        .run_read(|| async {
            let write = c.rw_lock(k.clone()).wait(LONG).write().await.map(|_| ());
            let read = c.rw_lock(k.clone()).wait(LONG).read().await.map(|_| ());
            assert!(
                matches!(read, Err(CoordError::Reentrant { .. })),
                "a second read of the same key in one task was not refused: {read:?}"
            );
            assert!(fencing_token().is_some(), "the read hold was kept");
            Ok(write)
        })
        .await;
    let write = inner.expect("the read hold was granted");
    assert!(
        matches!(write, Err(CoordError::LockUpgrade { .. })),
        "a read holder asking to write was not refused as an upgrade: {write:?}"
    );
    let through_attributes = read_then_write(&c, 7)
        .await
        .expect("the read hold was granted");
    assert!(
        matches!(through_attributes, Err(CoordError::LockUpgrade { .. })),
        "a `mode = \"read\"` body calling a `mode = \"write\"` one of the same key was not refused as an upgrade: {through_attributes:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the upgrade was refused only after waiting"
    );
    // Both holds are gone: a writer gets in.
    let w = c.rw_lock(k).try_write().await.unwrap();
    assert!(w.is_some(), "a hold was left behind by the refused upgrade");
}
