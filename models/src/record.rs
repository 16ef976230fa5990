//! The idempotency-record protocol behind `#[idempotent]`.
//!
//! # The store
//!
//! One record per key, in one of four states (the model's [`Record`]):
//!
//! * absent;
//! * `InFlight { owner, lease }`: a live in-flight marker with `lease` ticks left;
//! * `Abandoned { owner }`: a marker whose lease ran out without completion, kept because the
//!   claim asked for it (`on_abandoned = "fail"`). Under `on_abandoned = "rerun"` a lapsed
//!   marker disappears instead, so this state never occurs;
//! * `Completed { owner }`: the stored outcome of `owner`'s body.
//!
//! Every store command is one atomic step:
//!
//! | command | absent | own `InFlight` | other's `InFlight` | own `Abandoned` | other's `Abandoned` | own `Completed` | other's `Completed` |
//! |---|---|---|---|---|---|---|---|
//! | `claim(o)` | `InFlight{o}`, *Claimed* | *Claimed* (resend) | *InFlight* | *OutcomeUnknown* | *OutcomeUnknown* | replay | replay |
//! | `complete(o)` | `Completed{o}`, *StoredWithoutMarker* | `Completed{o}`, *Stored* | *Superseded* | `Completed{o}`, *Stored* | *Superseded* | *Stored* (resend) | *Superseded* |
//! | `abandon(o)` | `false` | absent, `true` | `false` | absent, `true` | `false` | `false` | `false` |
//! | `renew(o)` | no-op | lease reset | no-op | no-op | no-op | no-op | no-op |
//!
//! Time advances in ticks ([`RecordAction::Tick`]); each tick takes one tick off every live
//! marker's lease, and a marker at zero lapses (to `Abandoned` or to absent, by mode).
//! Completed records are kept for ever: the model has no retention expiry, so "the record was
//! retired by its retention" never excuses anything here.
//!
//! # The client (one call of an `#[idempotent]` function)
//!
//! Each client makes one call, on key `client % keys`, with its own owner token:
//!
//! 1. **Claim.** *Claimed*: go to 2. *InFlight*: wait and claim again, or give up with
//!    `InFlight`. Replay: return `Ok` with the stored owner's outcome. *OutcomeUnknown*: return
//!    that error. **No reply** (the command may or may not have run): do not run the body; send
//!    an owner-checked `abandon` (cleanup), retried on error; return an error once it is
//!    answered, or give up (the cleanup is then unconfirmed).
//! 2. **Run.** Start the body (it may now have had effects), renew the marker while running
//!    (owner-checked, the answer ignored), finish with `Ok` or `Err`.
//!    With `on_lost = "cancel"` ([`RecordModel::cancel_on_lost`]), a started body can be
//!    cancelled at any point (its renewal found the marker gone, or could not reach the store
//!    for a whole lease): the call returns `LockLost` and sends nothing, leaving the record as
//!    it is, because the body may have had effects ([`RecordBug::AbandonAfterLostHold`] is
//!    the alternative that abandons instead).
//! 3. **Settle.** After `Ok`: `complete`, retried on error. *Stored* or *StoredWithoutMarker*:
//!    return `Ok`. *Superseded*, or giving up after errors: return `OutcomeNotStored`, never
//!    `Ok`. After `Err`: `abandon` (retried on error), then return the body's error.
//!
//! **Dropped** ([`RecordModel::drops`]): the caller can drop the call's future while it claims
//! (the claim sent or not) or before the body started: the runtime's clean-up, armed before the
//! claim can leave the process, sends the owner-checked `abandon` (phase *Cleaning*, retried)
//! under either `on_abandoned`, since no body ran. Dropped after the body started: under
//! `"rerun"` the marker is abandoned; under `"fail"` it is left to lapse. Completion and the
//! abandon after `Err` go on in the background: a drop there changes nothing.
//!
//! # Faults
//!
//! * Lost replies ([`RecordModel::lost_replies`]): any claim, complete or abandon either runs
//!   and loses its reply or does not run at all; the client sees the same error either way.
//! * Delayed requests ([`RecordModel::delayed_requests`], off unless asked for): a command
//!   the client saw fail (timed out) stays in the network and runs at some later moment,
//!   after the client's next commands (at most one such command per client at a time). On
//!   one multiplexed connection this cannot happen, as the server runs a connection's commands
//!   in order; it can when the client gives up on a connection and sends its next command on
//!   a new one.
//! * Crashes ([`RecordModel::crashes`]): a client can stop for good at any point; its marker
//!   lapses by lease. A slow client is a client that takes no step while ticks pass.
//! * Data loss ([`RecordModel::data_loss`]): the store forgets a key's record (a Redis
//!   restart without persistence), once per key.
//!
//! # Properties
//!
//! The names below are the [`stateright::Property`] names.
//!
//! * [`AT_MOST_ONCE`]: with `on_abandoned = "fail"`, at most one body per key has started
//!   and not failed, unless the key's data was lost. (A body that returned `Err` is not
//!   counted: its marker is abandoned on purpose so that a retry runs it again.)
//! * [`OK_IS_REPLAYABLE`]: a caller told `Ok` finds a `Completed` record at its key, unless
//!   the key's data was lost.
//! * [`UNKNOWN_MEANS_STARTED`]: a caller told `OutcomeUnknown` is told so because a body
//!   started at that key, or because a claimed marker lapsed while its unstarted owner was
//!   crashed, stalled, or still trying to clean it up: the excuse is recorded as a ghost flag
//!   when the lapse happens. A client that returns having skipped its cleanup is not excused.
//!   With [`RecordModel::delayed_requests`] this property fails, and the tests expect it to:
//!   a claim delayed in the network can run after its owner's cleanup abandon was answered,
//!   and its marker then lapses into an abandoned record although no body ever started. The
//!   owner-checked cleanup covers lost replies, not reordering across connections.
//! * [`ONE_ANSWER`]: all callers told `Ok` at a key got the outcome of the same body, unless
//!   the key's data was lost.
//! * [`RERUN_ONLY_BY_LAPSE`]: two bodies at one key that started and did not fail are only
//!   possible after a claimed marker lapsed while its owner's body was running or could
//!   still start (a client stalled between its claim and the body's start is the same
//!   window: the check found that case), or after data loss. This is the at-least-once
//!   window of `on_abandoned = "rerun"`; under `"fail"` [`AT_MOST_ONCE`] rules it out.
//!
//! Reachability checks (`sometimes` properties, which the tests expect to be reached, so that
//! the properties above are not vacuous): [`REACH_OK`], [`REACH_UNKNOWN`], [`REACH_NOT_STORED`],
//! [`REACH_RERUN`].

