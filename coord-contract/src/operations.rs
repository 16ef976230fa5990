//! What an operator can see and do with a provider's state: inspect a lock or a record, list
//! the locks and records of one operation, force a lock free. (Purging a record is
//! [`IdempotencyStore::purge`](crate::IdempotencyStore::purge).)
//!
//! A provider implements [`Operations`]; applications and tools go through coord-core's
//! `Coordinator::operator`, whose `Operator` handle works in the coordinator's namespace and
//! logs every destructive call.
//!
//! Everything here takes and returns [`CallKey`]s, shown as `operation:parts`: the form
//! errors, call reports and log lines print, and the form a listing yields, so an operator can
//! paste any of them back (through [`CallKey::from_op_key`]).

use std::fmt;
use std::time::Duration;

use crate::BoxFuture;
use crate::call_key::CallKey;
use crate::error::{BackendError, BackendErrorKind};
use crate::tokens::{FencingToken, OwnerToken};

/// The most keys one listing page holds. Larger requested limits are lowered to this.
pub const MAX_PAGE: usize = 1000;

/// A lock as the backend holds it now.
///
/// A snapshot: the lock may change the moment after it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock's key.
    pub key: CallKey,
    /// The holder, or `None` when the lock is free (never taken, released, or its lease ran
    /// out).
    pub holder: Option<LockHolder>,
    /// The newest fencing token minted for the key that the backend still keeps, if any. While
    /// a holder whose acquisition was fenced holds the lock, this is that holder's token. It
    /// may be an earlier holder's (an unfenced holder after a fenced one; a free lock whose
    /// counter the backend keeps, as Redis does for a while after each mint), and `None` says
    /// only that the backend keeps none.
    pub fencing_token: Option<FencingToken>,
}

impl LockInfo {
    /// A lock as `key`'s state was found.
    pub fn new(
        key: CallKey,
        holder: Option<LockHolder>,
        fencing_token: Option<FencingToken>,
    ) -> LockInfo {
        LockInfo {
            key,
            holder,
            fencing_token,
        }
    }
}

/// Who holds a lock, and for how long yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockHolder {
    /// The token of the holding acquisition (as the holder's own logs show it).
    pub owner: OwnerToken,
    /// Time left on the lease, by the backend's clock, when it was read. A holder that renews
    /// pushes it back.
    pub lease_left: Duration,
    /// Who waits for the lock, as far as the backend knows.
    pub waiters: Waiters,
}

impl LockHolder {
    /// A holder as found.
    pub fn new(owner: OwnerToken, lease_left: Duration, waiters: Waiters) -> LockHolder {
        LockHolder {
            owner,
            lease_left,
            waiters,
        }
    }
}

/// Who waits for a held lock, as far as the backend knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Waiters {
    /// The backend keeps the queue: exactly this many callers wait (the in-process provider).
    Counted(usize),
    /// The backend keeps only a flag (Redis): `true` when a caller has announced that it waits
    /// for the current holder (it may have given up since); `false` when none has, although a
    /// caller that has only just started waiting may not have announced itself yet.
    Flagged(bool),
}

/// One hold of a semaphore or of a read-write lock, as the backend holds it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct HoldInfo {
    /// The token of the holding acquisition (as the holder's own logs show it).
    pub owner: OwnerToken,
    /// Time left on the hold's lease, by the backend's clock, when it was read. A holder that
    /// renews pushes it back.
    pub lease_left: Duration,
    /// The hold's fencing token, when the backend keeps one for it.
    pub fencing_token: Option<FencingToken>,
}

impl HoldInfo {
    /// A hold as found.
    pub fn new(
        owner: OwnerToken,
        lease_left: Duration,
        fencing_token: Option<FencingToken>,
    ) -> HoldInfo {
        HoldInfo {
            owner,
            lease_left,
            fencing_token,
        }
    }
}

/// The permits of the semaphore at one key, as the backend holds them now.
///
/// A snapshot: permits may be taken or released the moment after it was read. The semaphore's
/// limit is not stored (each caller passes its own `permits`), so it is not shown.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SemaphoreInfo {
    /// The semaphore's key.
    pub key: CallKey,
    /// Every permit whose lease has not ended, soonest-ending first. Empty when none is held.
    pub permits: Vec<HoldInfo>,
    /// Who waits for a permit, as far as the backend knows (see [`Waiters`]).
    pub waiters: Waiters,
}

