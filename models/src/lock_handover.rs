//! The waiting side of the lock protocol behind `#[distributed_lock]` on Redis: a waiter's
//! queue entry, the release that hands a contended lock to the first waiter in the same step,
//! the claim window of a waiter of another process, and waiters that crash or give up.
//!
//! [`crate::lock`] models callers that retry; this model is the same key with the queue the
//! Redis provider keeps beside it. It leaves out what [`crate::lock`] already checks (failover,
//! renewals, the clock's share in a token) and keeps the fenced resource.
//!
//! # The store
//!
//! One key: free, or held by `(owner, lease ticks left, token)`, where the token is `None` for
//! a *claim* (handed to a waiter of another process, not yet confirmed), and a *marked* flag
//! ("someone is waiting"); the fence counter (the last token minted); the queue of waiters'
//! entries, in order. Only the first waiter of each process stands in the queue; the model
//! gives every waiter its own entry, which is that case when each process has one waiter at a
//! time, and what the store sees of a process's head otherwise. Commands are atomic steps:
//!
//! * `look(o)` (`LOCK_LOOK`, modes new and keep): free → held by `o` with a full lease and a
//!   token minted (`last + 1`), marked if the queue is not empty, `o`'s entry taken out;
//!   held by `o` already (handed over to it) → the hold confirmed: the lease made whole and a
//!   token minted; held by another → the holder marked and `o`'s entry appended unless it is
//!   there: *held*.
//! * `look(o)` in mode leave (the waiter's last look at its deadline): as above when the lock
//!   is free or `o`'s; held by another → `o`'s entry taken out.
//! * `release(o, entry)` (`RELEASE`): held by `o` unmarked → freed. Held by `o` marked → the
//!   first entry popped and its waiter made the holder in this step, marked if more wait: a
//!   waiter of the releasing process with its full lease and a token minted here (told in
//!   memory, [`HandoverModel`]'s `notice`); a waiter of another process with the claim window
//!   ([`HandoverModel::claim_window`], at most its lease) and no token (told by a message);
//!   an empty queue frees the lock. Not `o`'s → the given entry (a waiter giving up) taken out.
//!
//! Time advances in ticks ([`HandoverAction::Tick`], up to [`HandoverModel::horizon`]); a tick
//! takes one tick off the lease (or the claim) and a lease at zero frees the lock.
//!
//! # The waiters (one `#[distributed_lock]` call each, with a wait)
//!
//! 1. Look. Won: inside, with the token. Held: wait. No reply (request or reply lost): wait,
//!    looking again later (the entry may or may not be in the queue; the next look keeps it
//!    there without adding it twice).
//! 2. Waiting: look again at any moment (woken by a message, or the head's re-check timer,
//!    whichever comes first; a message lost or delayed is a look that comes later, or not
//!    before the window ends, which the model covers by letting ticks pass between any two
//!    steps), or take the in-memory notice of a hand-over by its own process (inside with
//!    the token, no command), or give up: a last look in mode leave; no reply → withdraw.
//! 3. Withdrawing (the `Queued` guard, dropped unsettled): `release(o, entry)`, retried until
//!    it runs: takes the entry out and, if the lock was handed over to `o` meanwhile, hands it
//!    onward.
//! 4. Inside: write to the resource with the token, leave; release, retried on a lost
//!    request, or given up (the lease frees the lock).
//!
//! A process can crash once ([`HandoverModel::crash`]): all its waiters and holders stop
//! taking steps; a claim handed to a crashed waiter is never confirmed and lapses with the
//! window.
//!
//! Not modelled: a look held back in the network to run after the waiter crashed (it would
//! confirm a claim for a crashed waiter: the lock is then held for one lease, as by any
//! holder that crashed); the withdrawal's retry budget (the provider retries it until the
//! waiter's lease, or the window, would have ended; the model retries until it runs);
//! multi-key waiters (a bare process id in the queue, only woken).
//!
//! # Properties
//!
//! * [`FENCE_ORDER`]: of two writes accepted one after the other from different owners, the
//!   later carries the strictly greater token, across plain grants, hand-overs in memory and
//!   confirmed claims.
//! * [`OVERLAP_ONLY_BY_EXPIRY`]: two waiters inside at once only in histories where a lease
//!   lapsed while its holder was inside or had been told in memory (a paused holder): the
//!   hand-over itself never makes two holders.
//! * [`NO_GONE_HOLDER`]: a waiter that gave up never holds the lock once its withdrawal has
//!   run, and a claim handed to a crashed waiter never has more than the claim window left:
//!   nothing can extend it, so the lock is free again within the window (the bounded form of
//!   "a crashed waiter does not hold the lock forever").
//!
//! Reachability: [`REACH_LOCAL_HANDOVER`], [`REACH_CLAIM_CONFIRMED`],
//! [`REACH_LAPSED_CLAIM_TAKEN`], [`REACH_ONWARD_RELEASE`], [`REACH_STALE_REFUSED`].

