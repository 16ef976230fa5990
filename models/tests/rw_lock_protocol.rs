//! Exhaustive checks of the read-write lock model, and of its broken variants.

mod support;

use coord_models::rw_lock::{
    EXCLUSION_ONLY_BY_EXPIRY, FENCE_ORDER, REACH_CLAIM, REACH_SHARED, REACH_WRITER, RwAction,
    RwBug, RwModel, STORE_EXCLUSION, WRITER_PREFERENCE,
};
use coord_models::semaphore::Net;
use support::{assert_broken, assert_holds};

#[test]
fn holds_with_one_writer_and_two_readers() {
    assert_holds(
        "rw 1w 2r x1",
        RwModel::new(),
        &[REACH_SHARED, REACH_WRITER, REACH_CLAIM],
    );
}

#[test]
fn holds_with_two_writers_and_one_reader() {
    assert_holds(
        "rw 2w 1r x1",
        RwModel {
            writers: 2,
            ..RwModel::new()
        },
        &[REACH_WRITER, REACH_CLAIM],
    );
}

#[test]
fn holds_with_two_clients_two_calls_each() {
    assert_holds(
        "rw 1w 1r x2",
        RwModel {
            clients: 2,
            sessions: 2,
            ..RwModel::new()
        },
        &[REACH_WRITER, REACH_CLAIM],
    );
}

/// The peers' bug: a read release deleting a write hold.
#[test]
fn a_read_release_deleting_a_write_hold_breaks_exclusion() {
    let model = RwModel {
        bug: Some(RwBug::ReadReleaseDeletesWrite),
        ..RwModel::new()
    };
    let actions = assert_broken(
        "rw ReadReleaseDeletesWrite",
        model,
        EXCLUSION_ONLY_BY_EXPIRY,
    );
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, RwAction::Send { net, .. } if *net != Net::Delivered)),
        "the harmful read release is a retry after a lost reply: {actions:?}"
    );
}

#[test]
fn a_writer_ignoring_readers_breaks_store_exclusion() {
    assert_broken(
        "rw WriterIgnoresReaders",
        RwModel {
            lost_replies: false,
            bug: Some(RwBug::WriterIgnoresReaders),
            ..RwModel::new()
        },
        STORE_EXCLUSION,
    );
}

#[test]
fn a_counter_per_mode_breaks_fence_order() {
    assert_broken(
        "rw CounterPerMode",
        RwModel {
            lost_replies: false,
            bug: Some(RwBug::CounterPerMode),
            ..RwModel::new()
        },
        FENCE_ORDER,
    );
}

#[test]
fn a_reader_ignoring_the_claim_breaks_writer_preference() {
    assert_broken(
        "rw ReaderIgnoresClaim",
        RwModel {
            lost_replies: false,
            bug: Some(RwBug::ReaderIgnoresClaim),
            ..RwModel::new()
        },
        WRITER_PREFERENCE,
    );
}