impl SemaphoreInfo {
    /// A semaphore as found.
    pub fn new(key: CallKey, permits: Vec<HoldInfo>, waiters: Waiters) -> SemaphoreInfo {
        SemaphoreInfo {
            key,
            permits,
            waiters,
        }
    }
}

/// The claim a waiting writer leaves on a read-write lock: while it lasts, no new reader gets
/// in (writer preference).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriterClaim {
    /// The waiting writer's owner token.
    pub owner: OwnerToken,
    /// Time until the claim ends unless the writer re-asserts it (a live waiting writer does,
    /// at least twice per claim; a crashed one does not).
    pub claim_left: Duration,
}

impl WriterClaim {
    /// A claim as found.
    pub fn new(owner: OwnerToken, claim_left: Duration) -> WriterClaim {
        WriterClaim { owner, claim_left }
    }
}

/// The read-write lock at one key, as the backend holds it now.
///
/// A snapshot: holds may change the moment after it was read. Readers and the writer exclude
/// each other, so at most one of `readers` and `writer` is non-empty unless the backend's
/// state is inconsistent (which is reported as [`BackendErrorKind::Corrupt`] instead).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwLockInfo {
    /// The read-write lock's key.
    pub key: CallKey,
    /// Every read hold whose lease has not ended, soonest-ending first.
    pub readers: Vec<HoldInfo>,
    /// The write hold, when one is live.
    pub writer: Option<HoldInfo>,
    /// The waiting writer whose claim is live, if any. Only one claim exists per key: further
    /// waiting writers wait behind it and are counted in `waiters` only.
    pub waiting_writer: Option<WriterClaim>,
    /// Who waits for the lock in either mode, as far as the backend knows (see [`Waiters`]).
    pub waiters: Waiters,
}

impl RwLockInfo {
    /// A read-write lock as found.
    pub fn new(
        key: CallKey,
        readers: Vec<HoldInfo>,
        writer: Option<HoldInfo>,
        waiting_writer: Option<WriterClaim>,
        waiters: Waiters,
    ) -> RwLockInfo {
        RwLockInfo {
            key,
            readers,
            writer,
            waiting_writer,
            waiters,
        }
    }

    /// True when nobody holds the lock (no live reader or writer).
    pub fn is_free(&self) -> bool {
        self.readers.is_empty() && self.writer.is_none()
    }
}

/// What an idempotency record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RecordStatus {
    /// An in-flight marker within its lease: a call is running (or its owner died and the
    /// lease has not run out yet).
    InFlight,
    /// A marker whose lease ended without completion, kept because the operation asked for it
    /// (`on_abandoned = "fail"`): whether the call's side effects happened is unknown, and
    /// duplicates get `CoordError::OutcomeUnknown` until the record is purged or expires.
    Abandoned,
    /// A stored outcome, replayed to duplicates until its retention ends.
    Completed,
}

impl RecordStatus {
    /// A short, stable name: `in_flight`, `abandoned`, `completed`.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordStatus::InFlight => "in_flight",
            RecordStatus::Abandoned => "abandoned",
            RecordStatus::Completed => "completed",
        }
    }
}

impl fmt::Display for RecordStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An idempotency record as the backend holds it now.
///
/// A snapshot: the record may change the moment after it was read. Durations are measured by
/// the backend's clock (Redis: the server's) when the record was read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordInfo {
    /// The record's key.
    pub key: CallKey,
    /// What the record is.
    pub status: RecordStatus,
    /// The marker's owner, or the owner whose completion stored the outcome; `None` when the
    /// backend does not know it (Redis records completed by older versions of coord).
    pub owner: Option<OwnerToken>,
    /// Time since the record was written in its current form: since the claim that made the
    /// marker (in flight or abandoned), or since the outcome was stored (completed). `None`
    /// when the backend does not know (records written by older versions of coord).
    pub age: Option<Duration>,
    /// Time left on the marker's lease: `Some` for [`RecordStatus::InFlight`] only.
    pub lease_left: Option<Duration>,
    /// Time until the backend drops the record: the retention left of a completed outcome, the
    /// keep period left of an abandoned marker, and for a marker in flight the end of its lease
    /// (plus the keep period, when the operation keeps abandoned markers).
    pub expires_in: Duration,
    /// Size of the stored outcome in bytes, as encoded: `Some` for
    /// [`RecordStatus::Completed`] only.
    pub payload_bytes: Option<usize>,
    /// Whether a fingerprint of the call's parameters is stored with the record (the operation
    /// fingerprints its parameters).
    pub has_fingerprint: bool,
}

