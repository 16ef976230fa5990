//! The cancellation harness: drops a call after exactly N polls, for N = 1, 2, … until the call
//! completes on its own, and checks after each drop that nothing of the call is left behind.
//!
//! A future dropped at an `.await` is how a call is cancelled in Rust: a `tokio::time::timeout`
//! around it that fires, a `select!` that takes another branch, an HTTP server dropping the
//! handler of a client that disconnected. Every `.await` of a call is a point where that can
//! happen, and every one must leave the key usable. [`poll_then_drop`] makes the drop points
//! enumerable: the call is polled N times (each poll after a real wake-up, so the call is at
//! its N-th suspension point: a connection being dialled, a command sent and its reply not in,
//! a script being loaded, a body half-way), then dropped. [`sweep`] walks N upwards for one
//! [`Layer`] and, after each drop and a short settle, checks:
//!
//! * the key is free: the lock can be taken, the idempotent call runs or replays (never
//!   `InFlight`; `OutcomeUnknown` only when the body had started under `on_abandoned = "fail"`,
//!   whose marker is ended as the abandoned record at once: still `InFlight` after the settle
//!   counts as a key left blocked for work that has stopped),
//!   a flight's next call runs at once, the cluster flight's claim can be taken by another
//!   owner;
//! * [`Coordinator::active_renewals`] is back to 0;
//! * the provider's own state, read through its [`Operations`](coord_core::provider::Operations),
//!   holds nothing of the call: no lock holder, no record (a completed one when the body had
//!   finished and its outcome was stored past the drop, an abandoned one only when the body
//!   had started under `on_abandoned = "fail"`, as documented).
//!
//! Clean-ups after a drop run in the background (they cannot block a `Drop`), so "free" is
//! checked as "free within [`SETTLE_LIMIT`]": a generous bound far below the 30 s leases the
//! harness uses, so a key left blocked until its lease ends is caught, and a loaded machine
//! does not make the check flaky.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use coord_core::handle::CacheScope;
use coord_core::provider::{FlightClaim, OwnerToken, RecordStatus};
use coord_core::{CallKey, CoordError, Coordinator, OnAbandoned};

/// The lease of every lock, marker and flight claim the harness makes: long enough that a key
/// left blocked until its lease ends cannot pass for one cleaned up.
pub const LEASE: Duration = Duration::from_secs(30);

/// How long after a drop the harness lets background clean-ups run before a key that is still
/// not free counts as left behind.
pub const SETTLE_LIMIT: Duration = Duration::from_secs(5);

/// The most drop points a sweep tries before it fails: a call that never completes on its own
/// within this many polls is a hang, not a long call.
pub const MAX_POLLS: usize = 10_000;

/// Polls `fut` until it completes or until it has been polled `polls` times, then drops it.
/// Returns its output if it completed within those polls, `None` if it was dropped.
///
/// Each poll after the first happens when the future's waker fires, as under any executor, so
/// the N-th drop point is the N-th place the call really suspends. `polls` of 0 counts as 1.
pub async fn poll_then_drop<F: Future>(fut: F, polls: usize) -> Option<F::Output> {
    let mut fut = pin!(fut);
    let mut left = polls.max(1);
    std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
        Poll::Ready(output) => Poll::Ready(Some(output)),
        Poll::Pending => {
            left -= 1;
            if left == 0 {
                Poll::Ready(None)
            } else {
                Poll::Pending
            }
        }
    })
    .await
}

/// A layer the harness drives, with the options that change what a drop can leave behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Layer {
    /// `#[idempotent]` with this `on_abandoned`, and marker renewal when `renewing`.
    Idempotent {
        /// What a duplicate gets after a body was stopped half-way.
        on_abandoned: OnAbandoned,
        /// Whether the in-flight marker is renewed while the body runs.
        renewing: bool,
    },
    /// `#[distributed_lock]`, with renewal when `renewing`.
    Lock {
        /// Whether the lock is renewed while the body runs.
        renewing: bool,
    },
    /// `#[single_flight]` (process scope).
    ProcessFlight,
    /// `#[single_flight(scope = "cluster")]`.
    ClusterFlight,
    /// `#[cached(scope = "shared")]`.
    CachedShared,
}

