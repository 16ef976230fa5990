//! Multi-key locks taken key by key while redis-server fails, for every client: its
//! connections killed (`CLIENT KILL`), the server frozen (SIGSTOP) and restarted without its
//! data, half way through an acquisition (the first keys taken, a later one held by someone
//! else) and under a held set. Each case checks what the caller gets, that a failure leaves
//! none of the keys it had taken held (not until their lease: at once, or as soon as the
//! server answers again), and that a key lost while the body runs cancels the body.
//!
//! The key-by-key path is the one a Redis Cluster takes for keys of different hash slots; a
//! provider built on the application's own client takes it too (it cannot know the client
//! talks to one server), which lets these cases freeze and restart one plain server.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use coord_core::provider::LossCause;
use coord_core::{CallKey, CoordError, Coordinator, MultiLockGuard};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::{RedisServer, Resp};
use support::*;

per_client!(
    connections_killed_while_a_key_by_key_acquire_waits,
    server_paused_while_a_key_by_key_acquire_waits,
    server_restarted_while_a_key_by_key_acquire_waits,
    server_paused_past_the_lease_cancels_the_body,
    server_restarted_under_a_held_set_cancels_the_body,
    a_key_lost_mid_body_cancels_it_and_frees_the_others,
);

const COMMAND_TIMEOUT: Duration = Duration::from_millis(500);

/// A coordinator whose provider is built on an application's own client for `server`: it
/// takes a set of keys of different hash slots key by key.
async fn key_by_key(server: &RedisServer, client: Client, ns: &str) -> Coordinator {
    let builder = match client {
        #[cfg(feature = "redis-client")]
        Client::RedisRs => {
            RedisProvider::from_redis_client(redis::Client::open(server.url()).expect("url"))
        }
        #[cfg(feature = "fred")]
        Client::Fred => {
            use ::fred::prelude::{Builder, ClientLike, Config, ReconnectPolicy};
            let config = Config::from_url(&server.url()).expect("url");
            let app = Builder::from_config(config)
                // As an application would: reconnect, quickly, for ever.
                .set_policy(ReconnectPolicy::new_exponential(0, 10, 250, 2))
                .build()
                .expect("fred client");
            app.init().await.expect("fred connects");
            RedisProvider::from_fred_client(app)
        }
        _ => unreachable!("no other client is compiled in"),
    };
    let provider = builder
        .command_timeout(COMMAND_TIMEOUT)
        .connect()
        .await
        .expect("connect to the test server");
    Coordinator::builder()
        .namespace(ns)
        .provider(provider)
        .build()
        .expect("coordinator")
}

/// Another process's coordinator on `server` (its own connections).
async fn other(server: &RedisServer, client: Client, ns: &str) -> Coordinator {
    Coordinator::builder()
        .namespace(ns)
        .provider(
            RedisProvider::builder(server.url())
                .client(client)
                .command_timeout(COMMAND_TIMEOUT)
                .connect()
                .await
                .expect("connect"),
        )
        .build()
        .expect("coordinator")
}

/// Three keys of one operation, in canonical order: `a` and `b` are taken first, `c` last.
fn three(c: &Coordinator, name: &str) -> [CallKey; 3] {
    ["a", "b", "c"].map(|part| c.key(name).part(&part).finish())
}

fn lock_name(key: &CallKey) -> String {
    redis_key(key, "lock")
}

/// Whether the server holds the lock of `key` (any owner).
fn locked(server: &RedisServer, key: &CallKey) -> bool {
    server.command(&["EXISTS", &lock_name(key)]) == Resp::Int(1)
}

/// Asserts that another caller takes `key` at once (so nobody holds it), and frees it again.
async fn assert_free(c: &Coordinator, key: &CallKey, when: &str) {
    let probe = c
        .lock(key.clone())
        .lease(LONG)
        .try_acquire()
        .await
        .expect("try_acquire");
    let Some(probe) = probe else {
        panic!("{when}: {key} is still held");
    };
    assert!(probe.release().await.expect("release"));
}

