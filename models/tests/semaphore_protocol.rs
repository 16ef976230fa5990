//! Exhaustive checks of the semaphore model, and of its broken variants.

mod support;

use coord_models::semaphore::{
    FENCE_ORDER, LIMIT_ONLY_BY_EXPIRY, Net, REACH_FULL, REACH_OVER_BY_LAPSE, STORE_LIMIT,
    SemAction, SemBug, SemModel,
};
use support::{assert_broken, assert_holds};

#[test]
fn holds_with_three_clients_and_two_permits() {
    assert_holds(
        "semaphore 3c x1 limit 2",
        SemModel::new(),
        &[REACH_FULL, REACH_OVER_BY_LAPSE],
    );
}

#[test]
fn holds_with_two_clients_two_calls_each_and_one_permit() {
    assert_holds(
        "semaphore 2c x2 limit 1",
        SemModel {
            clients: 2,
            sessions: 2,
            limit: 1,
            ..SemModel::new()
        },
        &[REACH_FULL, REACH_OVER_BY_LAPSE],
    );
}

#[test]
fn check_then_add_breaks_the_limit() {
    let model = SemModel {
        clients: 2,
        limit: 1,
        lost_replies: false,
        bug: Some(SemBug::CheckThenAdd),
        ..SemModel::new()
    };
    assert_broken("semaphore CheckThenAdd", model.clone(), STORE_LIMIT);
    let actions = assert_broken("semaphore CheckThenAdd", model, LIMIT_ONLY_BY_EXPIRY);
    assert_eq!(
        actions
            .iter()
            .filter(|a| matches!(a, SemAction::Add { .. }))
            .count(),
        2,
        "two checks before either add: {actions:?}"
    );
}

/// The peers' bug: a permit released after it expired frees someone else's place.
#[test]
fn a_late_release_freeing_another_breaks_the_limit() {
    let actions = assert_broken(
        "semaphore LateReleaseFreesAnother",
        SemModel {
            clients: 2,
            sessions: 2,
            limit: 1,
            bug: Some(SemBug::LateReleaseFreesAnother),
            ..SemModel::new()
        },
        LIMIT_ONLY_BY_EXPIRY,
    );
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, SemAction::Send { net, .. } if *net != Net::Delivered)),
        "the late release is a retry after a lost reply"
    );
}

#[test]
fn minting_from_the_count_breaks_fence_order() {
    assert_broken(
        "semaphore MintFromCount",
        SemModel {
            clients: 2,
            limit: 2,
            bug: Some(SemBug::MintFromCount),
            ..SemModel::new()
        },
        FENCE_ORDER,
    );
}
