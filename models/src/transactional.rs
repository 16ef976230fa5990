//! The transactional idempotency protocol behind `#[idempotent(transaction = "tx")]`: the
//! claim on the store's own connection, the completion written in the caller's transaction,
//! beside the body's own writes.
//!
//! # The database
//!
//! One key. Its committed record is one of (the model's [`TxRecord`]):
//!
//! * absent;
//! * `InFlight { owner, lease }`: a marker, live while `lease > 0`. A marker at zero has
//!   lapsed but stays (as a row stays in a table) until a claim takes the key over or the
//!   reaper removes it; a lapsed transactional marker is never kept as abandoned;
//! * `Completed { owner }`: the committed outcome of `owner`'s body.
//!
//! Beside it: which client's open transaction holds the record's row lock (it wrote its
//! completion there and has not ended), and, per client, whether its body's writes committed
//! (ghost state: what the properties read).
//!
//! Store commands on the store's own connection are one atomic step each, and do not wait for a
//! row lock: a locked row is answered as in flight (the PostgreSQL provider must do the same,
//! or wait for the lock; either keeps the checked behaviour).
//!
//! | command | absent | live `InFlight` | lapsed `InFlight`, unlocked | lapsed `InFlight`, locked | `Completed{o}` |
//! |---|---|---|---|---|---|
//! | `claim(c)` (transactional) | `InFlight{c}`, *Claimed* | *InFlight* | `InFlight{c}`, *Claimed* (taken over) | *InFlight* | replay of `o` |
//! | `abandon(c)` | no-op | absent if `c`'s and unlocked | absent if `c`'s | no-op | no-op |
//! | `renew(c)` | no-op | lease reset if `c`'s | no-op | no-op | no-op |
//!
//! In the caller's transaction:
//!
//! * `complete_in_transaction(c)`: when the row is `InFlight{c}` (live or lapsed) and not
//!   locked by another transaction, lock it and remember the completion (*Written*); else
//!   make the transaction unable to commit (*Superseded* or *MarkerMissing*).
//! * `commit`: a doomed transaction rolls back. Otherwise the body's writes commit, and with
//!   them the completion (the record becomes `Completed{c}`); the lock is released.
//! * `rollback` (or the connection dying with the process): the writes and the completion are
//!   discarded, the lock released; the marker is in flight again, and lapses.
//!
//! # The client (one call)
//!
//! 1. **Claim.** *Claimed*: run. *InFlight*: retry, or give up (`InFlight`). Replay: `Ok`.
//!    (Lost replies of the claim and their owner-checked clean-up are the plain protocol's,
//!    checked in [`record`](crate::record), and left out here.)
//! 2. **Run.** The body writes in the transaction; the marker is renewed while it runs. It
//!    returns `Ok` or `Err`.
//! 3. **Settle.** After `Err`: abandon the marker, roll back (`RolledBack`). After `Ok`:
//!    `complete_in_transaction`; then the caller commits, whatever the answer (a careless
//!    caller commits even after `TransactionRollbackOnly`: the transaction's doom is what
//!    protects the database, not the caller's discipline), or rolls back. A commit whose
//!    reply is lost may or may not have committed (`CommitFailed`).
//!
//! A body stopped because its marker was lost (`renew` with `on_lost = "cancel"`) dooms its
//! transaction as a failed check does; it is not modelled apart.
//!
//! **Dropped** ([`TxModel::drops`]): the call's future dropped before the commit: the
//! transaction is rolled back with it and the run token abandons the marker. **Crashed**
//! ([`TxModel::crashes`]): the transaction rolls back (the database sees the connection die);
//! the marker lapses.
//!
//! # Properties
//!
//! * [`ONE_COMMIT`]: the writes of at most one body commit.
//! * [`WRITES_IFF_RECORD`]: a body's writes committed exactly when the record is that body's
//!   completed outcome: never one without the other.
//! * [`OK_IS_THE_RECORD`]: a caller told `Ok` (its own commit, or a replay) got the committed
//!   record's outcome.
//!
//! Reachability: [`REACH_OK`], [`REACH_SUPERSEDED`] (a completion refused after a takeover),
//! [`REACH_TWO_BODIES`] (a second body ran), [`REACH_UNKNOWN_COMMIT`] (a commit whose reply was
//! lost, that had committed).

