//! The in-process provider: the contract's traits over the lock table, the record store, the
//! cache map and the flight table. The engine answers in the contract's own types, so each
//! method calls it and returns its answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use tokio::time::Instant;

use crate::{Attempt, LockTable, RecordStore};

use coord_contract::CallKey;
use coord_contract::{BackendError, BackendErrorKind};
use coord_contract::{
    BoxFuture, CacheEntry, CacheStore, ClaimOutcome, ClaimRequest, CompleteOutcome,
    CompleteRequest, IdempotencyStore, LockGrant, LockProvider, LockRequest, OwnerToken,
    ReleaseOutcome, RenewOutcome,
};
use coord_contract::{
    Cursor, ForcedRelease, ListRequest, LockHolder, LockInfo, NamespaceListRequest, Operations,
    Page, RecordInfo, RwLockInfo, SemaphoreInfo, Waiters,
};
use coord_contract::{FlightClaim, FlightStore, FlightWait};
use coord_contract::{MultiLockGrant, MultiLockRequest, MultiLockStore};
use coord_contract::{PermitGrant, PermitRequest, SemaphoreStore};
use coord_contract::{RwGrant, RwLockRequest, RwLockStore, RwMode};

/// Coordination within this process: leases, fencing, FIFO hand-off and idempotency records
/// held in memory.
///
/// Exclusion and at-most-once hold among the tasks of this process only. Chosen with
/// `Coordinator::builder().memory()`, and used as the fallback when no coordinator is
/// installed. Never reports a backend fault: the one error it returns is a
/// [`BackendErrorKind::Config`] error for a listing cursor it did not make.
///
/// Every duration in a request is accepted, from zero to [`Duration::MAX`]: deadlines
/// saturate at about thirty years, so a lease, keep or retention of `Duration::MAX` lasts as
/// long as the process, and a wait of `Duration::MAX` waits until the lock is granted or the
/// `acquire` future is dropped. A zero lease or retention makes state that has already
/// expired.
///
/// A resent claim by the owner of the live marker answers [`ClaimOutcome::Claimed`] and
/// restarts the marker's lease from that claim.
#[derive(Debug, Default)]
pub struct MemoryProvider {
    locks: LockTable,
    records: RecordStore,
    /// The shared tier of `#[cached]`: bytes and their expiry (tokio's clock, like the rest).
    cache: DashMap<CallKey, (Arc<[u8]>, Instant)>,
    /// Sets since the last sweep of expired cache entries.
    cache_sets: AtomicU64,
    /// Cluster-scope single-flight claims and hand-overs.
    pub(crate) flights: crate::flights::FlightTable,
    /// Semaphores (`permits`).
    semaphores: crate::SemaphoreTable,
    /// Read-write locks (`mode`).
    rw_locks: crate::RwLockTable,
}

/// Expired cache entries are swept once per this many sets, so keys never read again do not
/// accumulate (a read removes an expired entry at once).
const CACHE_SWEEP_EVERY: u64 = 1024;

impl MemoryProvider {
    /// An empty provider.
    pub fn new() -> MemoryProvider {
        MemoryProvider::default()
    }