impl RecordInfo {
    /// A record as found: its key, what it is, and the time until the backend drops it, with
    /// nothing else known (no owner, age, lease, payload size or fingerprint). A provider adds
    /// what its backend knows with the `with_*` methods, e.g.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use coord_contract::{CallKey, RecordInfo, RecordStatus};
    /// let key = CallKey::builder("shop", "charge").part("order-7").finish();
    /// let info = RecordInfo::new(key, RecordStatus::Completed, Duration::from_secs(60))
    ///     .with_age(Some(Duration::from_secs(3)))
    ///     .with_payload_bytes(Some(42));
    /// assert_eq!(info.payload_bytes, Some(42));
    /// assert_eq!(info.owner, None);
    /// ```
    ///
    /// The struct is non-exhaustive: providers outside this crate build it here; a field added
    /// later starts unknown and gets a `with_*` method of its own.
    pub fn new(key: CallKey, status: RecordStatus, expires_in: Duration) -> RecordInfo {
        RecordInfo {
            key,
            status,
            owner: None,
            age: None,
            lease_left: None,
            expires_in,
            payload_bytes: None,
            has_fingerprint: false,
        }
    }

    /// Sets [`RecordInfo::owner`] (`None`: the backend does not know it).
    pub fn with_owner(mut self, owner: Option<OwnerToken>) -> RecordInfo {
        self.owner = owner;
        self
    }

    /// Sets [`RecordInfo::age`] (`None`: the backend does not know it).
    pub fn with_age(mut self, age: Option<Duration>) -> RecordInfo {
        self.age = age;
        self
    }

    /// Sets [`RecordInfo::lease_left`] (`Some` for a marker in flight only).
    pub fn with_lease_left(mut self, lease_left: Option<Duration>) -> RecordInfo {
        self.lease_left = lease_left;
        self
    }

    /// Sets [`RecordInfo::payload_bytes`] (`Some` for a completed record only).
    pub fn with_payload_bytes(mut self, payload_bytes: Option<usize>) -> RecordInfo {
        self.payload_bytes = payload_bytes;
        self
    }

    /// Sets [`RecordInfo::has_fingerprint`].
    pub fn with_fingerprint(mut self, has_fingerprint: bool) -> RecordInfo {
        self.has_fingerprint = has_fingerprint;
        self
    }
}

/// Where a listing resumes: the `next` of a [`Page`], passed back as it is.
///
/// Opaque and provider-specific, but plain printable text (no whitespace), so a tool can print
/// it and read it back. A provider refuses a cursor it did not make with a
/// [`BackendErrorKind::Config`] error.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Cursor(String);

impl Cursor {
    /// Wraps a cursor's text (a provider making one, or a tool reading one back).
    pub fn new(text: impl Into<String>) -> Cursor {
        Cursor(text.into())
    }

    /// The cursor's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One request for a page of keys of one operation.
#[derive(Debug, Clone, Copy)]
pub struct ListRequest<'a> {
    /// The key of the operation with no parts (`CallKey::builder(namespace, operation)
    /// .finish()`, or `Coordinator::key(operation).finish()`): it names the namespace and
    /// the operation exactly as the keys to list are written. Listed: that key itself and every
    /// key of the operation with parts (see [`CallKey::is_of_operation`]).
    pub operation: &'a CallKey,
    /// `None` for the first page; then the previous page's [`Page::next`].
    pub cursor: Option<&'a Cursor>,
    /// The most keys the page may hold: between 1 and [`MAX_PAGE`] (a provider treats 0 as 1
    /// and anything above [`MAX_PAGE`] as [`MAX_PAGE`]).
    pub limit: usize,
}

impl ListRequest<'_> {
    /// [`ListRequest::limit`] brought into `1..=MAX_PAGE`.
    pub fn page_size(&self) -> usize {
        self.limit.clamp(1, MAX_PAGE)
    }
}