use stateright::{Model, Property};

/// Property: the writes of at most one body commit.
pub const ONE_COMMIT: &str = "the writes of at most one body commit";
/// Property: a body's writes are committed exactly when the record is its completed outcome.
pub const WRITES_IFF_RECORD: &str = "writes committed iff the record is theirs";
/// Property: a caller told `Ok` got the committed record's outcome.
pub const OK_IS_THE_RECORD: &str = "ok is the committed record";
/// Reachability: some caller is told `Ok`.
pub const REACH_OK: &str = "some caller is told ok";
/// Reachability: a completion was refused because another caller took the key over.
pub const REACH_SUPERSEDED: &str = "a completion is refused after a takeover";
/// Reachability: two bodies ran.
pub const REACH_TWO_BODIES: &str = "two bodies run";
/// Reachability: a commit whose reply was lost had committed.
pub const REACH_UNKNOWN_COMMIT: &str = "a commit with a lost reply committed";

/// A deliberate defect, to show that each property can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TxBug {
    /// A failed owner check leaves the transaction able to commit (the provider's promise
    /// broken): the careless caller commits the writes without their record. Breaks
    /// [`WRITES_IFF_RECORD`].
    CommitAfterFailedCheck,
    /// The completion writes whatever is at the key (no owner check). Breaks [`ONE_COMMIT`].
    CompleteIgnoresOwner,
    /// The completion's check does not lock the row until the commit (a check, then a write
    /// at commit time): another caller can take a lapsed marker over in between. Breaks
    /// [`ONE_COMMIT`].
    NoRowLock,
}

/// The bounds and switches of one transactional-protocol model.
#[derive(Clone, Debug)]
pub struct TxModel {
    /// Number of clients, each making one call on the one key (keep to 2-3).
    pub clients: u8,
    /// Lease of an in-flight marker, in ticks (at least 1).
    pub lease: u8,
    /// Whether bodies can return `Err`.
    pub body_errors: bool,
    /// Whether a caller can roll back after its completion was written.
    pub rollbacks: bool,
    /// Whether a commit's reply can be lost (it committed or not; the caller cannot tell).
    pub commit_faults: bool,
    /// Whether clients can crash (their transaction rolls back).
    pub crashes: bool,
    /// Whether a call can be dropped before its commit.
    pub drops: bool,
    /// Whether a reaper (or an operator's purge) can remove a lapsed, unlocked marker.
    pub reaper: bool,
    /// A deliberate defect, or `None` for the protocol as specified.
    pub bug: Option<TxBug>,
}

impl TxModel {
    /// Two clients, lease 2, every fault on, no defect.
    pub fn new() -> TxModel {
        TxModel {
            clients: 2,
            lease: 2,
            body_errors: true,
            rollbacks: true,
            commit_faults: true,
            crashes: true,
            drops: true,
            reaper: true,
            bug: None,
        }
    }

    fn has(&self, bug: TxBug) -> bool {
        self.bug == Some(bug)
    }
}

impl Default for TxModel {
    fn default() -> Self {
        TxModel::new()
    }
}

/// The key's committed record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TxRecord {
    /// No record.
    Absent,
    /// A marker; lapsed at `lease == 0`.
    InFlight {
        /// The claiming client.
        owner: u8,
        /// Ticks until it lapses.
        lease: u8,
    },
    /// A committed outcome.
    Completed {
        /// The client whose body produced it.
        owner: u8,
    },
}