    /// One attempt to take the lock of `key` for `owner`, made at `now` (see
    /// [`LockTable::attempt_shared_at`]): what [`LockProvider::acquire`] does, without its
    /// boxed future and its own clock read, for a caller that holds this provider as itself
    /// and read tokio's clock just before. A [`Attempt::Queued`] caller waits with
    /// [`Waiter::wait`](crate::Waiter::wait); a grant is timed from `now` (`lease_began`).
    pub fn attempt_lock_at<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
        wait: Duration,
        fenced: bool,
        now: Instant,
    ) -> Attempt<'a> {
        self.locks
            .attempt_shared_at(key.shared(), owner, lease, wait, fenced, now)
    }

    /// Frees the lock of `key` if `owner` holds it, at `now` (see [`LockTable::release_at`]):
    /// what [`LockProvider::release`] answers, without its boxed future and its own clock read.
    pub fn release_lock_at(
        &self,
        key: &CallKey,
        owner: OwnerToken,
        now: Instant,
    ) -> ReleaseOutcome {
        self.locks.release_at(key.qualified(), owner, now)
    }

    /// How many lock keys are held or waited for (zero once all locks are released).
    pub fn lock_keys(&self) -> usize {
        self.locks.len()
    }

    /// How many semaphore keys have permits or waiters (zero once every permit is released
    /// or expired and nobody waits).
    pub fn semaphore_keys(&self) -> usize {
        self.semaphores.len()
    }

    /// How many live permits of `key` are held now.
    pub fn permits_held(&self, key: &CallKey) -> usize {
        self.semaphores.held(key.qualified())
    }

    /// How many read-write lock keys have holds, a waiting writer's claim, or waiters (zero
    /// once every hold is released or expired and nobody waits).
    pub fn rw_lock_keys(&self) -> usize {
        self.rw_locks.len()
    }

    /// The live read holds of the read-write lock `key`, and whether a live write hold exists.
    pub fn rw_holds(&self, key: &CallKey) -> (usize, bool) {
        self.rw_locks.held(key.qualified())
    }

    /// How many shared cache entries are kept, expired ones not yet swept included.
    pub fn cache_entries(&self) -> usize {
        self.cache.len()
    }

    /// How many idempotency records are stored.
    pub fn records(&self) -> u64 {
        self.records.len()
    }

    /// How many single-flight claims and hand-overs are kept (`scope = "cluster"`), expired
    /// ones not yet swept included.
    pub fn flight_entries(&self) -> usize {
        self.flights.len()
    }
}

impl LockProvider for MemoryProvider {
    fn acquire<'a>(
        &'a self,
        req: LockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<LockGrant>, BackendError>> {
        let attempt =
            self.locks
                .attempt_shared(req.key.shared(), req.owner, req.lease, req.wait, req.fenced);
        match attempt {
            // The common grant (first attempt, unfenced) is one constant, so its answer boxes
            // without allocating: the runtime times the lease from just before the attempt,
            // which is never later than it began.
            Attempt::Granted(LockGrant {
                fencing_token: None,
                contended: false,
                ..
            }) => Box::pin(ReadyWith(|| {
                Ok(Some(LockGrant {
                    fencing_token: None,
                    contended: false,
                    lease_began: None,
                }))
            })),
            Attempt::Granted(grant) => Box::pin(std::future::ready(Ok(Some(grant)))),
            Attempt::Held => Box::pin(ReadyWith(|| Ok(None))),
            Attempt::Queued(waiter) => Box::pin(async move { Ok(waiter.wait().await) }),
        }
    }

    fn release<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        // One zero-sized future per answer, so that boxing it allocates nothing.
        match self.locks.release(key.qualified(), owner) {
            ReleaseOutcome::Released => Box::pin(ReadyWith(|| Ok(ReleaseOutcome::Released))),
            ReleaseOutcome::NotHeld => Box::pin(ReadyWith(|| Ok(ReleaseOutcome::NotHeld))),
            ReleaseOutcome::ForceReleased => {
                Box::pin(ReadyWith(|| Ok(ReleaseOutcome::ForceReleased)))
            }
        }
    }

    fn renew<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        let outcome = self.locks.renew(key.qualified(), owner, lease);
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn release_detached(self: Arc<Self>, key: CallKey, owner: OwnerToken, _lease_left: Duration) {
        // Release is synchronous here: do it now rather than on another task.
        self.locks.release(key.qualified(), owner);
    }
}

/// Multi-key locks taken in one synchronous pass over the lock table (see
/// [`LockTable::acquire_all`]).
impl MultiLockStore for MemoryProvider {
    fn supports_multi_locks(&self) -> bool {
        true
    }

    fn acquire_all<'a>(
        &'a self,
        req: MultiLockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<MultiLockGrant>, BackendError>> {
        Box::pin(async move { Ok(self.locks.acquire_all(&req).await) })
    }
}