impl Layer {
    /// Every layer and option combination the harness knows.
    pub const ALL: [Layer; 9] = [
        Layer::Idempotent {
            on_abandoned: OnAbandoned::Rerun,
            renewing: false,
        },
        Layer::Idempotent {
            on_abandoned: OnAbandoned::Fail,
            renewing: false,
        },
        Layer::Idempotent {
            on_abandoned: OnAbandoned::Rerun,
            renewing: true,
        },
        Layer::Idempotent {
            on_abandoned: OnAbandoned::Fail,
            renewing: true,
        },
        Layer::Lock { renewing: false },
        Layer::Lock { renewing: true },
        Layer::ProcessFlight,
        Layer::ClusterFlight,
        Layer::CachedShared,
    ];

    fn operation(self) -> &'static str {
        match self {
            Layer::Idempotent { .. } => "cancellation.idempotent",
            Layer::Lock { .. } => "cancellation.lock",
            Layer::ProcessFlight => "cancellation.flight",
            Layer::ClusterFlight => "cancellation.cluster_flight",
            Layer::CachedShared => "cancellation.cached",
        }
    }
}

/// What one [`sweep`] did. A sweep that finds a key left blocked panics (or, from
/// [`try_sweep`], returns a [`Finding`]), so every returned sweep left nothing behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Sweep {
    /// The layer swept.
    pub layer: Layer,
    /// Calls dropped, one per drop point (N = 1 ..= `drop_points`).
    pub drop_points: usize,
    /// Of those, calls dropped after their body had started.
    pub dropped_in_body: usize,
}

/// What a [`try_sweep`] found left behind by one drop: the first drop point that left the key
/// blocked (or the provider holding something of the call) and what was found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finding {
    /// The layer swept.
    pub layer: Layer,
    /// The drop point: the call was dropped after this many polls.
    pub polls: usize,
    /// Whether the call's body had started when it was dropped.
    pub in_body: bool,
    /// What was left behind, in words (the same text [`sweep`] panics with).
    pub what: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} dropped after {} poll(s) (body started: {}): {}",
            self.layer, self.polls, self.in_body, self.what
        )
    }
}

/// Sweeps the drop points of one call of `layer`: for N = 1, 2, …, a call on a new key (from
/// the coordinator `coordinator_for(N)` returns) is dropped after N polls; after each drop the
/// key and the coordinator are checked as the [module docs](self) say. Ends at the first N at
/// which the call completes on its own, and returns the counts.
///
/// `coordinator_for` decides cold or warm: a new coordinator over a new provider per N sweeps
/// the drop points of a process's first call; one coordinator for every N, after a call that
/// completed, sweeps a warm one. Keys are the layer's operation with the variant, `tag` and N as
/// parts, so sweeps of different variants or `tag`s can share a namespace.
///
/// # Panics
///
/// With a message naming the layer, N and what was left behind, when a drop leaves anything
/// behind, or when the call has not completed on its own after [`MAX_POLLS`] polls.
pub async fn sweep<M, MF>(layer: Layer, tag: &str, coordinator_for: M) -> Sweep
where
    M: FnMut(usize) -> MF,
    MF: Future<Output = Coordinator>,
{
    match try_sweep(layer, tag, coordinator_for).await {
        Ok(sweep) => sweep,
        Err(finding) => panic!("{finding}"),
    }
}

/// [`sweep`], returning the first drop point that left something behind instead of panicking:
/// for a test that a broken layer or provider is caught, at the drop point where it breaks.
///
/// # Panics
///
/// When the call has not completed on its own after [`MAX_POLLS`] polls.
pub async fn try_sweep<M, MF>(
    layer: Layer,
    tag: &str,
    mut coordinator_for: M,
) -> Result<Sweep, Finding>
where
    M: FnMut(usize) -> MF,
    MF: Future<Output = Coordinator>,
{
    let mut sweep = Sweep {
        layer,
        drop_points: 0,
        dropped_in_body: 0,
    };
    for polls in 1..=MAX_POLLS {
        let c = coordinator_for(polls).await;
        let variant = format!("{layer:?}");
        let key = c
            .key(layer.operation())
            .part(&variant)
            .part(tag)
            .part(&polls)
            .finish();
        let started = Arc::new(AtomicBool::new(false));
        let call = one_call(&c, layer, key.clone(), started.clone());
        if poll_then_drop(call, polls).await.is_some() {
            return Ok(sweep);
        }
        sweep.drop_points += 1;
        let in_body = started.load(Ordering::SeqCst);
        if in_body {
            sweep.dropped_in_body += 1;
        }
        if let Err(what) = check_left_nothing(&c, layer, &key, in_body, polls).await {
            return Err(Finding {
                layer,
                polls,
                in_body,
                what,
            });
        }
    }
    panic!("{layer:?}: the call did not complete on its own within {MAX_POLLS} polls");
}