/// How a client's call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TxOutcome {
    /// `Ok` with the outcome of `from`'s body (its own committed one, or a replay).
    Ok {
        /// The client whose body produced the value.
        from: u8,
    },
    /// Another caller's marker held the key, and this caller stopped waiting.
    InFlight,
    /// The body failed, or the caller rolled back after the completion was written.
    RolledBack,
    /// The completion was refused (`TransactionRollbackOnly`); the commit, if tried, rolled
    /// back.
    RollbackOnly,
    /// The commit's reply was lost.
    CommitFailed,
    /// The call was dropped before its commit.
    Dropped,
}

/// Where a client is in its call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TxPhase {
    /// About to send (or resend) its claim.
    Claiming,
    /// Claimed: the body has not returned.
    Running,
    /// The body returned `Ok`: writing the completion in the transaction.
    Completing,
    /// The completion was answered: the caller commits or rolls back.
    Committing,
    /// The body returned `Err`: abandoning the marker, then rolling back.
    Abandoning,
    /// Returned to its caller.
    Done(TxOutcome),
    /// Stopped for good.
    Crashed,
}

/// One client and its open transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TxClient {
    /// Where it is.
    pub phase: TxPhase,
    /// Its claim was answered `InFlight`: it may give up.
    pub retrying: bool,
    /// Its body started: its transaction holds the body's writes.
    pub started: bool,
    /// Its completion is written in its transaction.
    pub completion: bool,
    /// Its transaction can no longer commit.
    pub doomed: bool,
    /// Its completion was refused because another owner held the key.
    pub superseded: bool,
    /// Its body's writes are committed (ghost).
    pub committed: bool,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TxState {
    /// The key's committed record.
    pub record: TxRecord,
    /// The client whose open transaction holds the record's row lock.
    pub locked_by: Option<u8>,
    /// One entry per client.
    pub clients: Vec<TxClient>,
}

/// One step of the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TxAction {
    /// The client sends its claim (on the store's own connection).
    Claim {
        /// Which client.
        client: u8,
    },
    /// The client stops waiting for an in-flight duplicate.
    GiveUp {
        /// Which client.
        client: u8,
    },
    /// The body starts writing in the transaction.
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
    /// The renewal task renews the client's live marker.
    Renew {
        /// Which client.
        client: u8,
    },
    /// The completion is written in the client's transaction.
    Complete {
        /// Which client.
        client: u8,
    },
    /// The caller commits.
    Commit {
        /// Which client.
        client: u8,
        /// Whether the reply is lost.
        reply_lost: bool,
        /// With a lost reply: whether the commit ran before the connection died.
        ran: bool,
    },
    /// The caller rolls back after the completion was answered.
    Rollback {
        /// Which client.
        client: u8,
    },
    /// The body failed: the marker is abandoned and the transaction rolled back.
    Abandon {
        /// Which client.
        client: u8,
    },
    /// The call is dropped: the transaction rolls back and the marker is abandoned.
    Drop {
        /// Which client.
        client: u8,
    },
    /// The client crashes: its transaction rolls back, its marker lapses.
    Crash {
        /// Which client.
        client: u8,
    },
    /// The reaper removes a lapsed, unlocked marker.
    Reap,
    /// One tick passes.
    Tick,
}

impl TxState {
    /// Ends `client`'s transaction without committing: its lock is released.
    fn discard(&mut self, client: u8) {
        if self.locked_by == Some(client) {
            self.locked_by = None;
        }
        let c = &mut self.clients[usize::from(client)];
        c.completion = false;
    }

    /// The owner-checked abandon on the store's own connection (a locked row is not touched:
    /// it is another transaction's business until it ends).
    fn abandon(&mut self, client: u8) {
        if matches!(self.record, TxRecord::InFlight { owner, .. } if owner == client)
            && self.locked_by.is_none()
        {
            self.record = TxRecord::Absent;
        }
    }
}

impl Model for TxModel {
    type State = TxState;
    type Action = TxAction;

    fn init_states(&self) -> Vec<TxState> {
        vec![TxState {
            record: TxRecord::Absent,
            locked_by: None,
            clients: vec![
                TxClient {
                    phase: TxPhase::Claiming,
                    retrying: false,
                    started: false,
                    completion: false,
                    doomed: false,
                    superseded: false,
                    committed: false,
                };
                usize::from(self.clients)
            ],
        }]
    }