/// Semaphores, exact among the tasks of this process.
impl SemaphoreStore for MemoryProvider {
    fn supports_semaphores(&self) -> bool {
        true
    }

    fn acquire_permit<'a>(
        &'a self,
        req: PermitRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<PermitGrant>, BackendError>> {
        Box::pin(async move {
            Ok(self
                .semaphores
                .acquire(
                    req.key.qualified(),
                    req.owner,
                    req.limit,
                    req.lease,
                    req.wait,
                )
                .await)
        })
    }

    fn release_permit<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        let outcome = self.semaphores.release(key.qualified(), owner);
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn renew_permit<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        let outcome = self.semaphores.renew(key.qualified(), owner, lease);
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn release_permit_detached(
        self: Arc<Self>,
        key: CallKey,
        owner: OwnerToken,
        _lease_left: Duration,
    ) {
        self.semaphores.release(key.qualified(), owner);
    }
}

/// Read-write locks, exact among the tasks of this process.
impl RwLockStore for MemoryProvider {
    fn supports_rw_locks(&self) -> bool {
        true
    }

    fn acquire_rw<'a>(
        &'a self,
        req: RwLockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<RwGrant>, BackendError>> {
        Box::pin(async move {
            Ok(self
                .rw_locks
                .acquire(
                    req.key.qualified(),
                    req.owner,
                    req.mode,
                    req.lease,
                    req.wait,
                    req.claim,
                )
                .await)
        })
    }

    fn release_rw<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        mode: RwMode,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        let outcome = self.rw_locks.release(key.qualified(), owner, mode);
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn renew_rw<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        mode: RwMode,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        let outcome = self.rw_locks.renew(key.qualified(), owner, mode, lease);
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn release_rw_detached(
        self: Arc<Self>,
        key: CallKey,
        owner: OwnerToken,
        mode: RwMode,
        _lease_left: Duration,
    ) {
        self.rw_locks.release(key.qualified(), owner, mode);
    }
}

/// A future ready at once with what `make` returns. Given a closure that captures nothing it is
/// zero-sized, so boxing it (as the provider traits require) allocates nothing: the answers
/// of the hot path (a free lock granted, a lock released) cost no allocation.
struct ReadyWith<M>(M);

impl<T, M: Fn() -> T + Unpin> Future for ReadyWith<M> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<T> {
        Poll::Ready((self.0)())
    }
}

impl IdempotencyStore for MemoryProvider {
    fn claim<'a>(
        &'a self,
        req: ClaimRequest<'a>,
    ) -> BoxFuture<'a, Result<ClaimOutcome, BackendError>> {
        // A transactional marker that lapses is absent, kept or not: nothing of its run can
        // have committed without the completed record (see `ClaimRequest::transactional`).
        let keep_abandoned_for = if req.transactional {
            None
        } else {
            req.keep_abandoned_for
        };
        let outcome = self.records.claim_shared(
            req.key.shared(),
            req.owner,
            req.in_flight_lease,
            req.fingerprint,
            keep_abandoned_for,
        );
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn complete<'a>(
        &'a self,
        req: CompleteRequest<'a>,
    ) -> BoxFuture<'a, Result<CompleteOutcome, BackendError>> {
        let outcome = self.records.complete_shared(
            req.key.shared(),
            req.owner,
            req.payload,
            req.retention,
            req.fingerprint,
        );
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn abandon<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let done = self.records.abandon(key.qualified(), owner);
        Box::pin(std::future::ready(Ok(done)))
    }

    fn wait_settled<'a>(
        &'a self,
        key: &'a CallKey,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            self.records.wait_settled(key.qualified(), timeout).await;
            Ok(())
        })
    }

    fn renew_marker<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        let outcome = self.records.renew(key.qualified(), owner, lease);
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn purge<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(std::future::ready(Ok(self.records.purge(key.qualified()))))
    }

    /// Transactional claims are taken (with their lapse rule), so that the runtime's
    /// transactional path can be exercised in-process; this provider has no database, so the
    /// only transactions that complete here are test doubles built over it. A real database
    /// transaction paired with this provider finds no marker at completion and cannot commit.
    fn transactional_claims(&self) -> bool {
        true
    }

    fn abandon_detached(self: Arc<Self>, key: CallKey, owner: OwnerToken, _lease_left: Duration) {
        self.records.abandon(key.qualified(), owner);
    }
}

