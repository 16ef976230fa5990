//! The bad-input corpus against Redis, for every client compiled in: no input panics, hangs or
//! deadlocks, and each gets its documented answer.
//!
//! One table of cases, run once per client against a `redis-server` of its own. Every case
//! names its input, states what it expects and prints what it saw (`panicked` for a panic,
//! `hung` for no answer within [`BOUND`]). Categories:
//!
//! * request durations: 1 ns, 999 µs, `u64::MAX` s and 2^46 ms ± 1 (the provider's expiry
//!   cap) in every duration field of the provider API. Zero, 1 µs, `Duration::MAX` and
//!   `u64::MAX` ms are in `durations.rs` and not repeated here. Long expiries must reach Redis
//!   capped at 2^46 ms, never unbounded; long waits last until granted or dropped.
//! * the builder's command timeout: zero (refused as `Config`), sub-millisecond, and values
//!   too large to add to a clock.
//! * hostile call keys on a real server: every Redis name of one call key lands in the
//!   namespace, with the call key as its hash tag, in one slot; tuples that differ get
//!   different names.
//! * raw keys handed straight to the provider (bypassing the key builder): a key whose layout
//!   would break (empty, braces) is refused as `Config` naming the key, before Redis sees it.
//! * payloads: empty, 1 MiB, non-UTF-8 bytes, extreme fingerprints, replayed byte-exact.
//! * the attributes over Redis with the longest durations the macros accept.
//!
//! Values coord did not write under its keys are the table in `corrupt_state.rs`.

use crate::support;

use coord_core::CallKey;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::provider::{
    BackendErrorKind, ClaimOutcome, ClaimRequest, CompleteOutcome, CompleteRequest, Fingerprint,
    IdempotencyStore, LockProvider, OwnerToken, ReleaseOutcome, RenewOutcome,
};
use coord_core::{CoordError, Coordinator, distributed_lock, idempotent};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::{RedisServer, Resp};
use support::*;

per_client!(redis_bad_input_corpus);

/// The longest any case may take before it counts as hung.
const BOUND: Duration = Duration::from_secs(20);
/// How long a wait that should go on is watched before it is released.
const WATCH: Duration = Duration::from_millis(300);
/// How soon a released waiter must answer (generous: the machine is shared).
const PROMPT: Duration = Duration::from_secs(3);
/// The provider's expiry cap, 2^46 ms.
const CAP_MS: i64 = 1 << 46;

fn durations() -> Vec<(&'static str, Duration)> {
    let cap = Duration::from_millis(CAP_MS as u64);
    vec![
        ("1ns", Duration::from_nanos(1)),
        ("999us", Duration::from_micros(999)),
        ("u64::MAX s", Duration::from_secs(u64::MAX)),
        ("2^46 ms - 1", cap - Duration::from_millis(1)),
        ("2^46 ms", cap),
        ("2^46 ms + 1", cap + Duration::from_millis(1)),
    ]
}

fn is_long(d: Duration) -> bool {
    d >= Duration::from_secs(1)
}