    fn actions(&self, s: &TxState, actions: &mut Vec<TxAction>) {
        for (i, c) in s.clients.iter().enumerate() {
            let client = i as u8;
            match c.phase {
                TxPhase::Claiming => {
                    actions.push(TxAction::Claim { client });
                    if c.retrying {
                        actions.push(TxAction::GiveUp { client });
                    }
                }
                TxPhase::Running => {
                    if c.started {
                        actions.push(TxAction::FinishBody { client, ok: true });
                        if self.body_errors {
                            actions.push(TxAction::FinishBody { client, ok: false });
                        }
                    } else {
                        actions.push(TxAction::StartBody { client });
                    }
                    if matches!(s.record, TxRecord::InFlight { owner, lease }
                        if owner == client && lease > 0 && lease < self.lease)
                    {
                        actions.push(TxAction::Renew { client });
                    }
                }
                TxPhase::Completing => actions.push(TxAction::Complete { client }),
                TxPhase::Committing => {
                    actions.push(TxAction::Commit {
                        client,
                        reply_lost: false,
                        ran: true,
                    });
                    if self.commit_faults {
                        for ran in [true, false] {
                            actions.push(TxAction::Commit {
                                client,
                                reply_lost: true,
                                ran,
                            });
                        }
                    }
                    if self.rollbacks {
                        actions.push(TxAction::Rollback { client });
                    }
                }
                TxPhase::Abandoning => actions.push(TxAction::Abandon { client }),
                TxPhase::Done(_) | TxPhase::Crashed => continue,
            }
            if self.drops
                && matches!(
                    c.phase,
                    TxPhase::Running | TxPhase::Completing | TxPhase::Committing
                )
            {
                actions.push(TxAction::Drop { client });
            }
            if self.crashes {
                actions.push(TxAction::Crash { client });
            }
        }
        if matches!(s.record, TxRecord::InFlight { lease, .. } if lease > 0) {
            actions.push(TxAction::Tick);
        }
        if self.reaper
            && s.locked_by.is_none()
            && matches!(s.record, TxRecord::InFlight { lease: 0, .. })
        {
            actions.push(TxAction::Reap);
        }
    }