/// The operations API: reads of the lock table and the record store, by this process's clock.
///
/// A lock reports its exact number of waiters ([`Waiters::Counted`]) and the newest fencing
/// token minted since it was last free; a semaphore its live permits and its waiters, a
/// read-write lock its live holds, its waiting writer's claim and its waiters in either mode
/// (all counted exactly). Listings are sorted by key; a cursor holds the last key
/// listed (hex-encoded), and the next page starts after it.
impl Operations for MemoryProvider {
    fn inspect_lock<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<LockInfo, BackendError>> {
        let info = match self.locks.inspect(key.qualified()) {
            Some(view) => LockInfo::new(
                key.clone(),
                Some(LockHolder::new(
                    view.owner,
                    view.lease_left,
                    Waiters::Counted(view.waiters),
                )),
                view.fencing_token,
            ),
            None => LockInfo::new(key.clone(), None, None),
        };
        Box::pin(std::future::ready(Ok(info)))
    }

    fn inspect_semaphore<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<SemaphoreInfo, BackendError>> {
        let (permits, waiting) = self.semaphores.inspect(key.qualified());
        let info = SemaphoreInfo::new(key.clone(), permits, Waiters::Counted(waiting));
        Box::pin(std::future::ready(Ok(info)))
    }

    fn inspect_rw_lock<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<RwLockInfo, BackendError>> {
        let view = self.rw_locks.inspect(key.qualified());
        let info = RwLockInfo::new(
            key.clone(),
            view.readers,
            view.writer,
            view.claim,
            Waiters::Counted(view.waiting),
        );
        Box::pin(std::future::ready(Ok(info)))
    }

    fn inspect_record<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<Option<RecordInfo>, BackendError>> {
        let info = self.records.inspect(key.qualified()).map(|view| {
            RecordInfo::new(
                key.clone(),
                view.status,
                Some(view.owner),
                Some(view.age),
                view.lease_left,
                view.expires_in,
                view.payload_len,
                view.has_fingerprint,
            )
        });
        Box::pin(std::future::ready(Ok(info)))
    }

    fn list_locks<'a>(
        &'a self,
        req: ListRequest<'a>,
    ) -> BoxFuture<'a, Result<Page<CallKey>, BackendError>> {
        let page = page_of(
            self.locks.held_keys(),
            req.operation,
            true,
            req.cursor,
            req.page_size(),
        );
        Box::pin(std::future::ready(page))
    }

    fn list_records<'a>(
        &'a self,
        req: ListRequest<'a>,
    ) -> BoxFuture<'a, Result<Page<CallKey>, BackendError>> {
        let page = page_of(
            self.records.keys(),
            req.operation,
            true,
            req.cursor,
            req.page_size(),
        );
        Box::pin(std::future::ready(page))
    }

    fn list_namespace_locks<'a>(
        &'a self,
        req: NamespaceListRequest<'a>,
    ) -> BoxFuture<'a, Result<Page<CallKey>, BackendError>> {
        let page = page_of(
            self.locks.held_keys(),
            req.namespace,
            false,
            req.cursor,
            req.page_size(),
        );
        Box::pin(std::future::ready(page))
    }

    fn list_namespace_records<'a>(
        &'a self,
        req: NamespaceListRequest<'a>,
    ) -> BoxFuture<'a, Result<Page<CallKey>, BackendError>> {
        let page = page_of(
            self.records.keys(),
            req.namespace,
            false,
            req.cursor,
            req.page_size(),
        );
        Box::pin(std::future::ready(page))
    }

    fn force_release<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<ForcedRelease, BackendError>> {
        let outcome = self.locks.force_release(key.qualified());
        Box::pin(std::future::ready(Ok(outcome)))
    }
}

