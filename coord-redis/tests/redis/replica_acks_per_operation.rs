//! `replica_acks` per operation: an attribute option or a handle setter overrides the
//! provider's `replica_acks` for one operation's granting writes, both ways. A replica is cut
//! off by pausing it (SIGSTOP), as in `replica_acks.rs`; both take their servers and steps from
//! `replicated.rs`, and the operations from `coord_history::replica_acks`, which the in-process
//! tests use too.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::handle::ClusterFlight;
use coord_core::{CoordError, Coordinator, distributed_lock};
use coord_history::replica_acks::{
    charge_default, charge_off, charge_on, flight_default, flight_off, flight_on, lock_default,
    lock_off, lock_on, many_off, many_on, permit_off, permit_on, read_on, write_off,
};
use coord_redis::Client;
use tokio::sync::Notify;

use super::replicated::{
    ACK_WAIT, NONE_OF_ONE, await_online, coordinator, cut_off_under_a_renewing_hold,
    enter_and_wait, eventually_absent, not_replicated, refused_within_the_wait, replicated,
    short_of_the_replica,
};

/// Provider default off, the operation asks for one replica: with the replica in step every
/// kind of grant succeeds; with it cut off, each fails with `NotReplicated` (0 of 1) without
/// running its body, attribute and handle alike, while an operation without the override on
/// the same coordinator is granted as before.
async fn an_operation_asks_for_replicas_the_provider_does_not(client: Client) {
    let (primary, replica, c) = replicated(client, false, "op-on").await;
    let runs = Arc::new(AtomicUsize::new(0));

    assert_eq!(lock_on(&c, 1, runs.clone()).await.unwrap(), 1);
    assert_eq!(permit_on(&c, 1, runs.clone()).await.unwrap(), 1);
    assert_eq!(read_on(&c, 1, runs.clone()).await.unwrap(), 1);
    assert_eq!(many_on(&c, vec![1, 2], runs.clone()).await.unwrap(), 2);
    assert_eq!(charge_on(&c, 1, runs.clone()).await.unwrap(), 10);
    assert_eq!(runs.load(Ordering::SeqCst), 5);

    replica.pause();
    refused_within_the_wait(lock_on(&c, 2, runs.clone())).await;
    eventually_absent(&primary, "op-on:lock:*op.lock*2*").await;
    short_of_the_replica(permit_on(&c, 2, runs.clone()).await);
    short_of_the_replica(read_on(&c, 2, runs.clone()).await);
    short_of_the_replica(many_on(&c, vec![3, 4], runs.clone()).await);
    short_of_the_replica(charge_on(&c, 2, runs.clone()).await);
    eventually_absent(&primary, "op-on:idem:*op.charge*2*").await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        5,
        "no body ran without its grant"
    );

    // The handle form of each, with the setter.
    let key = |op: &str, id: u32| c.key(op).part(&id).finish();
    let lock = c.lock(key("op.h.lock", 1)).replica_acks(1, ACK_WAIT);
    short_of_the_replica(lock.acquire().await);
    let semaphore = c.semaphore(key("op.h.permit", 1), 3);
    short_of_the_replica(semaphore.replica_acks(1, ACK_WAIT).acquire().await);
    let rw = c.rw_lock(key("op.h.rw", 1)).replica_acks(1, ACK_WAIT);
    short_of_the_replica(rw.run_write(|| async { Ok::<_, CoordError>(()) }).await);
    let both = [key("op.h.many", 1), key("op.h.many", 2)];
    short_of_the_replica(c.multi_lock(both).replica_acks(1, ACK_WAIT).acquire().await);
    let charge = c
        .idempotent(key("op.h.charge", 1))
        .replica_acks(1, ACK_WAIT);
    short_of_the_replica(charge.run(|| async { Ok::<_, CoordError>(1u32) }).await);

    // The provider's setting (off) still rules the operations that do not override it.
    assert_eq!(lock_default(&c, 1, runs.clone()).await.unwrap(), 1);
    let plain = c.lock(key("op.h.plain", 1)).try_acquire().await.unwrap();
    assert!(plain.is_some(), "granted without waiting for the replica");
    replica.resume();
    await_online(&primary);
    assert_eq!(lock_on(&c, 2, runs.clone()).await.unwrap(), 2);
}

/// A renewing lock without replica acknowledgement, held across several renewals while the
/// replica is cut off: its renewals must not wait for the replica either.
#[distributed_lock(key_from = "id", coordinator = c, name = "op.renew_off", lease = "1500ms", renew = true, replica_acks = 0)]
async fn renewing_off(c: &Coordinator, id: u32) -> Result<u32, CoordError> {
    // Two whole leases: the hold stands only if its renewals counted.
    tokio::time::sleep(Duration::from_secs(3)).await;
    Ok(id)
}

