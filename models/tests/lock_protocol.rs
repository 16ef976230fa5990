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

mod handover {
    use coord_models::lock_handover::{
        FENCE_ORDER, HandoverAction, HandoverBug, HandoverModel, NO_GONE_HOLDER,
        OVERLAP_ONLY_BY_EXPIRY, REACH_CLAIM_CONFIRMED, REACH_LAPSED_CLAIM_TAKEN,
        REACH_LOCAL_HANDOVER, REACH_ONWARD_RELEASE, REACH_STALE_REFUSED,
    };

    use super::support::{assert_broken, assert_holds};

    const REACHED: &[&str] = &[
        REACH_LOCAL_HANDOVER,
        REACH_CLAIM_CONFIRMED,
        REACH_LAPSED_CLAIM_TAKEN,
        REACH_ONWARD_RELEASE,
        REACH_STALE_REFUSED,
    ];

    fn crashed(actions: &[HandoverAction]) -> bool {
        actions
            .iter()
            .any(|a| matches!(a, HandoverAction::Crash { .. }))
    }

    #[test]
    fn handover_holds_with_three_waiters_two_processes() {
        assert_holds(
            "handover 3w 2p",
            HandoverModel {
                lost_replies: false,
                ..HandoverModel::new()
            },
            &REACHED[..3],
        );
    }

    /// Every waiter in a process of its own: each hand-over is a claim confirmed by a look.
    #[test]
    fn handover_holds_with_every_waiter_remote() {
        assert_holds(
            "handover 3w 3p",
            HandoverModel {
                shared_process: 1,
                lost_replies: false,
                ..HandoverModel::new()
            },
            &[REACH_CLAIM_CONFIRMED, REACH_LAPSED_CLAIM_TAKEN],
        );
    }

    /// Lost requests and replies: a last look unanswered, the withdrawal hands onward.
    #[test]
    fn handover_holds_with_two_remote_waiters_and_lost_replies() {
        assert_holds(
            "handover 2w 2p lost",
            HandoverModel {
                clients: 2,
                shared_process: 1,
                ..HandoverModel::new()
            },
            &[
                REACH_CLAIM_CONFIRMED,
                REACH_ONWARD_RELEASE,
                REACH_STALE_REFUSED,
            ],
        );
    }

    /// A claim with the whole lease lets a crashed waiter keep the lock past the window.
    #[test]
    fn handover_without_claim_window_keeps_the_lock_for_a_crashed_waiter() {
        let actions = assert_broken(
            "handover HandOverWithoutClaimWindow",
            HandoverModel {
                bug: Some(HandoverBug::HandOverWithoutClaimWindow),
                ..HandoverModel::new()
            },
            NO_GONE_HOLDER,
        );
        assert!(crashed(&actions), "the claim is a crashed waiter's");
    }

    /// A withdrawal that only takes the entry out leaves a lock handed over meanwhile with a
    /// waiter that gave up.
    #[test]
    fn give_up_without_onward_release_leaves_the_lock_with_a_gone_waiter() {
        let actions = assert_broken(
            "handover GiveUpWithoutOnwardRelease",
            HandoverModel {
                crash: false,
                bug: Some(HandoverBug::GiveUpWithoutOnwardRelease),
                ..HandoverModel::new()
            },
            NO_GONE_HOLDER,
        );
        assert!(
            actions
                .iter()
                .any(|a| matches!(a, HandoverAction::Withdraw { .. })),
            "the waiter withdrew"
        );
    }

    #[test]
    fn confirming_without_minting_breaks_fence_order() {
        assert_broken(
            "handover ConfirmWithoutMint",
            HandoverModel {
                crash: false,
                bug: Some(HandoverBug::ConfirmWithoutMint),
                ..HandoverModel::new()
            },
            FENCE_ORDER,
        );
    }

    /// The hand-over alone never puts two waiters inside: without ticks no lease lapses, so
    /// the overlap property holds here with no exception, and the check still reaches both
    /// kinds of hand-over.
    #[test]
    fn handover_without_time_never_overlaps() {
        assert_holds(
            "handover 3w 2p no time",
            HandoverModel {
                horizon: 0,
                ..HandoverModel::new()
            },
            &[
                REACH_LOCAL_HANDOVER,
                REACH_CLAIM_CONFIRMED,
                REACH_ONWARD_RELEASE,
            ],
        );
    }

    #[test]
    fn withdrawing_without_owner_check_breaks_mutual_exclusion() {
        let actions = assert_broken(
            "handover WithdrawWithoutOwnerCheck",
            HandoverModel {
                crash: false,
                bug: Some(HandoverBug::WithdrawWithoutOwnerCheck),
                ..HandoverModel::new()
            },
            OVERLAP_ONLY_BY_EXPIRY,
        );
        assert!(
            !actions.contains(&HandoverAction::Tick),
            "no lease lapsed: the withdrawal made the second holder"
        );
    }
}
