//! The cluster flight protocol behind `#[single_flight(scope = "cluster")]`.
//!
//! # The store
//!
//! One key. The claim is either free or held by `(owner, lease)`; next to it, hand-overs
//! `(leader, time to live)`, one per leader that finished. Commands are atomic steps:
//!
//! * `claim(o)` (`SET NX PX`-like): free → held by `o` with a full lease (the caller leads);
//!   held by `o` → its lease restarts (a resend); held by another → *joined*, naming the leader.
//! * `renew(o)`: resets the lease only while `o` holds the claim.
//! * `finish(o, v)`: only while `o` holds the claim: stores the hand-over `(o, v)` for the
//!   hand-over time and frees the claim, in one step; otherwise changes nothing (fenced).
//! * `abandon(o)`: frees the claim only while `o` holds it.
//! * `peek(l)` (what a follower of leader `l` reads after each wake-up): the hand-over of `l`
//!   if kept; else *waiting* while `l` holds the claim; else *vacant*.
//!
//! Time advances in ticks ([`FlightAction::Tick`], up to [`FlightModel::horizon`]); a tick
//! takes one tick off the claim's lease and each hand-over's time to live, and frees what
//! reaches zero.
//!
//! # The instances (one call each; its local followers share whatever it gets)
//!
//! 1. Claim. Led: run the body, then finish (the caller keeps its own outcome whether or not
//!    the finish was taken). Joined: follow the leader.
//! 2. A follower peeks (a wake-up, or its wait of the lease left ending): the leader's
//!    hand-over answers it; *waiting* waits; *vacant* sends it back to step 1 (a takeover).
//! 3. A leader may crash (it takes no step again), be cancelled before its body ends (it
//!    abandons its claim), or renew its lease, or not (renewals failing), while its body runs.
//!
//! # Properties
//!
//! * [`ANSWERS_ARE_RUNS`]: an instance answered with another's outcome got the outcome of a
//!   body that ran, from the leader it followed (never a value nobody computed).
//! * [`ONE_RUN_UNLESS_A_LEADER_FAILED`]: two bodies run only in histories where a leader
//!   crashed, was cancelled, or its lease lapsed while its body ran (ghost flags), or where a
//!   call started after an earlier flight finished (nothing is remembered).
//! * [`NO_ANSWER_BEFORE_ITS_RUN`]: a follower is never answered before its leader finished.
//!
//! Reachability: [`REACH_TAKEOVER`] (an instance leads after following), [`REACH_SHARED`] (an
//! instance answered with another's outcome).

use stateright::{Model, Property};

/// Property: a follower's answer is the outcome of a body that ran, its leader's.
pub const ANSWERS_ARE_RUNS: &str = "followers get the outcome of their leader's run";
/// Property: more than one run only after a leader failed or a flight ended.
pub const ONE_RUN_UNLESS_A_LEADER_FAILED: &str =
    "one run unless a leader failed or the flight ended";
/// Property: no follower answered before its leader finished.
pub const NO_ANSWER_BEFORE_ITS_RUN: &str = "no follower answered before its leader finished";
/// Reachability: an instance takes over after following.
pub const REACH_TAKEOVER: &str = "a follower takes over";
/// Reachability: an instance answered with another's outcome.
pub const REACH_SHARED: &str = "an outcome is shared";

/// A deliberate defect, to show that each property can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlightBug {
    /// `claim` overwrites a live claim (a `SET` without `NX`). Breaks
    /// [`ONE_RUN_UNLESS_A_LEADER_FAILED`].
    ClaimWithoutNx,
    /// Hand-overs are kept under one name for every leader instead of one per leader, and
    /// `finish` is not fenced: a follower can read a late leader's outcome before its own
    /// leader finished. Breaks [`NO_ANSWER_BEFORE_ITS_RUN`].
    OneHandOverName,
    /// The claim writes an empty hand-over for its leader at once (a result key made up
    /// front, filled in later), which followers read as an outcome. Breaks
    /// [`ANSWERS_ARE_RUNS`].
    PlaceholderAtClaim,
}

/// The model's bounds and its optional defect.
#[derive(Clone, Debug)]
pub struct FlightModel {
    /// Instances, one call each.
    pub instances: u8,
    /// The claim's lease, in ticks.
    pub lease: u8,
    /// How long a hand-over is kept, in ticks.
    pub hand_over: u8,
    /// Ticks of clock.
    pub horizon: u8,
    /// A deliberate defect.
    pub bug: Option<FlightBug>,
}

