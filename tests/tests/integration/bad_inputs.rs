//! The bad-input corpus for the in-process provider and the attributes: no input panics, hangs
//! or deadlocks, and each one gets its documented answer.
//!
//! One table of cases, run by one test. Every case names its input, states what it expects and
//! prints what it saw; a case that panics prints `panicked`, one that does not answer within
//! [`BOUND`] prints `hung`. Categories:
//!
//! * provider requests: every duration field of `LockRequest`, `ClaimRequest`,
//!   `CompleteRequest`, `renew`, `renew_marker` and `wait_settled`, with zero, 1 ns, 1 µs,
//!   999 µs, `Duration::MAX`, `u64::MAX` ms, `u64::MAX` s and 2^46 ms ± 1 (the Redis
//!   provider's expiry cap). A wait that is long enough to be "until granted or cancelled"
//!   must still be waiting after a while, and answer promptly once the holder lets go.
//! * the builder: namespaces that are empty, hold `:`, braces, whitespace or control
//!   characters (refused), and long, Unicode, glob-like ones (accepted and usable).
//! * the attributes: the longest durations the macros accept, the shortest lease, 1 MiB keys,
//!   payloads and fingerprinted parameters, hostile key parts, absent keys.
//! * lifecycle: a coordinator used after the runtime it first ran on is dropped (with a lock
//!   held at the drop), and many tasks cancelled at pseudo-random points.

use coord_core::CallKey;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::provider::{
    ClaimOutcome, ClaimRequest, CompleteOutcome, CompleteRequest, LockRequest, OwnerToken,
    ReleaseOutcome, RenewOutcome,
};
use coord_core::{
    BuildError, CoordError, Coordinator, distributed_lock, idempotent, single_flight,
};
use tokio::sync::Notify;

/// The longest any case may take before it counts as hung.
const BOUND: Duration = Duration::from_secs(20);
/// A lease or wait that outlives every case.
const LONG: Duration = Duration::from_secs(30);
/// How long a wait that should go on is watched before it is released.
const WATCH: Duration = Duration::from_millis(300);
/// How soon a released waiter must answer (generous: the machine is shared).
const PROMPT: Duration = Duration::from_secs(3);
/// The Redis provider's expiry cap, 2^46 ms.
const CAP: Duration = Duration::from_millis(1 << 46);

/// The durations every provider-request field is tried with.
fn durations() -> Vec<(&'static str, Duration)> {
    vec![
        ("zero", Duration::ZERO),
        ("1ns", Duration::from_nanos(1)),
        ("1us", Duration::from_micros(1)),
        ("999us", Duration::from_micros(999)),
        ("Duration::MAX", Duration::MAX),
        ("u64::MAX ms", Duration::from_millis(u64::MAX)),
        ("u64::MAX s", Duration::from_secs(u64::MAX)),
        ("2^46 ms - 1", CAP - Duration::from_millis(1)),
        ("2^46 ms", CAP),
        ("2^46 ms + 1", CAP + Duration::from_millis(1)),
    ]
}

/// Durations under a second lapse within a case; the others outlast it.
fn is_long(d: Duration) -> bool {
    d >= Duration::from_secs(1)
}

fn fresh_key(ns: &str) -> CallKey {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    CallKey::builder(ns, "op")
        .part(&NEXT.fetch_add(1, Ordering::Relaxed))
        .finish()
}

fn memory(ns: &str) -> Coordinator {
    Coordinator::builder()
        .namespace(ns)
        .memory()
        .build()
        .expect("memory coordinator")
}

// ---------------------------------------------------------------------------------------------
// The table.

/// Which duration field of a provider request a case sets.
#[derive(Debug, Clone, Copy)]
enum Field {
    LockLease,
    LockWait,
    LockRenew,
    ClaimLease,
    KeepAbandoned,
    Retention,
    MarkerRenew,
    SettleTimeout,
}

#[derive(Debug, Clone, Copy)]
enum Attr {
    LongestLockUncontended,
    LongestLockWaitCancelled,
    ShortestLeaseOutlived,
    ShortestLeaseRenewed,
    ShortLeaseRenewed,
    LongestRecordDurations,
    LongestDuplicateWait,
    MibKey,
    MibPayload,
    MibFingerprint,
    HostileKeyPairs,
    AbsentKey,
    MibFlightKey,
    HostilePurge,
}

#[derive(Debug, Clone, Copy)]
enum Life {
    AfterRuntimeDropped,
    RandomCancellation,
}

#[derive(Debug, Clone)]
enum Input {
    Request(Field, Duration),
    Namespace(String),
    NoProvider,
    Attr(Attr),
    Life(Life),
}

struct Case {
    name: String,
    input: Input,
    expect: String,
}

fn case(name: impl Into<String>, input: Input, expect: impl Into<String>) -> Case {
    Case {
        name: name.into(),
        input,
        expect: expect.into(),
    }
}

