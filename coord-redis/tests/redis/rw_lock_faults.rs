//! Read-write locks while redis-server fails under held read holds and a waiting writer, for
//! every client: its connections killed (`CLIENT KILL`), the server frozen (SIGSTOP) and
//! restarted without its data, and a waiting writer whose process goes away while the server
//! is frozen. Each case checks what the readers and the writer get, that no writer is admitted
//! while a reader's lease is live, and that no reader entry, writer or claim is left behind
//! once everyone is done.

use crate::support;

use std::time::{Duration, Instant};

use coord_core::handle::RwLockGuard;
use coord_core::provider::{OwnerToken, RwLockRequest, RwLockStore, RwMode};
use coord_core::{CallKey, CoordError, Coordinator};
use coord_redis::Client;
use coord_redis_testing::{RedisServer, Resp};
use support::*;

per_client!(
    connections_killed_while_readers_hold_and_a_writer_waits,
    server_paused_while_readers_hold_and_a_writer_waits,
    server_restarted_while_readers_hold_and_a_writer_waits,
    server_paused_past_the_readers_lease_leaves_no_reader_behind,
    a_waiting_writer_gone_during_a_pause_holds_readers_back_only_until_its_claim_ends,
);

/// The readers' lease: renewed every [`RENEW`], so only renewals keep a reader past it.
const LEASE: Duration = Duration::from_secs(2);
const RENEW: Duration = Duration::from_millis(200);

async fn coordinator(server: &RedisServer, client: Client) -> Coordinator {
    Coordinator::builder()
        .namespace("rwfault")
        .provider(provider(server, client).await)
        .build()
        .expect("coordinator")
}

/// The state hash of `key` (writer, claim, readers' tokens, counter), as the provider names it.
fn state_name(key: &CallKey) -> String {
    format!("{}:rw:{{{}}}", key.namespace(), key.op_key())
}

/// The readers' sorted set of `key` (owner → end of lease, server ms).
fn readers_name(key: &CallKey) -> String {
    format!("{}:rw-r:{{{}}}", key.namespace(), key.op_key())
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis()
}

/// How many readers of `key` the server holds whose lease has not ended (the test and the
/// server share one clock).
fn readers_live(server: &RedisServer, key: &CallKey) -> i64 {
    server
        .command(&[
            "ZCOUNT",
            &readers_name(key),
            &format!("({}", now_ms()),
            "+inf",
        ])
        .int()
        .unwrap_or(-1)
}

fn state_field(server: &RedisServer, key: &CallKey, field: &str) -> Option<String> {
    server.command(&["HGET", &state_name(key), field]).text()
}

/// Whether a waiting writer's claim is stored for `key` (live or not yet forgotten).
fn claim_stored(server: &RedisServer, key: &CallKey) -> bool {
    server.command(&["HEXISTS", &state_name(key), "c"]) == Resp::Int(1)
}

/// Whether the server holds a writer of `key` whose lease has not ended.
fn writer_live(server: &RedisServer, key: &CallKey) -> bool {
    state_field(server, key, "wx")
        .and_then(|end| end.parse::<u128>().ok())
        .is_some_and(|end| end > now_ms())
}

/// Two read holds of `key`, renewed.
async fn hold_readers(c: &Coordinator, key: &CallKey) -> Vec<RwLockGuard> {
    let mut held = Vec::new();
    for _ in 0..2 {
        let reader = c
            .rw_lock(key.clone())
            .lease(LEASE)
            .renew(RENEW)
            .try_read()
            .await
            .expect("read")
            .expect("a free key admits readers");
        held.push(reader);
    }
    held
}

type WriterTask = tokio::task::JoinHandle<(Result<RwLockGuard, CoordError>, Instant)>;

/// A writer waiting up to `wait` for `key`, on its own task.
fn spawn_writer(c: &Coordinator, key: &CallKey, wait: Duration) -> WriterTask {
    let (c, key) = (c.clone(), key.clone());
    tokio::spawn(async move {
        let writer = c.rw_lock(key).lease(LONG).wait(wait).write().await;
        (writer, Instant::now())
    })
}

