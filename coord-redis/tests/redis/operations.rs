//! The operations API over Redis, beyond what the conformance suite checks for every provider:
//! corrupt state is reported as `Corrupt` (never as a made-up holder or record) and forcing a
//! lock free clears it; records written without a write time or completing owner read back
//! with those unknown; a listing pages through thousands of keys among thousands of others
//! without exceeding its page size, skipping or repeating a key; on a Cluster it scans every
//! master; and the server report reads the settings `coord check` judges.

use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use coord_core::provider::{
    BackendErrorKind, ClaimRequest, Cursor, ForcedRelease, IdempotencyStore, ListRequest,
    LockProvider, Operations, OwnerToken, Page, RecordStatus,
};
use coord_core::{CallKey, Coordinator};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::{RedisCluster, RedisServer, Resp};
use support::*;

per_client!(
    corrupt_state_is_reported_not_made_up,
    records_of_older_versions_read_with_unknowns,
    listing_pages_exactly_through_many_keys,
    a_forced_release_is_remembered_for_its_former_holder,
    a_namespace_listing_finds_every_operation_with_state,
    inspecting_shared_holds_leaves_out_what_ended_and_changes_nothing,
);

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

/// `force_release` leaves a marker naming the released owner, in the lock's hash slot, for the
/// rest of the released lease plus `FORCED_RELEASE_MEMORY`; the former holder's renewal and
/// release read it (whoever holds the key since), and nobody else is told so.
async fn a_forced_release_is_remembered_for_its_former_holder(client: Client) {
    use coord_core::LossCause;
    use coord_core::provider::{FORCED_RELEASE_MEMORY, ReleaseOutcome, RenewOutcome};

    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("ops-forced");
    let (first, second) = (OwnerToken::new(), OwnerToken::new());
    let lease = Duration::from_secs(60);
    assert!(
        p.acquire(lock(&k, first, lease, Duration::ZERO))
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(
        p.force_release(&k).await.unwrap(),
        ForcedRelease::Released { owner: first }
    );
    let marker = redis_key(&k, "lock-forced");
    let left = server.command(&["PTTL", &marker]).int().unwrap();
    let most = (lease + FORCED_RELEASE_MEMORY).as_millis() as i64;
    assert!(
        left > most - 10_000 && left <= most,
        "the marker lives the rest of the lease plus a minute: {left} ms"
    );
    // Someone else takes the key meanwhile: the former holder is still told the truth.
    assert!(
        p.acquire(lock(&k, second, lease, Duration::ZERO))
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(
        p.renew(&k, first, lease).await.unwrap(),
        RenewOutcome::Lost(LossCause::ForceReleased)
    );
    assert_eq!(
        p.release(&k, first).await.unwrap(),
        ReleaseOutcome::ForceReleased
    );
    assert_eq!(
        p.release(&k, first).await.unwrap(),
        ReleaseOutcome::ForceReleased,
        "a resend gets the same answer"
    );
    assert_eq!(
        p.renew(&k, OwnerToken::new(), lease).await.unwrap(),
        RenewOutcome::Lost(LossCause::TakenByOther),
        "an owner that was never forced out is not told so"
    );
    assert_eq!(
        p.release(&k, second).await.unwrap(),
        ReleaseOutcome::Released,
        "the new holder is untouched"
    );
    // Once the marker is gone, the release cannot tell why: it says only that it was not held.
    server.command(&["DEL", &marker]);
    assert_eq!(p.release(&k, first).await.unwrap(), ReleaseOutcome::NotHeld);
}

/// Without an operation, a listing of a namespace finds every operation's keys, and nothing of
/// another namespace; the operator's summary counts them per operation, reading module-path
/// names back whole.
async fn a_namespace_listing_finds_every_operation_with_state(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let c = Coordinator::builder()
        .namespace("svc")
        .provider(p)
        .build()
        .unwrap();
    let other = Coordinator::builder()
        .namespace("other")
        .provider(provider(&server, client).await)
        .build()
        .unwrap();
    let mut guards = Vec::new();
    for (op, part) in [
        ("app::jobs::nightly", "t-1"),
        ("app::jobs::nightly", "t-2"),
        ("payments.charge", "o-1"),
    ] {
        let key = c.key(op).part(part).finish();
        guards.push(
            c.lock(key)
                .lease(Duration::from_secs(60))
                .acquire()
                .await
                .unwrap(),
        );
    }
    let elsewhere = other.key("app::jobs::nightly").part("t-9").finish();
    guards.push(
        other
            .lock(elsewhere)
            .lease(Duration::from_secs(60))
            .acquire()
            .await
            .unwrap(),
    );
    let found = c.operator().lock_operations().await.unwrap();
    let found: Vec<(String, usize)> = found
        .into_iter()
        .map(|op| (op.operation, op.keys))
        .collect();
    assert_eq!(
        found,
        [
            ("app::jobs::nightly".to_owned(), 2),
            ("payments.charge".to_owned(), 1)
        ]
    );
    assert_eq!(c.operator().record_operations().await.unwrap(), []);
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert_eq!(c.operator().lock_operations().await.unwrap(), []);
}

fn set(server: &RedisServer, args: &[&str]) {
    let reply = server.command(args);
    assert!(!matches!(reply, Resp::Error(_)), "{args:?}: {reply:?}");
}

async fn corrupt_state_is_reported_not_made_up(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let lock_rows: &[(&str, &[&[&str]])] = &[
        ("lock is a list", &[&["RPUSH", "K", "x"]]),
        ("lock is a hash", &[&["HSET", "K", "owner", "T"]]),
        (
            "lock is not a token",
            &[&["SET", "K", "not-a-token", "PX", "60000"]],
        ),
        (
            "lock with an uppercase token",
            &[&[
                "SET",
                "K",
                "0123456789ABCDEF0123456789ABCDEF",
                "PX",
                "60000",
            ]],
        ),
        ("lock without expiry", &[&["SET", "K", "T"]]),
    ];
    for (name, setup) in lock_rows {
        let k = key("ops-corrupt");
        let target = redis_key(&k, "lock");
        for command in *setup {
            let args: Vec<&str> = command
                .iter()
                .map(|a| match *a {
                    "K" => target.as_str(),
                    "T" => TOKEN,
                    other => other,
                })
                .collect();
            set(&server, &args);
        }
        let err = p
            .inspect_lock(&k)
            .await
            .expect_err(&format!("{name}: refused"));
        assert_eq!(err.kind(), BackendErrorKind::Corrupt, "{name}: {err}");
        assert_eq!(err.key(), Some(&k), "{name}: names the key");
        assert_eq!(
            p.force_release(&k).await.unwrap(),
            if *name == "lock without expiry" {
                // A token without expiry is still a token: its holder is named.
                ForcedRelease::Released {
                    owner: OwnerToken::from_u128(u128::from_str_radix(TOKEN, 16).unwrap()),
                }
            } else {
                ForcedRelease::RemovedCorrupt
            },
            "{name}: forcing the lock free clears it"
        );
        assert_eq!(
            server.command(&["EXISTS", &target]).int(),
            Some(0),
            "{name}"
        );
        assert_eq!(
            p.inspect_lock(&k).await.unwrap().holder,
            None,
            "{name}: free now"
        );
    }

    for (name, counter) in [
        ("fence not digits", "12abc"),
        ("fence too big", "99999999999999999"),
    ] {
        let k = key("ops-corrupt-fence");
        set(&server, &["SET", &redis_key(&k, "fence"), counter]);
        let err = p.inspect_lock(&k).await.expect_err(name);
        assert_eq!(err.kind(), BackendErrorKind::Corrupt, "{name}: {err}");
    }

    let record_rows: &[(&str, &[&str])] = &[
        ("record is a string", &["SET", "K", "x"]),
        ("record without state", &["HSET", "K", "fp", "", "own", "T"]),
        (
            "record in an unknown state",
            &["HSET", "K", "st", "zzz", "fp", "", "own", "T"],
        ),
        ("marker without owner", &["HSET", "K", "st", "i", "fp", ""]),
        (
            "completed without payload",
            &["HSET", "K", "st", "c", "fp", "", "own", "T"],
        ),
        (
            "fingerprint of 3 bytes",
            &["HSET", "K", "st", "i", "fp", "abc", "own", "T"],
        ),
        (
            "foreign write time",
            &[
                "HSET",
                "K",
                "st",
                "i",
                "fp",
                "",
                "own",
                "T",
                "at",
                "yesterday",
            ],
        ),
        (
            "marker without expiry",
            &["HSET", "K", "st", "i", "fp", "", "own", "T"],
        ),
    ];
    for (name, setup) in record_rows {
        let k = key("ops-corrupt-record");
        let target = redis_key(&k, "idem");
        let args: Vec<&str> = setup
            .iter()
            .map(|a| match *a {
                "K" => target.as_str(),
                "T" => TOKEN,
                other => other,
            })
            .collect();
        set(&server, &args);
        if *name != "marker without expiry" && *name != "record is a string" {
            set(&server, &["PEXPIRE", &target, "60000"]);
        }
        let err = p
            .inspect_record(&k)
            .await
            .expect_err(&format!("{name}: refused"));
        assert_eq!(err.kind(), BackendErrorKind::Corrupt, "{name}: {err}");
        assert_eq!(err.key(), Some(&k), "{name}: names the key");
        assert!(p.purge(&k).await.unwrap(), "{name}: purge clears it");
        assert_eq!(p.inspect_record(&k).await.unwrap(), None, "{name}");
    }
}

async fn records_of_older_versions_read_with_unknowns(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    // A completed record as versions before completing owners and write times wrote it.
    let k = key("ops-old");
    let target = redis_key(&k, "idem");
    set(
        &server,
        &["HSET", &target, "st", "c", "fp", "", "pl", "abc"],
    );
    set(&server, &["PEXPIRE", &target, "60000"]);
    let info = p.inspect_record(&k).await.unwrap().expect("a record");
    assert_eq!(info.status, RecordStatus::Completed);
    assert_eq!(info.owner, None, "no owner was stored");
    assert_eq!(info.age, None, "no write time was stored");
    assert_eq!(info.payload_bytes, Some(3));
    assert!(!info.has_fingerprint);
    assert!(
        info.expires_in > Duration::from_secs(50) && info.expires_in <= Duration::from_secs(60)
    );

    // A record written now carries its write time, in the server's clock.
    let fresh = key("ops-new");
    let owner = OwnerToken::new();
    p.claim(ClaimRequest {
        key: &fresh,
        owner,
        in_flight_lease: LONG,
        fingerprint: None,
        keep_abandoned_for: None,
        transactional: false,
    })
    .await
    .unwrap();
    let at = server
        .command(&["HGET", &redis_key(&fresh, "idem"), "at"])
        .text()
        .expect("the claim stores its write time");
    let server_now = match server.command(&["TIME"]) {
        Resp::Array(parts) => {
            parts[0].text().unwrap().parse::<i64>().unwrap() * 1000
                + parts[1].text().unwrap().parse::<i64>().unwrap() / 1000
        }
        other => panic!("TIME answered {other:?}"),
    };
    let written = at.parse::<i64>().expect("milliseconds");
    assert!(
        (server_now - written).abs() < 10_000,
        "written at {written}, server time {server_now}"
    );
}

/// Pages through `list` with `limit`, checking the bound, and returns every key in order seen.
async fn pages(
    p: &RedisProvider,
    op: &CallKey,
    limit: usize,
    locks: bool,
) -> (Vec<CallKey>, usize) {
    let mut cursor: Option<Cursor> = None;
    let mut seen = Vec::new();
    let mut count = 0;
    loop {
        let req = ListRequest {
            operation: op,
            cursor: cursor.as_ref(),
            limit,
        };
        let page: Page<CallKey> = if locks {
            p.list_locks(req).await.unwrap()
        } else {
            p.list_records(req).await.unwrap()
        };
        count += 1;
        assert!(page.items.len() <= limit, "page of {}", page.items.len());
        seen.extend(page.items);
        match page.next {
            Some(next) => cursor = Some(next),
            None => return (seen, count),
        }
        assert!(count < 100_000, "the listing never ends");
    }
}

async fn listing_pages_exactly_through_many_keys(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let c = Coordinator::builder()
        .namespace("ops-list")
        .provider(p.clone())
        .build()
        .unwrap();
    let owner = OwnerToken::new();
    // Planted in one script (faster than 5000 acquires): what coord writes for a held lock.
    let mut expected = BTreeSet::new();
    let mut names = Vec::new();
    for i in 0..2500 {
        let k = c.key("jobs").part(&i).finish();
        let other = c.key("jobs.other").part(&i).finish();
        names.push(redis_key(&k, "lock"));
        names.push(redis_key(&other, "lock"));
        expected.insert(k.to_string());
    }
    let count = names.len().to_string();
    let token = owner.to_string();
    let mut args = vec![
        "EVAL",
        "for i = 1, #KEYS do redis.call('SET', KEYS[i], ARGV[1], 'PX', 600000) end",
        &count,
    ];
    args.extend(names.iter().map(String::as_str));
    args.push(&token);
    set(&server, &args);
    assert_eq!(server.command(&["DBSIZE"]).int(), Some(5000));
    // Glob characters in the names are matched literally.
    let globby = c.key("jobs").part("*?[x]\\").finish();
    p.acquire(lock(&globby, owner, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    expected.insert(globby.to_string());
    let op = c.key("jobs").finish();
    for limit in [7, 1000] {
        let (seen, count) = pages(&p, &op, limit, true).await;
        let unique: BTreeSet<String> = seen.iter().map(ToString::to_string).collect();
        assert_eq!(unique.len(), seen.len(), "limit {limit}: no key twice");
        assert_eq!(
            unique, expected,
            "limit {limit}: every key of `jobs`, no other"
        );
        assert!(
            count >= expected.len() / limit,
            "limit {limit}: {count} pages"
        );
    }
    let star = c.key("job*").finish();
    let (seen, _) = pages(&p, &star, 100, true).await;
    assert!(
        seen.is_empty(),
        "`job*` is an operation name, not a pattern: {seen:?}"
    );
    let (records, _) = pages(&p, &op, 100, false).await;
    assert!(records.is_empty(), "no records were made");
}

/// Every master of a Cluster is scanned, and a listing's keys spread over all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_listing_scans_every_master() {
    let cluster = RedisCluster::start(3);
    for client in clients() {
        let p = RedisProvider::cluster(cluster.urls())
            .client(client)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{client:?}: {e}"));
        let ns = format!("cl-{client:?}").to_lowercase();
        let c = Coordinator::builder()
            .namespace(ns)
            .provider(p.clone())
            .build()
            .unwrap();
        let owner = OwnerToken::new();
        let mut expected = BTreeSet::new();
        let mut nodes = BTreeSet::new();
        for i in 0..60 {
            let k = c.key("sweep").part(&i).finish();
            p.acquire(lock(&k, owner, LONG, Duration::ZERO))
                .await
                .unwrap()
                .expect("granted");
            p.claim(claim(&k, owner, LONG)).await.unwrap();
            nodes.insert(cluster.node_for(&redis_key(&k, "lock")).port());
            expected.insert(k.to_string());
        }
        assert_eq!(nodes.len(), 3, "the keys landed on every master");
        let op = c.key("sweep").finish();
        for locks in [true, false] {
            let (seen, _) = pages(&p, &op, 4, locks).await;
            let unique: BTreeSet<String> = seen.iter().map(ToString::to_string).collect();
            assert_eq!(unique, expected, "{client:?}, locks {locks}");
        }
        let k = c.key("sweep").part(&7).finish();
        let info = c.operator().lock(&k).await.unwrap();
        assert_eq!(info.holder.map(|h| h.owner), Some(owner));
        assert_eq!(
            c.operator().release_lock(&k, "test").await.unwrap(),
            ForcedRelease::Released { owner }
        );
        let report = p.server_report().await.unwrap();
        assert_eq!(report.nodes.len(), 3, "{client:?}: every master reports");
    }
}

/// The report `coord check` judges: the settings as configured, the version, and a clock on
/// the same machine (so within a few seconds of ours).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_report_reads_settings_version_and_clock() {
    let risky = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    for client in clients() {
        let p = RedisProvider::builder(risky.url())
            .client(client)
            .allow_eviction(true)
            .connect()
            .await
            .unwrap();
        let report = p.server_report().await.unwrap();
        let [node] = report.nodes.as_slice() else {
            panic!("one node: {report:?}");
        };
        assert_eq!(node.node, format!("127.0.0.1:{}", risky.port()));
        assert_eq!(node.maxmemory_policy.as_deref(), Some("allkeys-lru"));
        assert_eq!(node.eviction_safe(), Some(false));
        assert_eq!(node.version_supported(), Some(true), "{:?}", node.version);
        assert!(node.clock_offset_ms.abs() < 5_000, "{node:?}");
        assert_eq!(node.config_error, None);
        let persistence = node.persistence_on();
        assert!(persistence.is_some(), "{node:?}");
    }
    let safe = RedisServer::start_with(&["--appendonly", "yes"]);
    let p = RedisProvider::connect(&safe.url()).await.unwrap();
    let report = p.server_report().await.unwrap();
    assert_eq!(report.nodes[0].eviction_safe(), Some(true));
    assert_eq!(report.nodes[0].persistence_on(), Some(true));
}

/// `inspect_semaphore` and `inspect_rw_lock` show only holds whose lease has not ended by the
/// server's clock (a lapsed permit, reader or claim is left out though still stored), and
/// change nothing: the lapsed entries are still there after the reads.
async fn inspecting_shared_holds_leaves_out_what_ended_and_changes_nothing(client: Client) {
    use coord_core::provider::{
        PermitRequest, RwLockRequest, RwLockStore, RwMode, SemaphoreStore, Waiters,
    };
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("inspect-shared");
    let short = Duration::from_millis(300);
    let (lapsing, staying) = (OwnerToken::new(), OwnerToken::new());
    for (owner, lease) in [(lapsing, short), (staying, LONG)] {
        p.acquire_permit(PermitRequest {
            key: &k,
            owner,
            limit: 3,
            lease,
            wait: Duration::ZERO,
        })
        .await
        .unwrap()
        .unwrap();
        p.acquire_rw(RwLockRequest {
            key: &k,
            owner,
            mode: RwMode::Read,
            lease,
            wait: Duration::ZERO,
            claim: short,
        })
        .await
        .unwrap()
        .unwrap();
    }
    let sem = p.inspect_semaphore(&k).await.unwrap();
    assert_eq!(sem.permits.len(), 2);
    assert_eq!(sem.permits[0].owner, lapsing, "soonest-ending first");
    assert_eq!(sem.waiters, Waiters::Flagged(false));
    let rw = p.inspect_rw_lock(&k).await.unwrap();
    assert_eq!(rw.readers.len(), 2);
    assert_eq!(rw.readers[0].owner, lapsing, "soonest-ending first");
    assert!(rw.writer.is_none() && rw.waiting_writer.is_none());
    tokio::time::sleep(short + Duration::from_millis(200)).await;
    let sem = p.inspect_semaphore(&k).await.unwrap();
    let permits: Vec<_> = sem.permits.iter().map(|h| h.owner).collect();
    assert_eq!(permits, [staying], "the lapsed permit is left out");
    assert!(sem.permits[0].lease_left > LONG - Duration::from_secs(5));
    let rw = p.inspect_rw_lock(&k).await.unwrap();
    let readers: Vec<_> = rw.readers.iter().map(|h| h.owner).collect();
    assert_eq!(readers, [staying], "the lapsed reader is left out");
    assert!(rw.readers[0].fencing_token.is_some());
    // Reads only: the lapsed entries are still stored.
    assert_eq!(
        server.command(&["ZCARD", &redis_key(&k, "sem")]),
        Resp::Int(2)
    );
    assert_eq!(
        server.command(&["ZCARD", &redis_key(&k, "rw-r")]),
        Resp::Int(2)
    );
}