use stateright::{Model, Property};

pub use crate::holders::Net;

/// Property: tokens accepted from different owners strictly increase.
pub const FENCE_ORDER: &str = "fenced writes from different holders strictly increase";
/// Property: overlapping holders only after a lease lapsed under a holder.
pub const OVERLAP_ONLY_BY_EXPIRY: &str = "two holders overlap only through expiry";
/// Property: a gone waiter holds nothing beyond the claim window.
pub const NO_GONE_HOLDER: &str =
    "a waiter that gave up holds nothing, a crashed waiter's claim outlasts no window";
/// Reachability: a release hands the lock to a waiter of its own process, which enters.
pub const REACH_LOCAL_HANDOVER: &str = "a waiter enters on a hand-over in memory";
/// Reachability: a waiter of another process confirms its claim and enters.
pub const REACH_CLAIM_CONFIRMED: &str = "a waiter enters by confirming its claim";
/// Reachability: a claim lapses unconfirmed and another waiter enters after it.
pub const REACH_LAPSED_CLAIM_TAKEN: &str = "another waiter enters after a claim lapsed";
/// Reachability: a withdrawing waiter releases onward a lock handed to it.
pub const REACH_ONWARD_RELEASE: &str = "a withdrawing waiter hands its lock onward";
/// Reachability: the resource refuses a stale holder's write.
pub const REACH_STALE_REFUSED: &str = "a stale write is refused";

/// A deliberate defect, to show that each property can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HandoverBug {
    /// The release gives a waiter of another process its whole lease instead of the claim
    /// window. Breaks [`NO_GONE_HOLDER`]: a crashed waiter's claim outlasts the window.
    HandOverWithoutClaimWindow,
    /// A waiter's withdrawal only takes its entry out, and does not release a lock handed to
    /// it meanwhile. Breaks [`NO_GONE_HOLDER`]: a waiter that gave up holds the lock.
    GiveUpWithoutOnwardRelease,
    /// The confirming look makes the lease whole but mints no token: the waiter enters with
    /// the token its hand-over left in place, its releaser's. Breaks [`FENCE_ORDER`].
    ConfirmWithoutMint,
    /// A withdrawal releases onward whoever holds the lock (no owner check). Breaks
    /// [`OVERLAP_ONLY_BY_EXPIRY`]: the holder inside and the waiter handed the lock.
    WithdrawWithoutOwnerCheck,
}

/// The bounds and switches of one hand-over model.
#[derive(Clone, Debug)]
pub struct HandoverModel {
    /// Number of waiters (keep to 2-3), one call each.
    pub clients: u8,
    /// How many of them (the first ones) run in one process; each other waiter has its own.
    pub shared_process: u8,
    /// Lease in ticks (at least 1).
    pub lease: u8,
    /// Claim window in ticks (at least 1, at most the lease).
    pub claim_window: u8,
    /// Ticks the clock can advance; after it, leases stop running out.
    pub horizon: u8,
    /// Whether commands can lose their reply or not run at all.
    pub lost_replies: bool,
    /// Whether one process can crash.
    pub crash: bool,
    /// A deliberate defect, or `None` for the protocol as specified.
    pub bug: Option<HandoverBug>,
}

impl HandoverModel {
    /// Three waiters, the first two in one process, lease 2, claim window 1, horizon 2, lost
    /// replies and a crash on, no defect.
    pub fn new() -> HandoverModel {
        HandoverModel {
            clients: 3,
            shared_process: 2,
            lease: 2,
            claim_window: 1,
            horizon: 2,
            lost_replies: true,
            crash: true,
            bug: None,
        }
    }