fn request_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for (what, d) in durations() {
        let long = is_long(d);
        let pick = |l: &str, s: &str| if long { l.to_owned() } else { s.to_owned() };
        let fields = [
            (
                Field::LockLease,
                "lock lease",
                pick(
                    "granted with a token; held; released",
                    "granted with a token; free; not held",
                ),
            ),
            (
                Field::LockWait,
                "lock wait",
                pick(
                    "waits while held; granted on release",
                    "refused promptly while held",
                ),
            ),
            (
                Field::LockRenew,
                "lock renewal",
                pick("renewed; held", "renewed; free"),
            ),
            (
                Field::ClaimLease,
                "in-flight lease",
                pick("claimed; in flight", "claimed; claimable"),
            ),
            (
                Field::KeepAbandoned,
                "keep_abandoned_for",
                pick("claimed; abandoned", "claimed; claimable"),
            ),
            (
                Field::Retention,
                "retention",
                pick("stored; replayed", "stored; claimable"),
            ),
            (
                Field::MarkerRenew,
                "marker renewal",
                pick("renewed; in flight", "renewed; claimable"),
            ),
            (
                Field::SettleTimeout,
                "settle timeout",
                pick(
                    "waits while in flight; returns on completion",
                    "returns promptly while in flight",
                ),
            ),
        ];
        for (field, label, expect) in fields {
            cases.push(case(
                format!("{label} = {what}"),
                Input::Request(field, d),
                expect,
            ));
        }
    }
    cases
}

fn builder_cases() -> Vec<Case> {
    let refused = [
        ("empty namespace", String::new()),
        ("namespace with a colon", "a:b".to_owned()),
        ("namespace that is a colon", ":".to_owned()),
        ("namespace with an open brace", "a{".to_owned()),
        ("namespace with a close brace", "}a".to_owned()),
        ("namespace with a space", "a b".to_owned()),
        ("namespace of whitespace", " \t".to_owned()),
        ("namespace with a newline", "a\n".to_owned()),
        ("namespace with NUL", "a\0".to_owned()),
        (
            "namespace with an ideographic space",
            "a\u{3000}b".to_owned(),
        ),
        ("namespace with a C1 control", "a\u{85}".to_owned()),
    ];
    let accepted = [
        ("64 KiB namespace", "n".repeat(1 << 16)),
        ("Unicode namespace", "\u{540D}\u{524D}-\u{e9}".to_owned()),
        ("glob-like namespace", "*?[x]".to_owned()),
        ("namespace with percent escapes", "%7B%3A".to_owned()),
        ("namespace with a fullwidth colon", "a\u{FF1A}b".to_owned()),
    ];
    let mut cases: Vec<Case> = refused
        .into_iter()
        .map(|(name, ns)| case(name, Input::Namespace(ns), "refused: InvalidNamespace"))
        .collect();
    cases.extend(accepted.into_iter().map(|(name, ns)| {
        case(
            name,
            Input::Namespace(ns),
            "built; a call runs under the namespace",
        )
    }));
    cases.push(case(
        "builder without a provider",
        Input::NoProvider,
        "refused: NoProvider",
    ));
    cases
}

fn attribute_cases() -> Vec<Case> {
    use Attr::*;
    vec![
        case(
            "lock with the longest lease and wait, uncontended",
            Input::Attr(LongestLockUncontended),
            "ran once",
        ),
        case(
            "lock with the longest wait, contended then cancelled",
            Input::Attr(LongestLockWaitCancelled),
            "waited until cancelled; next caller admitted on release",
        ),
        case(
            "lock with the shortest lease, body outlives it",
            Input::Attr(ShortestLeaseOutlived),
            "ran; Ok; lapsed release counted",
        ),
        case(
            "lock with the shortest lease, renewed",
            Input::Attr(ShortestLeaseRenewed),
            "ran; Ok or LockLost; no renewal left",
        ),
        case(
            "lock with a 500 ms lease, renewed through five leases",
            Input::Attr(ShortLeaseRenewed),
            "ran; Ok; no renewal left",
        ),
        case(
            "idempotent with the longest retention and in-flight lease",
            Input::Attr(LongestRecordDurations),
            "ran once; replayed",
        ),
        case(
            "idempotent duplicate with the longest wait",
            Input::Attr(LongestDuplicateWait),
            "duplicate waited; replayed; ran once",
        ),
        case(
            "idempotent with a 1 MiB key",
            Input::Attr(MibKey),
            "ran once; replayed; a key differing in its last byte ran",
        ),
        case(
            "idempotent with a 1 MiB outcome",
            Input::Attr(MibPayload),
            "ran once; replayed 1 MiB intact",
        ),
        case(
            "idempotent with a 1 MiB fingerprinted parameter",
            Input::Attr(MibFingerprint),
            "replayed for the same; KeyReused for a different one",
        ),
        case(
            "idempotent with hostile key pairs",
            Input::Attr(HostileKeyPairs),
            "4 distinct tuples ran 4 times; each replays its own",
        ),
        case(
            "idempotent with an absent key",
            Input::Attr(AbsentKey),
            "MissingKey; body not run",
        ),
        case(
            "single-flight with a hostile 1 MiB key and 16 callers",
            Input::Attr(MibFlightKey),
            "ran once; 16 answers",
        ),
        case(
            "purge_record with hostile operation keys",
            Input::Attr(HostilePurge),
            "nothing to purge for each",
        ),
    ]
}

