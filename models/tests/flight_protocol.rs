//! Exhaustive checks of the cluster flight model, and of its broken variants.

mod support;

use coord_models::flight::{
    ANSWERS_ARE_RUNS, FlightBug, FlightModel, NO_ANSWER_BEFORE_ITS_RUN,
    ONE_RUN_UNLESS_A_LEADER_FAILED, REACH_SHARED, REACH_TAKEOVER,
};
use support::{assert_broken, assert_holds};

#[test]
fn holds_with_three_instances() {
    assert_holds(
        "flight 3i",
        FlightModel::new(),
        &[REACH_TAKEOVER, REACH_SHARED],
    );
}

#[test]
fn holds_with_a_longer_lease_and_hand_over() {
    assert_holds(
        "flight 3i lease 3",
        FlightModel {
            lease: 3,
            hand_over: 2,
            horizon: 5,
            ..FlightModel::new()
        },
        &[REACH_TAKEOVER, REACH_SHARED],
    );
}

#[test]
fn a_claim_without_nx_runs_twice_with_nothing_failed() {
    assert_broken(
        "flight ClaimWithoutNx",
        FlightModel {
            bug: Some(FlightBug::ClaimWithoutNx),
            ..FlightModel::new()
        },
        ONE_RUN_UNLESS_A_LEADER_FAILED,
    );
}

#[test]
fn one_hand_over_name_answers_before_the_leader_finished() {
    assert_broken(
        "flight OneHandOverName",
        FlightModel {
            bug: Some(FlightBug::OneHandOverName),
            ..FlightModel::new()
        },
        NO_ANSWER_BEFORE_ITS_RUN,
    );
}

#[test]
fn a_placeholder_written_at_claim_is_read_as_an_outcome() {
    assert_broken(
        "flight PlaceholderAtClaim",
        FlightModel {
            bug: Some(FlightBug::PlaceholderAtClaim),
            ..FlightModel::new()
        },
        ANSWERS_ARE_RUNS,
    );
}