use stateright::{Model, Property};

/// What happens to one request on the wire: the holder models' network, whose
/// [`Net::Delayed`] request runs later as a [`RecordAction::Deliver`] here.
pub use crate::holders::Net;

/// Property: at most one started, non-failed body per key under `on_abandoned = "fail"`.
pub const AT_MOST_ONCE: &str = "at most once under on_abandoned=fail";
/// Property: a caller told `Ok` leaves a `Completed` record at its key.
pub const OK_IS_REPLAYABLE: &str = "ok leaves a replayable record";
/// Property: `OutcomeUnknown` only for a key where a body started (or a marker lapsed under a
/// stalled, crashed or still-cleaning owner).
pub const UNKNOWN_MEANS_STARTED: &str = "outcome unknown only when a body may have started";
/// Property: all callers told `Ok` at a key got the same body's outcome.
pub const ONE_ANSWER: &str = "callers told ok agree on one body";
/// Property: two live bodies at one key only after a running (or about to run) body's marker
/// lapsed.
pub const RERUN_ONLY_BY_LAPSE: &str = "a second body runs only after a claimed marker lapsed";
/// Reachability: some caller is told `Ok`.
pub const REACH_OK: &str = "some caller is told ok";
/// Reachability: some caller is told `OutcomeUnknown`.
pub const REACH_UNKNOWN: &str = "some caller is told outcome unknown";
/// Reachability: some caller is told `OutcomeNotStored`.
pub const REACH_NOT_STORED: &str = "some caller is told outcome not stored";
/// Reachability: two bodies at one key started and neither failed.
pub const REACH_RERUN: &str = "two bodies run at one key";

