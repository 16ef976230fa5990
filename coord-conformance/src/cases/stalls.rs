//! Time promises when the caller's process stalls: a blocking call on its runtime, a pause,
//! SIGSTOP, a frozen VM. A lease or ttl must be counted from the moment it refers to, not from
//! when the stalled process got round to looking.
//!
//! Each case runs the call on a current-thread runtime of its own, where a second task blocks
//! the thread for `STALL` (2 s) at a chosen moment: everything on that runtime (the body, the
//! renewal task, the cache layer) stops at once, as in a stalled process. Whatever the
//! provider runs on other runtimes (connections made by the caller of the kit) keeps going,
//! as a server would.
//!
//! * A renewing lock whose process stalls past its lease ends in `LockLost { cause: Expired }`:
//!   after the stall the body's pending await and the loss are ready together, and the loss
//!   wins.
//! * With `on_lost = "signal"` the body runs on but sees `is_held() == false` and a resolved
//!   `lock_lost()`, and the call's `CallReport` says the hold was lost; without renewal the
//!   body runs to its end and the report and the coordinator's counters say its lease lapsed.
//! * No cache scope serves an answer older than its ttl, also when the stall falls between the
//!   body's return and the cache write (here: while the lock inside the cache is released).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coord_core::{
    CoordError, Coordinator, LossCause, cached, distributed_lock, is_held, lock_lost, observe,
};
use tokio::sync::Notify;

/// How long the stalled runtime's thread is blocked: twice the lease and the ttl below.
const STALL: Duration = Duration::from_secs(2);
/// The lease of the locks and the ttl of the cached operations.
const LEASE: Duration = Duration::from_secs(1);
/// When the lock cases stall, counted from the call: while the body awaits.
const STALL_AFTER: Duration = Duration::from_millis(50);
/// When the cache cases read again, counted from the first call: after the stall, and past
/// the ttl of the first answer however its write was timed.
const READ_AT: Duration = Duration::from_millis(2500);

/// Runs `call` on a current-thread runtime of its own (on a blocking thread of the case's
/// runtime), where a second task blocks that thread for [`STALL`] once `stall_when` resolves.
async fn on_stalled_runtime<T, S, F>(stall_when: S, call: F) -> T
where
    T: Send + 'static,
    S: Future<Output = ()> + Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime for the stalled call");
        runtime.block_on(async move {
            let staller = tokio::spawn(async move {
                stall_when.await;
                // Blocks the runtime's only thread: nothing on it runs until this returns.
                std::thread::sleep(STALL);
            });
            let output = call.await;
            staller.abort();
            output
        })
    })
    .await
    .expect("the stalled runtime's thread panicked")
}

/// A stall that starts [`STALL_AFTER`] into the call (the timer starts on the stalled runtime).
async fn shortly_after_the_start() {
    tokio::time::sleep(STALL_AFTER).await;
}

#[distributed_lock(key_from = "slot", coordinator = coord, name = "conformance.stall.renewing", lease = "1s", wait = "0s", renew = true)]
async fn renewing_section(coord: &Coordinator, slot: u32) -> Result<bool, CoordError> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(is_held())
}

/// A renewing lock whose process stalls past its lease while the body awaits ends in
/// `LockLost { cause: Expired }`, not in the body's `Ok`: the body ran on a lapsed lease.
pub async fn stall_renewing_lock_ends_in_lock_lost(c: Coordinator) {
    let coord = c.clone();
    let outcome = on_stalled_runtime(shortly_after_the_start(), async move {
        renewing_section(&coord, 1).await
    })
    .await;
    match outcome {
        Err(CoordError::LockLost {
            cause, held_for, ..
        }) => {
            assert_eq!(
                cause,
                LossCause::Expired,
                "a lease that ran out while the process stalled is lost as Expired"
            );
            assert!(
                held_for >= LEASE,
                "the hold is reported lost only once its lease had run out (held {held_for:?})"
            );
        }
        other => panic!(
            "a renewing lock whose process stalled {STALL:?} past its {LEASE:?} lease must end \
             in LockLost (the loss wins over the body's pending await); got {other:?}"
        ),
    }
}

