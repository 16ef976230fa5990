//! Test doubles shared by the integration tests: a provider that counts calls and can be told
//! to fail, and a tracing layer that records what coord's spans carried.

use coord_core::CallKey;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_core::memory::MemoryProvider;
use coord_core::provider::{
    BackendErrorKind, BoxFuture, CacheEntry, CacheStore, ClaimOutcome, ClaimRequest,
    CompleteOutcome, CompleteRequest, IdempotencyStore, LockGrant, LockProvider, LockRequest,
    OwnerToken, ReleaseOutcome, RenewOutcome, ReplicaAcks, replicas,
};
use coord_core::{BackendError, Coordinator, LossCause};

/// The in-process provider, wrapped to count calls and to fail on demand.
#[derive(Debug, Default)]
pub struct InstrumentedProvider {
    /// The provider doing the work.
    pub inner: MemoryProvider,
    /// `acquire` calls.
    pub acquires: AtomicUsize,
    /// `release` calls (including detached ones).
    pub releases: AtomicUsize,
    /// `claim` calls.
    pub claims: AtomicUsize,
    /// When set, every lock call fails as if the backend were unreachable.
    pub fail_locks: AtomicBool,
    /// When set, every idempotency call fails as if the backend were unreachable.
    pub fail_records: AtomicBool,
    /// `renew` and `renew_marker` calls.
    pub renewals: AtomicUsize,
    /// When set, renewals fail as if the backend were unreachable (acquire still works).
    pub fail_renewals: AtomicBool,
    /// When set, renewals report the lease lost (as if another owner held it).
    pub lose_renewals: AtomicBool,
    /// `cache_get` calls.
    pub cache_gets: AtomicUsize,
    /// `cache_set` calls.
    pub cache_sets: AtomicUsize,
    /// When set, every shared cache call fails as if the backend were unreachable.
    pub fail_cache: AtomicBool,
    /// `flight_claim` calls (cluster-scope single-flight).
    pub flight_claims: AtomicUsize,
    /// When set, every flight call fails as if the backend were unreachable.
    pub fail_flights: AtomicBool,
    /// When set, a flight claim is made but its reply is lost (reported as a fault).
    pub lose_flight_claim_replies: AtomicBool,
    /// When set, flight renewals fail as if the backend were unreachable.
    pub fail_flight_renewals: AtomicBool,
    /// `flight_wait` calls (a cluster follower waiting on another instance's leader), counted
    /// when they start.
    pub flight_waits: AtomicUsize,
    /// `flight_finish` calls (hand-over writes), counted when they start.
    pub flight_finishes: AtomicUsize,
    /// When set, hand-over writes fail as if the backend were unreachable.
    pub fail_flight_finishes: AtomicBool,
    /// When set, every hand-over write first takes a permit from this semaphore (so a test
    /// holds writes back until it adds permits).
    pub flight_finish_gate: Mutex<Option<Arc<tokio::sync::Semaphore>>>,
    /// The operation's replica acknowledgement each flight claim, renewal and hand-over write
    /// found in scope while it was polled (`"claim"`, `"renew"`, `"finish"`), in order.
    pub flight_acks_seen: Mutex<Vec<(&'static str, Option<ReplicaAcks>)>>,
    /// When set, a lock acquire takes nothing and fails with `Timeout`, and its grant lands
    /// (on the in-process table) with the first release of its owner that follows, which
    /// answers `NotHeld`: a grant whose commit became visible only after the clean-up looked
    /// (a commit waiting for a synchronous standby).
    pub late_grants: AtomicBool,
    /// The grants of acquires that failed under `late_grants`, not landed yet.
    pub grants_to_land: Mutex<Vec<(CallKey, OwnerToken, Duration, bool)>>,
}

impl InstrumentedProvider {
    /// A fresh provider and a coordinator over it in namespace `ns`.
    pub fn coordinator(ns: &str) -> (Arc<InstrumentedProvider>, Coordinator) {
        let provider = Arc::new(InstrumentedProvider::default());
        let coordinator = Coordinator::builder()
            .namespace(ns)
            .provider(provider.clone())
            .build()
            .expect("valid test coordinator");
        (provider, coordinator)
    }

    fn forced_renewal<'a>(&self) -> Option<BoxFuture<'a, Result<RenewOutcome, BackendError>>> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        if self.fail_renewals.load(Ordering::SeqCst) {
            return Some(Box::pin(async { Err(Self::fault()) }));
        }
        if self.lose_renewals.load(Ordering::SeqCst) {
            return Some(Box::pin(async {
                Ok(RenewOutcome::Lost(LossCause::TakenByOther))
            }));
        }
        None
    }

    /// `fut`, noting what replica acknowledgement is in scope when it is first polled (where a
    /// provider reads it), as `what`.
    fn seeing_acks<'a, T: 'a>(
        &'a self,
        what: &'static str,
        fut: BoxFuture<'a, T>,
    ) -> BoxFuture<'a, T> {
        Box::pin(async move {
            self.flight_acks_seen
                .lock()
                .unwrap()
                .push((what, replicas::in_scope()));
            fut.await
        })
    }

    fn fault() -> BackendError {
        BackendError::new(
            BackendErrorKind::Unavailable,
            "injected fault: backend down",
        )
    }
}