/// What the store does with a marker whose lease lapsed without completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OnAbandoned {
    /// Keep it as `Abandoned`; later claims answer `OutcomeUnknown` (at most once).
    Fail,
    /// Drop it; the next claim runs the body again (at least once).
    Rerun,
}

/// A deliberate defect, to show that each property can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordBug {
    /// `claim` on an `Abandoned` record hands out a fresh claim. Breaks [`AT_MOST_ONCE`].
    ClaimTakesAbandoned,
    /// A client whose claim got no reply runs the body anyway. Breaks [`AT_MOST_ONCE`].
    RunAfterLostClaim,
    /// A client returns `Ok` whatever its completion found (what the runtime did before
    /// completion reported whether it stored). Breaks [`OK_IS_REPLAYABLE`].
    OkWithoutStoring,
    /// A client whose claim got no reply returns at once, without the owner-checked cleanup.
    /// Breaks [`UNKNOWN_MEANS_STARTED`].
    NoCleanupAfterLostClaim,
    /// A call whose body was cancelled because its hold was lost abandons its marker, as for
    /// a body that returned `Err`. The abandon also removes the owner's lapsed, kept marker, so
    /// the next claim runs the body again although the cancelled one may have had effects.
    /// Breaks [`AT_MOST_ONCE`].
    AbandonAfterLostHold,
    /// A call dropped before its body started leaves its marker (the clean-up armed only once
    /// the claim was answered, and not under `"fail"`). Breaks [`UNKNOWN_MEANS_STARTED`].
    KeepMarkerOfUnstartedDrop,
    /// `complete` overwrites another owner's record. Breaks [`ONE_ANSWER`] under
    /// `on_abandoned = "rerun"` (under `"fail"` only one body ever runs, so there is no
    /// second answer to give).
    CompleteIgnoresOwner,
}

/// The bounds and switches of one record-protocol model.
#[derive(Clone, Debug)]
pub struct RecordModel {
    /// Number of clients, each making one call (keep to 2-3: the state space is exponential).
    pub clients: u8,
    /// Number of keys; client `i` uses key `i % keys`.
    pub keys: u8,
    /// Lease of an in-flight marker, in ticks (at least 1).
    pub lease: u8,
    /// The mode every claim uses.
    pub on_abandoned: OnAbandoned,
    /// Whether commands can lose their reply or not run at all.
    pub lost_replies: bool,
    /// Whether a command the client saw fail can run later, after the client's next commands.
    pub delayed_requests: bool,
    /// Whether clients can crash.
    pub crashes: bool,
    /// Whether the store can forget a key's record (once per key).
    pub data_loss: bool,
    /// Whether bodies can return `Err`.
    pub body_errors: bool,
    /// Whether a started body can be cancelled because its hold was lost
    /// (`on_lost = "cancel"`).
    pub cancel_on_lost: bool,
    /// Whether a caller can drop the call's future before its body finished.
    pub drops: bool,
    /// A deliberate defect, or `None` for the protocol as specified.
    pub bug: Option<RecordBug>,
}

impl RecordModel {
    /// Two clients on one key, lease 2, every fault on except data loss, no defect.
    pub fn new(on_abandoned: OnAbandoned) -> RecordModel {
        RecordModel {
            clients: 2,
            keys: 1,
            lease: 2,
            on_abandoned,
            lost_replies: true,
            delayed_requests: false,
            crashes: true,
            data_loss: false,
            body_errors: true,
            cancel_on_lost: true,
            drops: true,
            bug: None,
        }
    }

    fn key_of(&self, client: usize) -> usize {
        client % usize::from(self.keys.max(1))
    }

    fn has(&self, bug: RecordBug) -> bool {
        self.bug == Some(bug)
    }