#[distributed_lock(key_from = "slot", coordinator = coord, name = "conformance.stall.signal", lease = "1s", wait = "0s", renew = true, on_lost = "signal")]
async fn signalled_section(
    coord: &Coordinator,
    slot: u32,
) -> Result<(bool, Option<LossCause>), CoordError> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Resolved already, or not at all: a zero timeout polls it once.
    let seen = tokio::time::timeout(Duration::ZERO, lock_lost())
        .await
        .ok()
        .flatten();
    Ok((is_held(), seen))
}

/// With `on_lost = "signal"`, a renewing lock whose process stalls past its lease lets the body
/// run on, but the body's next poll sees `is_held() == false` and `lock_lost()` resolved, and
/// the call's report says the hold was lost.
pub async fn stall_signalled_lock_shows_and_reports_the_loss(c: Coordinator) {
    let coord = c.clone();
    let (outcome, report) = on_stalled_runtime(shortly_after_the_start(), async move {
        observe(signalled_section(&coord, 2)).await
    })
    .await;
    match outcome {
        Ok((held, seen)) => {
            assert!(
                !held,
                "is_held() is false in the first poll after the lease ran out"
            );
            assert_eq!(
                seen,
                Some(LossCause::Expired),
                "lock_lost() has resolved, as Expired, before the body's first poll after the stall"
            );
        }
        Err(err) => panic!("on_lost = \"signal\" lets the body finish; got {err:?}"),
    }
    assert_eq!(
        report.lock_lost(),
        Some(LossCause::Expired),
        "the call's report says the hold was lost: {report:?}"
    );
}

#[distributed_lock(key_from = "slot", coordinator = coord, name = "conformance.stall.unrenewed", lease = "1s", wait = "0s")]
async fn unrenewed_section(coord: &Coordinator, slot: u32) -> Result<bool, CoordError> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(is_held())
}

/// Without renewal the body runs to its end, as documented, but a lease that ran out before it
/// returned is reported in the call's report and counted by the coordinator.
pub async fn stall_unrenewed_lock_reports_the_lapse(c: Coordinator) {
    let coord = c.clone();
    let before = c.metrics().lapsed_holds();
    let (outcome, report) = on_stalled_runtime(shortly_after_the_start(), async move {
        observe(unrenewed_section(&coord, 3)).await
    })
    .await;
    assert_eq!(
        outcome.ok(),
        Some(false),
        "without renewal the body runs to its end, and is_held() tells it the lease ran out"
    );
    assert_eq!(
        report.lock_lost(),
        Some(LossCause::Expired),
        "the call's report says the lease lapsed before the body returned: {report:?}"
    );
    assert_eq!(
        c.metrics().lapsed_holds(),
        before + 1,
        "the coordinator counts the lapsed hold"
    );
}

/// The answers a cached operation computed, by number, and when; and the signal that a body
/// is about to return (when the cache cases stall).
#[derive(Default)]
struct Answers {
    computed: Mutex<Vec<Instant>>,
    returning: Notify,
}

impl Answers {
    /// A new answer: its number, computed now.
    fn compute(&self) -> u64 {
        let mut computed = self.computed.lock().unwrap();
        computed.push(Instant::now());
        let n = computed.len() as u64 - 1;
        drop(computed);
        // The stall starts the moment the body returns (at the caller's next await).
        self.returning.notify_one();
        n
    }

    /// How old answer `n` is now.
    fn age(&self, n: u64) -> Duration {
        self.computed.lock().unwrap()[n as usize].elapsed()
    }
}

// Each cached operation holds a lock inside the cache (the fixed order): its release is where
// a provider that awaits its backend lets the stall fall between the body and the cache write.

#[cached(key_from = "slot", coordinator = coord, name = "conformance.stall.cache_local", ttl = "1s")]
#[distributed_lock(key_from = "slot", coordinator = coord, name = "conformance.stall.cache_local", lease = "20s", wait = "10s")]
async fn local_answer(
    coord: &Coordinator,
    slot: u32,
    answers: Arc<Answers>,
) -> Result<u64, CoordError> {
    Ok(answers.compute())
}