/// The call under test: its body marks that it started, suspends once (a drop point inside the
/// body), and answers `Ok`.
async fn one_call(c: &Coordinator, layer: Layer, key: CallKey, started: Arc<AtomicBool>) {
    let body = move || async move {
        started.store(true, Ordering::SeqCst);
        tokio::task::yield_now().await;
        Ok::<u64, CoordError>(7)
    };
    let _ = match layer {
        Layer::Idempotent {
            on_abandoned,
            renewing,
        } => {
            let mut call = c
                .idempotent(key)
                .in_flight_lease(LEASE)
                .on_abandoned(on_abandoned);
            if renewing {
                call = call.renew(LEASE / 3);
            }
            call.run(body).await
        }
        Layer::Lock { renewing } => {
            let mut call = c.lock(key).lease(LEASE);
            if renewing {
                call = call.renew(LEASE / 3);
            }
            call.run(body).await
        }
        Layer::ProcessFlight => c.single_flight(key).run(body).await,
        Layer::ClusterFlight => c.single_flight(key).cluster().lease(LEASE).run(body).await,
        Layer::CachedShared => {
            c.cached(key)
                .scope(CacheScope::Shared)
                .ttl(LEASE)
                .run(body)
                .await
        }
    };
}

/// Waits until `check` passes, for at most [`SETTLE_LIMIT`]; then fails with its last
/// complaint.
async fn eventually<C, CF>(what: &str, mut check: C) -> Result<(), String>
where
    C: FnMut() -> CF,
    CF: Future<Output = Result<(), String>>,
{
    let until = Instant::now() + SETTLE_LIMIT;
    loop {
        match check().await {
            Ok(()) => return Ok(()),
            Err(why) if Instant::now() >= until => {
                return Err(format!(
                    "{what} was not the case {SETTLE_LIMIT:?} after the drop: {why}"
                ));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// A new call with the key must complete within [`SETTLE_LIMIT`].
async fn completes<F: Future>(what: &str, fut: F) -> Result<F::Output, String> {
    tokio::time::timeout(SETTLE_LIMIT, fut).await.map_err(|_| {
        format!("{what} did not answer within {SETTLE_LIMIT:?}: the key was left blocked")
    })
}

async fn check_left_nothing(
    c: &Coordinator,
    layer: Layer,
    key: &CallKey,
    in_body: bool,
    polls: usize,
) -> Result<(), String> {
    eventually("no renewal registered", || async {
        match c.active_renewals() {
            0 => Ok(()),
            n => Err(format!("{n} renewals still registered")),
        }
    })
    .await?;
    match layer {
        Layer::Idempotent { on_abandoned, .. } => {
            // Kept as abandoned only for a body stopped half-way under "fail"; never left in
            // flight: a marker still in flight once the settle is over blocks duplicates for
            // work that has stopped (until its lease ends), which is what this catches.
            let may_keep = in_body && on_abandoned == OnAbandoned::Fail;
            eventually("no record but what the docs allow", || async {
                let info = c
                    .operations()
                    .inspect_record(key)
                    .await
                    .map_err(|e| format!("inspecting the record: {e}"))?;
                match info.map(|i| i.status) {
                    None | Some(RecordStatus::Completed) => Ok(()),
                    Some(RecordStatus::Abandoned) if may_keep => Ok(()),
                    Some(RecordStatus::InFlight) => Err(format!(
                        "the record is {} (the key is blocked for work that has stopped)",
                        RecordStatus::InFlight
                    )),
                    Some(status) => Err(format!("the record is {status}")),
                }
            })
            .await?;
            let again = c
                .idempotent(key.clone())
                .in_flight_lease(LEASE)
                .on_abandoned(on_abandoned)
                .run(|| async { Ok::<u64, CoordError>(7) });
            match completes("the next idempotent call", again).await? {
                Ok(7) => {}
                Err(CoordError::OutcomeUnknown { .. }) if may_keep => {}
                other => return Err(format!("the next idempotent call answered {other:?}")),
            }
        }
        Layer::Lock { .. } => {
            eventually("the lock has no holder", || async {
                let info = c
                    .operations()
                    .inspect_lock(key)
                    .await
                    .map_err(|e| format!("inspecting the lock: {e}"))?;
                match info.holder {
                    None => Ok(()),
                    Some(holder) => Err(format!("held by {:?}", holder.owner)),
                }
            })
            .await?;
            let guard = completes("taking the lock", c.lock(key.clone()).try_acquire())
                .await?
                .map_err(|e| format!("taking the lock failed: {e}"))?
                .ok_or_else(|| "the lock was not free".to_owned())?;
            let _ = guard.release().await;
        }
        Layer::ProcessFlight => {
            let next = c.single_flight(key.clone()).run(|| async move { polls });
            let got = completes("the next flight", next).await?;
            if got != polls {
                return Err(format!("the next flight answered another run's {got}"));
            }
        }
        Layer::ClusterFlight => {
            let store = c.flight_store();
            let probe = OwnerToken::new();
            eventually("the cluster flight is vacant", || async {
                match store.flight_claim(key, probe, LEASE).await {
                    Ok(FlightClaim::Claimed) => Ok(()),
                    Ok(FlightClaim::Joined { leader, .. }) => Err(format!("still led by {leader}")),
                    Err(e) => Err(format!("claiming: {e}")),
                }
            })
            .await?;
            let _ = store.flight_abandon(key, probe).await;
            let next = c
                .single_flight(key.clone())
                .cluster()
                .lease(LEASE)
                .run(|| async { Ok::<u64, CoordError>(8) });
            match completes("the next cluster flight", next).await? {
                Ok(8) => {}
                other => return Err(format!("the next cluster flight answered {other:?}")),
            }
        }
        Layer::CachedShared => {
            let next = c
                .cached(key.clone())
                .scope(CacheScope::Shared)
                .ttl(LEASE)
                .run(|| async { Ok::<u64, CoordError>(7) });
            match completes("the next cached call", next).await? {
                Ok(7) => {}
                other => return Err(format!("the next cached call answered {other:?}")),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The harness catches a broken provider, at the drop point where it breaks.

    use super::*;

    use coord_core::memory::MemoryProvider;
    use coord_core::provider::{
        BackendError, BoxFuture, CacheStore, ClaimOutcome, ClaimRequest, CompleteOutcome,
        CompleteRequest, FlightStore, IdempotencyStore, LockGrant, LockInfo, LockProvider,
        LockRequest, MultiLockStore, Operations, RecordInfo, ReleaseOutcome, RenewOutcome,
        RwLockStore, SemaphoreStore,
    };

    /// The in-process provider, except that, when `broken`, `abandon` answers that it cleared
    /// the marker and clears nothing: a call dropped after its claim leaves its marker behind
    /// until the lease ends (a clean-up script that misses its key, say); and
    /// `end_marker_lease` answers that it ended the lease and ends nothing, so a body stopped
    /// half-way under `on_abandoned = "fail"` leaves its marker in flight until its lease
    /// ends, which is what the runtime did before it ended such leases. Everything else is the
    /// in-process provider's.
    struct LeavesMarkerOnDrop {
        inner: MemoryProvider,
        broken: bool,
    }

    impl LockProvider for LeavesMarkerOnDrop {
        fn acquire<'a>(
            &'a self,
            req: LockRequest<'a>,
        ) -> BoxFuture<'a, Result<Option<LockGrant>, BackendError>> {
            self.inner.acquire(req)
        }

        fn release<'a>(
            &'a self,
            key: &'a CallKey,
            owner: OwnerToken,
        ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
            self.inner.release(key, owner)
        }

        fn renew<'a>(
            &'a self,
            key: &'a CallKey,
            owner: OwnerToken,
            lease: Duration,
        ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
            self.inner.renew(key, owner, lease)
        }
    }

    impl IdempotencyStore for LeavesMarkerOnDrop {
        fn claim<'a>(
            &'a self,
            req: ClaimRequest<'a>,
        ) -> BoxFuture<'a, Result<ClaimOutcome, BackendError>> {
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
            if self.broken {
                return Box::pin(std::future::ready(Ok(true)));
            }
            self.inner.abandon(key, owner)
        }

        fn end_marker_lease<'a>(
            &'a self,
            key: &'a CallKey,
            owner: OwnerToken,
        ) -> BoxFuture<'a, Result<bool, BackendError>> {
            if self.broken {
                return Box::pin(std::future::ready(Ok(true)));
            }
            self.inner.end_marker_lease(key, owner)
        }

        fn wait_settled<'a>(
            &'a self,
            key: &'a CallKey,
            timeout: Duration,
        ) -> BoxFuture<'a, Result<(), BackendError>> {
            self.inner.wait_settled(key, timeout)
        }

        fn renew_marker<'a>(
            &'a self,
            key: &'a CallKey,
            owner: OwnerToken,
            lease: Duration,
        ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
            self.inner.renew_marker(key, owner, lease)
        }
    }

    impl Operations for LeavesMarkerOnDrop {
        fn inspect_lock<'a>(
            &'a self,
            key: &'a CallKey,
        ) -> BoxFuture<'a, Result<LockInfo, BackendError>> {
            self.inner.inspect_lock(key)
        }

        fn inspect_record<'a>(
            &'a self,
            key: &'a CallKey,
        ) -> BoxFuture<'a, Result<Option<RecordInfo>, BackendError>> {
            self.inner.inspect_record(key)
        }
    }

    impl CacheStore for LeavesMarkerOnDrop {}
    impl FlightStore for LeavesMarkerOnDrop {}
    impl SemaphoreStore for LeavesMarkerOnDrop {}
    impl RwLockStore for LeavesMarkerOnDrop {}
    impl MultiLockStore for LeavesMarkerOnDrop {}

    /// A coordinator over a new provider, broken when `broken`.
    fn over(broken: bool) -> Coordinator {
        Coordinator::builder()
            .namespace("broken")
            .provider(LeavesMarkerOnDrop {
                inner: MemoryProvider::new(),
                broken,
            })
            .build()
            .expect("coordinator")
    }

    const RERUN: Layer = Layer::Idempotent {
        on_abandoned: OnAbandoned::Rerun,
        renewing: false,
    };

    /// Cold sweeps (a new provider per drop point): with the provider whole, the sweep passes;
    /// with the provider broken at one drop point only (a drop in the body, after the claim),
    /// the sweep passes every earlier point and reports exactly that one, naming the marker it
    /// found.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_marker_left_on_a_drop_at_the_chosen_poll_is_reported_there() {
        let whole = try_sweep(RERUN, "whole", |_| std::future::ready(over(false)))
            .await
            .expect("the whole provider leaves nothing behind");
        assert!(whole.dropped_in_body > 0, "{whole:?}: no drop in the body");
        // The last drop point is in the body (it suspends once), so after the claim.
        let chosen = whole.drop_points;
        let finding = try_sweep(RERUN, "broken", |polls| {
            std::future::ready(over(polls == chosen))
        })
        .await
        .expect_err("the sweep passed a provider that left a marker behind");
        assert_eq!(finding.layer, RERUN);
        assert_eq!(finding.polls, chosen, "{finding}");
        assert!(finding.in_body, "{finding}");
        assert!(finding.what.contains("record"), "{finding}");
    }

    const FAIL: Layer = Layer::Idempotent {
        on_abandoned: OnAbandoned::Fail,
        renewing: false,
    };

    /// Under `on_abandoned = "fail"`, a body stopped half-way must leave the abandoned record
    /// at once, not a marker in flight until its lease ends: with the provider whole the cold
    /// sweep passes (the dropped body's marker is found abandoned, the next call gets
    /// `OutcomeUnknown`); with a provider that leaves the marker to lapse at the drop in the
    /// body (the runtime's behaviour before it ended such leases), the sweep reports that drop
    /// point as a key left blocked, within the settle limit, far below the 30 s lease.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_marker_left_in_flight_under_fail_is_reported_as_blocked() {
        let whole = try_sweep(FAIL, "whole", |_| std::future::ready(over(false)))
            .await
            .expect("the whole provider ends the stopped body's marker as abandoned");
        assert!(whole.dropped_in_body > 0, "{whole:?}: no drop in the body");
        let chosen = whole.drop_points;
        let started = Instant::now();
        let finding = try_sweep(FAIL, "lapsing", |polls| {
            std::future::ready(over(polls == chosen))
        })
        .await
        .expect_err("the sweep passed a marker left in flight under \"fail\"");
        assert!(
            started.elapsed() < LEASE,
            "caught only once the lease had ended: {finding}"
        );
        assert_eq!(finding.polls, chosen, "{finding}");
        assert!(finding.in_body, "{finding}");
        assert!(
            finding.what.contains("in_flight") || finding.what.contains("in flight"),
            "{finding}"
        );
        assert!(finding.what.contains("blocked"), "{finding}");
    }

    /// The panicking form reports the same finding.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sweep_panics_with_the_finding() {
        let whole = try_sweep(RERUN, "whole", |_| std::future::ready(over(false)))
            .await
            .expect("the whole provider leaves nothing behind");
        let chosen = whole.drop_points;
        let swept = tokio::spawn(async move {
            sweep(RERUN, "broken", |polls| {
                std::future::ready(over(polls == chosen))
            })
            .await
        })
        .await;
        let panic = swept.expect_err("the sweep passed a broken provider");
        let message = panic.into_panic();
        let message = message
            .downcast_ref::<String>()
            .expect("a formatted panic message");
        assert!(
            message.contains(&format!("dropped after {chosen} poll(s)")),
            "{message}"
        );
    }
}
