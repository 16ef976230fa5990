//! Exhaustive checks of the lock model, and of its broken variants.

mod support;

use coord_models::lock::{
    FENCE_ORDER, LockAction, LockBug, LockModel, Net, OVERLAP_ONLY_BY_EXPIRY, REACH_OVERLAP,
    REACH_STALE_REFUSED,
};
use support::{assert_broken, assert_holds};

fn lost(action: &LockAction) -> bool {
    matches!(action, LockAction::Send { net, .. } if *net != Net::Delivered)
}

#[test]
fn holds_with_two_clients_two_calls_each() {
    assert_holds(
        "lock 2c x2",
        LockModel::new(),
        &[REACH_OVERLAP, REACH_STALE_REFUSED],
    );
}

#[test]
fn holds_with_three_clients() {
    assert_holds(
        "lock 3c x1",
        LockModel {
            clients: 3,
            sessions: 1,
            ..LockModel::new()
        },
        &[REACH_OVERLAP, REACH_STALE_REFUSED],
    );
}

/// Without failover, an overlap needs a lease to lapse under a paused holder.
#[test]
fn overlap_without_failover_needs_a_lapse() {
    let model = LockModel {
        failover: false,
        ..LockModel::new()
    };
    assert_holds("lock 2c x2 no failover", model, &[REACH_OVERLAP]);
}

#[test]
fn release_without_owner_check_breaks_mutual_exclusion() {
    let actions = assert_broken(
        "lock ReleaseWithoutOwnerCheck",
        LockModel {
            failover: false,
            bug: Some(LockBug::ReleaseWithoutOwnerCheck),
            ..LockModel::new()
        },
        OVERLAP_ONLY_BY_EXPIRY,
    );
    assert!(
        actions.iter().any(lost),
        "the foreign release is a cleanup or retry after a lost reply"
    );
}

#[test]
fn entering_after_a_lost_acquire_breaks_mutual_exclusion() {
    let actions = assert_broken(
        "lock EnterAfterLostAcquire",
        LockModel {
            failover: false,
            bug: Some(LockBug::EnterAfterLostAcquire),
            ..LockModel::new()
        },
        OVERLAP_ONLY_BY_EXPIRY,
    );
    assert!(actions.iter().any(lost));
}

#[test]
fn minting_from_the_clock_alone_breaks_fence_order() {
    assert_broken(
        "lock MintFromClockOnly",
        LockModel {
            failover: false,
            bug: Some(LockBug::MintFromClockOnly),
            ..LockModel::new()
        },
        FENCE_ORDER,
    );
}

/// The fence survives failover only because the clock moves past the lost token: a failover
/// within one clock unit hands the same token to two holders.
#[test]
fn failover_within_one_clock_unit_breaks_fence_order() {
    let actions = assert_broken(
        "lock FailoverWithoutClockAdvance",
        LockModel {
            bug: Some(LockBug::FailoverWithoutClockAdvance),
            ..LockModel::new()
        },
        FENCE_ORDER,
    );
    assert!(actions.contains(&LockAction::Failover));
}

/// A stale acquire that runs after its own cleanup takes the lock for an owner that has
/// given up: that costs others a lease of waiting, never exclusivity or fence order.
#[test]
fn delayed_requests_keep_both_properties() {
    assert_holds(
        "lock 2c x2 delayed",
        LockModel {
            delayed_requests: true,
            failover: false,
            ..LockModel::new()
        },
        &[REACH_OVERLAP, REACH_STALE_REFUSED],
    );
}