fn lifecycle_cases() -> Vec<Case> {
    vec![
        case(
            "coordinator used after its first runtime is dropped",
            Input::Life(Life::AfterRuntimeDropped),
            "lock freed by its lease; renewals run on the new runtime",
        ),
        case(
            "32 tasks cancelled at pseudo-random points",
            Input::Life(Life::RandomCancellation),
            "all tasks ended; every key usable; nothing left open",
        ),
    ]
}

fn describe(input: &Input) -> String {
    match input {
        Input::Request(field, d) => format!("{field:?} {d:?}"),
        Input::Namespace(ns) if ns.len() > 40 => format!("namespace of {} bytes", ns.len()),
        Input::Namespace(ns) => format!("namespace {ns:?}"),
        other => format!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Running.

type Saw = Pin<Box<dyn Future<Output = String> + Send>>;

fn run(input: Input) -> Saw {
    match input {
        Input::Request(field, d) => Box::pin(request(field, d)),
        Input::Namespace(ns) => Box::pin(namespace(ns)),
        Input::NoProvider => Box::pin(async {
            match Coordinator::builder().build() {
                Err(BuildError::NoProvider) => "refused: NoProvider".to_owned(),
                other => format!("{other:?}"),
            }
        }),
        Input::Attr(attr) => Box::pin(attribute(attr)),
        Input::Life(life) => Box::pin(lifecycle(life)),
    }
}

async fn request(field: Field, d: Duration) -> String {
    let c = memory("req");
    let (locks, records) = (c.lock_provider().clone(), c.idempotency_store().clone());
    let k = fresh_key("req");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    let lapse = || tokio::time::sleep(Duration::from_millis(20));
    let lock = |owner, lease, wait| LockRequest {
        key: &k,
        owner,
        lease,
        wait,
        fenced: true,
    };
    let claim = |owner, lease| ClaimRequest {
        key: &k,
        owner,
        in_flight_lease: lease,
        fingerprint: None,
        keep_abandoned_for: None,
        transactional: false,
    };
    let complete = |owner, retention| CompleteRequest {
        key: &k,
        owner,
        payload: Arc::from(&b"outcome"[..]),
        retention,
        fingerprint: None,
    };
    let probe_lock = || async {
        match locks.acquire(lock(b, LONG, Duration::ZERO)).await {
            Ok(Some(_)) => "free",
            Ok(None) => "held",
            Err(_) => "error",
        }
    };
    let probe_record = || async {
        match records.claim(claim(b, LONG)).await {
            Ok(ClaimOutcome::Claimed) => "claimable".to_owned(),
            Ok(ClaimOutcome::InFlight { .. }) => "in flight".to_owned(),
            Ok(ClaimOutcome::Abandoned { .. }) => "abandoned".to_owned(),
            Ok(ClaimOutcome::Completed { payload, .. }) if &payload[..] == b"outcome" => {
                "replayed".to_owned()
            }
            other => format!("{other:?}"),
        }
    };
    match field {
        Field::LockLease => {
            let grant = match locks.acquire(lock(a, d, Duration::ZERO)).await {
                Ok(Some(g)) if g.fencing_token.is_some() => "granted with a token",
                Ok(Some(_)) => "granted without a token",
                Ok(None) => "refused",
                Err(_) => "error",
            };
            if !is_long(d) {
                lapse().await;
            }
            let probe = probe_lock().await;
            let released = match locks.release(&k, a).await {
                Ok(ReleaseOutcome::Released) => "released",
                Ok(ReleaseOutcome::NotHeld) => "not held",
                Ok(ReleaseOutcome::ForceReleased) => "force released",
                Err(_) => "error",
            };
            format!("{grant}; {probe}; {released}")
        }
        Field::LockWait => {
            if !matches!(
                locks.acquire(lock(a, LONG, Duration::ZERO)).await,
                Ok(Some(_))
            ) {
                return "setup: holder refused".into();
            }
            let started = Instant::now();
            let waiter = tokio::spawn({
                let (locks, k) = (locks.clone(), k.clone());
                async move {
                    let got = locks
                        .acquire(LockRequest {
                            key: &k,
                            owner: b,
                            lease: LONG,
                            wait: d,
                            fenced: true,
                        })
                        .await;
                    (got.map(|g| g.is_some()), Instant::now())
                }
            });
            if !is_long(d) {
                return match tokio::time::timeout(PROMPT, waiter).await {
                    Ok(Ok((Ok(false), _))) => "refused promptly while held".into(),
                    other => format!("{other:?} after {:?}", started.elapsed()),
                };
            }
            tokio::time::sleep(WATCH).await;
            if waiter.is_finished() {
                return format!("returned while held: {:?}", waiter.await);
            }
            let released_at = Instant::now();
            let _ = locks.release(&k, a).await;
            match tokio::time::timeout(PROMPT, waiter).await {
                Ok(Ok((Ok(true), at))) if at.duration_since(released_at) < PROMPT => {
                    "waits while held; granted on release".into()
                }
                other => format!("after release: {other:?}"),
            }
        }
        Field::LockRenew => {
            if !matches!(
                locks.acquire(lock(a, LONG, Duration::ZERO)).await,
                Ok(Some(_))
            ) {
                return "setup: holder refused".into();
            }
            let renewed = match locks.renew(&k, a, d).await {
                Ok(RenewOutcome::Renewed) => "renewed".to_owned(),
                other => format!("{other:?}"),
            };
            if !is_long(d) {
                lapse().await;
            }
            format!("{renewed}; {}", probe_lock().await)
        }
        Field::ClaimLease => {
            let claimed = describe_claim(records.claim(claim(a, d)).await);
            if !is_long(d) {
                lapse().await;
            }
            format!("{claimed}; {}", probe_record().await)
        }
        Field::KeepAbandoned => {
            let req = ClaimRequest {
                keep_abandoned_for: Some(d),
                ..claim(a, Duration::from_millis(1))
            };
            let claimed = describe_claim(records.claim(req).await);
            lapse().await;
            format!("{claimed}; {}", probe_record().await)
        }
        Field::Retention => {
            let _ = records.claim(claim(a, LONG)).await;
            let stored = match records.complete(complete(a, d)).await {
                Ok(CompleteOutcome::Stored) => "stored".to_owned(),
                other => format!("{other:?}"),
            };
            if !is_long(d) {
                lapse().await;
            }
            format!("{stored}; {}", probe_record().await)
        }
        Field::MarkerRenew => {
            let _ = records.claim(claim(a, LONG)).await;
            let renewed = match records.renew_marker(&k, a, d).await {
                Ok(RenewOutcome::Renewed) => "renewed".to_owned(),
                other => format!("{other:?}"),
            };
            if !is_long(d) {
                lapse().await;
            }
            format!("{renewed}; {}", probe_record().await)
        }
        Field::SettleTimeout => {
            let _ = records.claim(claim(a, LONG)).await;
            let waiter = tokio::spawn({
                let (records, k) = (records.clone(), k.clone());
                async move { (records.wait_settled(&k, d).await, Instant::now()) }
            });
            if !is_long(d) {
                return match tokio::time::timeout(PROMPT, waiter).await {
                    Ok(Ok((Ok(()), _))) => "returns promptly while in flight".into(),
                    other => format!("{other:?}"),
                };
            }
            tokio::time::sleep(WATCH).await;
            if waiter.is_finished() {
                return format!("returned while in flight: {:?}", waiter.await);
            }
            let settled_at = Instant::now();
            let _ = records.complete(complete(a, LONG)).await;
            match tokio::time::timeout(PROMPT, waiter).await {
                Ok(Ok((Ok(()), at))) if at.duration_since(settled_at) < PROMPT => {
                    "waits while in flight; returns on completion".into()
                }
                other => format!("after completion: {other:?}"),
            }
        }
    }
}

fn describe_claim(outcome: Result<ClaimOutcome, coord_core::BackendError>) -> String {
    match outcome {
        Ok(ClaimOutcome::Claimed) => "claimed".into(),
        other => format!("{other:?}"),
    }
}

#[distributed_lock(key_from = "slot", lease = "5s", name = "ns.probe", coordinator = c)]
async fn plain_section(c: &Coordinator, slot: u32) -> Result<u32, CoordError> {
    Ok(slot)
}

/// Builds a coordinator with namespace `ns`; when that is accepted, shows that a call's lock
/// lives under `ns`: holding `ns:ns.probe:7` by hand keeps the call out, releasing lets it in.
async fn namespace(ns: String) -> String {
    let built = Coordinator::builder()
        .namespace(ns.clone())
        .memory()
        .build();
    let c = match built {
        Err(BuildError::InvalidNamespace(back)) if back == ns => {
            return "refused: InvalidNamespace".into();
        }
        Err(other) => return format!("refused: {other:?}"),
        Ok(c) => c,
    };
    let key = CallKey::builder(&ns, "ns.probe").part(&7u32).finish();
    let me = OwnerToken::new();
    let held = c
        .lock_provider()
        .acquire(LockRequest {
            key: &key,
            owner: me,
            lease: LONG,
            wait: Duration::ZERO,
            fenced: false,
        })
        .await;
    let kept_out = plain_section(&c, 7).await;
    let _ = c.lock_provider().release(&key, me).await;
    let let_in = plain_section(&c, 7).await;
    match (held, kept_out, let_in) {
        (Ok(Some(_)), Err(CoordError::LockNotAcquired { .. }), Ok(7)) if c.namespace() == ns => {
            "built; a call runs under the namespace".into()
        }
        other => format!("built; {other:?}"),
    }
}

// --- attribute scenarios ---------------------------------------------------------------------

const MAX_MS: &str = "9223372036854775807ms";

#[distributed_lock(key_from = "k", lease = "9223372036854775807ms", wait = "9223372036854775807ms", coordinator = c)]
async fn longest_lock(
    c: &Coordinator,
    k: &str,
    entered: Arc<AtomicUsize>,
    gate: Option<Arc<Notify>>,
) -> Result<(), CoordError> {
    entered.fetch_add(1, Ordering::SeqCst);
    if let Some(gate) = gate {
        gate.notified().await;
    }
    Ok(())
}

#[distributed_lock(key_from = "k", lease = "1ms", coordinator = c)]
async fn shortest_lease(c: &Coordinator, k: &str, hold: Duration) -> Result<(), CoordError> {
    tokio::time::sleep(hold).await;
    Ok(())
}

#[distributed_lock(key_from = "k", lease = "3ms", renew = true, coordinator = c)]
async fn shortest_renewed(c: &Coordinator, k: &str, hold: Duration) -> Result<(), CoordError> {
    tokio::time::sleep(hold).await;
    Ok(())
}

#[distributed_lock(key_from = "k", lease = "500ms", renew = true, coordinator = c)]
async fn short_renewed(c: &Coordinator, k: &str, hold: Duration) -> Result<(), CoordError> {
    tokio::time::sleep(hold).await;
    Ok(())
}

#[idempotent(
    key_from = "k",
    retention = "9223372036854775807ms",
    in_flight_lease = "9223372036854775807ms",
    wait = "9223372036854775807ms",
    coordinator = c
)]
async fn longest_record(
    c: &Coordinator,
    k: &str,
    runs: Arc<AtomicUsize>,
    hold: Duration,
) -> Result<String, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(hold).await;
    Ok(format!("done:{}", k.len()))
}

