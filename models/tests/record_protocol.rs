//! Exhaustive checks of the idempotency-record model, and of its broken variants.

mod support;

use coord_models::record::{
    AT_MOST_ONCE, Net, OK_IS_REPLAYABLE, ONE_ANSWER, OnAbandoned, REACH_NOT_STORED, REACH_OK,
    REACH_RERUN, REACH_UNKNOWN, RERUN_ONLY_BY_LAPSE, RecordAction, RecordBug, RecordModel,
    UNKNOWN_MEANS_STARTED,
};
use support::{assert_broken, assert_holds, check};

fn model(on_abandoned: OnAbandoned, clients: u8, bug: Option<RecordBug>) -> RecordModel {
    RecordModel {
        clients,
        bug,
        ..RecordModel::new(on_abandoned)
    }
}

fn lost(action: &RecordAction) -> bool {
    matches!(action, RecordAction::Send { net, .. } if *net != Net::Delivered)
}

#[test]
fn fail_mode_holds_with_two_clients() {
    assert_holds(
        "record fail 2c",
        model(OnAbandoned::Fail, 2, None),
        &[REACH_OK, REACH_UNKNOWN, REACH_NOT_STORED],
    );
}

#[test]
fn fail_mode_holds_with_three_clients() {
    assert_holds(
        "record fail 3c",
        model(OnAbandoned::Fail, 3, None),
        &[REACH_OK, REACH_UNKNOWN, REACH_NOT_STORED],
    );
}

#[test]
fn rerun_mode_holds_with_three_clients() {
    assert_holds(
        "record rerun 3c",
        model(OnAbandoned::Rerun, 3, None),
        &[REACH_OK, REACH_NOT_STORED, REACH_RERUN],
    );
}

/// Data loss is excused key by key: with two keys, losing one key's record must not excuse
/// anything at the other key, and the properties still hold.
#[test]
fn both_modes_hold_with_two_keys_and_data_loss() {
    for on_abandoned in [OnAbandoned::Fail, OnAbandoned::Rerun] {
        assert_holds(
            &format!("record {on_abandoned:?} 3c 2k data loss"),
            RecordModel {
                keys: 2,
                data_loss: true,
                // Crashes and cancellation are covered by the one-key checks; without them
                // this check stays small enough for a debug build.
                crashes: false,
                cancel_on_lost: false,
                ..model(on_abandoned, 3, None)
            },
            &[REACH_OK],
        );
    }
}

/// Without the data-loss excuse the promise "Ok leaves a replayable record" is false: the
/// excuse in the property is needed, not decoration.
#[test]
fn data_loss_breaks_replayability_when_not_excused() {
    let checker_model = RecordModel {
        data_loss: true,
        ..model(OnAbandoned::Fail, 1, None)
    };
    let actions = assert_broken(
        "record data loss",
        UnexcusedDataLoss(checker_model),
        OK_IS_REPLAYABLE,
    );
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, RecordAction::LoseData { .. }))
    );
}

#[test]
fn claiming_an_abandoned_record_breaks_at_most_once() {
    let actions = assert_broken(
        "record ClaimTakesAbandoned",
        model(OnAbandoned::Fail, 2, Some(RecordBug::ClaimTakesAbandoned)),
        AT_MOST_ONCE,
    );
    assert!(actions.contains(&RecordAction::Tick), "needs a lapse");
}

#[test]
fn running_after_a_lost_claim_breaks_at_most_once() {
    let actions = assert_broken(
        "record RunAfterLostClaim",
        model(OnAbandoned::Fail, 2, Some(RecordBug::RunAfterLostClaim)),
        AT_MOST_ONCE,
    );
    assert!(actions.iter().any(lost));
}

/// The at-least-once mode's excuse is a lapse of a started marker; running after a lost claim
/// makes two bodies without any lapse.
#[test]
fn running_after_a_lost_claim_breaks_rerun_only_by_lapse() {
    let actions = assert_broken(
        "record rerun RunAfterLostClaim",
        model(OnAbandoned::Rerun, 2, Some(RecordBug::RunAfterLostClaim)),
        RERUN_ONLY_BY_LAPSE,
    );
    assert!(actions.iter().any(lost));
}

/// A cancelled body may have had effects: abandoning its lapsed, kept marker lets the next
/// claim run the body again.
#[test]
fn abandoning_after_a_lost_hold_breaks_at_most_once() {
    let actions = assert_broken(
        "record AbandonAfterLostHold",
        model(OnAbandoned::Fail, 2, Some(RecordBug::AbandonAfterLostHold)),
        AT_MOST_ONCE,
    );
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, RecordAction::Cancel { .. }))
    );
}

#[test]
fn ok_without_storing_breaks_replayability() {
    for on_abandoned in [OnAbandoned::Fail, OnAbandoned::Rerun] {
        let actions = assert_broken(
            &format!("record {on_abandoned:?} OkWithoutStoring"),
            model(on_abandoned, 2, Some(RecordBug::OkWithoutStoring)),
            OK_IS_REPLAYABLE,
        );
        assert!(actions.iter().any(lost) || actions.contains(&RecordAction::Tick));
    }
}

