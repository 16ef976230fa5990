//! Exhaustive checks of the transactional idempotency model, and of its broken variants.

mod support;

use coord_models::transactional::{
    OK_IS_THE_RECORD, ONE_COMMIT, REACH_OK, REACH_SUPERSEDED, REACH_TWO_BODIES,
    REACH_UNKNOWN_COMMIT, TxAction, TxBug, TxModel, WRITES_IFF_RECORD,
};
use support::{assert_broken, assert_holds};

fn model(clients: u8, bug: Option<TxBug>) -> TxModel {
    TxModel {
        clients,
        bug,
        ..TxModel::new()
    }
}

#[test]
fn the_protocol_holds_with_two_clients() {
    assert_holds(
        "transactional 2c",
        model(2, None),
        &[
            REACH_OK,
            REACH_SUPERSEDED,
            REACH_TWO_BODIES,
            REACH_UNKNOWN_COMMIT,
        ],
    );
}

#[test]
fn the_protocol_holds_with_three_clients() {
    assert_holds(
        "transactional 3c",
        TxModel {
            // Drops are a rollback plus an abandon, both checked with two clients; without
            // them this check stays small enough for a debug build.
            drops: false,
            ..model(3, None)
        },
        &[REACH_OK, REACH_SUPERSEDED, REACH_TWO_BODIES],
    );
}

/// The provider's promise that a failed owner check dooms the transaction is what keeps a
/// careless caller's commit from writing effects without their record.
#[test]
fn a_transaction_that_can_commit_after_a_failed_check_breaks_writes_iff_record() {
    let actions = assert_broken(
        "transactional CommitAfterFailedCheck",
        model(2, Some(TxBug::CommitAfterFailedCheck)),
        WRITES_IFF_RECORD,
    );
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, TxAction::Complete { .. }))
    );
}

#[test]
fn a_completion_without_the_owner_check_breaks_one_commit() {
    assert_broken(
        "transactional CompleteIgnoresOwner",
        model(2, Some(TxBug::CompleteIgnoresOwner)),
        ONE_COMMIT,
    );
}

/// Checking the owner without holding the row until the commit leaves a window in which a
/// lapsed marker is taken over: both runs then commit.
#[test]
fn a_completion_that_does_not_lock_the_row_breaks_one_commit() {
    let actions = assert_broken(
        "transactional NoRowLock",
        model(2, Some(TxBug::NoRowLock)),
        ONE_COMMIT,
    );
    assert!(
        actions.contains(&TxAction::Tick),
        "needs a lapse: {actions:?}"
    );
}

/// The replay answer is checked too: a caller told `Ok` by a replay or its own commit got the
/// committed record's outcome, in every variant that keeps one commit.
#[test]
fn ok_is_the_record_is_not_vacuous() {
    let actions = assert_broken(
        "transactional CompleteIgnoresOwner ok",
        model(2, Some(TxBug::CompleteIgnoresOwner)),
        OK_IS_THE_RECORD,
    );
    assert!(
        actions
            .iter()
            .filter(|a| matches!(a, TxAction::Commit { .. }))
            .count()
            >= 2,
        "{actions:?}"
    );
}