/// One request for a page of keys of every operation of one namespace: what has state there,
/// for an operator who does not know the operations' names yet.
#[derive(Debug, Clone, Copy)]
pub struct NamespaceListRequest<'a> {
    /// A key in the namespace to list, such as `CallKey::builder(namespace, "any").finish()`:
    /// only its namespace is read. Listed keys are made from it with [`CallKey::with_op_key`],
    /// so none knows its operation for sure: [`CallKey::shown_operation`] reads it from the
    /// shown form.
    pub namespace: &'a CallKey,
    /// `None` for the first page; then the previous page's [`Page::next`].
    pub cursor: Option<&'a Cursor>,
    /// The most keys the page may hold, as [`ListRequest::limit`].
    pub limit: usize,
}

impl NamespaceListRequest<'_> {
    /// [`NamespaceListRequest::limit`] brought into `1..=MAX_PAGE`.
    pub fn page_size(&self) -> usize {
        self.limit.clamp(1, MAX_PAGE)
    }
}

/// One page of a listing.
///
/// # Promised
/// * At most the request's [`page_size`](ListRequest::page_size) items.
/// * Following `next` until it is `None` visits every key that existed for the whole
///   listing; a key created or removed meanwhile may or may not appear, and a key may appear
///   twice (Redis `SCAN` semantics). The order is the provider's.
/// * A page may hold fewer items than asked for, even none, while `next` is `Some`: keep
///   going until `next` is `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    /// The items of this page.
    pub items: Vec<T>,
    /// Where the next page starts; `None` when the listing is complete.
    pub next: Option<Cursor>,
}

/// What forcing a lock free found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForcedRelease {
    /// `owner` held the lock; now it does not. A waiter (if any) is woken and may take it at
    /// once. The former holder is not told at once: it learns of the loss at its next renewal
    /// ([`LossCause::ForceReleased`](crate::LossCause::ForceReleased)), or when it releases
    /// ([`ReleaseOutcome::ForceReleased`](crate::ReleaseOutcome::ForceReleased)); until then its
    /// body may still be running, which is what fencing tokens are for (the fencing counter is
    /// left as it was, so the next fenced holder's token is greater than the former holder's).
    Released {
        /// The former holder.
        owner: OwnerToken,
    },
    /// The lock was free; nothing changed.
    NotHeld,
    /// The lock's key held a value coord did not write (corrupt state, which every other call
    /// refuses), and it was removed.
    RemovedCorrupt,
}