    fn has(&self, bug: HandoverBug) -> bool {
        self.bug == Some(bug)
    }

    /// The process `client` runs in.
    fn process(&self, client: u8) -> u8 {
        client.saturating_sub(self.shared_process.saturating_sub(1))
    }

    fn nets(&self) -> &'static [Net] {
        if self.lost_replies {
            &[Net::Delivered, Net::ReplyLost, Net::RequestLost]
        } else {
            &[Net::Delivered]
        }
    }
}

impl Default for HandoverModel {
    fn default() -> Self {
        HandoverModel::new()
    }
}

/// The lock's holder as the store keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Hold {
    /// The holder (a waiter's index; each waiter makes one call).
    pub owner: u8,
    /// Lease (or claim) ticks left.
    pub lease: u8,
    /// Its token; `None` for an unconfirmed claim.
    pub token: Option<u16>,
}

/// The store: the lock key, its mark, the fence counter and the queue.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Store {
    /// The holder, if any.
    pub holder: Option<Hold>,
    /// Someone is waiting: the release hands over.
    pub marked: bool,
    /// The last token minted.
    pub fence: u16,
    /// Waiters' entries, first first.
    pub queue: Vec<u8>,
}

/// Where a waiter's call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Its first look not sent yet.
    Start,
    /// Waiting for the lock (its entry in the queue, or about to be).
    Waiting,
    /// Gave up with its last look unanswered: its withdrawal (`release` with the entry) is due.
    Withdrawing,
    /// Inside, with its token.
    Inside(u16),
    /// Left: releasing.
    Releasing,
    /// Gave up, its withdrawal run.
    GaveUp,
    /// Finished its call.
    Done,
    /// Its process crashed; `holding` if it was inside, releasing, or told of a hand-over in
    /// memory (a holder that crashed, not a waiter).
    Crashed {
        /// It held the lock, as far as it knew.
        holding: bool,
    },
}

/// One waiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Waiter {
    /// Where it is.
    pub phase: Phase,
    /// A hand-over by its own process, told in memory: the token.
    pub notice: Option<u16>,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HandoverState {
    /// The clock, in ticks.
    pub now: u8,
    /// The store.
    pub store: Store,
    /// Waiters.
    pub waiters: Vec<Waiter>,
    /// The resource: highest accepted token and its writer.
    pub resource: Option<(u16, u8)>,
    /// Ghost: a process crashed.
    pub crashed: bool,
    /// Ghost: a lease lapsed while its holder was inside (or told in memory).
    pub lapsed_inside: bool,
    /// Ghost: the resource accepted, from a different owner, a token not above the last one.
    pub fence_broken: bool,
    /// Ghost: the resource refused a stale write.
    pub stale_refused: bool,
    /// Ghost: a waiter entered on a notice.
    pub local_entered: bool,
    /// Ghost: a waiter entered by confirming a claim.
    pub claim_confirmed: bool,
    /// Ghost: the waiter whose claim lapsed unconfirmed last.
    pub claim_lapsed: Option<u8>,
    /// Ghost: a waiter entered after a claim lapsed.
    pub lapsed_claim_taken: bool,
    /// Ghost: a withdrawal handed a lock onward.
    pub onward_released: bool,
}

/// One step of the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HandoverAction {
    /// The waiter looks (first look, or woken, or its re-check).
    Look {
        /// Which waiter.
        client: u8,
        /// What the network does with it.
        net: Net,
    },
    /// The waiter takes the in-memory notice of a hand-over and enters.
    TakeNotice {
        /// Which waiter.
        client: u8,
    },
    /// The waiter's deadline: its last look, in mode leave.
    GiveUp {
        /// Which waiter.
        client: u8,
        /// What the network does with it.
        net: Net,
    },
    /// The withdrawal of a waiter that gave up runs (or is lost and retried).
    Withdraw {
        /// Which waiter.
        client: u8,
        /// What the network does with it.
        net: Net,
    },
    /// The holder writes to the resource with its token.
    Write {
        /// Which waiter.
        client: u8,
    },
    /// The holder leaves the section.
    Leave {
        /// Which waiter.
        client: u8,
    },
    /// The leaver sends `release`.
    Release {
        /// Which waiter.
        client: u8,
        /// What the network does with it.
        net: Net,
    },
    /// The leaver stops retrying its release (the lease frees the lock).
    Abandon {
        /// Which waiter.
        client: u8,
    },
    /// A process crashes.
    Crash {
        /// Which process.
        process: u8,
    },
    /// One tick of the store's clock.
    Tick,
}

