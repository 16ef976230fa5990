//! A PostgreSQL failover: the primary is killed (SIGKILL) while a fenced lock is held and
//! renewed and right after transactional idempotent calls (the record in the caller's
//! transaction, beside a `charges` row) committed; its streaming standby is promoted
//! (`pg_promote`) and new clients connect to it. What the promoted server has is compared with
//! what the callers were told.
//!
//! | Case (test) | Standby | Expected on the promoted server |
//! |---|---|---|
//! | `synchronous_on_keeps_every_acknowledged_commit` | named in `synchronous_standby_names`, `synchronous_commit = on` | every committed charge and its record (a duplicate replays, the body does not run again); the lock row with the holder's fencing token and an expiry no earlier than the last renewal read on the primary, so the lock is still held; the next token is newer than the holder's |
//! | `synchronous_remote_apply_keeps_every_acknowledged_commit` | the same with `synchronous_commit = remote_apply` | the same |
//! | `synchronous_standby_gone_fails_writes_never_ok` | named, synchronous, its WAL receiver stopped (no failover) | coord's writes wait for it and fail with `Timeout`, never `Ok`; once it is back, the lock granted to nobody is released within seconds (its lease is 30 s) and the idempotent key runs once; the control (a release that stops at "found nothing") leaves the key held until its lease ends |
//! | `asynchronous_lagging_standby_loses_what_it_never_received` (the control) | not named (asynchronous), its WAL receiver stopped before the lock and the calls (`primary_conninfo = ''`) | none of the charges or records (every duplicate runs its body again), no lock row (a second holder is granted at once), and the second holder's token is not newer than the first's: the sequence lost its advance too |
//!
//! A commit is visible to other sessions on the primary only after the synchronous standby
//! confirmed it, so the lock expiry read on the primary just before the kill is a value the
//! standby had.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::{CoordError, Coordinator, LockGuard, idempotent};
use coord_history::planted::{Planted, PlantedBug};
use coord_postgres::{PostgresProvider, Transaction};
use coord_postgres_testing::{PostgresServer, ServerOptions};

/// Charges committed before the primary dies.
const CHARGES: usize = 20;
const STANDBY: &str = "standby_a";
const LEASE: Duration = Duration::from_secs(30);
const RENEW: Duration = Duration::from_millis(300);
/// The lease of the lock asked for while the synchronous standby is gone: long, so that a
/// lock freed by its release is told apart from one that lapsed.
const GONE_LEASE: Duration = Duration::from_secs(30);