impl FlightModel {
    /// Three instances, a lease of 2 ticks, hand-overs kept 1 tick, 4 ticks of clock.
    pub fn new() -> FlightModel {
        FlightModel {
            instances: 3,
            lease: 2,
            hand_over: 1,
            horizon: 4,
            bug: None,
        }
    }

    fn has(&self, bug: FlightBug) -> bool {
        self.bug == Some(bug)
    }
}

impl Default for FlightModel {
    fn default() -> Self {
        FlightModel::new()
    }
}

/// Where one instance's call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// About to claim.
    Claiming,
    /// Leading, its body running.
    Running,
    /// Leading, its body done, about to finish.
    Finishing,
    /// Following the leader with this index.
    Following(u8),
    /// Answered with the outcome of the run by the instance with this index.
    Answered(u8),
    /// Crashed or cancelled: takes no step again.
    Gone,
}

/// One instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Instance {
    /// Where its call is.
    pub phase: Phase,
    /// Whether its body ran (to its end).
    pub ran: bool,
    /// Whether its finish was taken (its hand-over stored).
    pub handed_over: bool,
    /// Whether it followed someone before (a claim after that is a takeover).
    pub followed: bool,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FlightState {
    /// Ticks passed.
    pub now: u8,
    /// The claim: owner index and lease left.
    pub claim: Option<(u8, u8)>,
    /// Hand-overs: leader index and time to live.
    pub kept: Vec<(u8, u8)>,
    /// The instances.
    pub instances: Vec<Instance>,
    /// Bodies started.
    pub runs: u8,
    /// Ghost: a leader crashed or was cancelled holding the claim, or its lease lapsed while
    /// its body ran.
    pub leader_failed: bool,
    /// Ghost: a flight finished (a later claim starts a new one).
    pub flight_ended: bool,
    /// Ghost: a follower was answered by a leader that had not finished.
    pub early_answer: bool,
    /// Ghost: a follower got a value that is not its leader's run.
    pub wrong_answer: bool,
}

/// One step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlightAction {
    /// An instance claims.
    Claim(u8),
    /// A leader's body ends.
    Run(u8),
    /// A leader renews its lease.
    Renew(u8),
    /// A leader finishes.
    Finish(u8),
    /// A follower reads.
    Peek(u8),
    /// A leader crashes (no clean-up).
    Crash(u8),
    /// A leader's caller is cancelled while its body runs (it abandons its claim).
    Cancel(u8),
    /// The clock advances.
    Tick,
}

impl Model for FlightModel {
    type State = FlightState;
    type Action = FlightAction;

    fn init_states(&self) -> Vec<FlightState> {
        vec![FlightState {
            now: 0,
            claim: None,
            kept: Vec::new(),
            instances: vec![
                Instance {
                    phase: Phase::Claiming,
                    ran: false,
                    handed_over: false,
                    followed: false,
                };
                usize::from(self.instances)
            ],
            runs: 0,
            leader_failed: false,
            flight_ended: false,
            early_answer: false,
            wrong_answer: false,
        }]
    }

    fn actions(&self, s: &FlightState, actions: &mut Vec<FlightAction>) {
        for (i, instance) in s.instances.iter().enumerate() {
            let i = i as u8;
            match instance.phase {
                Phase::Claiming => actions.push(FlightAction::Claim(i)),
                Phase::Running => {
                    actions.push(FlightAction::Run(i));
                    actions.push(FlightAction::Renew(i));
                    actions.push(FlightAction::Crash(i));
                    actions.push(FlightAction::Cancel(i));
                }
                Phase::Finishing => {
                    actions.push(FlightAction::Finish(i));
                    actions.push(FlightAction::Crash(i));
                }
                Phase::Following(_) => actions.push(FlightAction::Peek(i)),
                Phase::Answered(_) | Phase::Gone => {}
            }
        }
        if s.now < self.horizon {
            actions.push(FlightAction::Tick);
        }
    }