/// An operator's view of a provider: inspect, list, force free.
///
/// Every method has a default that fails with a [`BackendErrorKind::Config`] error saying the
/// provider does not support it, so a provider can opt out with `impl Operations for MyProvider
/// {}`; coord's in-process and Redis providers implement all of them, and the
/// `coord-conformance` suite checks them.
///
/// # Contract
/// * Reads change nothing, and report what coord itself would see: a lock whose lease ran
///   out is free, a record past its lease, keep period or retention is absent.
/// * State under coord's keys that coord did not write is an error of kind
///   [`BackendErrorKind::Corrupt`] naming the key, never a made-up holder or record.
/// * Listings follow [`Page`]'s promises, and never block the backend on a whole-keyspace
///   command (no Redis `KEYS`).
/// * `force_release` frees the lock whoever holds it, as the holder's own release would (a
///   waiter is woken), and leaves the fencing counter alone. A provider should remember the
///   released owner (coord's providers keep a marker for the rest of the released lease plus
///   [`FORCED_RELEASE_MEMORY`](crate::FORCED_RELEASE_MEMORY)) so that the former holder's
///   release and renewal report a forced release rather than a lapse; one that does not makes
///   the former holder report that it cannot tell the two apart.
pub trait Operations: Send + Sync + 'static {
    /// The lock at `key`.
    fn inspect_lock<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<LockInfo, BackendError>> {
        unsupported(key, "inspecting a lock")
    }

    /// The idempotency record at `key`, or `None` when there is none.
    fn inspect_record<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<Option<RecordInfo>, BackendError>> {
        unsupported(key, "inspecting a record")
    }

    /// A page of the keys of `req.operation` whose lock is held.
    fn list_locks<'a>(
        &'a self,
        req: ListRequest<'a>,
    ) -> BoxFuture<'a, Result<Page<CallKey>, BackendError>> {
        unsupported(req.operation, "listing locks")
    }

    /// A page of the keys of `req.operation` that have an idempotency record.
    fn list_records<'a>(
        &'a self,
        req: ListRequest<'a>,
    ) -> BoxFuture<'a, Result<Page<CallKey>, BackendError>> {
        unsupported(req.operation, "listing records")
    }

    /// Frees the lock at `key` whoever holds it.
    fn force_release<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<ForcedRelease, BackendError>> {
        unsupported(key, "forcing a lock free")
    }

    /// A page of the keys, of every operation of `req.namespace`, whose lock is held. Follows
    /// [`Page`]'s promises.
    fn list_namespace_locks<'a>(
        &'a self,
        req: NamespaceListRequest<'a>,
    ) -> BoxFuture<'a, Result<Page<CallKey>, BackendError>> {
        unsupported(req.namespace, "listing the locks of a namespace")
    }

    /// A page of the keys, of every operation of `req.namespace`, that have an idempotency
    /// record. Follows [`Page`]'s promises.
    fn list_namespace_records<'a>(
        &'a self,
        req: NamespaceListRequest<'a>,
    ) -> BoxFuture<'a, Result<Page<CallKey>, BackendError>> {
        unsupported(req.namespace, "listing the records of a namespace")
    }
    /// The permits held of the semaphore at `key` (`permits = N`, `Coordinator::semaphore`):
    /// what coord itself would count, so permits whose lease ended are left out. A semaphore
    /// nobody holds is an empty [`SemaphoreInfo`], not an error. Added after the methods
    /// above: a provider without it answers a [`BackendErrorKind::Config`] error saying so.
    fn inspect_semaphore<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<SemaphoreInfo, BackendError>> {
        unsupported(key, "inspecting a semaphore")
    }

    /// The read-write lock at `key` (`mode = "read" | "write"`, `Coordinator::rw_lock`): its
    /// live readers, its writer and its waiting writer's claim, leaving out whatever ended. A
    /// lock nobody holds is an empty [`RwLockInfo`], not an error. Added after the methods
    /// above: a provider without it answers a [`BackendErrorKind::Config`] error saying so.
    fn inspect_rw_lock<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<RwLockInfo, BackendError>> {
        unsupported(key, "inspecting a read-write lock")
    }
}

fn unsupported<'a, T: Send + 'a>(
    key: &CallKey,
    what: &str,
) -> BoxFuture<'a, Result<T, BackendError>> {
    let err = BackendError::new(
        BackendErrorKind::Config,
        format!("{what}: this provider does not implement coord's operations API"),
    )
    .with_key(key);
    Box::pin(std::future::ready(Err(err)))
}

impl<P: Operations> Operations for std::sync::Arc<P> {
    fn inspect_lock<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<LockInfo, BackendError>> {
        (**self).inspect_lock(key)
    }

    fn inspect_record<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<Option<RecordInfo>, BackendError>> {
        (**self).inspect_record(key)
    }

    fn list_locks<'a>(
        &'a self,
        req: ListRequest<'a>,
    ) -> BoxFuture<'a, Result<Page<CallKey>, BackendError>> {
        (**self).list_locks(req)
    }

    fn list_records<'a>(
        &'a self,
        req: ListRequest<'a>,
    ) -> BoxFuture<'a, Result<Page<CallKey>, BackendError>> {
        (**self).list_records(req)
    }

    fn force_release<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<ForcedRelease, BackendError>> {
        (**self).force_release(key)
    }

    fn list_namespace_locks<'a>(
        &'a self,
        req: NamespaceListRequest<'a>,
    ) -> BoxFuture<'a, Result<Page<CallKey>, BackendError>> {
        (**self).list_namespace_locks(req)
    }

    fn list_namespace_records<'a>(
        &'a self,
        req: NamespaceListRequest<'a>,
    ) -> BoxFuture<'a, Result<Page<CallKey>, BackendError>> {
        (**self).list_namespace_records(req)
    }

    fn inspect_semaphore<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<SemaphoreInfo, BackendError>> {
        (**self).inspect_semaphore(key)
    }

    fn inspect_rw_lock<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<RwLockInfo, BackendError>> {
        (**self).inspect_rw_lock(key)
    }
}