/// A call key under a namespace of its own (so `KEYS <ns>:*` lists only its names).
fn fresh_ns() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("bi{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

// ---------------------------------------------------------------------------------------------
// The table.

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
enum Payload {
    Empty,
    Mib,
    NonUtf8Mib,
    ExtremeFingerprints,
}

#[derive(Debug, Clone, Copy)]
enum Attr {
    LongestLock,
    LongestRecord,
    HostileMibKey,
}

#[derive(Debug, Clone)]
enum Input {
    Request(Field, Duration),
    CommandTimeout(Duration),
    PoolSize(usize),
    /// String parts of a call key built by the key builder.
    Parts(Vec<String>),
    /// Two tuples that must not share Redis names.
    PartsPair(Vec<String>, Vec<String>),
    /// A key handed to the provider as it is.
    RawKey(String),
    PurgeOpKey(String),
    Payload(Payload),
    Attr(Attr),
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
                    "granted with a token; capped expiry; held; released",
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
                pick("renewed; capped expiry; held", "renewed; free"),
            ),
            (
                Field::ClaimLease,
                "in-flight lease",
                pick("claimed; capped expiry; in flight", "claimed; claimable"),
            ),
            (
                Field::KeepAbandoned,
                "keep_abandoned_for",
                pick("claimed; capped expiry; abandoned", "claimed; claimable"),
            ),
            (
                Field::Retention,
                "retention",
                pick("stored; capped expiry; replayed", "stored; claimable"),
            ),
            (
                Field::MarkerRenew,
                "marker renewal",
                pick("renewed; capped expiry; in flight", "renewed; claimable"),
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

fn timeout_cases() -> Vec<Case> {
    let mut cases = vec![case(
        "command timeout = zero",
        Input::CommandTimeout(Duration::ZERO),
        "refused: Config",
    )];
    for (what, d) in [
        ("1ns", Duration::from_nanos(1)),
        ("1us", Duration::from_micros(1)),
        ("999us", Duration::from_micros(999)),
    ] {
        cases.push(case(
            format!("command timeout = {what}"),
            Input::CommandTimeout(d),
            "typed answers",
        ));
    }
    for (what, d) in [
        ("2^46 ms", Duration::from_millis(CAP_MS as u64)),
        ("u64::MAX ms", Duration::from_millis(u64::MAX)),
        ("u64::MAX s", Duration::from_secs(u64::MAX)),
        ("Duration::MAX", Duration::MAX),
    ] {
        cases.push(case(
            format!("command timeout = {what}"),
            Input::CommandTimeout(d),
            "connected; granted",
        ));
    }
    cases.push(case("pool size = 0", Input::PoolSize(0), "refused: Config"));
    // No machine holds usize::MAX connections: the builder has to refuse it, not let the
    // pool's allocation panic.
    cases.push(case(
        "pool size = usize::MAX",
        Input::PoolSize(usize::MAX),
        "refused: Config",
    ));
    cases
}

fn parts(list: &[&str]) -> Vec<String> {
    list.iter().map(|p| (*p).to_owned()).collect()
}

fn key_cases() -> Vec<Case> {
    let confined = "3 names in the namespace, tagged by the call key, one slot";
    // A fenced lock is two names (lock and fence counter) per call key.
    let apart = "both granted; 4 distinct names";
    let mib = "a".repeat(1 << 20);
    vec![
        case("empty part", Input::Parts(parts(&[""])), confined),
        case(
            "NUL, newline and DEL",
            Input::Parts(parts(&["\0\n\r\x7f"])),
            confined,
        ),
        case(
            "hash tag in a part",
            Input::Parts(parts(&["{user}", "}{"])),
            confined,
        ),
        case(
            "glob characters",
            Input::Parts(parts(&["*", "?", "[a]"])),
            confined,
        ),
        case(
            "separators and escapes",
            Input::Parts(parts(&[":", "%", "%3A"])),
            confined,
        ),
        case(
            "Unicode lookalikes",
            Input::Parts(parts(&["\u{FF1A}", "\u{FF5B}\u{FF5D}", "\u{2010}"])),
            confined,
        ),
        case(
            "text from non-UTF-8 bytes",
            Input::Parts(vec![String::from_utf8_lossy(b"\xff\xfe").into_owned()]),
            confined,
        ),
        case("1 MiB part", Input::Parts(vec![mib.clone()]), confined),
        case(
            "1 MiB of braces",
            Input::Parts(vec!["{}".repeat(1 << 19)]),
            confined,
        ),
        case(
            "separator in a part vs two parts",
            Input::PartsPair(parts(&["a:b"]), parts(&["a", "b"])),
            apart,
        ),
        case(
            "escaped text vs its escape",
            Input::PartsPair(parts(&["{"]), parts(&["%7B"])),
            apart,
        ),
        case(
            "fullwidth colon vs colon",
            Input::PartsPair(parts(&["a\u{FF1A}b"]), parts(&["a:b"])),
            apart,
        ),
        case(
            "empty part vs no part",
            Input::PartsPair(parts(&[""]), parts(&[])),
            apart,
        ),
        case(
            "1 MiB parts differing in the last byte",
            Input::PartsPair(vec![format!("{mib}x")], vec![format!("{mib}y")]),
            apart,
        ),
    ]
}

fn raw_key_cases() -> Vec<Case> {
    // Text an operator pastes (`namespace:operation[:parts]`) becomes a key only through
    // `CallKey::from_op_key`; what coord never prints is refused before Redis sees anything.
    let refused = "refused: not a coord key; nothing written";
    vec![
        case("empty key", Input::RawKey(String::new()), refused),
        case("namespace only", Input::RawKey("ns:".into()), refused),
        case(
            "brace in the key",
            Input::RawKey("ns:op:{x}".into()),
            refused,
        ),
        case("lone close brace", Input::RawKey("ns:op}".into()), refused),
        case(
            "brace in the namespace",
            Input::RawKey("n{s:op".into()),
            "accepted: the namespace is escaped; one hash tag per name",
        ),
        case(
            "purge_record with a brace",
            Input::PurgeOpKey("op:{x}".into()),
            "refused: not a coord key",
        ),
        case(
            "purge_record with control bytes",
            Input::PurgeOpKey("op:\0\n*".into()),
            "refused: not a coord key",
        ),
        case(
            "purge_record with nothing there",
            Input::PurgeOpKey("op:%00%0A*".into()),
            "nothing purged",
        ),
    ]
}

fn payload_cases() -> Vec<Case> {
    let same = "stored; replayed byte-exact";
    vec![
        case("empty payload", Input::Payload(Payload::Empty), same),
        case("1 MiB payload", Input::Payload(Payload::Mib), same),
        case(
            "1 MiB of non-UTF-8 bytes",
            Input::Payload(Payload::NonUtf8Mib),
            same,
        ),
        case(
            "all-zero and all-ones fingerprints",
            Input::Payload(Payload::ExtremeFingerprints),
            "fingerprints stored and read back exactly",
        ),
    ]
}

fn attribute_cases() -> Vec<Case> {
    vec![
        case(
            "lock with the longest lease and wait",
            Input::Attr(Attr::LongestLock),
            "ran; capped expiry while held; free after",
        ),
        case(
            "idempotent with the longest retention, lease and wait",
            Input::Attr(Attr::LongestRecord),
            "ran once; capped expiry; replayed",
        ),
        case(
            "idempotent with a hostile 1 MiB key",
            Input::Attr(Attr::HostileMibKey),
            "ran once; replayed; one record in the namespace",
        ),
    ]
}

fn describe(input: &Input) -> String {
    let short = |s: &str| {
        if s.len() > 40 {
            format!("{} bytes", s.len())
        } else {
            format!("{s:?}")
        }
    };
    match input {
        Input::Request(field, d) => format!("{field:?} {d:?}"),
        Input::CommandTimeout(d) => format!("command_timeout {d:?}"),
        Input::PoolSize(n) => format!("pool_size {n}"),
        Input::Parts(p) => format!("parts {:?}", p.iter().map(|s| short(s)).collect::<Vec<_>>()),
        Input::PartsPair(a, b) => format!(
            "parts {:?} vs {:?}",
            a.iter().map(|s| short(s)).collect::<Vec<_>>(),
            b.iter().map(|s| short(s)).collect::<Vec<_>>()
        ),
        Input::RawKey(k) | Input::PurgeOpKey(k) => short(k),
        other => format!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Running.

/// What one run needs: the server and a provider over it with the client under test.
#[derive(Clone)]
struct Env {
    server: Arc<RedisServer>,
    p: RedisProvider,
    client: Client,
}

type Saw = Pin<Box<dyn Future<Output = String> + Send>>;

fn run(env: Env, input: Input) -> Saw {
    match input {
        Input::Request(field, d) => Box::pin(request(env, field, d)),
        Input::CommandTimeout(d) => Box::pin(command_timeout(env, d)),
        Input::PoolSize(n) => Box::pin(pool_size(env, n)),
        Input::Parts(p) => Box::pin(confined(env, p)),
        Input::PartsPair(a, b) => Box::pin(apart(env, a, b)),
        Input::RawKey(k) => Box::pin(raw_key(env, k)),
        Input::PurgeOpKey(k) => Box::pin(purge_op_key(env, k)),
        Input::Payload(p) => Box::pin(payload(env, p)),
        Input::Attr(a) => Box::pin(attribute(env, a)),
    }
}

fn pttl(server: &RedisServer, name: &str) -> i64 {
    server.command(&["PTTL", name]).int().unwrap_or(i64::MIN)
}

/// `capped expiry` when `name`'s expiry is within a minute under the cap, else what it is.
fn capped(server: &RedisServer, name: &str) -> String {
    let ms = pttl(server, name);
    if ms > CAP_MS - 60_000 && ms <= CAP_MS + 1 {
        "capped expiry".into()
    } else {
        format!("PTTL {ms}")
    }
}

async fn request(env: Env, field: Field, d: Duration) -> String {
    let Env { server, p, .. } = env;
    let k = kk(&format!("{}:op:1", fresh_ns()));
    let (lock_name, record) = (redis_key(&k, "lock"), redis_key(&k, "idem"));
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    let lapse = || tokio::time::sleep(Duration::from_millis(20));
    let probe_lock = || async {
        match p.acquire(lock(&k, b, LONG, Duration::ZERO)).await {
            Ok(Some(_)) => "free".to_owned(),
            Ok(None) => "held".to_owned(),
            Err(e) => format!("{e}"),
        }
    };
    let probe_record = || async {
        match p.claim(claim(&k, b, LONG)).await {
            Ok(ClaimOutcome::Claimed) => "claimable".to_owned(),
            Ok(ClaimOutcome::InFlight { .. }) => "in flight".to_owned(),
            Ok(ClaimOutcome::Abandoned { .. }) => "abandoned".to_owned(),
            Ok(ClaimOutcome::Completed { payload, .. }) if &payload[..] == b"outcome" => {
                "replayed".to_owned()
            }
            other => format!("{other:?}"),
        }
    };
    let complete = |owner, retention| CompleteRequest {
        key: &k,
        owner,
        payload: Arc::from(&b"outcome"[..]),
        retention,
        fingerprint: None,
    };
    let expiry = |name: &str| {
        if is_long(d) {
            format!("; {}", capped(&server, name))
        } else {
            String::new()
        }
    };
    match field {
        Field::LockLease => {
            let grant = match p.acquire(fenced(&k, a, d, Duration::ZERO)).await {
                Ok(Some(g)) if g.fencing_token.is_some() => "granted with a token".to_owned(),
                other => format!("{other:?}"),
            };
            let expiry = expiry(&lock_name);
            if !is_long(d) {
                lapse().await;
            }
            let probe = probe_lock().await;
            let released = match p.release(&k, a).await {
                Ok(ReleaseOutcome::Released) => "released".to_owned(),
                Ok(ReleaseOutcome::NotHeld) => "not held".to_owned(),
                Ok(ReleaseOutcome::ForceReleased) => "force released".to_owned(),
                Err(e) => format!("{e}"),
            };
            format!("{grant}{expiry}; {probe}; {released}")
        }
        Field::LockWait => {
            if !matches!(
                p.acquire(lock(&k, a, LONG, Duration::ZERO)).await,
                Ok(Some(_))
            ) {
                return "setup: holder refused".into();
            }
            let waiter = tokio::spawn({
                let (p, k) = (p.clone(), k.clone());
                async move {
                    let got = p.acquire(fenced(&k, b, LONG, d)).await;
                    (got.map(|g| g.is_some()), Instant::now())
                }
            });
            if !is_long(d) {
                return match tokio::time::timeout(PROMPT, waiter).await {
                    Ok(Ok((Ok(false), _))) => "refused promptly while held".into(),
                    other => format!("{other:?}"),
                };
            }
            tokio::time::sleep(WATCH).await;
            if waiter.is_finished() {
                return format!("returned while held: {:?}", waiter.await);
            }
            let released_at = Instant::now();
            let _ = p.release(&k, a).await;
            match tokio::time::timeout(PROMPT, waiter).await {
                Ok(Ok((Ok(true), at))) if at.duration_since(released_at) < PROMPT => {
                    "waits while held; granted on release".into()
                }
                other => format!("after release: {other:?}"),
            }
        }
        Field::LockRenew => {
            if !matches!(
                p.acquire(lock(&k, a, LONG, Duration::ZERO)).await,
                Ok(Some(_))
            ) {
                return "setup: holder refused".into();
            }
            let renewed = match p.renew(&k, a, d).await {
                Ok(RenewOutcome::Renewed) => "renewed".to_owned(),
                other => format!("{other:?}"),
            };
            let expiry = expiry(&lock_name);
            if !is_long(d) {
                lapse().await;
            }
            format!("{renewed}{expiry}; {}", probe_lock().await)
        }
        Field::ClaimLease => {
            let claimed = describe_claim(p.claim(claim(&k, a, d)).await);
            let expiry = expiry(&record);
            if !is_long(d) {
                lapse().await;
            }
            format!("{claimed}{expiry}; {}", probe_record().await)
        }
        Field::KeepAbandoned => {
            let req = ClaimRequest {
                keep_abandoned_for: Some(d),
                ..claim(&k, a, Duration::from_millis(1))
            };
            let claimed = describe_claim(p.claim(req).await);
            let expiry = expiry(&record);
            lapse().await;
            format!("{claimed}{expiry}; {}", probe_record().await)
        }
        Field::Retention => {
            let _ = p.claim(claim(&k, a, LONG)).await;
            let stored = match p.complete(complete(a, d)).await {
                Ok(CompleteOutcome::Stored) => "stored".to_owned(),
                other => format!("{other:?}"),
            };
            let expiry = expiry(&record);
            if !is_long(d) {
                lapse().await;
            }
            format!("{stored}{expiry}; {}", probe_record().await)
        }
        Field::MarkerRenew => {
            let _ = p.claim(claim(&k, a, LONG)).await;
            let renewed = match p.renew_marker(&k, a, d).await {
                Ok(RenewOutcome::Renewed) => "renewed".to_owned(),
                other => format!("{other:?}"),
            };
            let expiry = expiry(&record);
            if !is_long(d) {
                lapse().await;
            }
            format!("{renewed}{expiry}; {}", probe_record().await)
        }
        Field::SettleTimeout => {
            let _ = p.claim(claim(&k, a, LONG)).await;
            let waiter = tokio::spawn({
                let (p, k) = (p.clone(), k.clone());
                async move { (p.wait_settled(&k, d).await, Instant::now()) }
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
            let _ = p.complete(complete(a, LONG)).await;
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

/// Connects with `timeout` as the command timeout. Tiny timeouts may fail to connect or time
/// commands out, but only with typed errors; huge ones must work as "no practical bound".
async fn command_timeout(env: Env, timeout: Duration) -> String {
    let connected = RedisProvider::builder(env.server.url())
        .client(env.client)
        .command_timeout(timeout)
        .connect()
        .await;
    let p = match connected {
        Err(e) if timeout.is_zero() && e.kind() == BackendErrorKind::Config => {
            return "refused: Config".into();
        }
        Err(e)
            if timeout < Duration::from_millis(1)
                && matches!(
                    e.kind(),
                    BackendErrorKind::Timeout | BackendErrorKind::Unavailable
                ) =>
        {
            println!("  (connect answered {e})");
            return "typed answers".into();
        }
        Err(e) => return format!("connect failed: {e:?}"),
        Ok(p) => p,
    };
    let k = kk(&format!("{}:op:1", fresh_ns()));
    let got = p
        .acquire(fenced(&k, OwnerToken::new(), LONG, Duration::ZERO))
        .await;
    match got {
        Ok(Some(_)) if timeout >= Duration::from_millis(1) => "connected; granted".into(),
        Ok(_) => "typed answers".into(),
        Err(e)
            if timeout < Duration::from_millis(1)
                && matches!(
                    e.kind(),
                    BackendErrorKind::Timeout | BackendErrorKind::Unavailable
                ) =>
        {
            println!("  (acquire answered {e})");
            "typed answers".into()
        }
        Err(e) => format!("acquire failed: {e:?}"),
    }
}

async fn pool_size(env: Env, size: usize) -> String {
    let connected = RedisProvider::builder(env.server.url())
        .client(env.client)
        .pool_size(size)
        .connect()
        .await;
    match connected {
        Err(e) if e.kind() == BackendErrorKind::Config => "refused: Config".into(),
        Err(e) => format!("refused: {e:?}"),
        Ok(_) => "connected".into(),
    }
}

/// CRC16/XMODEM, Redis Cluster's slot checksum.
fn crc16(data: &[u8]) -> u16 {
    let mut crc = 0u16;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// What Redis hashes of `name`: the first `{..}` when not empty, else all of it.
fn hashed_part(name: &[u8]) -> &[u8] {
    if let Some(open) = name.iter().position(|&b| b == b'{')
        && let Some(len) = name[open + 1..].iter().position(|&b| b == b'}')
        && len > 0
    {
        return &name[open + 1..open + 1 + len];
    }
    name
}

/// The names Redis holds under `ns` (`KEYS`; the namespaces here hold no glob characters).
fn names_in(server: &RedisServer, ns: &str) -> Vec<Vec<u8>> {
    match server.command(&["KEYS", &format!("{ns}:*")]) {
        Resp::Array(items) => items
            .into_iter()
            .filter_map(|item| match item {
                Resp::Bulk(bytes) => Some(bytes),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn call_key(ns: &str, parts: &[String]) -> CallKey {
    parts
        .iter()
        .fold(CallKey::builder(ns, "op"), |b, p| b.part(p.as_str()))
        .finish()
}

/// Takes a fenced lock and claims a record for the call key of `parts`, then checks every
/// name Redis now holds under the namespace.
async fn confined(env: Env, parts: Vec<String>) -> String {
    let Env { server, p, .. } = env;
    let ns = fresh_ns();
    let k = call_key(&ns, &parts);
    let owner = OwnerToken::new();
    let locked = p.acquire(fenced(&k, owner, LONG, Duration::ZERO)).await;
    let claimed = p.claim(claim(&k, owner, LONG)).await;
    if !matches!(locked, Ok(Some(_))) || !matches!(claimed, Ok(ClaimOutcome::Claimed)) {
        return format!("lock {locked:?}, claim {claimed:?}");
    }
    let names = names_in(&server, &ns);
    let tag = k.op_key().as_bytes();
    let prefix = format!("{ns}:");
    let mut problems = Vec::new();
    let slots: Vec<u16> = names
        .iter()
        .map(|n| crc16(hashed_part(n)) % 16384)
        .collect();
    if names.len() != 3 {
        problems.push(format!("{} names", names.len()));
    }
    for name in &names {
        if !name.starts_with(prefix.as_bytes()) {
            problems.push("a name outside the namespace".to_owned());
        }
        if hashed_part(name) != tag {
            problems.push("a hash tag that is not the call key".to_owned());
        }
    }
    if slots.windows(2).any(|w| w[0] != w[1]) {
        problems.push(format!("slots {slots:?}"));
    }
    let released = p.release(&k, owner).await;
    let abandoned = p.abandon(&k, owner).await;
    if !matches!(released, Ok(ReleaseOutcome::Released)) || !matches!(abandoned, Ok(true)) {
        problems.push(format!("release {released:?}, abandon {abandoned:?}"));
    }
    if problems.is_empty() {
        "3 names in the namespace, tagged by the call key, one slot".into()
    } else {
        problems.join("; ")
    }
}

async fn apart(env: Env, a: Vec<String>, b: Vec<String>) -> String {
    let Env { server, p, .. } = env;
    let ns = fresh_ns();
    let (ka, kb) = (call_key(&ns, &a), call_key(&ns, &b));
    let got_a = p
        .acquire(fenced(&ka, OwnerToken::new(), LONG, Duration::ZERO))
        .await;
    let got_b = p
        .acquire(fenced(&kb, OwnerToken::new(), LONG, Duration::ZERO))
        .await;
    let names = names_in(&server, &ns);
    match (got_a, got_b) {
        (Ok(Some(_)), Ok(Some(_))) => {
            let mut distinct = names.clone();
            distinct.sort();
            distinct.dedup();
            format!("both granted; {} distinct names", distinct.len())
        }
        other => format!("{other:?}"),
    }
}

async fn raw_key(env: Env, text: String) -> String {
    let Env { server, p, .. } = env;
    let before = server.command(&["DBSIZE"]).int();
    let (ns, op_key) = text.split_once(':').unwrap_or((&text, ""));
    let k = match CallKey::from_op_key(ns, op_key) {
        Err(_) => {
            let after = server.command(&["DBSIZE"]).int();
            return if before == after {
                "refused: not a coord key; nothing written".into()
            } else {
                format!("refused, but keys {before:?} -> {after:?}")
            };
        }
        Ok(k) => k,
    };
    let owner = OwnerToken::new();
    let locked = p.acquire(fenced(&k, owner, LONG, Duration::ZERO)).await;
    let claimed = p.claim(claim(&k, owner, LONG)).await;
    if !matches!(locked, Ok(Some(_))) || !matches!(claimed, Ok(ClaimOutcome::Claimed)) {
        return format!("lock {locked:?}, claim {claimed:?}");
    }
    let names = names_in(&server, k.namespace());
    let one_tag = |n: &Vec<u8>| {
        n.iter().filter(|&&b| b == b'{').count() == 1
            && n.iter().filter(|&&b| b == b'}').count() == 1
    };
    if names.len() == 3 && names.iter().all(one_tag) {
        "accepted: the namespace is escaped; one hash tag per name".into()
    } else {
        format!("names {names:?}")
    }
}

async fn purge_op_key(env: Env, op_key: String) -> String {
    let c = Coordinator::builder()
        .namespace(fresh_ns())
        .provider(env.p.clone())
        .build()
        .expect("coordinator");
    let Ok(key) = CallKey::from_op_key(c.namespace(), &op_key) else {
        return "refused: not a coord key".into();
    };
    match c.purge_record(&key).await {
        Ok(false) => "nothing purged".into(),
        other => format!("{other:?}"),
    }
}

async fn payload(env: Env, which: Payload) -> String {
    let p = env.p;
    let k = kk(&format!("{}:op:1", fresh_ns()));
    let owner = OwnerToken::new();
    if let Payload::ExtremeFingerprints = which {
        let mut seen = Vec::new();
        for (i, fp) in [[0u8; 16], [0xff; 16]].into_iter().enumerate() {
            let k = CallKey::builder(k.namespace(), "op")
                .part(&format!("1{i}"))
                .finish();
            let req = ClaimRequest {
                fingerprint: Some(Fingerprint(fp)),
                ..claim(&k, owner, LONG)
            };
            let _ = p.claim(req).await;
            match p.claim(claim(&k, OwnerToken::new(), LONG)).await {
                Ok(ClaimOutcome::InFlight { fingerprint, .. }) => {
                    seen.push(fingerprint == Some(Fingerprint(fp)))
                }
                other => return format!("{other:?}"),
            }
        }
        return if seen == [true, true] {
            "fingerprints stored and read back exactly".into()
        } else {
            format!("{seen:?}")
        };
    }
    let bytes: Vec<u8> = match which {
        Payload::Empty => Vec::new(),
        Payload::Mib => b"payload-".iter().copied().cycle().take(1 << 20).collect(),
        _ => (0..1u32 << 20)
            .map(|i| [0xff, 0xfe, 0x00, 0x80][i as usize % 4])
            .collect(),
    };
    let payload: Arc<[u8]> = Arc::from(bytes);
    let _ = p.claim(claim(&k, owner, LONG)).await;
    let stored = p
        .complete(CompleteRequest {
            key: &k,
            owner,
            payload: payload.clone(),
            retention: LONG,
            fingerprint: None,
        })
        .await;
    let replay = p.claim(claim(&k, OwnerToken::new(), LONG)).await;
    match (stored, replay) {
        (Ok(CompleteOutcome::Stored), Ok(ClaimOutcome::Completed { payload: back, .. }))
            if back == payload =>
        {
            "stored; replayed byte-exact".into()
        }
        (stored, Ok(ClaimOutcome::Completed { payload: back, .. })) => {
            format!(
                "{stored:?}; replayed {} of {} bytes",
                back.len(),
                payload.len()
            )
        }
        other => format!("{other:?}"),
    }
}

#[distributed_lock(key_from = "k", lease = "9223372036854775807ms", wait = "9223372036854775807ms", name = "bi.lock", coordinator = c)]
async fn longest_lock(
    c: &Coordinator,
    k: &str,
    server: &RedisServer,
    lock_name: &str,
) -> Result<String, CoordError> {
    Ok(capped(server, lock_name))
}

#[idempotent(
    key_from = "k",
    retention = "9223372036854775807ms",
    in_flight_lease = "9223372036854775807ms",
    wait = "9223372036854775807ms",
    name = "bi.record",
    coordinator = c
)]
async fn longest_record(
    c: &Coordinator,
    k: &str,
    runs: Arc<AtomicUsize>,
) -> Result<String, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(format!("done:{}", k.len()))
}

async fn attribute(env: Env, which: Attr) -> String {
    let Env { server, p, .. } = env;
    let ns = fresh_ns();
    let c = Coordinator::builder()
        .namespace(ns.clone())
        .provider(p)
        .build()
        .expect("coordinator");
    let runs = Arc::new(AtomicUsize::new(0));
    let ran = |n| runs.load(Ordering::SeqCst) == n;
    match which {
        Attr::LongestLock => {
            let key = CallKey::builder(&ns, "bi.lock").part("k").finish();
            let name = redis_key(&key, "lock");
            let inside = longest_lock(&c, "k", &server, &name).await;
            let after = server.command(&["EXISTS", &name]).int();
            match inside {
                Ok(expiry) if after == Some(0) => format!("ran; {expiry} while held; free after"),
                other => format!("{other:?}, exists after: {after:?}"),
            }
        }
        Attr::LongestRecord => {
            let a = longest_record(&c, "k", runs.clone()).await;
            let key = CallKey::builder(&ns, "bi.record").part("k").finish();
            let expiry = capped(&server, &redis_key(&key, "idem"));
            let b = longest_record(&c, "k", runs.clone()).await;
            match (a, b) {
                (Ok(a), Ok(b)) if a == b && ran(1) => format!("ran once; {expiry}; replayed"),
                other => format!("{other:?}, {expiry}, runs {}", runs.load(Ordering::SeqCst)),
            }
        }
        Attr::HostileMibKey => {
            let key = format!("{{\0:*\n}}{}", "\u{FF1A}".repeat(1 << 18));
            let a = longest_record(&c, &key, runs.clone()).await;
            let b = longest_record(&c, &key, runs.clone()).await;
            let names = names_in(&server, &ns);
            match (a, b) {
                (Ok(a), Ok(b)) if a == b && ran(1) && names.len() == 1 => {
                    "ran once; replayed; one record in the namespace".into()
                }
                other => format!(
                    "{other:?}, runs {}, names {}",
                    runs.load(Ordering::SeqCst),
                    names.len()
                ),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------

/// The smallest count of Redis cases the corpus promises (per client).
const MIN_CASES: usize = 75;

async fn redis_bad_input_corpus(client: Client) {
    let server = Arc::new(RedisServer::start());
    let p = provider(&server, client).await;
    let env = Env { server, p, client };
    let groups = [
        ("request durations", request_cases()),
        ("builder", timeout_cases()),
        ("call keys", key_cases()),
        ("raw keys", raw_key_cases()),
        ("payloads", payload_cases()),
        ("attributes", attribute_cases()),
    ];
    let mut total = 0;
    let mut failed = Vec::new();
    for (group, cases) in groups {
        let count = cases.len();
        for case in cases {
            let started = Instant::now();
            let task = tokio::spawn(run(env.clone(), case.input.clone()));
            let saw = match tokio::time::timeout(BOUND, task).await {
                Err(_) => format!("hung (no answer within {BOUND:?})"),
                Ok(Err(join)) if join.is_panic() => {
                    let payload = join.into_panic();
                    let msg = payload
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_default();
                    format!("panicked: {msg}")
                }
                Ok(Err(join)) => format!("task failed: {join}"),
                Ok(Ok(saw)) => saw,
            };
            let verdict = if saw == case.expect { "PASS" } else { "FAIL" };
            println!(
                "case {} [{client:?}; {}]: expected {}; saw {saw} ({:?}): {verdict}",
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
    println!(
        "redis corpus ({client:?}): {total} cases, {} failed",
        failed.len()
    );
    assert!(failed.is_empty(), "{client:?}: failed cases: {failed:?}");
    assert!(total >= MIN_CASES, "only {total} cases");
}