/// Provider default on, the operation turns it off: with the replica cut off, every kind of
/// grant, a completion and a hold renewed across two leases succeed, attribute and handle
/// alike, while an operation without the override on the same coordinator fails with
/// `NotReplicated`.
async fn an_operation_turns_off_what_the_provider_asks(client: Client) {
    let (_primary, replica, c) = replicated(client, true, "op-off").await;
    let runs = Arc::new(AtomicUsize::new(0));
    replica.pause();

    assert_eq!(lock_off(&c, 1, runs.clone()).await.unwrap(), 1);
    assert_eq!(permit_off(&c, 1, runs.clone()).await.unwrap(), 1);
    assert_eq!(write_off(&c, 1, runs.clone()).await.unwrap(), 1);
    assert_eq!(many_off(&c, vec![1, 2], runs.clone()).await.unwrap(), 2);
    assert_eq!(charge_off(&c, 1, runs.clone()).await.unwrap(), 10);
    assert_eq!(
        charge_off(&c, 1, runs.clone()).await.unwrap(),
        10,
        "a replay"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 5, "the replay ran nothing");
    assert_eq!(renewing_off(&c, 1).await.unwrap(), 1);

    let key = |op: &str, id: u32| c.key(op).part(&id).finish();
    let guard = c
        .lock(key("op.h.lock", 1))
        .without_replica_acks()
        .acquire()
        .await
        .unwrap();
    assert!(guard.release().await.unwrap());
    let permit = c
        .semaphore(key("op.h.permit", 1), 3)
        .without_replica_acks()
        .acquire()
        .await
        .unwrap();
    assert!(permit.release().await.unwrap());
    c.rw_lock(key("op.h.rw", 1))
        .without_replica_acks()
        .run_read(|| async { Ok::<_, CoordError>(()) })
        .await
        .unwrap();
    let all = c
        .multi_lock([key("op.h.many", 1), key("op.h.many", 2)])
        .without_replica_acks()
        .acquire()
        .await
        .unwrap();
    drop(all);
    // `replica_acks(0, ..)` is the same as turning it off.
    let stored = c
        .idempotent(key("op.h.charge", 1))
        .replica_acks(0, ACK_WAIT)
        .run(|| async { Ok::<_, CoordError>(7u32) })
        .await
        .unwrap();
    assert_eq!(stored, 7);

    // The provider's setting (one replica) still rules the operations that do not override it.
    short_of_the_replica(lock_default(&c, 1, runs.clone()).await);
    short_of_the_replica(charge_default(&c, 1, runs.clone()).await);
    replica.resume();
}

#[distributed_lock(key_from = "id", coordinator = c, name = "op.hold", lease = "3s", renew = true, replica_acks = 1, replica_acks_timeout = "1s")]
async fn long_hold_on(c: &Coordinator, id: u32, entered: Arc<Notify>) -> Result<(), CoordError> {
    enter_and_wait(entered).await
}

/// Provider default off, a renewing lock asks for one replica: once the replica is cut off,
/// its renewals fail and the hold is lost within the lease, as with the provider's setting.
async fn an_operations_renewals_wait_for_its_replicas(client: Client) {
    let (_primary, replica, c) = replicated(client, false, "op-renew").await;
    cut_off_under_a_renewing_hold(
        Duration::ZERO,
        // One lease from the last replicated renewal, with a margin for a loaded machine.
        Duration::from_secs(3) + Duration::from_secs(3),
        &replica,
        move |entered| async move { long_hold_on(&c, 1, entered).await },
    )
    .await;
}

/// An override whose timeout the provider cannot bound (not below its command timeout, 3 s
/// here) is refused with a `Config` error before anything is written.
async fn an_operation_timeout_past_the_command_timeout_is_refused(client: Client) {
    let (_primary, _replica, c) = replicated(client, false, "op-bad").await;
    let err = c
        .lock(c.key("op.bad").part(&1u32).finish())
        .replica_acks(1, Duration::from_secs(5))
        .acquire()
        .await
        .unwrap_err();
    match &err {
        CoordError::Backend(b) => {
            assert_eq!(
                b.kind(),
                coord_core::provider::BackendErrorKind::Config,
                "{err}"
            );
            assert!(b.message().contains("replica_acks"), "{err}");
        }
        other => panic!("expected a Config error, got {other:?}"),
    }
}