#[idempotent(key_from = "k", fingerprint = ["body"], coordinator = c)]
async fn echo(
    c: &Coordinator,
    k: &str,
    body: String,
    runs: Arc<AtomicUsize>,
) -> Result<String, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(body)
}

#[idempotent(key_from = ["a", "b"], coordinator = c)]
async fn pair(
    c: &Coordinator,
    a: &str,
    b: &str,
    runs: Arc<AtomicUsize>,
) -> Result<String, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(format!("{a}|{b}"))
}

#[idempotent(key_from = "k", coordinator = c)]
async fn optional_key(
    c: &Coordinator,
    k: Option<&str>,
    runs: Arc<AtomicUsize>,
) -> Result<u32, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(1)
}

/// Holds its run until `polled` callers are waiting (each counts itself once its first poll
/// returned, i.e. once it led or joined the flight), so every caller meets the same run.
#[single_flight(key_from = "k")]
async fn flight(
    k: Arc<String>,
    runs: Arc<AtomicUsize>,
    polled: Arc<AtomicUsize>,
) -> Result<usize, Arc<String>> {
    runs.fetch_add(1, Ordering::SeqCst);
    until(BOUND, || polled.load(Ordering::SeqCst) >= 16).await;
    Ok(k.len())
}

/// Runs `fut`, adding one to `polled` when its first poll returns pending.
async fn count_first_poll<F: Future>(fut: F, polled: Arc<AtomicUsize>) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let mut first = true;
    std::future::poll_fn(move |cx| {
        let poll = fut.as_mut().poll(cx);
        if std::mem::take(&mut first) && poll.is_pending() {
            polled.fetch_add(1, Ordering::SeqCst);
        }
        poll
    })
    .await
}