    fn nets(&self, client: &Client) -> &'static [Net] {
        match (
            self.lost_replies,
            self.delayed_requests && client.pending.is_none(),
        ) {
            (true, true) => &[
                Net::Delivered,
                Net::ReplyLost,
                Net::RequestLost,
                Net::Delayed,
            ],
            (true, false) => &[Net::Delivered, Net::ReplyLost, Net::RequestLost],
            (false, true) => &[Net::Delivered, Net::Delayed],
            (false, false) => &[Net::Delivered],
        }
    }
}

/// One key's record in the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Record {
    /// No record.
    Absent,
    /// A live in-flight marker.
    InFlight {
        /// The claiming client.
        owner: u8,
        /// Ticks until it lapses.
        lease: u8,
    },
    /// A lapsed marker kept under `on_abandoned = "fail"`.
    Abandoned {
        /// The client that claimed it.
        owner: u8,
    },
    /// A stored outcome.
    Completed {
        /// The client whose body produced it.
        owner: u8,
    },
}

/// How a client's call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// `Ok` with the outcome of `from`'s body (its own, or a replay).
    Ok {
        /// The client whose body produced the value.
        from: u8,
    },
    /// Another caller's marker held the key, and this caller stopped waiting.
    InFlight,
    /// The key holds an abandoned marker.
    OutcomeUnknown,
    /// The body ran and returned `Ok`, but its outcome could not be stored.
    OutcomeNotStored,
    /// The body returned `Err` (its marker was abandoned, or the abandon was given up).
    BodyFailed,
    /// The claim got no reply; the cleanup abandon was answered.
    ClaimFailed,
    /// The claim got no reply, and so did every cleanup abandon before the client gave up.
    CleanupUnconfirmed,
    /// The body was cancelled because the hold was lost (`LockLost`).
    Lost,
    /// The caller dropped the call (its future) and left its marker as it was.
    Dropped,
}

/// Where a client is in its call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// About to send (or resend, after an `InFlight` answer) its claim.
    Claiming,
    /// Its claim got no reply: sending the owner-checked cleanup abandon.
    Cleaning,
    /// Claimed: the body has not finished (see [`Client::started`]).
    Running,
    /// The body returned `Ok`: sending `complete`.
    Completing,
    /// The body returned `Err`: sending `abandon`.
    Abandoning,
    /// Returned to its caller.
    Done(Outcome),
    /// Stopped for good.
    Crashed,
}

/// One client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    /// Where it is.
    pub phase: Phase,
    /// Its last request in this phase failed or was answered `InFlight`: it may give up.
    pub retrying: bool,
    /// Its body started (it may have had effects).
    pub started: bool,
    /// Its body returned `Err`.
    pub body_failed: bool,
    /// A command it saw fail that is still in the network and may yet run.
    pub pending: Option<Command>,
}

/// A store command, as held in the network by [`Net::Delayed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    /// `claim` for the client.
    Claim,
    /// `complete` for the client.
    Complete,
    /// `abandon` for the client.
    Abandon,
}

/// Facts about a key's history that the properties need (ghost state: the protocol never
/// reads it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// The store forgot this key's record.
    pub data_lost: bool,
    /// A marker lapsed while its owner had not started the body and was crashed, stalled, or
    /// still trying to clean it up (or had given up cleaning).
    pub unstarted_lapse: bool,
    /// A marker lapsed while its owner's body had started, or could still start (the owner
    /// was stalled between its claim and the body's start).
    pub running_lapse: bool,
}

/// The whole system: store, clients, ghost facts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RecordState {
    /// One record per key.
    pub records: Vec<Record>,
    /// One entry per client.
    pub clients: Vec<Client>,
    /// One entry per key.
    pub ghosts: Vec<Ghost>,
}