/// Provider default off, a cluster flight asks for one replica: with the replica in step it
/// leads and runs; with the replica cut off, the leader's claim fails with `NotReplicated`
/// (0 of 1) within the operation's timeout, the body does not run and the claim is given up,
/// attribute and handle alike, while a flight without the override on the same coordinator
/// runs as before.
async fn a_cluster_flight_asks_for_replicas_the_provider_does_not(client: Client) {
    let (primary, replica, c) = replicated(client, false, "fl-on").await;
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(flight_on(&c, 1, runs.clone()).await.unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    replica.pause();
    refused_within_the_wait(flight_on(&c, 2, runs.clone())).await;
    eventually_absent(&primary, "fl-on:flight:*op.fl_on*2*").await;

    let key = |op: &str, id: u32| c.key(op).part(&id).finish();
    let counted = runs.clone();
    let err = c
        .single_flight(key("op.h.fl_on", 1))
        .cluster()
        .replica_acks(1, ACK_WAIT)
        .run(|| async move {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok::<_, CoordError>(1u32)
        })
        .await
        .unwrap_err();
    assert_eq!(not_replicated(&err), NONE_OF_ONE);
    eventually_absent(&primary, "fl-on:flight:*op.h.fl_on*").await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "no body ran without its claim"
    );

    // The provider's setting (off) still rules the flights that do not override it.
    assert_eq!(flight_default(&c, 2, runs.clone()).await.unwrap(), 2);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    replica.resume();
    await_online(&primary);
    assert_eq!(flight_on(&c, 2, runs.clone()).await.unwrap(), 2);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// The flight of the renewal check below: one key, lease `lease`, not waiting for replicas.
fn long_flight(c: &Coordinator, lease: Duration) -> ClusterFlight<'_> {
    c.single_flight(c.key("op.h.fl_long").part(&1u32).finish())
        .cluster()
        .lease(lease)
        .without_replica_acks()
}

/// Provider default on, a cluster flight turns it off: with the replica cut off it leads and
/// runs, attribute and handle alike (`replica_acks(0, ..)` too), and its renewals do not wait
/// either: a flight held across two leases keeps its claim, so a second instance that arrives
/// meanwhile joins it and gets the leader's outcome rather than running its own. A flight
/// without the override on the same coordinator fails with `NotReplicated`.
async fn a_cluster_flight_turns_off_what_the_provider_asks(client: Client) {
    let (primary, replica, c) = replicated(client, true, "fl-off").await;
    let runs = Arc::new(AtomicUsize::new(0));
    replica.pause();

    assert_eq!(flight_off(&c, 1, runs.clone()).await.unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let key = |op: &str, id: u32| c.key(op).part(&id).finish();
    let off = |id: u32| c.single_flight(key("op.h.fl_off", id)).cluster();
    let answer = |n: u32| move || async move { Ok::<_, CoordError>(n) };
    let led = off(1).without_replica_acks().run(answer(7)).await;
    assert_eq!(led.unwrap(), 7);
    let zero = off(2).replica_acks(0, ACK_WAIT).run(answer(8)).await;
    assert_eq!(
        zero.unwrap(),
        8,
        "`replica_acks(0, ..)` is the same as turning it off"
    );

    // Renewals: the leader's claim (lease 900 ms, renewed every 300 ms) is held while its body
    // runs 3 s; a second instance arriving after two leases must find it and join.
    let other = coordinator(&primary, client, true, "fl-off").await;
    let lease = Duration::from_millis(900);
    let entered = Arc::new(Notify::new());
    let leader = tokio::spawn({
        let (c, entered) = (c.clone(), entered.clone());
        async move {
            let body = || async move {
                entered.notify_one();
                tokio::time::sleep(Duration::from_secs(3)).await;
                Ok::<_, CoordError>(1u32)
            };
            long_flight(&c, lease).run(body).await
        }
    });
    tokio::time::timeout(Duration::from_secs(10), entered.notified())
        .await
        .expect("the leader's body runs");
    tokio::time::sleep(lease * 2).await;
    let joined = long_flight(&other, lease)
        .run(|| async { Ok::<_, CoordError>(2u32) })
        .await
        .unwrap();
    assert_eq!(
        joined, 1,
        "the second instance joined the flight whose claim the renewals kept"
    );
    assert_eq!(leader.await.unwrap().unwrap(), 1);

    // The provider's setting (one replica) still rules the flights that do not override it.
    short_of_the_replica(flight_default(&c, 1, runs.clone()).await);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the control's body did not run"
    );
    replica.resume();
}

per_client!(
    a_cluster_flight_asks_for_replicas_the_provider_does_not,
    a_cluster_flight_turns_off_what_the_provider_asks,
    an_operation_asks_for_replicas_the_provider_does_not,
    an_operation_turns_off_what_the_provider_asks,
    an_operations_renewals_wait_for_its_replicas,
    an_operation_timeout_past_the_command_timeout_is_refused,
);