/// No operator support: these tests never inspect or list.
impl coord_core::provider::Operations for InstrumentedProvider {}

/// No semaphores: these tests take plain locks only.
impl coord_core::provider::SemaphoreStore for InstrumentedProvider {}
impl coord_core::provider::RwLockStore for InstrumentedProvider {}
impl coord_core::provider::MultiLockStore for InstrumentedProvider {}

impl LockProvider for InstrumentedProvider {
    fn acquire<'a>(
        &'a self,
        req: LockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<LockGrant>, BackendError>> {
        self.acquires.fetch_add(1, Ordering::SeqCst);
        if self.fail_locks.load(Ordering::SeqCst) {
            return Box::pin(async { Err(Self::fault()) });
        }
        if self.late_grants.load(Ordering::SeqCst) {
            self.grants_to_land.lock().unwrap().push((
                req.key.clone(),
                req.owner,
                req.lease,
                req.fenced,
            ));
            return Box::pin(async {
                Err(BackendError::new(
                    BackendErrorKind::Timeout,
                    "injected fault: no answer in time (the grant lands later)",
                ))
            });
        }
        self.inner.acquire(req)
    }

    fn release<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        if self.fail_locks.load(Ordering::SeqCst) {
            return Box::pin(async { Err(Self::fault()) });
        }
        let landing = {
            let mut to_land = self.grants_to_land.lock().unwrap();
            to_land
                .iter()
                .position(|(k, o, _, _)| k == key && *o == owner)
                .map(|at| to_land.remove(at))
        };
        if let Some((_, _, lease, fenced)) = landing {
            // This release finds nothing; the grant lands right after it.
            return Box::pin(async move {
                let landed = self
                    .inner
                    .acquire(LockRequest {
                        key,
                        owner,
                        lease,
                        wait: Duration::ZERO,
                        fenced,
                    })
                    .await;
                assert!(matches!(landed, Ok(Some(_))), "the late grant landed");
                Ok(ReleaseOutcome::NotHeld)
            });
        }
        self.inner.release(key, owner)
    }

    fn renew<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        if let Some(forced) = self.forced_renewal() {
            return forced;
        }
        self.inner.renew(key, owner, lease)
    }
}

impl IdempotencyStore for InstrumentedProvider {
    fn claim<'a>(
        &'a self,
        req: ClaimRequest<'a>,
    ) -> BoxFuture<'a, Result<ClaimOutcome, BackendError>> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        if self.fail_records.load(Ordering::SeqCst) {
            return Box::pin(async { Err(Self::fault()) });
        }
        self.inner.claim(req)
    }

    fn complete<'a>(
        &'a self,
        req: CompleteRequest<'a>,
    ) -> BoxFuture<'a, Result<CompleteOutcome, BackendError>> {
        self.inner.complete(req)
    }

    fn abandon<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        self.inner.abandon(key, owner)
    }

    fn end_marker_lease<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        self.inner.end_marker_lease(key, owner)
    }

    fn wait_settled<'a>(
        &'a self,
        key: &'a CallKey,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.inner.wait_settled(key, timeout)
    }

    fn purge<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        self.inner.purge(key)
    }

    fn renew_marker<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        if let Some(forced) = self.forced_renewal() {
            return forced;
        }
        self.inner.renew_marker(key, owner, lease)
    }
}

/// One span named `coord`, as a [`SpanRecorder`] saw it.
#[derive(Debug, Clone, Default)]
pub struct RecordedSpan {
    /// Every field recorded on the span, rendered as text.
    pub fields: BTreeMap<String, String>,
}

/// A tracing layer that keeps the fields of every `coord` span, and counts warnings whose
/// message contains a given text.
#[derive(Debug, Clone, Default)]
pub struct SpanRecorder {
    spans: Arc<Mutex<Vec<(tracing::span::Id, RecordedSpan)>>>,
    warnings: Arc<Mutex<Vec<String>>>,
}

struct FieldText<'a>(&'a mut BTreeMap<String, String>);

impl tracing::field::Visit for FieldText<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl SpanRecorder {
    /// Every `coord` span seen so far, in creation order.
    pub fn spans(&self) -> Vec<RecordedSpan> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .map(|(_, s)| s.clone())
            .collect()
    }

    /// The messages of every warning seen so far.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.lock().unwrap().clone()
    }
}