/// What a look answered.
enum Looked {
    Won(u16),
    Held,
}

impl HandoverModel {
    fn mint(s: &mut HandoverState) -> u16 {
        s.store.fence += 1;
        s.store.fence
    }

    /// `LOCK_LOOK` for `client`; `leave`: the last look, taking the entry out when held.
    fn look(&self, s: &mut HandoverState, client: u8, leave: bool) -> Looked {
        match s.store.holder {
            Some(hold) if hold.owner != client => {
                if leave {
                    s.store.queue.retain(|&e| e != client);
                } else {
                    s.store.marked = true;
                    if !s.store.queue.contains(&client) {
                        s.store.queue.push(client);
                    }
                }
                Looked::Held
            }
            Some(hold) => {
                let token = if self.has(HandoverBug::ConfirmWithoutMint) {
                    hold.token.unwrap_or(s.store.fence)
                } else {
                    Self::mint(s)
                };
                s.store.holder = Some(Hold {
                    owner: client,
                    lease: self.lease,
                    token: Some(token),
                });
                Looked::Won(token)
            }
            None => {
                s.store.queue.retain(|&e| e != client);
                let token = Self::mint(s);
                s.store.marked = !s.store.queue.is_empty();
                s.store.holder = Some(Hold {
                    owner: client,
                    lease: self.lease,
                    token: Some(token),
                });
                Looked::Won(token)
            }
        }
    }

    /// `RELEASE` by `client`, from its process; `withdrawing`: also takes its entry out.
    fn release(&self, s: &mut HandoverState, client: u8, withdrawing: bool) {
        let ours = match s.store.holder {
            Some(h) => {
                h.owner == client
                    || (withdrawing && self.has(HandoverBug::WithdrawWithoutOwnerCheck))
            }
            None => false,
        };
        if withdrawing && self.has(HandoverBug::GiveUpWithoutOnwardRelease) {
            s.store.queue.retain(|&e| e != client);
            return;
        }
        if !ours {
            if withdrawing {
                s.store.queue.retain(|&e| e != client);
            }
            return;
        }
        if withdrawing {
            s.onward_released = true;
        }
        if !s.store.marked || s.store.queue.is_empty() {
            s.store.holder = None;
            s.store.marked = false;
            return;
        }
        let next = s.store.queue.remove(0);
        s.store.marked = !s.store.queue.is_empty();
        if self.process(next) == self.process(client) {
            let token = Self::mint(s);
            s.store.holder = Some(Hold {
                owner: next,
                lease: self.lease,
                token: Some(token),
            });
            s.waiters[usize::from(next)].notice = Some(token);
        } else {
            let lease = if self.has(HandoverBug::HandOverWithoutClaimWindow) {
                self.lease
            } else {
                self.claim_window.min(self.lease)
            };
            s.store.holder = Some(Hold {
                owner: next,
                lease,
                token: None,
            });
        }
    }

    /// `client` enters with `token`.
    fn enter(s: &mut HandoverState, client: u8, token: u16) {
        if s.claim_lapsed.is_some_and(|lapsed| lapsed != client) {
            s.lapsed_claim_taken = true;
        }
        s.waiters[usize::from(client)].phase = Phase::Inside(token);
        s.waiters[usize::from(client)].notice = None;
    }

    /// The holder `client` writes to the resource with its token.
    fn write_resource(s: &mut HandoverState, client: u8) -> Option<()> {
        let Phase::Inside(token) = s.waiters[usize::from(client)].phase else {
            return None;
        };
        match s.resource {
            Some((highest, _)) if token < highest => {
                if s.stale_refused {
                    return None;
                }
                s.stale_refused = true;
            }
            Some((highest, writer)) if highest == token && writer == client => return None,
            Some((highest, writer)) => {
                if writer != client && token <= highest {
                    s.fence_broken = true;
                }
                s.resource = Some((token, client));
            }
            None => s.resource = Some((token, client)),
        }
        Some(())
    }