/// A page of at most `size` keys after `cursor`, out of `keys` (whole keys as the tables hold
/// them): the keys of `op`'s namespace, and with `only_op` only those of its operation.
fn page_of(
    keys: Vec<Arc<str>>,
    op: &CallKey,
    only_op: bool,
    cursor: Option<&Cursor>,
    size: usize,
) -> Result<Page<CallKey>, BackendError> {
    let after = match cursor {
        None => None,
        Some(cursor) => Some(read_cursor(cursor).ok_or_else(|| {
            BackendError::new(
                BackendErrorKind::Config,
                format!("listing: `{cursor}` is not a cursor of the in-process provider"),
            )
            .with_key(op)
        })?),
    };
    // Everything before the shown form: the namespace and its `:`.
    let prefix = &op.qualified()[..op.qualified().len() - op.op_key().len()];
    let mut found: Vec<CallKey> = keys
        .iter()
        .filter_map(|full| full.strip_prefix(prefix))
        .filter(|shown| after.as_deref().is_none_or(|after| *shown > after))
        .filter_map(|shown| op.with_op_key(shown).ok())
        .filter(|key| !only_op || key.is_of_operation(op.op_key()))
        .collect();
    found.sort_unstable_by(|a, b| a.op_key().cmp(b.op_key()));
    let next = (found.len() > size).then(|| write_cursor(found[size - 1].op_key()));
    found.truncate(size);
    Ok(Page { items: found, next })
}

fn write_cursor(after: &str) -> Cursor {
    let mut text = String::with_capacity(2 + after.len() * 2);
    text.push_str("m.");
    for b in after.bytes() {
        text.push_str(&format!("{b:02x}"));
    }
    Cursor::new(text)
}

fn read_cursor(cursor: &Cursor) -> Option<String> {
    let hex = cursor.as_str().strip_prefix("m.")?;
    if hex.len() % 2 != 0 {
        return None;
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

impl CacheStore for MemoryProvider {
    fn cache_get<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<Option<CacheEntry>, BackendError>> {
        let now = Instant::now();
        let found = match self.cache.get(key) {
            Some(entry) if entry.1 > now => Some(CacheEntry {
                value: entry.0.to_vec(),
                ttl_left: Some(entry.1 - now),
            }),
            Some(entry) => {
                drop(entry);
                self.cache.remove_if(key, |_, (_, expires)| *expires <= now);
                None
            }
            None => None,
        };
        Box::pin(std::future::ready(Ok(found)))
    }

    fn cache_set<'a>(
        &'a self,
        key: &'a CallKey,
        value: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        let now = Instant::now();
        let expires = crate::deadline_after(now, ttl);
        self.cache.insert(key.clone(), (Arc::from(value), expires));
        if self.cache_sets.fetch_add(1, Ordering::Relaxed) + 1 >= CACHE_SWEEP_EVERY {
            self.cache_sets.store(0, Ordering::Relaxed);
            self.cache.retain(|_, (_, expires)| *expires > now);
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn cache_delete<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        let now = Instant::now();
        let removed = self.cache.remove(key);
        Box::pin(std::future::ready(Ok(
            removed.is_some_and(|(_, (_, expires))| expires > now)
        )))
    }
}

/// Cluster-scope flights live in the provider's flight table (`flights.rs`).
impl FlightStore for MemoryProvider {
    fn flight_claim<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<FlightClaim, BackendError>> {
        self.flights.flight_claim(key, owner, lease)
    }

    fn flight_renew<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        self.flights.flight_renew(key, owner, lease)
    }

    fn flight_finish<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        outcome: &'a [u8],
        hand_over: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        self.flights.flight_finish(key, owner, outcome, hand_over)
    }

    fn flight_abandon<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        self.flights.flight_abandon(key, owner)
    }

    fn flight_wait<'a>(
        &'a self,
        key: &'a CallKey,
        leader: OwnerToken,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<FlightWait, BackendError>> {
        self.flights.flight_wait(key, leader, timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coord_contract::{Fingerprint, LossCause, RecordStatus};

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
}