#[test]
fn skipping_cleanup_after_a_lost_claim_breaks_unknown_means_started() {
    let actions = assert_broken(
        "record NoCleanupAfterLostClaim",
        model(
            OnAbandoned::Fail,
            2,
            Some(RecordBug::NoCleanupAfterLostClaim),
        ),
        UNKNOWN_MEANS_STARTED,
    );
    assert!(actions.iter().any(lost));
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, RecordAction::StartBody { .. }))
    );
}

/// What the runtime did before the cancellation fix: a call dropped while its claim was in
/// flight, or between the claim's answer and the body's start, left its marker, which then
/// lapsed into an abandoned record under `"fail"` although no body ran.
#[test]
fn keeping_the_marker_of_a_call_dropped_before_its_body_breaks_unknown_means_started() {
    let actions = assert_broken(
        "record KeepMarkerOfUnstartedDrop",
        RecordModel {
            lost_replies: false,
            crashes: false,
            body_errors: false,
            cancel_on_lost: false,
            ..model(
                OnAbandoned::Fail,
                2,
                Some(RecordBug::KeepMarkerOfUnstartedDrop),
            )
        },
        UNKNOWN_MEANS_STARTED,
    );
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, RecordAction::Drop { .. }))
    );
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, RecordAction::StartBody { .. }))
    );
}

/// Under `on_abandoned = "fail"` only one body runs, so the defect cannot show there; the
/// fail-mode run below checks exactly that, and the rerun-mode run finds the counterexample.
#[test]
fn completing_over_another_owner_breaks_one_answer() {
    assert_holds(
        "record fail CompleteIgnoresOwner",
        model(OnAbandoned::Fail, 2, Some(RecordBug::CompleteIgnoresOwner)),
        &[REACH_OK],
    );
    let actions = assert_broken(
        "record rerun CompleteIgnoresOwner",
        model(OnAbandoned::Rerun, 2, Some(RecordBug::CompleteIgnoresOwner)),
        ONE_ANSWER,
    );
    assert!(
        actions.contains(&RecordAction::Tick),
        "needs a lapse to run twice"
    );
}

/// The record model with the data-loss excuse removed from [`OK_IS_REPLAYABLE`].
struct UnexcusedDataLoss(RecordModel);

impl stateright::Model for UnexcusedDataLoss {
    type State = coord_models::record::RecordState;
    type Action = RecordAction;

    fn init_states(&self) -> Vec<Self::State> {
        self.0.init_states()
    }

    fn actions(&self, state: &Self::State, actions: &mut Vec<Self::Action>) {
        self.0.actions(state, actions)
    }

    fn next_state(&self, last: &Self::State, action: Self::Action) -> Option<Self::State> {
        self.0.next_state(last, action)
    }

    fn properties(&self) -> Vec<stateright::Property<Self>> {
        vec![stateright::Property::always(
            OK_IS_REPLAYABLE,
            |_, s: &coord_models::record::RecordState| {
                s.clients.iter().all(|c| {
                    !matches!(
                        c.phase,
                        coord_models::record::Phase::Done(coord_models::record::Outcome::Ok { .. })
                    ) || matches!(s.records[0], coord_models::record::Record::Completed { .. })
                })
            },
        )]
    }
}

/// A claim that runs after its own cleanup (it was delayed in the network, the cleanup was
/// not) leaves a marker nobody will use: it lapses into an abandoned record, and a later
/// caller is told `OutcomeUnknown` for a body that never started. The cleanup protects
/// against lost replies, not against reordering; everything else still holds.
#[test]
fn a_claim_delayed_past_its_cleanup_breaks_only_unknown_means_started() {
    for (on_abandoned, clients) in [(OnAbandoned::Fail, 3), (OnAbandoned::Rerun, 2)] {
        let model = RecordModel {
            delayed_requests: true,
            ..model(on_abandoned, clients, None)
        };
        let broken: &[&str] = match on_abandoned {
            OnAbandoned::Fail => &[UNKNOWN_MEANS_STARTED],
            // Nothing is kept in at-least-once mode, so the late marker just lapses away.
            OnAbandoned::Rerun => &[],
        };
        let label = format!("record {on_abandoned:?} {clients}c delayed");
        let found = check(&label, model, &[REACH_OK, REACH_NOT_STORED], broken);
        if let Some(actions) = found.first() {
            let claim_at = actions.iter().position(|a| {
                matches!(
                    a,
                    RecordAction::Send {
                        net: Net::Delayed,
                        ..
                    }
                )
            });
            let delivered_at = actions
                .iter()
                .position(|a| matches!(a, RecordAction::Deliver { .. }));
            assert!(claim_at < delivered_at, "{actions:?}");
            assert!(
                !actions
                    .iter()
                    .any(|a| matches!(a, RecordAction::StartBody { .. }))
            );
        }
    }
}