/// One step of the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordAction {
    /// The client sends the command its phase calls for (claim, abandon or complete).
    Send {
        /// Which client.
        client: u8,
        /// What the network does with it.
        net: Net,
    },
    /// The client stops retrying and returns.
    GiveUp {
        /// Which client.
        client: u8,
    },
    /// The body starts.
    StartBody {
        /// Which client.
        client: u8,
    },
    /// The body returns.
    FinishBody {
        /// Which client.
        client: u8,
        /// `Ok` or `Err`.
        ok: bool,
    },
    /// The client's renewal task renews its marker (owner-checked; lost attempts change
    /// nothing and are not modelled).
    Renew {
        /// Which client.
        client: u8,
    },
    /// The client's started body is cancelled because its hold was lost.
    Cancel {
        /// Which client.
        client: u8,
    },
    /// The client's caller drops the call's future.
    Drop {
        /// Which client.
        client: u8,
    },
    /// The client crashes.
    Crash {
        /// Which client.
        client: u8,
    },
    /// A delayed command of the client runs now (its reply goes nowhere).
    Deliver {
        /// Whose command.
        client: u8,
    },
    /// One tick passes.
    Tick,
    /// The store forgets a key's record.
    LoseData {
        /// Which key.
        key: u8,
    },
}

enum ClaimAnswer {
    Claimed,
    InFlight,
    Unknown,
    Replay(u8),
}

impl RecordModel {
    fn claim(&self, rec: &mut Record, owner: u8) -> ClaimAnswer {
        match *rec {
            Record::Absent => {
                *rec = Record::InFlight {
                    owner,
                    lease: self.lease,
                };
                ClaimAnswer::Claimed
            }
            Record::InFlight { owner: o, .. } if o == owner => ClaimAnswer::Claimed,
            Record::InFlight { .. } => ClaimAnswer::InFlight,
            Record::Abandoned { .. } if self.has(RecordBug::ClaimTakesAbandoned) => {
                *rec = Record::InFlight {
                    owner,
                    lease: self.lease,
                };
                ClaimAnswer::Claimed
            }
            Record::Abandoned { .. } => ClaimAnswer::Unknown,
            Record::Completed { owner: o } => ClaimAnswer::Replay(o),
        }
    }

    /// Returns whether the outcome is stored (`Stored` or `StoredWithoutMarker`).
    fn complete(&self, rec: &mut Record, owner: u8) -> bool {
        match *rec {
            Record::Absent => {
                *rec = Record::Completed { owner };
                true
            }
            Record::InFlight { owner: o, .. } | Record::Abandoned { owner: o } if o == owner => {
                *rec = Record::Completed { owner };
                true
            }
            Record::Completed { owner: o } if o == owner => true,
            _ if self.has(RecordBug::CompleteIgnoresOwner) => {
                *rec = Record::Completed { owner };
                true
            }
            _ => false,
        }
    }

    fn abandon(rec: &mut Record, owner: u8) -> bool {
        match *rec {
            Record::InFlight { owner: o, .. } | Record::Abandoned { owner: o } if o == owner => {
                *rec = Record::Absent;
                true
            }
            _ => false,
        }
    }

    /// The client-side result of a `complete` that was answered.
    fn completion_outcome(&self, client: u8, stored: bool) -> Phase {
        if stored || self.has(RecordBug::OkWithoutStoring) {
            Phase::Done(Outcome::Ok { from: client })
        } else {
            Phase::Done(Outcome::OutcomeNotStored)
        }
    }

    fn tick(&self, s: &mut RecordState) {
        for key in 0..s.records.len() {
            if let Record::InFlight { owner, lease } = s.records[key] {
                if lease > 1 {
                    s.records[key] = Record::InFlight {
                        owner,
                        lease: lease - 1,
                    };
                    continue;
                }
                let c = s.clients[usize::from(owner)];
                if c.started || c.phase == Phase::Running {
                    // A client stalled between its claim and the body's start still starts
                    // the body when it wakes: from the store's side that is the same window.
                    s.ghosts[key].running_lapse = true;
                }
                if !c.started
                    && !matches!(
                        c.phase,
                        Phase::Done(Outcome::ClaimFailed | Outcome::Dropped)
                    )
                {
                    // Crashed, stalled before starting, still cleaning up, or gave up
                    // cleaning: the owner never said its claim was settled. Returning
                    // `ClaimFailed`, or leaving a dropped call's marker behind, with the
                    // marker still live are the unexcused cases.
                    s.ghosts[key].unstarted_lapse = true;
                }
                s.records[key] = match self.on_abandoned {
                    OnAbandoned::Fail => Record::Abandoned { owner },
                    OnAbandoned::Rerun => Record::Absent,
                };
            }
        }
    }
}