    /// Whether `waiter` holds the lock as far as it knows (inside, or told in memory).
    fn holds(waiter: &Waiter) -> bool {
        matches!(waiter.phase, Phase::Inside(_)) || waiter.notice.is_some()
    }

    fn gone_holder(&self, s: &HandoverState) -> bool {
        let Some(hold) = s.store.holder else {
            return false;
        };
        match s.waiters[usize::from(hold.owner)].phase {
            Phase::GaveUp => true,
            Phase::Crashed { holding: false } => {
                hold.token.is_none() && hold.lease > self.claim_window
            }
            _ => false,
        }
    }
}

impl Model for HandoverModel {
    type State = HandoverState;
    type Action = HandoverAction;

    fn init_states(&self) -> Vec<HandoverState> {
        vec![HandoverState {
            now: 0,
            store: Store::default(),
            waiters: vec![
                Waiter {
                    phase: Phase::Start,
                    notice: None,
                };
                usize::from(self.clients)
            ],
            resource: None,
            crashed: false,
            lapsed_inside: false,
            fence_broken: false,
            stale_refused: false,
            local_entered: false,
            claim_confirmed: false,
            claim_lapsed: None,
            lapsed_claim_taken: false,
            onward_released: false,
        }]
    }

    fn actions(&self, s: &HandoverState, actions: &mut Vec<HandoverAction>) {
        for (i, waiter) in s.waiters.iter().enumerate() {
            let client = i as u8;
            match waiter.phase {
                Phase::Start => {
                    for &net in self.nets() {
                        actions.push(HandoverAction::Look { client, net });
                    }
                }
                Phase::Waiting => {
                    if waiter.notice.is_some() {
                        actions.push(HandoverAction::TakeNotice { client });
                    }
                    // A resent look by a waiter already granted mints again: the bound
                    // keeps the fence counter (and so the state space) finite.
                    if s.store.fence > 2 * u16::from(self.clients) {
                        continue;
                    }
                    for &net in self.nets() {
                        actions.push(HandoverAction::Look { client, net });
                        actions.push(HandoverAction::GiveUp { client, net });
                    }
                }
                Phase::Withdrawing => {
                    for &net in self.nets() {
                        actions.push(HandoverAction::Withdraw { client, net });
                    }
                }
                Phase::Inside(_) => {
                    actions.push(HandoverAction::Write { client });
                    actions.push(HandoverAction::Leave { client });
                }
                Phase::Releasing => {
                    for &net in self.nets() {
                        actions.push(HandoverAction::Release { client, net });
                    }
                    actions.push(HandoverAction::Abandon { client });
                }
                Phase::GaveUp | Phase::Done | Phase::Crashed { .. } => {}
            }
        }
        if self.crash && !s.crashed {
            let mut processes: Vec<u8> = (0..self.clients).map(|c| self.process(c)).collect();
            processes.dedup();
            for process in processes {
                actions.push(HandoverAction::Crash { process });
            }
        }
        if s.now < self.horizon {
            actions.push(HandoverAction::Tick);
        }
    }

