//! Values under coord's keys that coord did not write: every operation that reads them is
//! refused with a `Corrupt` error naming the call key, changes nothing, and never turns the
//! garbage into a grant, a fencing token or a replay. Clearing the key (purge, or `DEL`)
//! makes the call key usable again. One table of corrupt states, run for every client.

use crate::support;

use coord_core::CallKey;
use std::sync::Arc;
use std::time::Duration;

use coord_core::BackendError;
use coord_core::provider::{
    BackendErrorKind, ClaimOutcome, CompleteRequest, IdempotencyStore, LockProvider, OwnerToken,
};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::{RedisServer, Resp};
use support::*;

per_client!(corrupt_states_are_refused);

/// One provider call.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// A single unfenced attempt (the bare `SET NX PX GET`).
    Acquire,
    /// An unfenced acquire that would wait (first attempt plus the remaining lease).
    AcquireWaiting,
    /// A fenced single attempt (the fenced script).
    AcquireFenced,
    Release,
    Renew,
    Claim,
    Complete,
    Abandon,
    RenewMarker,
    WaitSettled,
}

/// What a call must answer.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// `Err` of kind `Corrupt` carrying the call key, with nothing changed at any of the call
    /// key's Redis keys.
    Corrupt,
    /// This outcome, as [`describe`] spells it (for calls the corrupt key does not concern).
    Ok(&'static str),
}

use Expect::Corrupt;

/// Which Redis key of the call key a row corrupts.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Lock,
    Fence,
    Record,
}