/// What a client that settled by abandoning returns: the body's error, or (a cancelled body)
/// `LockLost`.
fn abandoned_outcome(c: &Client) -> Outcome {
    if c.body_failed {
        Outcome::BodyFailed
    } else {
        Outcome::Lost
    }
}

fn live_bodies(model: &RecordModel, s: &RecordState, key: usize) -> usize {
    s.clients
        .iter()
        .enumerate()
        .filter(|(i, c)| model.key_of(*i) == key && c.started && !c.body_failed)
        .count()
}

fn any_client(s: &RecordState, mut f: impl FnMut(usize, &Client) -> bool) -> bool {
    s.clients.iter().enumerate().any(|(i, c)| f(i, c))
}

impl Model for RecordModel {
    type State = RecordState;
    type Action = RecordAction;

    fn init_states(&self) -> Vec<RecordState> {
        let keys = usize::from(self.keys.max(1));
        vec![RecordState {
            records: vec![Record::Absent; keys],
            clients: vec![
                Client {
                    phase: Phase::Claiming,
                    retrying: false,
                    started: false,
                    body_failed: false,
                    pending: None,
                };
                usize::from(self.clients)
            ],
            ghosts: vec![Ghost::default(); keys],
        }]
    }

    fn actions(&self, s: &RecordState, actions: &mut Vec<RecordAction>) {
        for (i, c) in s.clients.iter().enumerate() {
            let client = i as u8;
            // The network holds a request whatever became of its sender.
            if c.pending.is_some() {
                actions.push(RecordAction::Deliver { client });
            }
            match c.phase {
                Phase::Claiming | Phase::Cleaning | Phase::Completing | Phase::Abandoning => {
                    for &net in self.nets(c) {
                        actions.push(RecordAction::Send { client, net });
                    }
                    if c.retrying {
                        actions.push(RecordAction::GiveUp { client });
                    }
                }
                Phase::Running => {
                    if c.started {
                        actions.push(RecordAction::FinishBody { client, ok: true });
                        if self.body_errors {
                            actions.push(RecordAction::FinishBody { client, ok: false });
                        }
                        if self.cancel_on_lost {
                            actions.push(RecordAction::Cancel { client });
                        }
                    } else {
                        actions.push(RecordAction::StartBody { client });
                    }
                    let key = self.key_of(i);
                    if matches!(s.records[key], Record::InFlight { owner, lease }
                        if owner == client && lease < self.lease)
                    {
                        actions.push(RecordAction::Renew { client });
                    }
                }
                Phase::Done(_) | Phase::Crashed => continue,
            }
            if self.drops && matches!(c.phase, Phase::Claiming | Phase::Running) {
                actions.push(RecordAction::Drop { client });
            }
            if self.crashes {
                actions.push(RecordAction::Crash { client });
            }
        }
        if s.records
            .iter()
            .any(|r| matches!(r, Record::InFlight { .. }))
        {
            actions.push(RecordAction::Tick);
        }
        if self.data_loss {
            for (key, r) in s.records.iter().enumerate() {
                if *r != Record::Absent && !s.ghosts[key].data_lost {
                    actions.push(RecordAction::LoseData { key: key as u8 });
                }
            }
        }
    }