/// One attempt at a new read hold; `true` when granted (and released again at once).
async fn reader_gets_in(c: &Coordinator, key: &CallKey) -> Result<bool, CoordError> {
    match c.rw_lock(key.clone()).lease(LONG).try_read().await? {
        Some(reader) => {
            reader.release().await?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// After every hold is released or has ended: one more write hold, taken and released (each
/// script first forgets what ended), leaves the key holding nothing but its counter and the
/// waiter note: no reader entry, no reader's token, no writer, no claim.
async fn assert_nothing_left(c: &Coordinator, server: &RedisServer, key: &CallKey) {
    let deadline = Instant::now() + LEASE + Duration::from_secs(5);
    let last = loop {
        assert!(
            Instant::now() < deadline,
            "a hold of {key} outlived every holder's lease"
        );
        if let Ok(Some(writer)) = c.rw_lock(key.clone()).lease(LONG).try_write().await {
            break writer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(last.release().await.expect("release"));
    assert_eq!(
        server.command(&["EXISTS", &readers_name(key)]),
        Resp::Int(0),
        "reader entries left behind"
    );
    let Resp::Array(fields) = server.command(&["HKEYS", &state_name(key)]) else {
        panic!("HKEYS answers an array");
    };
    for field in fields {
        let field = field.text().expect("a field name");
        assert!(
            field == "f" || field == "q",
            "field {field:?} left in the state of {key} (a reader's token, a writer or a claim)"
        );
    }
}

/// Connections killed under two renewed readers and a waiting writer: the readers stay held
/// past their lease (renewals over new connections), the writer is not admitted while they
/// are, its claim still keeps new readers out, and the last reader's release still wakes it
/// (its subscription was remade) well before its wait ends.
async fn connections_killed_while_readers_hold_and_a_writer_waits(client: Client) {
    let server = RedisServer::start();
    let c = coordinator(&server, client).await;
    let k = key("rw-kill");
    let mut readers = hold_readers(&c, &k).await;
    let writer = spawn_writer(&c, &k, Duration::from_secs(20));
    until("the writer's claim", LONG, || claim_stored(&server, &k)).await;
    for kind in ["normal", "pubsub"] {
        server.command(&["CLIENT", "KILL", "TYPE", kind]);
    }
    // Past the lease: only renewals over new connections keep the readers.
    tokio::time::sleep(LEASE + Duration::from_millis(500)).await;
    assert!(
        readers.iter().all(RwLockGuard::is_held),
        "a reader was lost to killed connections"
    );
    assert_eq!(readers_live(&server, &k), 2, "the server lost a reader");
    assert!(
        !writer.is_finished(),
        "the writer's wait ended while two readers held"
    );
    assert!(
        !reader_gets_in(&c, &k).await.expect("try_read"),
        "a new reader got in past the waiting writer's claim"
    );
    // One reader left: the writer still waits.
    assert!(readers.pop().unwrap().release().await.expect("release"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !writer.is_finished(),
        "the writer got in while a reader's lease was live"
    );
    let released_at = Instant::now();
    assert!(readers.pop().unwrap().release().await.expect("release"));
    let (writer, at) = writer.await.expect("writer task");
    let writer = writer.expect("the writer gets the freed key");
    let woke_after = at.saturating_duration_since(released_at);
    assert!(
        woke_after < Duration::from_secs(3),
        "the writer took {woke_after:?} after the last reader's release"
    );
    assert_eq!(readers_live(&server, &k), 0);
    assert!(writer_live(&server, &k));
    assert!(
        !reader_gets_in(&c, &k).await.expect("try_read"),
        "a reader got in beside the writer"
    );
    assert!(writer.release().await.expect("release"));
    assert_nothing_left(&c, &server, &k).await;
}

/// The server frozen for 1.5 s under two renewed readers (lease 2 s) and a waiting writer: a
/// second writer meanwhile fails or is refused, never granted; the waiting writer is granted
/// only once no reader's lease is live on the server (or gives up with a backend error); and
/// after the run no reader entry, writer or claim is left.
async fn server_paused_while_readers_hold_and_a_writer_waits(client: Client) {
    let server = RedisServer::start();
    let c = coordinator(&server, client).await;
    let k = key("rw-pause");
    let readers = hold_readers(&c, &k).await;
    let writer = spawn_writer(&c, &k, Duration::from_secs(20));
    until("the writer's claim", LONG, || claim_stored(&server, &k)).await;
    server.pause();
    let during = {
        let (c, k) = (c.clone(), k.clone());
        tokio::spawn(async move {
            c.rw_lock(k)
                .lease(LONG)
                .try_write()
                .await
                .map(|w| w.is_some())
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.resume();
    if let Ok(granted) = during.await.expect("task") {
        assert!(!granted, "a second writer was granted across the pause");
    }
    // One renewal round after the thaw.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let still = readers.iter().filter(|r| r.is_held()).count();
    if still == readers.len() && !writer.is_finished() {
        assert_eq!(
            readers_live(&server, &k),
            2,
            "both readers believe they hold, the server lost one"
        );
    }
    if writer.is_finished() {
        // Whatever it got, a writer's grant while a reader's lease is live would show here:
        // readers renew every 200 ms, and a renewal never revives a hold that ended.
        assert!(
            !(writer_live(&server, &k) && readers_live(&server, &k) > 0),
            "a writer and a reader both hold after the thaw"
        );
    }
    for reader in readers {
        let _ = reader.release().await;
    }
    let (writer, _) = tokio::time::timeout(Duration::from_secs(20), writer)
        .await
        .expect("the writer's wait ends")
        .expect("writer task");
    eprintln!(
        "{client:?}: readers still held after the thaw: {still}; the waiting writer got {:?}",
        writer.as_ref().map(RwLockGuard::fencing_token)
    );
    match writer {
        Ok(writer) => {
            assert_eq!(
                readers_live(&server, &k),
                0,
                "the writer was admitted beside a live reader"
            );
            assert!(writer.release().await.expect("release"));
        }
        // Its look during the freeze timed out: it waits no more, and withdraws its claim.
        Err(CoordError::Backend(err)) => assert!(err.kind().is_transient(), "{err}"),
        Err(other) => panic!("the waiting writer got {other}"),
    }
    assert_nothing_left(&c, &server, &k).await;
}

/// The server frozen for 3 s under two renewed readers (lease 2 s) and a waiting writer:
/// the readers' leases end during the freeze (their sorted set expires as a whole), the
/// readers learn they lost their holds, the writer is granted after the thaw (or its wait
/// ends with a transient backend error), and no reader's token is left behind in the lock's
/// state, though no script ever saw those readers lapse one by one.
async fn server_paused_past_the_readers_lease_leaves_no_reader_behind(client: Client) {
    let server = RedisServer::start();
    let c = coordinator(&server, client).await;
    let k = key("rw-pause-long");
    let readers = hold_readers(&c, &k).await;
    let writer = spawn_writer(&c, &k, Duration::from_secs(20));
    until("the writer's claim", LONG, || claim_stored(&server, &k)).await;
    server.pause();
    tokio::time::sleep(Duration::from_secs(3)).await;
    server.resume();
    until("the readers see their holds lost", LONG, || {
        readers.iter().all(|r| !r.is_held())
    })
    .await;
    let (writer, _) = tokio::time::timeout(Duration::from_secs(20), writer)
        .await
        .expect("the writer's wait ends")
        .expect("writer task");
    match writer {
        Ok(writer) => {
            assert_eq!(readers_live(&server, &k), 0);
            assert!(writer.release().await.expect("release"));
        }
        Err(CoordError::Backend(err)) => assert!(err.kind().is_transient(), "{err}"),
        Err(other) => panic!("the waiting writer got {other}"),
    }
    for reader in readers {
        assert!(
            !reader.release().await.unwrap_or(false),
            "a read hold that lapsed in the freeze was released as if held"
        );
    }
    assert_nothing_left(&c, &server, &k).await;
}

/// The server restarted without its data under two renewed readers and a waiting writer: the
/// readers learn their holds are gone (a renewal never revives one), the writer gets the key
/// after the restart (or fails over the restart and gets it on a new try), and the old
/// readers' late releases free nothing: the writer still holds and no reader gets in.
async fn server_restarted_while_readers_hold_and_a_writer_waits(client: Client) {
    let mut server = RedisServer::start();
    let c = coordinator(&server, client).await;
    let k = key("rw-restart");
    let readers = hold_readers(&c, &k).await;
    let writer = spawn_writer(&c, &k, Duration::from_secs(20));
    until("the writer's claim", LONG, || claim_stored(&server, &k)).await;
    server.restart();
    until("the old readers see their holds gone", LONG, || {
        readers.iter().all(|r| !r.is_held())
    })
    .await;
    assert_eq!(
        readers_live(&server, &k),
        0,
        "a renewal revived a read hold the restart lost"
    );
    let writer = writer.await.expect("writer task").0;
    eprintln!(
        "{client:?}: the waiting writer over a restart got {:?}",
        writer.as_ref().map(RwLockGuard::fencing_token)
    );
    let writer = match writer {
        Ok(writer) => writer,
        Err(CoordError::Backend(err)) if err.kind().is_transient() => {
            // The restart failed the wait itself: the key is free, a new try gets it.
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                assert!(Instant::now() < deadline, "no writer after the restart");
                match c.rw_lock(k.clone()).lease(LONG).try_write().await {
                    Ok(Some(writer)) => break writer,
                    Ok(None) => panic!("the restarted server kept a hold it lost"),
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        }
        Err(other) => panic!("the waiting writer got {other}"),
    };
    assert!(writer_live(&server, &k));
    for reader in readers {
        assert!(
            !reader.release().await.unwrap_or(false),
            "a read hold lost in the restart was released as if held"
        );
    }
    assert!(writer.is_held(), "a late read release freed the writer");
    assert!(
        writer_live(&server, &k),
        "a late read release freed the writer"
    );
    assert!(
        !reader_gets_in(&c, &k).await.expect("try_read"),
        "a reader got in beside the writer"
    );
    assert!(writer.release().await.expect("release"));
    assert_nothing_left(&c, &server, &k).await;
}

/// A writer (its own provider: another process) waits behind a renewed reader with a 4 s
/// claim; the server is frozen for 1 s and the writer's process goes away meanwhile. After the
/// thaw its claim still keeps new readers out until it ends (writer preference does not
/// vanish with a pause), then lapses: a new reader gets in within the claim plus a margin,
/// without anyone releasing anything, and the first reader kept its hold throughout.
async fn a_waiting_writer_gone_during_a_pause_holds_readers_back_only_until_its_claim_ends(
    client: Client,
) {
    const CLAIM: Duration = Duration::from_secs(4);
    let server = RedisServer::start();
    let c = coordinator(&server, client).await;
    let k = key("rw-gone-writer");
    let reader = c
        .rw_lock(k.clone())
        .lease(LEASE)
        .renew(RENEW)
        .try_read()
        .await
        .expect("read")
        .expect("a free key");
    let other = provider(&server, client).await;
    let writer_owner = OwnerToken::new();
    let writer = {
        let (other, k) = (other.clone(), k.clone());
        tokio::spawn(async move {
            other
                .acquire_rw(RwLockRequest {
                    key: &k,
                    owner: writer_owner,
                    mode: RwMode::Write,
                    lease: LONG,
                    wait: LONG,
                    claim: CLAIM,
                })
                .await
        })
    };
    let token = format!("{:032x}", writer_owner.as_u128());
    until("the writer's claim", LONG, || {
        state_field(&server, &k, "c").as_deref() == Some(token.as_str())
    })
    .await;
    server.pause();
    // The writer's process ends: its wait is dropped mid-way and its connections close.
    writer.abort();
    let _ = writer.await;
    drop(other);
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.resume();
    let resumed = Instant::now();
    // The claim was last re-asserted at most half a claim before the freeze.
    let claim_end: u128 = state_field(&server, &k, "cx")
        .expect("the gone writer's claim is still stored")
        .parse()
        .expect("a claim end in ms");
    if claim_end > now_ms() + 500 {
        assert!(
            !reader_gets_in(&c, &k).await.expect("try_read"),
            "a new reader got in while the waiting writer's claim was live"
        );
    }
    let deadline = resumed + CLAIM + Duration::from_secs(3);
    loop {
        assert!(
            Instant::now() < deadline,
            "the gone writer's claim kept readers out past its end"
        );
        if reader_gets_in(&c, &k).await.unwrap_or(false) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        now_ms() >= claim_end,
        "a reader got in before the claim's end"
    );
    assert!(reader.is_held(), "the reader lost its hold");
    assert!(
        !claim_stored(&server, &k),
        "the lapsed claim is still stored"
    );
    assert!(reader.release().await.expect("release"));
    assert_nothing_left(&c, &server, &k).await;
}