struct Row {
    name: &'static str,
    kind: Kind,
    /// Commands that plant the corrupt value; `K` stands for the Redis key, `T` for a valid
    /// owner token (not the caller's).
    setup: &'static [&'static [&'static str]],
    ops: &'static [(Op, Expect)],
}

const LOCK_OPS: &[(Op, Expect)] = &[
    (Op::Acquire, Corrupt),
    (Op::AcquireWaiting, Corrupt),
    (Op::AcquireFenced, Corrupt),
    (Op::Release, Corrupt),
    (Op::Renew, Corrupt),
];

/// A foreign fencing counter blocks fenced acquisitions only: an unfenced lock never reads it.
const FENCE_OPS: &[(Op, Expect)] = &[
    (Op::AcquireFenced, Corrupt),
    (Op::Acquire, Expect::Ok("granted")),
    (Op::AcquireFenced, Corrupt),
    (Op::Release, Expect::Ok("released")),
];

const RECORD_OPS: &[(Op, Expect)] = &[
    (Op::Claim, Corrupt),
    (Op::Complete, Corrupt),
    (Op::Abandon, Corrupt),
    (Op::RenewMarker, Corrupt),
    (Op::WaitSettled, Corrupt),
];

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

const ROWS: &[Row] = &[
    // Lock keys.
    Row {
        name: "lock is a list",
        kind: Kind::Lock,
        setup: &[&["RPUSH", "K", "x"]],
        ops: LOCK_OPS,
    },
    Row {
        name: "lock is a hash",
        kind: Kind::Lock,
        setup: &[&["HSET", "K", "owner", "T"]],
        ops: LOCK_OPS,
    },
    Row {
        name: "lock is a set",
        kind: Kind::Lock,
        setup: &[&["SADD", "K", "T"]],
        ops: LOCK_OPS,
    },
    Row {
        name: "lock is a sorted set",
        kind: Kind::Lock,
        setup: &[&["ZADD", "K", "1", "T"]],
        ops: LOCK_OPS,
    },
    Row {
        name: "lock is a string that is not a token",
        kind: Kind::Lock,
        setup: &[&["SET", "K", "not a token", "PX", "60000"]],
        ops: LOCK_OPS,
    },
    Row {
        name: "lock is an empty string",
        kind: Kind::Lock,
        setup: &[&["SET", "K", "", "PX", "60000"]],
        ops: LOCK_OPS,
    },
    Row {
        name: "lock is upper-case hex",
        kind: Kind::Lock,
        setup: &[&[
            "SET",
            "K",
            "0123456789ABCDEF0123456789ABCDEF",
            "PX",
            "60000",
        ]],
        ops: LOCK_OPS,
    },
    Row {
        name: "lock is 31 hex digits",
        kind: Kind::Lock,
        setup: &[&["SET", "K", "0123456789abcdef0123456789abcde", "PX", "60000"]],
        ops: LOCK_OPS,
    },
    Row {
        name: "lock is a token with two waiter marks",
        kind: Kind::Lock,
        setup: &[&[
            "SET",
            "K",
            "0123456789abcdef0123456789abcdef**",
            "PX",
            "60000",
        ]],
        ops: LOCK_OPS,
    },
    // Fencing counters: `tonumber` accepts several of these, the script must not.
    Row {
        name: "fence is nan",
        kind: Kind::Fence,
        setup: &[&["SET", "K", "nan"]],
        ops: FENCE_OPS,
    },
    Row {
        name: "fence is inf",
        kind: Kind::Fence,
        setup: &[&["SET", "K", "inf"]],
        ops: FENCE_OPS,
    },
    Row {
        name: "fence is negative",
        kind: Kind::Fence,
        setup: &[&["SET", "K", "-1"]],
        ops: FENCE_OPS,
    },
    Row {
        name: "fence overflows a double",
        kind: Kind::Fence,
        setup: &[&["SET", "K", "1e400"]],
        ops: FENCE_OPS,
    },
    Row {
        name: "fence has a leading space",
        kind: Kind::Fence,
        setup: &[&["SET", "K", " 5"]],
        ops: FENCE_OPS,
    },
    Row {
        name: "fence is hexadecimal",
        kind: Kind::Fence,
        setup: &[&["SET", "K", "0x10"]],
        ops: FENCE_OPS,
    },
    Row {
        name: "fence is a fraction",
        kind: Kind::Fence,
        setup: &[&["SET", "K", "5.5"]],
        ops: FENCE_OPS,
    },
    Row {
        name: "fence is empty",
        kind: Kind::Fence,
        setup: &[&["SET", "K", ""]],
        ops: FENCE_OPS,
    },
    Row {
        name: "fence is past 2^53",
        kind: Kind::Fence,
        setup: &[&["SET", "K", "9007199254740993"]],
        ops: FENCE_OPS,
    },
    Row {
        name: "fence is a hash",
        kind: Kind::Fence,
        setup: &[&["HSET", "K", "n", "5"]],
        ops: FENCE_OPS,
    },
    // Idempotency records.
    Row {
        name: "record is a string",
        kind: Kind::Record,
        setup: &[&["SET", "K", "x"]],
        ops: RECORD_OPS,
    },
    Row {
        name: "record is a list",
        kind: Kind::Record,
        setup: &[&["RPUSH", "K", "x"]],
        ops: RECORD_OPS,
    },
    Row {
        name: "record is a set",
        kind: Kind::Record,
        setup: &[&["SADD", "K", "x"]],
        ops: RECORD_OPS,
    },
    Row {
        name: "record has no state",
        kind: Kind::Record,
        setup: &[&["HSET", "K", "fp", "", "own", "T"]],
        ops: RECORD_OPS,
    },
    Row {
        name: "record has only foreign fields",
        kind: Kind::Record,
        setup: &[&["HSET", "K", "x", "y"]],
        ops: RECORD_OPS,
    },
    Row {
        name: "record has an unknown state",
        kind: Kind::Record,
        setup: &[&["HSET", "K", "st", "zzz", "fp", "", "own", "T"]],
        ops: RECORD_OPS,
    },
    Row {
        name: "completed record without payload",
        kind: Kind::Record,
        setup: &[&["HSET", "K", "st", "c", "fp", ""]],
        ops: RECORD_OPS,
    },
    Row {
        name: "completed record with a foreign owner",
        kind: Kind::Record,
        setup: &[&["HSET", "K", "st", "c", "fp", "", "pl", "p", "own", "me"]],
        ops: RECORD_OPS,
    },
    Row {
        name: "completed record with a lease end",
        kind: Kind::Record,
        setup: &[&[
            "HSET", "K", "st", "c", "fp", "", "pl", "p", "lx", "1", "kp", "1",
        ]],
        ops: RECORD_OPS,
    },
    Row {
        name: "marker without owner",
        kind: Kind::Record,
        setup: &[&["HSET", "K", "st", "i", "fp", ""]],
        ops: RECORD_OPS,
    },
    Row {
        name: "marker with a foreign owner",
        kind: Kind::Record,
        setup: &[&["HSET", "K", "st", "i", "fp", "", "own", "not-a-token"]],
        ops: RECORD_OPS,
    },
    Row {
        name: "marker with a payload",
        kind: Kind::Record,
        setup: &[&["HSET", "K", "st", "i", "fp", "", "own", "T", "pl", "p"]],
        ops: RECORD_OPS,
    },
    Row {
        name: "short fingerprint",
        kind: Kind::Record,
        setup: &[&["HSET", "K", "st", "c", "fp", "abc", "pl", "p"]],
        ops: RECORD_OPS,
    },
    Row {
        name: "no fingerprint",
        kind: Kind::Record,
        setup: &[&["HSET", "K", "st", "i", "own", "T"]],
        ops: RECORD_OPS,
    },
    Row {
        name: "write time is text",
        kind: Kind::Record,
        setup: &[&[
            "HSET",
            "K",
            "st",
            "c",
            "fp",
            "",
            "pl",
            "p",
            "at",
            "yesterday",
        ]],
        ops: RECORD_OPS,
    },
    Row {
        name: "lease end is text",
        kind: Kind::Record,
        setup: &[&[
            "HSET", "K", "st", "i", "fp", "", "own", "T", "lx", "soon", "kp", "1000",
        ]],
        ops: RECORD_OPS,
    },
    Row {
        name: "lease end is nan",
        kind: Kind::Record,
        setup: &[&[
            "HSET", "K", "st", "i", "fp", "", "own", "T", "lx", "nan", "kp", "1000",
        ]],
        ops: RECORD_OPS,
    },
    Row {
        name: "lease end overflows",
        kind: Kind::Record,
        setup: &[&[
            "HSET", "K", "st", "i", "fp", "", "own", "T", "lx", "1e400", "kp", "1000",
        ]],
        ops: RECORD_OPS,
    },
    Row {
        name: "lease end without keep period",
        kind: Kind::Record,
        setup: &[&[
            "HSET",
            "K",
            "st",
            "i",
            "fp",
            "",
            "own",
            "T",
            "lx",
            "99999999999999",
        ]],
        ops: RECORD_OPS,
    },
    Row {
        name: "keep period is negative",
        kind: Kind::Record,
        setup: &[&[
            "HSET",
            "K",
            "st",
            "i",
            "fp",
            "",
            "own",
            "T",
            "lx",
            "99999999999999",
            "kp",
            "-1",
        ]],
        ops: RECORD_OPS,
    },
    Row {
        name: "waiter flag is foreign",
        kind: Kind::Record,
        setup: &[&["HSET", "K", "st", "i", "fp", "", "own", "T", "w", "yes"]],
        ops: RECORD_OPS,
    },
    // A marker coord would write, but without an expiry: it would never lapse, so claims and
    // waiters refuse it; calls that only compare owners answer as for any other owner.
    Row {
        name: "marker without expiry",
        kind: Kind::Record,
        setup: &[&["HSET", "K", "st", "i", "fp", "", "own", "T"]],
        ops: &[
            (Op::Claim, Corrupt),
            (Op::WaitSettled, Corrupt),
            (Op::Complete, Expect::Ok("superseded by T, in flight")),
            (Op::Abandon, Expect::Ok("not abandoned")),
            (Op::RenewMarker, Expect::Ok("lost: taken_by_other")),
        ],
    },
];

/// Runs `op` for `owner` at call key `k`, describing a successful outcome in words.
async fn run(
    p: &RedisProvider,
    op: Op,
    k: &CallKey,
    owner: OwnerToken,
) -> Result<String, BackendError> {
    let wait = Duration::from_secs(1);
    Ok(match op {
        Op::Acquire | Op::AcquireWaiting | Op::AcquireFenced => {
            let req = match op {
                Op::Acquire => lock(k, owner, LONG, Duration::ZERO),
                Op::AcquireWaiting => lock(k, owner, LONG, wait),
                _ => fenced(k, owner, LONG, Duration::ZERO),
            };
            match p.acquire(req).await? {
                Some(_) => "granted".into(),
                None => "refused".into(),
            }
        }
        Op::Release => match p.release(k, owner).await? {
            coord_core::provider::ReleaseOutcome::Released => "released".into(),
            other => format!("{other:?}"),
        },
        Op::Renew => describe_renew(p.renew(k, owner, LONG).await?),
        Op::Claim => match p.claim(claim(k, owner, LONG)).await? {
            ClaimOutcome::Claimed => "claimed".into(),
            ClaimOutcome::Completed { payload, .. } => {
                format!("replay of {:?}", String::from_utf8_lossy(&payload))
            }
            other => format!("{other:?}"),
        },
        Op::Complete => {
            let outcome = p
                .complete(CompleteRequest {
                    key: k,
                    owner,
                    payload: Arc::from(&b"mine"[..]),
                    retention: LONG,
                    fingerprint: None,
                })
                .await?;
            match outcome {
                coord_core::provider::CompleteOutcome::Superseded {
                    other: Some(other),
                    completed,
                } => format!(
                    "superseded by {}, {}",
                    if other.to_string() == TOKEN {
                        "T".to_owned()
                    } else {
                        other.to_string()
                    },
                    if completed { "completed" } else { "in flight" }
                ),
                other => format!("{other:?}"),
            }
        }
        Op::Abandon => match p.abandon(k, owner).await? {
            true => "abandoned".into(),
            false => "not abandoned".into(),
        },
        Op::RenewMarker => describe_renew(p.renew_marker(k, owner, LONG).await?),
        Op::WaitSettled => {
            p.wait_settled(k, wait).await?;
            "settled".into()
        }
    })
}

fn describe_renew(outcome: coord_core::provider::RenewOutcome) -> String {
    match outcome {
        coord_core::provider::RenewOutcome::Renewed => "renewed".into(),
        coord_core::provider::RenewOutcome::Lost(cause) => format!("lost: {}", cause.as_str()),
    }
}

/// The serialized values of the lock, fence and record keys of `k` (`DUMP`, which leaves out
/// the expiry), to show that a refused call wrote nothing.
fn snapshot(server: &RedisServer, k: &CallKey) -> Vec<Resp> {
    ["lock", "fence", "idem"]
        .iter()
        .map(|kind| server.command(&["DUMP", &redis_key(k, kind)]))
        .collect()
}

async fn corrupt_states_are_refused(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    assert!(ROWS.len() >= 25, "the table covers at least 25 states");
    let mut checked = 0;
    for row in ROWS {
        let k = key("corrupt");
        let target = redis_key(
            &k,
            match row.kind {
                Kind::Lock => "lock",
                Kind::Fence => "fence",
                Kind::Record => "idem",
            },
        );
        for command in row.setup {
            let args: Vec<&str> = command
                .iter()
                .map(|a| match *a {
                    "K" => target.as_str(),
                    "T" => TOKEN,
                    other => other,
                })
                .collect();
            let reply = server.command(&args);
            assert!(
                !matches!(reply, Resp::Error(_)),
                "{}: setup {args:?} failed: {reply:?}",
                row.name
            );
        }
        let owner = OwnerToken::new();
        for &(op, expect) in row.ops {
            let before = snapshot(&server, &k);
            let result = run(&p, op, &k, owner).await;
            let what = format!("{} / {op:?}", row.name);
            match (expect, result) {
                (Corrupt, Err(err)) => {
                    assert_eq!(err.kind(), BackendErrorKind::Corrupt, "{what}: {err:?}");
                    assert_eq!(err.key(), Some(&k), "{what}: names the key");
                    assert!(!err.kind().is_transient(), "{what}: not retryable");
                    assert_eq!(snapshot(&server, &k), before, "{what}: nothing written");
                }
                (Corrupt, Ok(outcome)) => panic!("{what}: expected Corrupt, got {outcome}"),
                (Expect::Ok(want), Ok(outcome)) => assert_eq!(outcome, want, "{what}"),
                (Expect::Ok(want), Err(err)) => panic!("{what}: expected {want}, got {err:?}"),
            }
            checked += 1;
        }
        // Clearing the key makes the call key usable again.
        match row.kind {
            Kind::Record => {
                assert!(p.purge(&k).await.unwrap(), "{}: purge clears it", row.name);
                assert_eq!(
                    p.claim(claim(&k, owner, LONG)).await.unwrap(),
                    ClaimOutcome::Claimed,
                    "{}: claimable after the purge",
                    row.name
                );
            }
            Kind::Lock | Kind::Fence => {
                server.command(&["DEL", &target]);
                let grant = p
                    .acquire(fenced(&k, owner, LONG, Duration::ZERO))
                    .await
                    .unwrap();
                assert!(
                    grant.and_then(|g| g.fencing_token).is_some(),
                    "{}: a fenced lock after the key is deleted",
                    row.name
                );
            }
        }
    }
    assert!(checked >= 100, "{checked} checks");
}

/// The resource-side check refuses a stored fence it cannot compare, instead of letting `nan`
/// accept every write or `inf` refuse every write, and leaves the resource as it was.
#[cfg(feature = "redis-client")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_refuse_a_foreign_stored_fence() {
    use coord_core::FencingToken;
    use coord_redis::fence::{FencedWrite, write_fenced};

    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let token = FencingToken::new(1_000);
    for garbage in [
        "nan",
        "inf",
        "-1",
        "1e400",
        " 5",
        "0x10",
        "5.5",
        "",
        "9007199254740993",
    ] {
        let resource = format!("resource:{{{garbage}}}");
        server.command(&["HSET", &resource, "value", "old", "fence", garbage]);
        let written = write_fenced(&mut conn, &resource, b"new", token).await;
        assert!(written.is_err(), "fence {garbage:?}: {written:?}");
        assert_eq!(
            server.command(&["HGET", &resource, "value"]),
            Resp::Bulk(b"old".to_vec()),
            "fence {garbage:?}: not overwritten"
        );
    }
    server.command(&["SET", "resource:string", "old"]);
    assert!(
        write_fenced(&mut conn, "resource:string", b"new", token)
            .await
            .is_err()
    );
    // Tokens coord minted compare as numbers.
    server.command(&["HSET", "resource:ok", "value", "old", "fence", "5000"]);
    assert_eq!(
        write_fenced(&mut conn, "resource:ok", b"stale", token)
            .await
            .unwrap(),
        FencedWrite::Rejected {
            newest: FencingToken::new(5000)
        }
    );
    assert_eq!(
        write_fenced(&mut conn, "resource:ok", b"new", FencingToken::new(5001))
            .await
            .unwrap(),
        FencedWrite::Accepted
    );
    assert_eq!(
        server.command(&["HGET", "resource:ok", "value"]),
        Resp::Bulk(b"new".to_vec())
    );
}