    fn next_state(&self, last: &TxState, action: TxAction) -> Option<TxState> {
        let mut s = last.clone();
        match action {
            TxAction::Claim { client } => {
                let i = usize::from(client);
                let takeover_blocked = s.locked_by.is_some() && !self.has(TxBug::NoRowLock);
                match s.record {
                    TxRecord::Absent => {
                        s.record = TxRecord::InFlight {
                            owner: client,
                            lease: self.lease,
                        };
                        s.clients[i].phase = TxPhase::Running;
                    }
                    TxRecord::InFlight { lease: 0, .. } if !takeover_blocked => {
                        s.record = TxRecord::InFlight {
                            owner: client,
                            lease: self.lease,
                        };
                        s.clients[i].phase = TxPhase::Running;
                    }
                    TxRecord::InFlight { .. } => s.clients[i].retrying = true,
                    TxRecord::Completed { owner } => {
                        s.clients[i].phase = TxPhase::Done(TxOutcome::Ok { from: owner });
                    }
                }
            }
            TxAction::GiveUp { client } => {
                s.clients[usize::from(client)].phase = TxPhase::Done(TxOutcome::InFlight);
            }
            TxAction::StartBody { client } => s.clients[usize::from(client)].started = true,
            TxAction::FinishBody { client, ok } => {
                s.clients[usize::from(client)].phase = if ok {
                    TxPhase::Completing
                } else {
                    TxPhase::Abandoning
                };
            }
            TxAction::Renew { client } => {
                s.record = TxRecord::InFlight {
                    owner: client,
                    lease: self.lease,
                };
            }
            TxAction::Complete { client } => {
                let i = usize::from(client);
                let ours = matches!(s.record, TxRecord::InFlight { owner, .. } if owner == client);
                let free = match s.locked_by {
                    None => true,
                    Some(holder) => holder == client || self.has(TxBug::NoRowLock),
                };
                if free && (ours || self.has(TxBug::CompleteIgnoresOwner)) {
                    s.clients[i].completion = true;
                    if !self.has(TxBug::NoRowLock) {
                        s.locked_by = Some(client);
                    }
                } else {
                    s.clients[i].superseded = !matches!(s.record, TxRecord::Absent);
                    s.clients[i].doomed = !self.has(TxBug::CommitAfterFailedCheck);
                }
                s.clients[i].phase = TxPhase::Committing;
            }
            TxAction::Commit {
                client,
                reply_lost,
                ran,
            } => {
                let i = usize::from(client);
                let c = s.clients[i];
                let commits = ran && !c.doomed;
                if commits {
                    s.clients[i].committed = c.started;
                    if c.completion {
                        s.record = TxRecord::Completed { owner: client };
                    }
                }
                s.discard(client);
                s.clients[i].phase = TxPhase::Done(if reply_lost {
                    TxOutcome::CommitFailed
                } else if c.doomed || c.superseded || !c.completion {
                    TxOutcome::RollbackOnly
                } else {
                    TxOutcome::Ok { from: client }
                });
            }
            TxAction::Rollback { client } => {
                s.discard(client);
                s.clients[usize::from(client)].phase = TxPhase::Done(TxOutcome::RolledBack);
            }
            TxAction::Abandon { client } => {
                s.abandon(client);
                s.discard(client);
                s.clients[usize::from(client)].phase = TxPhase::Done(TxOutcome::RolledBack);
            }
            TxAction::Drop { client } => {
                s.discard(client);
                s.abandon(client);
                s.clients[usize::from(client)].phase = TxPhase::Done(TxOutcome::Dropped);
            }
            TxAction::Crash { client } => {
                s.discard(client);
                s.clients[usize::from(client)].phase = TxPhase::Crashed;
            }
            TxAction::Reap => s.record = TxRecord::Absent,
            TxAction::Tick => {
                if let TxRecord::InFlight { owner, lease } = s.record {
                    s.record = TxRecord::InFlight {
                        owner,
                        lease: lease.saturating_sub(1),
                    };
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(ONE_COMMIT, |_: &TxModel, s: &TxState| {
                s.clients.iter().filter(|c| c.committed).count() <= 1
            }),
            Property::always(WRITES_IFF_RECORD, |_: &TxModel, s: &TxState| {
                s.clients.iter().enumerate().all(|(i, c)| {
                    c.committed == (s.record == TxRecord::Completed { owner: i as u8 })
                })
            }),
            Property::always(OK_IS_THE_RECORD, |_: &TxModel, s: &TxState| {
                s.clients.iter().all(|c| match c.phase {
                    TxPhase::Done(TxOutcome::Ok { from }) => {
                        s.record == TxRecord::Completed { owner: from }
                    }
                    _ => true,
                })
            }),
            Property::sometimes(REACH_OK, |_: &TxModel, s: &TxState| {
                s.clients
                    .iter()
                    .any(|c| matches!(c.phase, TxPhase::Done(TxOutcome::Ok { .. })))
            }),
            Property::sometimes(REACH_SUPERSEDED, |_: &TxModel, s: &TxState| {
                s.clients.iter().any(|c| c.superseded)
            }),
            Property::sometimes(REACH_TWO_BODIES, |_: &TxModel, s: &TxState| {
                s.clients.iter().filter(|c| c.started).count() >= 2
            }),
            Property::sometimes(REACH_UNKNOWN_COMMIT, |_: &TxModel, s: &TxState| {
                s.clients
                    .iter()
                    .any(|c| c.committed && c.phase == TxPhase::Done(TxOutcome::CommitFailed))
            }),
        ]
    }
}