    fn next_state(&self, last: &RecordState, action: RecordAction) -> Option<RecordState> {
        let mut s = last.clone();
        match action {
            RecordAction::Send { client, net } => {
                let i = usize::from(client);
                let key = self.key_of(i);
                let runs = matches!(net, Net::Delivered | Net::ReplyLost);
                let answered = net == Net::Delivered;
                let c = &mut s.clients[i];
                let rec = &mut s.records[key];
                if net == Net::Delayed {
                    c.pending = match c.phase {
                        Phase::Claiming => Some(Command::Claim),
                        Phase::Completing => Some(Command::Complete),
                        _ => Some(Command::Abandon),
                    };
                }
                match c.phase {
                    Phase::Claiming => {
                        let answer = runs.then(|| self.claim(rec, client));
                        c.retrying = false;
                        c.phase = match (answered, answer) {
                            (true, Some(ClaimAnswer::Claimed)) => Phase::Running,
                            (true, Some(ClaimAnswer::InFlight)) => {
                                c.retrying = true;
                                Phase::Claiming
                            }
                            (true, Some(ClaimAnswer::Unknown)) => {
                                Phase::Done(Outcome::OutcomeUnknown)
                            }
                            (true, Some(ClaimAnswer::Replay(from))) => {
                                Phase::Done(Outcome::Ok { from })
                            }
                            _ if self.has(RecordBug::RunAfterLostClaim) => Phase::Running,
                            _ if self.has(RecordBug::NoCleanupAfterLostClaim) => {
                                Phase::Done(Outcome::ClaimFailed)
                            }
                            _ => Phase::Cleaning,
                        };
                    }
                    Phase::Cleaning | Phase::Abandoning => {
                        if runs {
                            Self::abandon(rec, client);
                        }
                        if answered {
                            c.retrying = false;
                            c.phase = Phase::Done(match c.phase {
                                Phase::Cleaning => Outcome::ClaimFailed,
                                _ => abandoned_outcome(c),
                            });
                        } else {
                            c.retrying = true;
                        }
                    }
                    Phase::Completing => {
                        let stored = runs && self.complete(rec, client);
                        if answered {
                            c.retrying = false;
                            c.phase = self.completion_outcome(client, stored);
                        } else {
                            c.retrying = true;
                        }
                    }
                    Phase::Running | Phase::Done(_) | Phase::Crashed => return None,
                }
            }
            RecordAction::GiveUp { client } => {
                let c = &mut s.clients[usize::from(client)];
                c.retrying = false;
                c.phase = match c.phase {
                    Phase::Claiming => Phase::Done(Outcome::InFlight),
                    Phase::Cleaning => Phase::Done(Outcome::CleanupUnconfirmed),
                    Phase::Abandoning => Phase::Done(abandoned_outcome(c)),
                    Phase::Completing => self.completion_outcome(client, false),
                    _ => return None,
                };
            }
            RecordAction::StartBody { client } => {
                s.clients[usize::from(client)].started = true;
            }
            RecordAction::FinishBody { client, ok } => {
                let c = &mut s.clients[usize::from(client)];
                c.body_failed = !ok;
                c.phase = if ok {
                    Phase::Completing
                } else {
                    Phase::Abandoning
                };
            }
            RecordAction::Renew { client } => {
                let key = self.key_of(usize::from(client));
                match &mut s.records[key] {
                    Record::InFlight { owner, lease } if *owner == client => *lease = self.lease,
                    _ => return None,
                }
            }
            RecordAction::Cancel { client } => {
                let c = &mut s.clients[usize::from(client)];
                c.phase = if self.has(RecordBug::AbandonAfterLostHold) {
                    Phase::Abandoning
                } else {
                    Phase::Done(Outcome::Lost)
                };
            }
            RecordAction::Drop { client } => {
                let c = &mut s.clients[usize::from(client)];
                c.retrying = false;
                c.phase = match (c.phase, c.started) {
                    // Unstarted: nothing ran, so the marker (if the claim landed or lands) is
                    // abandoned under either mode.
                    (Phase::Claiming | Phase::Running, false)
                        if self.has(RecordBug::KeepMarkerOfUnstartedDrop) =>
                    {
                        Phase::Done(Outcome::Dropped)
                    }
                    (Phase::Claiming | Phase::Running, false) => Phase::Cleaning,
                    (Phase::Running, true) => match self.on_abandoned {
                        // Stopped without an outcome, like a body that failed: the marker is
                        // cleared so a retry runs it again (at least once, by design).
                        OnAbandoned::Rerun => {
                            c.body_failed = true;
                            Phase::Abandoning
                        }
                        OnAbandoned::Fail => Phase::Done(Outcome::Dropped),
                    },
                    _ => return None,
                };
            }
            RecordAction::Crash { client } => {
                let c = &mut s.clients[usize::from(client)];
                c.phase = Phase::Crashed;
                c.retrying = false;
            }
            RecordAction::Deliver { client } => {
                let i = usize::from(client);
                let key = self.key_of(i);
                let rec = &mut s.records[key];
                match s.clients[i].pending.take() {
                    Some(Command::Claim) => {
                        self.claim(rec, client);
                    }
                    Some(Command::Complete) => {
                        self.complete(rec, client);
                    }
                    Some(Command::Abandon) => {
                        Self::abandon(rec, client);
                    }
                    None => return None,
                }
            }
            RecordAction::Tick => self.tick(&mut s),
            RecordAction::LoseData { key } => {
                let key = usize::from(key);
                s.records[key] = Record::Absent;
                s.ghosts[key].data_lost = true;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(AT_MOST_ONCE, |m: &RecordModel, s: &RecordState| {
                m.on_abandoned == OnAbandoned::Rerun
                    || (0..s.records.len())
                        .all(|k| s.ghosts[k].data_lost || live_bodies(m, s, k) <= 1)
            }),
            Property::always(OK_IS_REPLAYABLE, |m: &RecordModel, s: &RecordState| {
                !any_client(s, |i, c| {
                    let k = m.key_of(i);
                    matches!(c.phase, Phase::Done(Outcome::Ok { .. }))
                        && !s.ghosts[k].data_lost
                        && !matches!(s.records[k], Record::Completed { .. })
                })
            }),
            Property::always(UNKNOWN_MEANS_STARTED, |m: &RecordModel, s: &RecordState| {
                !any_client(s, |i, c| {
                    let k = m.key_of(i);
                    c.phase == Phase::Done(Outcome::OutcomeUnknown)
                        && !s.ghosts[k].unstarted_lapse
                        && !any_client(s, |j, d| m.key_of(j) == k && d.started)
                })
            }),
            Property::always(ONE_ANSWER, |m: &RecordModel, s: &RecordState| {
                !any_client(s, |i, c| {
                    let Phase::Done(Outcome::Ok { from: a }) = c.phase else {
                        return false;
                    };
                    let k = m.key_of(i);
                    !s.ghosts[k].data_lost
                        && any_client(s, |j, d| {
                            m.key_of(j) == k
                                && matches!(d.phase, Phase::Done(Outcome::Ok { from: b }) if b != a)
                        })
                })
            }),
            Property::always(RERUN_ONLY_BY_LAPSE, |m: &RecordModel, s: &RecordState| {
                (0..s.records.len()).all(|k| {
                    s.ghosts[k].data_lost || s.ghosts[k].running_lapse || live_bodies(m, s, k) <= 1
                })
            }),
            Property::sometimes(REACH_OK, |_: &RecordModel, s: &RecordState| {
                any_client(s, |_, c| matches!(c.phase, Phase::Done(Outcome::Ok { .. })))
            }),
            Property::sometimes(REACH_UNKNOWN, |_: &RecordModel, s: &RecordState| {
                any_client(s, |_, c| c.phase == Phase::Done(Outcome::OutcomeUnknown))
            }),
            Property::sometimes(REACH_NOT_STORED, |_: &RecordModel, s: &RecordState| {
                any_client(s, |_, c| c.phase == Phase::Done(Outcome::OutcomeNotStored))
            }),
            Property::sometimes(REACH_RERUN, |m: &RecordModel, s: &RecordState| {
                (0..s.records.len()).any(|k| live_bodies(m, s, k) >= 2)
            }),
        ]
    }
}