impl<S> tracing_subscriber::Layer<S> for SpanRecorder
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if attrs.metadata().name() != "coord" {
            return;
        }
        let mut span = RecordedSpan::default();
        attrs.record(&mut FieldText(&mut span.fields));
        self.spans.lock().unwrap().push((id.clone(), span));
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut spans = self.spans.lock().unwrap();
        if let Some((_, span)) = spans.iter_mut().rev().find(|(sid, _)| sid == id) {
            values.record(&mut FieldText(&mut span.fields));
        }
    }

    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if *event.metadata().level() == tracing::Level::WARN {
            let mut fields = BTreeMap::new();
            event.record(&mut FieldText(&mut fields));
            self.warnings
                .lock()
                .unwrap()
                .push(fields.remove("message").unwrap_or_default());
        }
    }
}

/// Polls `check` until it returns true, failing with `what` after `within`. For clean-up that
/// providers may finish on another task (a detached release), where "promptly" means well
/// inside the lease, not "before the next instruction".
pub async fn eventually<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {within:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// True when nobody holds the lock `key`: a probe acquires it (one attempt) and releases it.
pub async fn lock_is_free(c: &Coordinator, key: &CallKey) -> bool {
    let probe = OwnerToken::new();
    let got = c
        .lock_provider()
        .acquire(LockRequest {
            key,
            owner: probe,
            lease: Duration::from_secs(30),
            wait: Duration::ZERO,
            fenced: false,
        })
        .await
        .expect("probe acquire");
    if got.is_some() {
        c.lock_provider()
            .release(key, probe)
            .await
            .expect("probe release");
    }
    got.is_some()
}

impl CacheStore for InstrumentedProvider {
    fn cache_get<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<Option<CacheEntry>, BackendError>> {
        self.cache_gets.fetch_add(1, Ordering::SeqCst);
        if self.fail_cache.load(Ordering::SeqCst) {
            return Box::pin(async { Err(Self::fault()) });
        }
        self.inner.cache_get(key)
    }

    fn cache_set<'a>(
        &'a self,
        key: &'a CallKey,
        value: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.cache_sets.fetch_add(1, Ordering::SeqCst);
        if self.fail_cache.load(Ordering::SeqCst) {
            return Box::pin(async { Err(Self::fault()) });
        }
        self.inner.cache_set(key, value, ttl)
    }

    fn cache_delete<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        if self.fail_cache.load(Ordering::SeqCst) {
            return Box::pin(async { Err(Self::fault()) });
        }
        self.inner.cache_delete(key)
    }
}

impl coord_core::provider::FlightStore for InstrumentedProvider {
    fn flight_claim<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<coord_core::provider::FlightClaim, BackendError>> {
        self.flight_claims.fetch_add(1, Ordering::SeqCst);
        if self.fail_flights.load(Ordering::SeqCst) {
            return Box::pin(async { Err(Self::fault()) });
        }
        if self.lose_flight_claim_replies.load(Ordering::SeqCst) {
            return Box::pin(async move {
                let _landed = self.inner.flight_claim(key, owner, lease).await;
                Err(Self::fault())
            });
        }
        self.seeing_acks("claim", self.inner.flight_claim(key, owner, lease))
    }

    fn flight_renew<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        if self.fail_flights.load(Ordering::SeqCst)
            || self.fail_flight_renewals.load(Ordering::SeqCst)
        {
            return Box::pin(async { Err(Self::fault()) });
        }
        self.seeing_acks("renew", self.inner.flight_renew(key, owner, lease))
    }

    fn flight_finish<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        outcome: &'a [u8],
        hand_over: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        self.flight_finishes.fetch_add(1, Ordering::SeqCst);
        if self.fail_flights.load(Ordering::SeqCst) {
            return Box::pin(async { Err(Self::fault()) });
        }
        let gate = self.flight_finish_gate.lock().unwrap().clone();
        let fail = self.fail_flight_finishes.load(Ordering::SeqCst);
        self.seeing_acks(
            "finish",
            Box::pin(async move {
                if let Some(gate) = gate {
                    gate.acquire().await.expect("the gate stays open").forget();
                }
                if fail {
                    return Err(Self::fault());
                }
                self.inner
                    .flight_finish(key, owner, outcome, hand_over)
                    .await
            }),
        )
    }

    /// This double's hand-over request "leaves the process" when it is made (counted), before
    /// the gate that holds its answer back, as a request written to a slow server would.
    fn flight_finish_noting_sent<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        outcome: &'a [u8],
        hand_over: Duration,
        sent: coord_core::provider::SentNotice,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let finish = self.flight_finish(key, owner, outcome, hand_over);
        sent.notify();
        finish
    }

    fn flight_abandon<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        if self.fail_flights.load(Ordering::SeqCst) {
            return Box::pin(async { Err(Self::fault()) });
        }
        self.inner.flight_abandon(key, owner)
    }

    fn flight_wait<'a>(
        &'a self,
        key: &'a CallKey,
        leader: OwnerToken,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<coord_core::provider::FlightWait, BackendError>> {
        self.flight_waits.fetch_add(1, Ordering::SeqCst);
        if self.fail_flights.load(Ordering::SeqCst) {
            return Box::pin(async { Err(Self::fault()) });
        }
        self.inner.flight_wait(key, leader, timeout)
    }
}