    fn next_state(&self, last: &HandoverState, action: HandoverAction) -> Option<HandoverState> {
        let mut s = last.clone();
        match action {
            HandoverAction::Look { client, net } => {
                let confirming =
                    matches!(s.store.holder, Some(h) if h.owner == client && h.token.is_none());
                let answer = match net {
                    Net::RequestLost | Net::Delayed => None,
                    Net::Delivered | Net::ReplyLost => Some(self.look(&mut s, client, false)),
                };
                match (net, answer) {
                    (Net::Delivered, Some(Looked::Won(token))) => {
                        if confirming {
                            s.claim_confirmed = true;
                        }
                        Self::enter(&mut s, client, token);
                    }
                    _ => s.waiters[usize::from(client)].phase = Phase::Waiting,
                }
            }
            HandoverAction::TakeNotice { client } => {
                let token = s.waiters[usize::from(client)].notice?;
                s.local_entered = true;
                Self::enter(&mut s, client, token);
            }
            HandoverAction::GiveUp { client, net } => {
                let answer = match net {
                    Net::RequestLost | Net::Delayed => None,
                    Net::Delivered | Net::ReplyLost => Some(self.look(&mut s, client, true)),
                };
                let told = s.waiters[usize::from(client)].notice.is_some();
                let me = &mut s.waiters[usize::from(client)];
                match (net, answer) {
                    (Net::Delivered, Some(Looked::Won(token))) => {
                        Self::enter(&mut s, client, token);
                    }
                    (Net::Delivered, Some(Looked::Held)) if !told => {
                        me.phase = Phase::GaveUp;
                    }
                    // Unanswered, or told of a hand-over while looking a last time: the
                    // guard withdraws (and releases onward).
                    _ => {
                        me.phase = Phase::Withdrawing;
                        me.notice = None;
                    }
                }
            }
            HandoverAction::Withdraw { client, net } => {
                if net == Net::RequestLost {
                    return Some(s);
                }
                self.release(&mut s, client, true);
                let me = &mut s.waiters[usize::from(client)];
                me.phase = Phase::GaveUp;
                me.notice = None;
            }
            HandoverAction::Write { client } => Self::write_resource(&mut s, client)?,
            HandoverAction::Leave { client } => {
                s.waiters[usize::from(client)].phase = Phase::Releasing;
            }
            HandoverAction::Release { client, net } => {
                if net == Net::RequestLost {
                    return Some(s);
                }
                self.release(&mut s, client, false);
                s.waiters[usize::from(client)].phase = Phase::Done;
            }
            HandoverAction::Abandon { client } => {
                s.waiters[usize::from(client)].phase = Phase::Done;
            }
            HandoverAction::Crash { process } => {
                s.crashed = true;
                for client in 0..self.clients {
                    if self.process(client) != process {
                        continue;
                    }
                    let me = &mut s.waiters[usize::from(client)];
                    let holding = match me.phase {
                        Phase::GaveUp | Phase::Done | Phase::Crashed { .. } => continue,
                        Phase::Inside(_) | Phase::Releasing => true,
                        _ => me.notice.is_some(),
                    };
                    me.phase = Phase::Crashed { holding };
                    me.notice = None;
                }
            }
            HandoverAction::Tick => {
                s.now += 1;
                if let Some(hold) = s.store.holder {
                    if hold.lease > 1 {
                        s.store.holder = Some(Hold {
                            lease: hold.lease - 1,
                            ..hold
                        });
                    } else {
                        s.store.holder = None;
                        s.store.marked = false;
                        if hold.token.is_none() {
                            s.claim_lapsed = Some(hold.owner);
                        }
                        if Self::holds(&s.waiters[usize::from(hold.owner)]) {
                            s.lapsed_inside = true;
                        }
                    }
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(FENCE_ORDER, |_: &HandoverModel, s: &HandoverState| {
                !s.fence_broken
            }),
            Property::always(
                OVERLAP_ONLY_BY_EXPIRY,
                |_: &HandoverModel, s: &HandoverState| {
                    s.waiters.iter().filter(|w| HandoverModel::holds(w)).count() <= 1
                        || s.lapsed_inside
                },
            ),
            Property::always(NO_GONE_HOLDER, |m: &HandoverModel, s: &HandoverState| {
                !m.gone_holder(s)
            }),
            Property::sometimes(
                REACH_LOCAL_HANDOVER,
                |_: &HandoverModel, s: &HandoverState| s.local_entered,
            ),
            Property::sometimes(
                REACH_CLAIM_CONFIRMED,
                |_: &HandoverModel, s: &HandoverState| s.claim_confirmed,
            ),
            Property::sometimes(
                REACH_LAPSED_CLAIM_TAKEN,
                |_: &HandoverModel, s: &HandoverState| s.lapsed_claim_taken,
            ),
            Property::sometimes(
                REACH_ONWARD_RELEASE,
                |_: &HandoverModel, s: &HandoverState| s.onward_released,
            ),
            Property::sometimes(
                REACH_STALE_REFUSED,
                |_: &HandoverModel, s: &HandoverState| s.stale_refused,
            ),
        ]
    }
}