    fn next_state(&self, last: &FlightState, action: FlightAction) -> Option<FlightState> {
        let mut s = last.clone();
        let holds = |s: &FlightState, i: u8| matches!(s.claim, Some((owner, _)) if owner == i);
        match action {
            FlightAction::Claim(i) => {
                let me = &mut s.instances[usize::from(i)];
                match s.claim {
                    Some((owner, _)) if owner != i && !self.has(FlightBug::ClaimWithoutNx) => {
                        me.phase = Phase::Following(owner);
                        me.followed = true;
                    }
                    _ => {
                        s.claim = Some((i, self.lease));
                        me.phase = Phase::Running;
                        s.runs += 1;
                        if self.has(FlightBug::PlaceholderAtClaim) {
                            s.kept.retain(|(leader, _)| *leader != i);
                            s.kept.push((i, self.hand_over));
                        }
                    }
                }
            }
            FlightAction::Run(i) => {
                let me = &mut s.instances[usize::from(i)];
                me.ran = true;
                me.phase = Phase::Finishing;
            }
            FlightAction::Renew(i) => {
                if !holds(&s, i) {
                    return None;
                }
                s.claim = Some((i, self.lease));
            }
            FlightAction::Finish(i) => {
                let taken = holds(&s, i) || self.has(FlightBug::OneHandOverName);
                if taken {
                    if holds(&s, i) {
                        s.claim = None;
                    }
                    s.kept.retain(|(leader, _)| *leader != i);
                    s.kept.push((i, self.hand_over));
                    s.flight_ended = true;
                }
                let me = &mut s.instances[usize::from(i)];
                me.handed_over = taken;
                me.phase = Phase::Answered(i);
            }
            FlightAction::Peek(i) => {
                let Phase::Following(leader) = s.instances[usize::from(i)].phase else {
                    return None;
                };
                // With one hand-over name, any kept outcome is read as the leader's.
                let found = s
                    .kept
                    .iter()
                    .map(|(l, _)| *l)
                    .find(|l| *l == leader || self.has(FlightBug::OneHandOverName));
                let next = match found {
                    Some(from) => {
                        let source = s.instances[usize::from(from)];
                        if !source.ran || !source.handed_over {
                            s.wrong_answer = true;
                        }
                        let own = s.instances[usize::from(leader)];
                        if !own.handed_over && from != leader {
                            s.early_answer = true;
                        }
                        Phase::Answered(from)
                    }
                    None if holds(&s, leader) => return None,
                    None => Phase::Claiming,
                };
                s.instances[usize::from(i)].phase = next;
            }
            FlightAction::Crash(i) => {
                if holds(&s, i) {
                    s.leader_failed = true;
                }
                s.instances[usize::from(i)].phase = Phase::Gone;
            }
            FlightAction::Cancel(i) => {
                if holds(&s, i) {
                    s.leader_failed = true;
                    s.claim = None;
                }
                s.instances[usize::from(i)].phase = Phase::Gone;
            }
            FlightAction::Tick => {
                s.now += 1;
                if let Some((owner, lease)) = s.claim {
                    if lease > 1 {
                        s.claim = Some((owner, lease - 1));
                    } else {
                        s.claim = None;
                        if matches!(
                            s.instances[usize::from(owner)].phase,
                            Phase::Running | Phase::Finishing
                        ) {
                            s.leader_failed = true;
                        }
                    }
                }
                for entry in &mut s.kept {
                    entry.1 = entry.1.saturating_sub(1);
                }
                s.kept.retain(|(_, ttl)| *ttl > 0);
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(ANSWERS_ARE_RUNS, |_: &FlightModel, s: &FlightState| {
                !s.wrong_answer
            }),
            Property::always(
                ONE_RUN_UNLESS_A_LEADER_FAILED,
                |_: &FlightModel, s: &FlightState| s.runs <= 1 || s.leader_failed || s.flight_ended,
            ),
            Property::always(
                NO_ANSWER_BEFORE_ITS_RUN,
                |_: &FlightModel, s: &FlightState| !s.early_answer,
            ),
            Property::sometimes(REACH_TAKEOVER, |_: &FlightModel, s: &FlightState| {
                s.instances
                    .iter()
                    .any(|i| i.followed && matches!(i.phase, Phase::Running | Phase::Finishing))
            }),
            Property::sometimes(REACH_SHARED, |_: &FlightModel, s: &FlightState| {
                s.instances.iter().enumerate().any(
                    |(me, i)| matches!(i.phase, Phase::Answered(from) if usize::from(from) != me),
                )
            }),
        ]
    }
}