#[cached(key_from = "slot", coordinator = coord, name = "conformance.stall.cache_shared", ttl = "1s", scope = "shared")]
#[distributed_lock(key_from = "slot", coordinator = coord, name = "conformance.stall.cache_shared", lease = "20s", wait = "10s")]
async fn shared_answer(
    coord: &Coordinator,
    slot: u32,
    answers: Arc<Answers>,
) -> Result<u64, CoordError> {
    Ok(answers.compute())
}

#[cached(key_from = "slot", coordinator = coord, name = "conformance.stall.cache_two_tier", ttl = "1s", scope = "two_tier", local_ttl = "900ms")]
#[distributed_lock(key_from = "slot", coordinator = coord, name = "conformance.stall.cache_two_tier", lease = "20s", wait = "10s")]
async fn two_tier_answer(
    coord: &Coordinator,
    slot: u32,
    answers: Arc<Answers>,
) -> Result<u64, CoordError> {
    Ok(answers.compute())
}

type CachedCall = fn(
    Coordinator,
    Arc<Answers>,
) -> std::pin::Pin<Box<dyn Future<Output = Result<u64, CoordError>> + Send>>;

/// The first call stalls from the moment its body returns; then, [`READ_AT`] after it started,
/// the stalled runtime calls again and so does a caller on another runtime. Whatever either is
/// served must be no older than the ttl.
async fn no_answer_older_than_its_ttl(c: Coordinator, scope: &str, call: CachedCall) {
    let answers = Arc::new(Answers::default());
    let started = tokio::time::Instant::now();
    let other = {
        let (c, answers) = (c.clone(), answers.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until(started + READ_AT).await;
            let answer = call(c, answers.clone()).await;
            answer.map(|n| (n, answers.age(n)))
        })
    };
    let stalled = {
        let (c, answers) = (c.clone(), answers.clone());
        let returning = answers.clone();
        on_stalled_runtime(
            async move { returning.returning.notified().await },
            async move {
                let first = call(c.clone(), answers.clone()).await;
                tokio::time::sleep_until(started + READ_AT).await;
                let again = call(c, answers.clone()).await;
                (first, again.map(|n| (n, answers.age(n))))
            },
        )
        .await
    };
    let (first, again) = stalled;
    assert!(first.is_ok(), "{scope}: the first call answers: {first:?}");
    for (who, served) in [
        ("the stalled caller", again),
        ("another caller", other.await.unwrap()),
    ] {
        match served {
            Ok((n, age)) => assert!(
                age <= LEASE,
                "{scope}: {who} was served answer {n}, {age:?} old, from an operation with a \
                 {LEASE:?} ttl (the caller stalled {STALL:?} between the body's return and the \
                 cache write): expired entries are never served"
            ),
            Err(err) => panic!("{scope}: {who}'s call failed: {err:?}"),
        }
    }
}

/// `scope = "local"`: no answer older than its ttl, though the process stalled between the
/// body's return and the cache write.
pub async fn stall_cache_local_serves_nothing_older_than_its_ttl(c: Coordinator) {
    no_answer_older_than_its_ttl(c, "local", |c, a| {
        Box::pin(async move { local_answer(&c, 1, a).await })
    })
    .await;
}

/// `scope = "shared"`: no answer older than its ttl, though the writer stalled between the
/// body's return and the cache write.
pub async fn stall_cache_shared_serves_nothing_older_than_its_ttl(c: Coordinator) {
    no_answer_older_than_its_ttl(c, "shared", |c, a| {
        Box::pin(async move { shared_answer(&c, 1, a).await })
    })
    .await;
}

/// `scope = "two_tier"`: no answer older than its ttl from either tier, though the writer
/// stalled between the body's return and the cache write.
pub async fn stall_cache_two_tier_serves_nothing_older_than_its_ttl(c: Coordinator) {
    no_answer_older_than_its_ttl(c, "two_tier", |c, a| {
        Box::pin(async move { two_tier_answer(&c, 1, a).await })
    })
    .await;
}