#[derive(Debug)]
enum ChargeError {
    Db(#[allow(dead_code)] tokio_postgres::Error),
    Coord(#[allow(dead_code)] CoordError),
}

impl From<tokio_postgres::Error> for ChargeError {
    fn from(err: tokio_postgres::Error) -> Self {
        ChargeError::Db(err)
    }
}

impl From<CoordError> for ChargeError {
    fn from(err: CoordError) -> Self {
        ChargeError::Coord(err)
    }
}

/// A charge: a row in `charges` and the idempotency record, both in `tx`.
#[idempotent(key_from = "order", coordinator = c, name = "fo.charge", transaction = "tx")]
async fn charge(
    c: &Coordinator,
    tx: &mut Transaction<'_>,
    order: &str,
    runs: &AtomicUsize,
) -> Result<i64, ChargeError> {
    runs.fetch_add(1, Ordering::SeqCst);
    let row = tx
        .query_one(
            "INSERT INTO charges (order_id) VALUES ($1) RETURNING id",
            &[&order],
        )
        .await?;
    Ok(row.get(0))
}

/// How commits wait for the standby.
#[derive(Clone, Copy, Debug)]
enum Replication {
    /// Named in `synchronous_standby_names`, with this `synchronous_commit`.
    Synchronous(&'static str),
    /// Not named; its WAL receiver stopped before the workload, so it receives nothing of it.
    AsynchronousStopped,
}

/// Waits (up to 60 s) until `done`.
fn await_condition(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A migrated primary with `charges`, and its standby, streaming as `replication` says.
async fn cluster(replication: Replication) -> (PostgresServer, PostgresServer) {
    let primary = PostgresServer::start();
    PostgresProvider::migrate(&primary.url())
        .await
        .expect("migrate the primary");
    primary.sql("CREATE TABLE charges (id bigserial PRIMARY KEY, order_id text NOT NULL)");
    let standby = primary.start_standby(STANDBY, ServerOptions::new());
    await_condition("the standby to stream", || {
        primary.sql(&format!(
            "SELECT count(*) FROM pg_stat_replication \
             WHERE application_name = '{STANDBY}' AND state = 'streaming'"
        )) == "1"
    });
    match replication {
        Replication::Synchronous(commit) => {
            primary.sql(&format!(
                "ALTER SYSTEM SET synchronous_standby_names = '{STANDBY}'"
            ));
            primary.sql(&format!("ALTER SYSTEM SET synchronous_commit = '{commit}'"));
            primary.sql("SELECT pg_reload_conf()");
            await_condition("the standby to be synchronous", || {
                primary.sql("SELECT sync_state FROM pg_stat_replication") == "sync"
                    && primary.sql("SHOW synchronous_commit") == commit
            });
        }
        Replication::AsynchronousStopped => {
            standby.sql("ALTER SYSTEM SET primary_conninfo = ''");
            standby.sql("SELECT pg_reload_conf()");
            await_condition("the standby to stop receiving", || {
                primary.sql("SELECT count(*) FROM pg_stat_replication") == "0"
                    && standby.sql("SELECT count(*) FROM pg_stat_wal_receiver") == "0"
            });
        }
    }
    (primary, standby)
}

async fn coordinator(url: &str) -> (PostgresProvider, Coordinator) {
    let provider = PostgresProvider::builder(url)
        .command_timeout(Duration::from_secs(2))
        .pool_size(4)
        .connect()
        .await
        .expect("connect");
    let coord = Coordinator::builder()
        .namespace("fo")
        .provider(provider.clone())
        .build()
        .expect("coordinator");
    (provider, coord)
}

async fn app_client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("the application's connection");
    tokio::spawn(connection);
    client
}

/// The lock row on `server`: its fencing token and expiry (microseconds since the epoch).
fn lock_row(server: &PostgresServer) -> Option<(u64, i64)> {
    let row = server
        .sql("SELECT fence, (extract(epoch FROM expires_at) * 1000000)::bigint FROM coord.locks");
    let (fence, expiry) = row.split_once('|')?;
    Some((fence.parse().ok()?, expiry.parse().ok()?))
}

/// What the primary's clients were told, and what the promoted server then had.
struct Failover {
    token: u64,
    /// The lock's expiry last read on the primary before the kill.
    expiry_before: i64,
    /// The lock row on the promoted server.
    row_after: Option<(u64, i64)>,
    /// Charges committed (`Ok` from `commit`), and how many of them the promoted server has.
    committed: usize,
    charges_kept: usize,
    /// Duplicates of the committed charges on the promoted server that replayed, and bodies
    /// run by them (a lost record runs again).
    replayed: usize,
    runs_after: usize,
    /// A second holder asking at once on the promoted server: its token, if granted.
    second_holder: Option<u64>,
    /// A fenced lock of another key on the promoted server: its token.
    next_token: u64,
    /// Mean time of a charge from `begin` to a committed `commit`.
    mean_commit: Duration,
}

async fn fail_over(replication: Replication) -> Failover {
    let (mut primary, standby) = cluster(replication).await;
    let (provider, coord) = coordinator(&primary.url()).await;
    let holder: LockGuard = coord
        .lock(coord.key("fo.job").part("nightly").finish())
        .lease(LEASE)
        .renew(RENEW)
        .fenced()
        .acquire()
        .await
        .expect("the holder takes the lock");
    let token = holder.fencing_token().expect("a fenced hold").get();
    let (_, granted_expiry) = lock_row(&primary).expect("the lock row on the primary");
    // A renewal committed: the expiry moved on.
    await_condition("a renewal", || {
        lock_row(&primary).is_some_and(|(_, e)| e > granted_expiry)
    });

    let runs = AtomicUsize::new(0);
    let mut app = app_client(&primary.url()).await;
    let mut committed = 0;
    let started = Instant::now();
    for i in 0..CHARGES {
        let mut tx = provider.begin(&mut app).await.expect("begin");
        charge(&coord, &mut tx, &format!("order-{i}"), &runs)
            .await
            .expect("the charge");
        tx.commit().await.expect("commit");
        committed += 1;
    }
    let mean_commit = started.elapsed() / CHARGES as u32;
    assert!(holder.is_held(), "the holder held throughout the charges");
    let (_, expiry_before) = lock_row(&primary).expect("the lock row on the primary");
    primary.kill();
    drop(app);
    standby.promote();

    // New clients, on the promoted server.
    let (provider, coord) = coordinator(&standby.url()).await;
    let charges_kept: usize = standby
        .sql("SELECT count(*) FROM charges")
        .parse()
        .expect("a count");
    let row_after = lock_row(&standby);
    let runs_after = AtomicUsize::new(0);
    let mut replayed = 0;
    let mut app = app_client(&standby.url()).await;
    for i in 0..CHARGES {
        let mut tx = provider.begin(&mut app).await.expect("begin");
        let before = runs_after.load(Ordering::SeqCst);
        charge(&coord, &mut tx, &format!("order-{i}"), &runs_after)
            .await
            .expect("the duplicate");
        tx.commit().await.expect("commit");
        if runs_after.load(Ordering::SeqCst) == before {
            replayed += 1;
        }
    }
    let second_holder = coord
        .lock(coord.key("fo.job").part("nightly").finish())
        .lease(LEASE)
        .fenced()
        .try_acquire()
        .await
        .expect("ask for the lock on the promoted server")
        .map(|guard| guard.fencing_token().expect("a fenced hold").get());
    let next_token = coord
        .lock(coord.key("fo.job").part("other").finish())
        .fenced()
        .acquire()
        .await
        .expect("another lock")
        .fencing_token()
        .expect("a fenced hold")
        .get();
    // The first holder's renewals went to the dead primary.
    drop(holder);
    let outcome = Failover {
        token,
        expiry_before,
        row_after,
        committed,
        charges_kept,
        replayed,
        runs_after: runs_after.load(Ordering::SeqCst),
        second_holder,
        next_token,
        mean_commit,
    };
    println!(
        "{replication:?}: {} of {} committed charges kept, {} duplicates replayed ({} bodies run \
         again); lock row after {:?} (holder's token {}, expiry read before the kill {}); a \
         second holder {:?}; next token {}; mean charge with commit {:?}",
        outcome.charges_kept,
        outcome.committed,
        outcome.replayed,
        outcome.runs_after,
        outcome.row_after,
        outcome.token,
        outcome.expiry_before,
        outcome.second_holder,
        outcome.next_token,
        outcome.mean_commit,
    );
    outcome
}

fn assert_everything_kept(f: &Failover) {
    assert_eq!(f.committed, CHARGES);
    assert_eq!(f.charges_kept, CHARGES, "every committed charge is there");
    assert_eq!(f.replayed, CHARGES, "every duplicate replays the record");
    assert_eq!(f.runs_after, 0, "no body ran again");
    let (fence, expiry) = f.row_after.expect("the lock row is on the promoted server");
    assert_eq!(fence, f.token, "with the holder's fencing token");
    assert!(
        expiry >= f.expiry_before,
        "with the renewal the primary had confirmed ({expiry} < {})",
        f.expiry_before
    );
    assert_eq!(f.second_holder, None, "the lock is still held");
    assert!(
        f.next_token > f.token,
        "tokens keep growing ({} after {})",
        f.next_token,
        f.token
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_on_keeps_every_acknowledged_commit() {
    assert_everything_kept(&fail_over(Replication::Synchronous("on")).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_remote_apply_keeps_every_acknowledged_commit() {
    assert_everything_kept(&fail_over(Replication::Synchronous("remote_apply")).await);
}

/// The control: the same calls and kill with a standby that received none of them. Were the
/// loss not seen here, the cases above would not show what synchronous replication keeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_lagging_standby_loses_what_it_never_received() {
    let f = fail_over(Replication::AsynchronousStopped).await;
    assert_eq!(
        f.committed, CHARGES,
        "every charge was committed on the primary"
    );
    assert_eq!(f.charges_kept, 0, "no committed charge reached the standby");
    assert_eq!(f.replayed, 0, "no record either");
    assert_eq!(f.runs_after, CHARGES, "every duplicate ran its body again");
    assert_eq!(f.row_after, None, "the lock row is gone");
    let second = f.second_holder.expect("a second holder is granted at once");
    assert!(
        second <= f.token,
        "the sequence lost its advance too: the second holder's token {second} is not newer \
         than the first's {}",
        f.token
    );
}

/// Stops the standby's WAL receiver, so that every commit on `primary` waits for it; returns
/// the standby's `primary_conninfo`, to bring it back with [`standby_back`].
fn standby_gone(primary: &PostgresServer, standby: &PostgresServer) -> String {
    let conninfo = standby.sql("SHOW primary_conninfo");
    standby.sql("ALTER SYSTEM SET primary_conninfo = ''");
    standby.sql("SELECT pg_reload_conf()");
    await_condition("the standby to stop receiving", || {
        primary.sql("SELECT count(*) FROM pg_stat_replication") == "0"
    });
    conninfo
}

/// Brings the standby back: the commits waiting for it complete.
fn standby_back(primary: &PostgresServer, standby: &PostgresServer, conninfo: &str) {
    standby.sql(&format!(
        "ALTER SYSTEM SET primary_conninfo = '{}'",
        conninfo.replace('\'', "''")
    ));
    standby.sql("SELECT pg_reload_conf()");
    await_condition("the standby to be synchronous again", || {
        primary.sql("SELECT sync_state FROM pg_stat_replication") == "sync"
    });
}

/// The live lock rows of keys containing `part` on `server`.
fn live_lock_rows(server: &PostgresServer, part: &str) -> usize {
    server
        .sql(&format!(
            "SELECT count(*) FROM coord.locks \
             WHERE key LIKE '%{part}%' AND expires_at > clock_timestamp()"
        ))
        .parse()
        .expect("a count")
}

/// Seconds from now until the lock row of a key containing `part` on `server` expires.
fn lock_expires_in(server: &PostgresServer, part: &str) -> f64 {
    server
        .sql(&format!(
            "SELECT extract(epoch FROM max(expires_at) - clock_timestamp()) FROM coord.locks \
             WHERE key LIKE '%{part}%'"
        ))
        .parse()
        .expect("seconds")
}

/// With the one standby that `synchronous_standby_names` names gone, every commit waits for
/// it. coord's writes then fail within the command timeout, never `Ok`: a lock acquire with
/// `Backend(Timeout)`, an idempotent call likewise and without running its body. Once the
/// standby is back the waiting commits complete, and neither key stays blocked: the lock
/// granted to nobody is released within seconds of the standby's return, long before its
/// 30 s lease ends (the release of an acquire whose answer was not read keeps trying until it
/// removes the grant: the tries while the standby was gone found nothing, because the grant's
/// commit was invisible to other sessions), and the idempotent key runs its body once.
///
/// The control, on the same servers: a coordinator whose release of an unanswered acquire
/// stops at the first answer (`PlantedBug::UnansweredReleaseStopsAtNothing`, what coord did
/// before). Its release finds nothing while the standby is gone and stops; when the standby is
/// back the grant commits, and the key is held by an owner nobody has until its lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_standby_gone_fails_writes_never_ok() {
    let (primary, standby) = cluster(Replication::Synchronous("on")).await;
    let conninfo = standby_gone(&primary, &standby);
    let (provider, coord) = coordinator(&primary.url()).await;
    let started = Instant::now();
    let lock_key = || coord.key("fo.job").part("gone").finish();
    let refused = coord.lock(lock_key()).lease(GONE_LEASE).acquire().await;
    match refused {
        Err(CoordError::Backend(e)) => assert_eq!(
            e.kind(),
            coord_core::provider::BackendErrorKind::Timeout,
            "{e}"
        ),
        other => panic!("an acquire whose commit waits for a gone standby: {other:?}"),
    }
    let runs = AtomicUsize::new(0);
    let charge_key = || coord.key("fo.charge_gone").part("o1").finish();
    let call = || async {
        coord
            .idempotent(charge_key())
            .in_flight_lease(Duration::from_secs(2))
            .run(|| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, CoordError>(7)
            })
            .await
    };
    let first = call().await;
    assert!(
        matches!(first, Err(CoordError::Backend(ref e)) if e.kind() == coord_core::provider::BackendErrorKind::Timeout),
        "an idempotent call whose claim waits for a gone standby: {first:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "no body ran");

    standby_back(&primary, &standby, &conninfo);
    let back = Instant::now();
    let deadline = back + Duration::from_secs(60);
    loop {
        match coord.lock(lock_key()).lease(GONE_LEASE).try_acquire().await {
            Ok(Some(_)) => break,
            Ok(None) | Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("the lock granted to nobody stayed held: {other:?}"),
        }
    }
    let lock_free = started.elapsed();
    let free_after_back = back.elapsed();
    assert!(
        free_after_back < Duration::from_secs(10) && lock_free < GONE_LEASE,
        "the lock granted to nobody was free {free_after_back:?} after the standby's return, \
         {lock_free:?} after the acquire: released, not lapsed at the end of its \
         {GONE_LEASE:?} lease"
    );
    loop {
        match call().await {
            Ok(7) => break,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("the idempotent key stayed blocked: {other:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
    println!(
        "standby gone: both writes refused; lock free {free_after_back:?} after the standby's \
         return, {lock_free:?} after the acquire (lease {GONE_LEASE:?}); idempotent key run \
         {:?} after the first acquire",
        started.elapsed()
    );

    // The control: the clean-up that stops at "found nothing".
    let planted = Planted::new(
        provider.clone(),
        PlantedBug::UnansweredReleaseStopsAtNothing,
    );
    let control = Coordinator::builder()
        .namespace("fo")
        .provider(planted.clone())
        .build()
        .expect("the control's coordinator");
    let conninfo = standby_gone(&primary, &standby);
    let control_key = || control.key("fo.job").part("control").finish();
    let control_started = Instant::now();
    let refused = control
        .lock(control_key())
        .lease(GONE_LEASE)
        .acquire()
        .await;
    assert!(
        matches!(refused, Err(CoordError::Backend(ref e)) if e.kind() == coord_core::provider::BackendErrorKind::Timeout),
        "the control's acquire: {refused:?}"
    );
    // Its release ran while the grant was invisible, found nothing, and stopped.
    await_condition("the control's release to end", || {
        planted.unanswered_releases_ended() == 1
    });
    standby_back(&primary, &standby, &conninfo);
    await_condition("the control's grant to commit", || {
        live_lock_rows(&primary, "control") == 1
    });
    let held = control
        .lock(control_key())
        .lease(GONE_LEASE)
        .try_acquire()
        .await
        .expect("an answer");
    assert!(
        held.is_none(),
        "the control's key is held by the owner nobody has"
    );
    let left = lock_expires_in(&primary, "control");
    let since = control_started.elapsed().as_secs_f64();
    assert!(
        left + since > GONE_LEASE.as_secs_f64() - 1.0,
        "the control's key stays held until its lease ends: {left:.1} s left, {since:.1} s \
         after its acquire"
    );
    println!(
        "control: the key still held {:.1} s after its acquire, {left:.1} s of its lease left",
        since
    );
}