async fn until(bound: Duration, cond: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    while !cond() {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    true
}

fn mib(fill: char) -> String {
    std::iter::repeat_n(fill, 1 << 20).collect()
}

async fn attribute(attr: Attr) -> String {
    let c = memory("attr");
    let runs = Arc::new(AtomicUsize::new(0));
    let ran = |n| runs.load(Ordering::SeqCst) == n;
    match attr {
        Attr::LongestLockUncontended => {
            let _ = MAX_MS;
            match longest_lock(&c, "k", runs.clone(), None).await {
                Ok(()) if ran(1) => "ran once".into(),
                other => format!("{other:?}, runs {}", runs.load(Ordering::SeqCst)),
            }
        }
        Attr::LongestLockWaitCancelled => {
            let gate = Arc::new(Notify::new());
            let holder = tokio::spawn({
                let (c, runs, gate) = (c.clone(), runs.clone(), gate.clone());
                async move { longest_lock(&c, "k", runs, Some(gate)).await }
            });
            if !until(PROMPT, || ran(1)).await {
                return "holder never entered".into();
            }
            let cancelled =
                tokio::time::timeout(WATCH, longest_lock(&c, "k", runs.clone(), None)).await;
            if cancelled.is_ok() || !ran(1) {
                return format!("the waiter returned: {cancelled:?}");
            }
            let next = tokio::spawn({
                let (c, runs) = (c.clone(), runs.clone());
                async move { longest_lock(&c, "k", runs, None).await }
            });
            tokio::time::sleep(Duration::from_millis(100)).await;
            if !ran(1) {
                return "the next caller got in while held".into();
            }
            gate.notify_one();
            let done = tokio::time::timeout(PROMPT, async { (holder.await, next.await) }).await;
            match done {
                Ok((Ok(Ok(())), Ok(Ok(())))) if ran(2) => {
                    "waited until cancelled; next caller admitted on release".into()
                }
                other => format!("{other:?}"),
            }
        }
        Attr::ShortestLeaseOutlived => {
            let before = c.metrics().lapsed_releases();
            match shortest_lease(&c, "k", Duration::from_millis(50)).await {
                Ok(()) if c.metrics().lapsed_releases() == before + 1 => {
                    "ran; Ok; lapsed release counted".into()
                }
                other => format!(
                    "{other:?}, lapsed releases {}",
                    c.metrics().lapsed_releases() - before
                ),
            }
        }
        Attr::ShortestLeaseRenewed => {
            // A 3 ms lease renewed every millisecond: on a busy machine a renewal can come late,
            // and then the documented answer is `LockLost` with the body stopped. Either typed
            // answer is right; a panic, a hang, another error or a renewal left running is not.
            let out = shortest_renewed(&c, "k", Duration::from_millis(100)).await;
            let drained = until(PROMPT, || c.active_renewals() == 0).await;
            println!("  (shortest renewed lease answered {out:?})");
            match out {
                Ok(()) | Err(CoordError::LockLost { .. }) if drained => {
                    "ran; Ok or LockLost; no renewal left".into()
                }
                other => format!("{other:?}, renewals left {}", c.active_renewals()),
            }
        }
        Attr::ShortLeaseRenewed => {
            // Renewed every third of it, a 500 ms lease leaves over 300 ms of slack per renewal:
            // enough on a shared machine, so losing it here would be a renewal bug, not
            // scheduling noise.
            let out = short_renewed(&c, "k", Duration::from_millis(2500)).await;
            let drained = until(PROMPT, || c.active_renewals() == 0).await;
            match out {
                Ok(()) if drained => "ran; Ok; no renewal left".into(),
                other => format!("{other:?}, renewals left {}", c.active_renewals()),
            }
        }
        Attr::LongestRecordDurations => {
            let first = longest_record(&c, "k", runs.clone(), Duration::ZERO).await;
            let second = longest_record(&c, "k", runs.clone(), Duration::ZERO).await;
            match (first, second) {
                (Ok(a), Ok(b)) if a == b && ran(1) => "ran once; replayed".into(),
                other => format!("{other:?}, runs {}", runs.load(Ordering::SeqCst)),
            }
        }
        Attr::LongestDuplicateWait => {
            let first = tokio::spawn({
                let (c, runs) = (c.clone(), runs.clone());
                async move { longest_record(&c, "dup", runs, Duration::from_millis(300)).await }
            });
            if !until(PROMPT, || ran(1)).await {
                return "first call never started".into();
            }
            let second = longest_record(&c, "dup", runs.clone(), Duration::ZERO).await;
            match (first.await, second) {
                (Ok(Ok(a)), Ok(b)) if a == b && ran(1) => {
                    "duplicate waited; replayed; ran once".into()
                }
                other => format!("{other:?}, runs {}", runs.load(Ordering::SeqCst)),
            }
        }
        Attr::MibKey => {
            let key = mib('k');
            let mut other = key.clone();
            other.pop();
            other.push('{');
            let a = longest_record(&c, &key, runs.clone(), Duration::ZERO).await;
            let b = longest_record(&c, &key, runs.clone(), Duration::ZERO).await;
            let once = ran(1);
            let d = longest_record(&c, &other, runs.clone(), Duration::ZERO).await;
            match (a, b, d) {
                (Ok(a), Ok(b), Ok(_)) if a == b && once && ran(2) => {
                    "ran once; replayed; a key differing in its last byte ran".into()
                }
                other => format!("{other:?}, runs {}", runs.load(Ordering::SeqCst)),
            }
        }
        Attr::MibPayload => {
            let body = mib('\u{e9}');
            let a = echo(&c, "big", body.clone(), runs.clone()).await;
            let b = echo(&c, "big", body.clone(), runs.clone()).await;
            match (a, b) {
                (Ok(a), Ok(b)) if a == body && b == body && ran(1) => {
                    "ran once; replayed 1 MiB intact".into()
                }
                (a, b) => format!(
                    "lengths {:?} / {:?}, runs {}",
                    a.map(|s| s.len()),
                    b.map(|s| s.len()),
                    runs.load(Ordering::SeqCst)
                ),
            }
        }
        Attr::MibFingerprint => {
            let body = mib('x');
            let mut changed = body.clone();
            changed.insert(0, 'y');
            changed.pop();
            let a = echo(&c, "fp", body.clone(), runs.clone()).await;
            let b = echo(&c, "fp", body.clone(), runs.clone()).await;
            let d = echo(&c, "fp", changed, runs.clone()).await;
            match (a, b, d) {
                (Ok(a), Ok(b), Err(CoordError::KeyReused { .. })) if a == b && ran(1) => {
                    "replayed for the same; KeyReused for a different one".into()
                }
                (a, b, d) => format!(
                    "{:?} / {:?} / {:?}, runs {}",
                    a.map(|s| s.len()),
                    b.map(|s| s.len()),
                    d.map(|s| s.len()),
                    runs.load(Ordering::SeqCst)
                ),
            }
        }
        Attr::HostileKeyPairs => {
            let tuples = [("x:y", "z"), ("x", "y:z"), ("{x", "}"), ("", "\0")];
            for (a, b) in tuples {
                let _ = pair(&c, a, b, runs.clone()).await;
            }
            let mut wrong = Vec::new();
            for (a, b) in tuples {
                match pair(&c, a, b, runs.clone()).await {
                    Ok(out) if out == format!("{a}|{b}") => {}
                    other => wrong.push(format!("{a:?},{b:?} -> {other:?}")),
                }
            }
            if wrong.is_empty() && ran(4) {
                "4 distinct tuples ran 4 times; each replays its own".into()
            } else {
                format!("runs {}, wrong {wrong:?}", runs.load(Ordering::SeqCst))
            }
        }
        Attr::AbsentKey => match optional_key(&c, None, runs.clone()).await {
            Err(CoordError::MissingKey { .. }) if ran(0) => "MissingKey; body not run".into(),
            other => format!("{other:?}, runs {}", runs.load(Ordering::SeqCst)),
        },
        Attr::MibFlightKey => {
            let key = Arc::new(format!("{{:}}\0{}", mib('a')));
            let polled = Arc::new(AtomicUsize::new(0));
            let callers: Vec<_> = (0..16)
                .map(|_| {
                    let call = flight(key.clone(), runs.clone(), polled.clone());
                    tokio::spawn(count_first_poll(call, polled.clone()))
                })
                .collect();
            let mut answers = 0;
            for caller in callers {
                if let Ok(Ok(n)) = caller.await {
                    answers += usize::from(n == key.len());
                }
            }
            if ran(1) && answers == 16 {
                "ran once; 16 answers".into()
            } else {
                format!("runs {}, answers {answers}", runs.load(Ordering::SeqCst))
            }
        }
        Attr::HostilePurge => {
            let big = mib('}');
            // What coord never prints is refused as a key; what it could print purges
            // nothing that is not there.
            let refused = ["", ":", "{op}:1", "op:\0\n", big.as_str()];
            let mut answers = Vec::new();
            for k in refused {
                if CallKey::from_op_key(c.namespace(), k).is_ok() {
                    answers.push(Err(format!("{k:?} was accepted")));
                }
            }
            for k in ["op:%7Bx%7D", "op:%00%0A", "%_"] {
                let key = CallKey::from_op_key(c.namespace(), k).expect("a printable key");
                answers.push(c.purge_record(&key).await.map_err(|e| e.to_string()));
            }
            if answers.iter().all(|a| matches!(a, Ok(false))) {
                "nothing to purge for each".into()
            } else {
                format!("{answers:?}")
            }
        }
    }
}

// --- lifecycle -------------------------------------------------------------------------------

#[distributed_lock(key_from = "k", lease = "1s", wait = "10s", renew = "100ms", coordinator = c)]
async fn renewing(
    c: &Coordinator,
    k: u32,
    gate: Option<Arc<Notify>>,
    hold: Duration,
) -> Result<(), CoordError> {
    if let Some(gate) = gate {
        gate.notify_one();
        std::future::pending::<()>().await;
    }
    tokio::time::sleep(hold).await;
    Ok(())
}

async fn lifecycle(life: Life) -> String {
    match life {
        Life::AfterRuntimeDropped => tokio::task::spawn_blocking(after_runtime_dropped)
            .await
            .unwrap_or_else(|e| format!("panicked: {e}")),
        Life::RandomCancellation => random_cancellation().await,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A lock is held (and being renewed) on a runtime that is then dropped; on a second runtime
/// the same coordinator must see the lock freed by its lease, and renew new holds.
fn after_runtime_dropped() -> String {
    let c = memory("life");
    let first = runtime();
    let entered = Arc::new(Notify::new());
    first.spawn({
        let (c, entered) = (c.clone(), entered.clone());
        async move { renewing(&c, 1, Some(entered), Duration::ZERO).await }
    });
    let held = first.block_on(async {
        tokio::time::timeout(PROMPT, entered.notified())
            .await
            .is_ok()
            && renewing(&c, 2, None, Duration::ZERO).await.is_ok()
    });
    drop(first);
    if !held {
        return "the first runtime never held the lock".into();
    }
    let second = runtime();
    second.block_on(async {
        let started = Instant::now();
        // The hold on key 1 died with its runtime: the lease (1 s) frees it.
        let next = renewing(&c, 1, None, Duration::ZERO).await;
        let waited = started.elapsed();
        // A body three leases long survives only if renewals run on this runtime.
        let long = renewing(&c, 3, None, Duration::from_millis(3000)).await;
        let drained = until(PROMPT, || c.active_renewals() == 0).await;
        match (next, long) {
            (Ok(()), Ok(())) if waited < Duration::from_secs(5) && drained => {
                "lock freed by its lease; renewals run on the new runtime".into()
            }
            other => format!(
                "{other:?} after {waited:?}, renewals left {}",
                c.active_renewals()
            ),
        }
    })
}

#[distributed_lock(key_from = "k", lease = "2s", wait = "50ms", coordinator = c)]
async fn churn_lock(c: &Coordinator, k: u32, hold: Duration) -> Result<(), CoordError> {
    tokio::time::sleep(hold).await;
    Ok(())
}

#[idempotent(key_from = "k", in_flight_lease = "2s", wait = "50ms", coordinator = c)]
#[distributed_lock(lease = "2s", wait = "50ms")]
async fn churn_both(c: &Coordinator, k: u64, hold: Duration) -> Result<u64, CoordError> {
    tokio::time::sleep(hold).await;
    Ok(k)
}

#[single_flight(key_from = "k")]
async fn churn_flight(k: u32, hold: Duration) -> Result<u32, Arc<String>> {
    tokio::time::sleep(hold).await;
    Ok(k)
}

/// A small deterministic generator: the cut points differ per task and round, and a failure
/// can be replayed.
fn next_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

async fn random_cancellation() -> String {
    let c = memory("churn");
    let stop = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..32u64 {
        let (c, stop, finished) = (c.clone(), stop.clone(), finished.clone());
        tasks.push(tokio::spawn(async move {
            let mut state = 0x9E37_79B9_7F4A_7C15 ^ (t + 1);
            let mut round = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let r = next_random(&mut state);
                let key = (r % 3) as u32;
                let hold = Duration::from_micros(r % 3000);
                let cut = Duration::from_micros((r >> 8) % 4000);
                match (r >> 20) % 3 {
                    0 => drop(tokio::time::timeout(cut, churn_lock(&c, key, hold)).await),
                    1 => drop(
                        tokio::time::timeout(cut, churn_both(&c, u64::from(key) + round * 3, hold))
                            .await,
                    ),
                    _ => drop(tokio::time::timeout(cut, churn_flight(key, hold)).await),
                }
                round += 1;
            }
            finished.fetch_add(1, Ordering::SeqCst);
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::SeqCst);
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        for task in tasks {
            let _ = task.await;
        }
    })
    .await
    .is_ok();
    if !ended {
        return format!(
            "deadlock: {} of 32 tasks ended",
            finished.load(Ordering::SeqCst)
        );
    }
    // Every key still answers: a lock taken with a wait longer than any leftover lease.
    let mut usable = 0;
    for key in 0..3 {
        usable += usize::from(churn_lock(&c, key, Duration::ZERO).await.is_ok());
        usable += usize::from(churn_flight(key, Duration::ZERO).await == Ok(key));
    }
    let quiet = until(PROMPT, || c.active_renewals() == 0).await;
    if usable == 6 && quiet && finished.load(Ordering::SeqCst) == 32 {
        "all tasks ended; every key usable; nothing left open".into()
    } else {
        format!("usable {usable}/6, renewals left {}", c.active_renewals())
    }
}

// ---------------------------------------------------------------------------------------------

/// The smallest count of in-process cases the corpus promises.
const MIN_CASES: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_bad_input_corpus() {
    let groups = [
        ("provider requests", request_cases()),
        ("builder", builder_cases()),
        ("attributes", attribute_cases()),
        ("lifecycle", lifecycle_cases()),
    ];
    let mut total = 0;
    let mut failed = Vec::new();
    for (group, cases) in groups {
        let count = cases.len();
        for case in cases {
            let started = Instant::now();
            let saw = match tokio::time::timeout(BOUND, tokio::spawn(run(case.input.clone()))).await
            {
                Err(_) => format!("hung (no answer within {BOUND:?})"),
                Ok(Err(join)) if join.is_panic() => "panicked".to_owned(),
                Ok(Err(join)) => format!("task failed: {join}"),
                Ok(Ok(saw)) => saw,
            };
            let verdict = if saw == case.expect { "PASS" } else { "FAIL" };
            println!(
                "case {} [{}]: expected {}; saw {saw} ({:?}): {verdict}",
                case.name,
                describe(&case.input),
                case.expect,
                started.elapsed()
            );
            if verdict == "FAIL" {
                failed.push(case.name);
            }
        }
        println!("category {group}: {count} cases");
        total += count;
    }
    println!("in-process corpus: {total} cases, {} failed", failed.len());
    assert!(failed.is_empty(), "failed cases: {failed:?}");
    assert!(total >= MIN_CASES, "only {total} cases");
}