/// Asserts that another caller is refused `key`.
async fn assert_taken(c: &Coordinator, key: &CallKey, when: &str) {
    let probe = c
        .lock(key.clone())
        .lease(LONG)
        .try_acquire()
        .await
        .expect("try_acquire");
    assert!(probe.is_none(), "{when}: another caller got {key}");
}

type SetTask = tokio::task::JoinHandle<(Result<MultiLockGuard, CoordError>, Instant)>;

fn spawn_set(c: &Coordinator, keys: &[CallKey], lease: Duration, wait: Duration) -> SetTask {
    let (c, keys) = (c.clone(), keys.to_vec());
    tokio::spawn(async move {
        let set = c.multi_lock(keys).lease(lease).wait(wait).acquire().await;
        (set, Instant::now())
    })
}

/// Connections killed while a key-by-key acquisition holds `a` and `b` and waits for `c`:
/// either the wait goes on over new connections, `a` and `b` stay its own (nobody else gets
/// them) and the release of `c` still wakes it (its subscription was remade) well before its
/// wait ends; or the kill failed a command of the wait, the caller gets a transient backend
/// error, and `a` and `b` are free within seconds, not at the end of their 30 s lease.
async fn connections_killed_while_a_key_by_key_acquire_waits(client: Client) {
    let server = RedisServer::start();
    let c = key_by_key(&server, client, "mkkill").await;
    let o = other(&server, client, "mkkill").await;
    let [a, b, k3] = three(&c, "kill");
    let holder = o
        .lock(k3.clone())
        .lease(LONG)
        .try_acquire()
        .await
        .unwrap()
        .expect("c is free");
    let set = spawn_set(
        &c,
        &[a.clone(), b.clone(), k3.clone()],
        LONG,
        Duration::from_secs(20),
    );
    until("a and b taken", LONG, || {
        locked(&server, &a) && locked(&server, &b)
    })
    .await;
    for kind in ["normal", "pubsub"] {
        server.command(&["CLIENT", "KILL", "TYPE", kind]);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    if set.is_finished() {
        // The kill failed a command of the wait: the caller gets a backend error, and what
        // the set had taken is released at once, not at the end of its 30 s lease.
        let (set, _) = set.await.expect("set task");
        eprintln!("{client:?}: the half-taken set over killed connections got {set:?}");
        match set {
            Err(CoordError::Backend(err)) => assert!(err.kind().is_transient(), "{err}"),
            other => panic!("the wait for c ended with c held: {other:?}"),
        }
        until("a and b released", Duration::from_secs(5), || {
            !locked(&server, &a) && !locked(&server, &b)
        })
        .await;
        assert_free(&o, &a, "after the failed set").await;
        assert_free(&o, &b, "after the failed set").await;
        assert_taken(&o, &k3, "after the failed set").await;
        assert!(holder.release().await.expect("release"));
        return;
    }
    assert_taken(&o, &a, "while the set waits for c").await;
    assert_taken(&o, &b, "while the set waits for c").await;
    let released_at = Instant::now();
    assert!(holder.release().await.expect("release"));
    let (set, at) = set.await.expect("set task");
    let set = set.expect("the set gets c once it is free");
    let woke_after = at.saturating_duration_since(released_at);
    assert!(
        woke_after < Duration::from_secs(3),
        "the set took {woke_after:?} after c was released"
    );
    assert!(
        !set.taken_together(),
        "the keys were meant to go one by one"
    );
    assert!(set.is_held());
    for key in [&a, &b, &k3] {
        assert!(set.fencing_token(key).is_some());
        assert_taken(&o, key, "while the set holds").await;
    }
    assert!(set.release().await.expect("release"));
    for key in [&a, &b, &k3] {
        assert_free(&o, key, "after the release").await;
    }
}

/// The server frozen while a key-by-key acquisition (lease 30 s, wait 2.5 s) holds `a` and
/// `b` and waits for `c`, and kept frozen until the caller has its answer: the answer comes
/// within 4 s while the server is still frozen (a refusal or a backend error, never a grant),
/// so the release of `a` and `b` it attempts cannot land; once the server answers again they
/// are free within seconds (released in the background), not at the end of their 30 s lease:
/// nothing of the half-taken set is left.
async fn server_paused_while_a_key_by_key_acquire_waits(client: Client) {
    let server = RedisServer::start();
    let c = key_by_key(&server, client, "mkpause").await;
    let o = other(&server, client, "mkpause").await;
    let [a, b, k3] = three(&c, "pause");
    let _holder = o
        .lock(k3.clone())
        .lease(LONG)
        .try_acquire()
        .await
        .unwrap()
        .expect("c is free");
    let started = Instant::now();
    let set = spawn_set(
        &c,
        &[a.clone(), b.clone(), k3.clone()],
        LONG,
        Duration::from_millis(2500),
    );
    until("a and b taken", LONG, || {
        locked(&server, &a) && locked(&server, &b)
    })
    .await;
    server.pause();
    let answer = tokio::time::timeout(Duration::from_secs(4), set).await;
    let frozen_for = started.elapsed();
    server.resume();
    let resumed = Instant::now();
    let (set, _) = answer
        .unwrap_or_else(|_| panic!("no answer within 4 s of the freeze ({frozen_for:?})"))
        .expect("set task");
    eprintln!("{client:?}: the half-taken set over a freeze got {set:?}");
    match set {
        Ok(_) => panic!("the set was granted while c was held and the server frozen"),
        Err(CoordError::LockNotAcquired { .. }) => {}
        Err(CoordError::Backend(err)) => assert!(err.kind().is_transient(), "{err}"),
        Err(other) => panic!("the set got {other}"),
    }
    until(
        "a and b released after the thaw",
        Duration::from_secs(5),
        || !locked(&server, &a) && !locked(&server, &b),
    )
    .await;
    let freed_after = resumed.elapsed();
    assert!(
        freed_after < Duration::from_secs(5),
        "a and b were freed {freed_after:?} after the thaw"
    );
    assert_free(&o, &a, "after the thaw").await;
    assert_free(&o, &b, "after the thaw").await;
    assert_taken(&o, &k3, "after the thaw").await;
}

/// The server restarted without its data while a key-by-key acquisition holds `a` and `b` and
/// waits for `c`. Either the acquisition fails over the restart (and then nothing is held:
/// the restart forgot `a` and `b`, and nothing of the set's comes back), or it gets `c` from
/// the restarted server: then it believes it holds `a` and `b`, which the restart forgot,
/// and the first renewal finds them gone, so its body is cancelled with `LockLost` naming one
/// of them well before its lease ends.
async fn server_restarted_while_a_key_by_key_acquire_waits(client: Client) {
    let mut server = RedisServer::start();
    let c = key_by_key(&server, client, "mkrestart").await;
    let o = other(&server, client, "mkrestart").await;
    let [a, b, k3] = three(&c, "restart");
    let _holder = o
        .lock(k3.clone())
        .lease(LONG)
        .try_acquire()
        .await
        .unwrap()
        .expect("c is free");
    let ran = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    let set = {
        let (c, keys) = (c.clone(), vec![a.clone(), b.clone(), k3.clone()]);
        let (ran, finished) = (ran.clone(), finished.clone());
        tokio::spawn(async move {
            let outcome = c
                .multi_lock(keys)
                .lease(Duration::from_secs(2))
                .renew(Duration::from_millis(200))
                .wait(Duration::from_secs(20))
                .run(|| async {
                    ran.store(true, Ordering::SeqCst);
                    tokio::time::sleep(LONG).await;
                    finished.store(true, Ordering::SeqCst);
                    Ok::<_, CoordError>(())
                })
                .await;
            (outcome, Instant::now())
        })
    };
    until("a and b taken", LONG, || {
        locked(&server, &a) && locked(&server, &b)
    })
    .await;
    server.restart();
    let restarted = Instant::now();
    let (outcome, at) = tokio::time::timeout(Duration::from_secs(15), set)
        .await
        .expect("the call answers")
        .expect("set task");
    assert!(!finished.load(Ordering::SeqCst), "the body ran to its end");
    eprintln!("{client:?}: the half-taken set over a restart got {outcome:?}");
    match outcome {
        Err(CoordError::LockLost { key, .. }) => {
            assert!(ran.load(Ordering::SeqCst));
            assert!(
                key == a || key == b,
                "the lost key is {key}, not one the restart forgot"
            );
            let after = at.saturating_duration_since(restarted);
            assert!(
                after < Duration::from_secs(5),
                "the body was cancelled {after:?} after the restart"
            );
        }
        Err(CoordError::Backend(err)) => {
            assert!(err.kind().is_transient(), "{err}");
            assert!(!ran.load(Ordering::SeqCst), "the body ran on a failed set");
        }
        other => panic!("the set over a restart got {other:?}"),
    }
    // Nothing of the set is held: each key is free for another caller.
    until("the set's keys released", Duration::from_secs(5), || {
        !locked(&server, &a) && !locked(&server, &b) && !locked(&server, &k3)
    })
    .await;
    for key in [&a, &b, &k3] {
        assert_free(&o, key, "after the restart").await;
    }
}

/// A set held by a body that renews every 200 ms and would run for [`LONG`]: the task that
/// answers the body's outcome and when it came, a receiver told once the body has started, and
/// whether the body ran to its end.
struct HeldSet {
    task: tokio::task::JoinHandle<(Result<(), CoordError>, Instant)>,
    entered: tokio::sync::oneshot::Receiver<()>,
    finished: Arc<AtomicBool>,
}

fn spawn_held_set(c: &Coordinator, keys: &[CallKey], lease: Duration) -> HeldSet {
    let (entered_tx, entered) = tokio::sync::oneshot::channel();
    let finished = Arc::new(AtomicBool::new(false));
    let task = {
        let (c, keys, finished) = (c.clone(), keys.to_vec(), finished.clone());
        tokio::spawn(async move {
            let outcome = c
                .multi_lock(keys)
                .lease(lease)
                .renew(Duration::from_millis(200))
                .run(|| async {
                    let _ = entered_tx.send(());
                    tokio::time::sleep(LONG).await;
                    finished.store(true, Ordering::SeqCst);
                    Ok::<_, CoordError>(())
                })
                .await;
            (outcome, Instant::now())
        })
    };
    HeldSet {
        task,
        entered,
        finished,
    }
}

/// A held set (lease 1 s, renewed every 200 ms) through a 2.5 s freeze: no renewal is
/// confirmed for a whole lease, so the body is cancelled with `LockLost`
/// (`BackendUnreachable`) while the server is still frozen; after the thaw every key has
/// lapsed and another caller takes each at once.
async fn server_paused_past_the_lease_cancels_the_body(client: Client) {
    let server = RedisServer::start();
    let c = key_by_key(&server, client, "mkfreeze").await;
    let o = other(&server, client, "mkfreeze").await;
    let keys = three(&c, "freeze");
    let HeldSet {
        task: set,
        entered,
        finished,
    } = spawn_held_set(&c, &keys, Duration::from_secs(1));
    entered.await.expect("the body starts");
    server.pause();
    let paused = Instant::now();
    let answer = tokio::time::timeout(Duration::from_millis(2500), set).await;
    // The freeze lasts its full 2.5 s whenever the body was cancelled: well past the lease
    // of every key by the server's clock.
    tokio::time::sleep_until((paused + Duration::from_millis(2500)).into()).await;
    server.resume();
    let (outcome, at) = answer
        .expect("the body was not cancelled during the freeze")
        .expect("set task");
    assert!(!finished.load(Ordering::SeqCst));
    match outcome {
        Err(CoordError::LockLost { key, cause, .. }) => {
            assert!(keys.contains(&key), "{key}");
            assert_eq!(cause, LossCause::BackendUnreachable);
        }
        other => panic!("the frozen set's body got {other:?}"),
    }
    let after = at.saturating_duration_since(paused);
    assert!(
        after < Duration::from_millis(2200),
        "cancelled {after:?} after the freeze began (lease 1 s)"
    );
    for key in &keys {
        assert_free(&o, key, "after the thaw").await;
    }
}

/// The server restarted without its data under a held set (lease 2 s, renewed): the first
/// renewal finds a key gone, the body is cancelled with `LockLost`, and every key is free
/// for another caller; the set's late releases free nobody else's lock.
async fn server_restarted_under_a_held_set_cancels_the_body(client: Client) {
    let mut server = RedisServer::start();
    let c = key_by_key(&server, client, "mkheld").await;
    let o = other(&server, client, "mkheld").await;
    let keys = three(&c, "held");
    let HeldSet {
        task: set,
        entered,
        finished,
    } = spawn_held_set(&c, &keys, Duration::from_secs(2));
    entered.await.expect("the body starts");
    server.restart();
    let restarted = Instant::now();
    // Another caller takes the first key on the restarted server (it is free there): the
    // set's late releases must leave it held.
    let first = loop {
        match o.lock(keys[0].clone()).lease(LONG).try_acquire().await {
            Ok(Some(first)) => break first,
            Ok(None) => panic!("the restarted server kept a key it lost"),
            Err(_) => {
                assert!(
                    restarted.elapsed() < Duration::from_secs(10),
                    "no reconnect"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let (outcome, at) = tokio::time::timeout(Duration::from_secs(10), set)
        .await
        .expect("the body is cancelled")
        .expect("set task");
    assert!(!finished.load(Ordering::SeqCst));
    assert!(
        matches!(outcome, Err(CoordError::LockLost { .. })),
        "the set's body over a restart got {outcome:?}"
    );
    let after = at.saturating_duration_since(restarted);
    assert!(
        after < Duration::from_secs(4),
        "the body was cancelled {after:?} after the restart (lease 2 s)"
    );
    // The set's releases ran (owner-checked): the other caller's lock stands.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(first.is_held());
    assert_taken(&c, &keys[0], "after the set's releases").await;
    assert!(first.release().await.expect("release"));
    for key in &keys {
        assert_free(&o, key, "after the restart").await;
    }
}

/// One key of a held set removed on the server (as a failover that lost the write, or a key
/// evicted, would leave it): the body is cancelled with `LockLost` naming that key, and the
/// other two keys are released at once, not at the end of their 30 s lease.
async fn a_key_lost_mid_body_cancels_it_and_frees_the_others(client: Client) {
    let server = RedisServer::start();
    let c = key_by_key(&server, client, "mklost").await;
    let o = other(&server, client, "mklost").await;
    let keys = three(&c, "lost");
    let HeldSet {
        task: set,
        entered,
        finished,
    } = spawn_held_set(&c, &keys, LONG);
    entered.await.expect("the body starts");
    assert_eq!(server.command(&["DEL", &lock_name(&keys[1])]), Resp::Int(1));
    let removed = Instant::now();
    let (outcome, at) = tokio::time::timeout(Duration::from_secs(5), set)
        .await
        .expect("the body is cancelled")
        .expect("set task");
    assert!(!finished.load(Ordering::SeqCst));
    match outcome {
        Err(CoordError::LockLost { key, .. }) => assert_eq!(key, keys[1]),
        other => panic!("the set's body got {other:?}"),
    }
    let after = at.saturating_duration_since(removed);
    assert!(
        after < Duration::from_secs(2),
        "cancelled {after:?} after the key was removed (renewal every 200 ms)"
    );
    until("the other keys released", Duration::from_secs(3), || {
        !locked(&server, &keys[0]) && !locked(&server, &keys[2])
    })
    .await;
    for key in &keys {
        assert_free(&o, key, "after the loss").await;
    }
}
