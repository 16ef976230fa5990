//! The semaphore protocol behind `#[distributed_lock(permits = n)]`, with a fencing token per
//! permit.
//!
//! # The store
//!
//! One key: a set of permits `(owner, lease ticks left, token)` and the fence counter (the last
//! token minted). Commands are atomic steps, as the providers' scripts are:
//!
//! * `acquire(o)`: drops the permits whose lease ran out; `o`'s own permit (a resent acquire
//!   whose first send landed) is granted again with its token, nothing minted; otherwise, with
//!   fewer than `limit` permits, adds `o`'s with a full lease and token `last + 1`; otherwise
//!   *full*.
//! * `release(o)`: removes `o`'s permit if it holds a live one; changes nothing otherwise.
//! * `renew(o)`: resets the lease of `o`'s live permit; answers whether there was one.
//!
//! Time advances in ticks ([`SemAction::Tick`], up to [`SemModel::horizon`]); a tick takes one
//! tick off every lease and a lease at zero drops its permit. (The fence counter's own expiry
//! and failover are the lock model's: the semaphore mints the same way.)
//!
//! # The client (one call per session)
//!
//! Each client makes up to [`SemModel::sessions`] calls, each with a new owner token: send
//! `acquire` (granted: enter with the token; full: retry or give up; **no reply**: do not
//! enter, release owner-checked in cleanup); inside, renew or leave; then send `release`,
//! retried on a lost reply, or give up (the lease frees the permit). A paused client is one
//! that takes no step while ticks pass.
//!
//! # Properties
//!
//! * [`LIMIT_ONLY_BY_EXPIRY`]: more clients inside than `limit` only in histories where a
//!   permit's lease lapsed while its holder was inside (a ghost flag).
//! * [`STORE_LIMIT`]: the store never holds more than `limit` permits.
//! * [`FENCE_ORDER`]: every newly minted permit token is greater than every token minted
//!   before it.
//!
//! Reachability: [`REACH_FULL`] (`limit` clients inside at once), [`REACH_OVER_BY_LAPSE`]
//! (more than `limit` inside, after a lapse).

use stateright::{Model, Property};

/// Property: more holders inside than permits only after a lease lapsed under a holder.
pub const LIMIT_ONLY_BY_EXPIRY: &str = "more holders than permits only through expiry";
/// Property: the store never holds more permits than the limit.
pub const STORE_LIMIT: &str = "the store holds at most limit permits";
/// Property: minted permit tokens strictly increase.
pub const FENCE_ORDER: &str = "permit tokens strictly increase";
/// Reachability: `limit` clients are inside at once.
pub const REACH_FULL: &str = "every permit held by a client inside";
/// Reachability: more than `limit` clients inside, after a lapse.
pub const REACH_OVER_BY_LAPSE: &str = "more holders than permits after a lapse";

/// A deliberate defect, to show that each property can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SemBug {
    /// `acquire` counts the permits in one step and adds one in another (not atomic). Breaks
    /// [`STORE_LIMIT`] and [`LIMIT_ONLY_BY_EXPIRY`] through two clients checking at once.
    CheckThenAdd,
    /// A release by an owner whose permit is gone frees another permit (a counter semaphore
    /// that gives back what it no longer holds). Breaks [`LIMIT_ONLY_BY_EXPIRY`] through a
    /// release retried after its permit lapsed.
    LateReleaseFreesAnother,
    /// A permit's token is the number of permits held plus one. Breaks [`FENCE_ORDER`].
    MintFromCount,
}

/// The bounds and switches of one semaphore model.
#[derive(Clone, Debug)]
pub struct SemModel {
    /// Number of clients (2-3).
    pub clients: u8,
    /// Calls each client makes, one after another (1-2).
    pub sessions: u8,
    /// Permits (1-2).
    pub limit: u8,
    /// Lease in ticks (at least 1).
    pub lease: u8,
    /// Ticks the clock can advance.
    pub horizon: u8,
    /// Whether commands can lose their reply or not run at all.
    pub lost_replies: bool,
    /// A deliberate defect, or `None` for the protocol as specified.
    pub bug: Option<SemBug>,
}

impl SemModel {
    /// Three clients with one call each, two permits, lease 2, horizon 3, lost replies on.
    pub fn new() -> SemModel {
        SemModel {
            clients: 3,
            sessions: 1,
            limit: 2,
            lease: 2,
            horizon: 3,
            lost_replies: true,
            bug: None,
        }
    }

    fn has(&self, bug: SemBug) -> bool {
        self.bug == Some(bug)
    }

    fn owner(&self, client: u8, session: u8) -> u8 {
        client * self.sessions + session
    }

    fn nets(&self) -> &'static [Net] {
        if self.lost_replies {
            &[Net::Delivered, Net::ReplyLost, Net::RequestLost]
        } else {
            &[Net::Delivered]
        }
    }
}

impl Default for SemModel {
    fn default() -> Self {
        SemModel::new()
    }
}

/// What happened to one command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Net {
    /// It ran and its reply arrived.
    Delivered,
    /// It ran; its reply was lost.
    ReplyLost,
    /// It never ran.
    RequestLost,
}

/// Where a client is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Sending acquire.
    Acquiring,
    /// Saw room and will add its permit in a second step ([`SemBug::CheckThenAdd`] only).
    Checked,
    /// Its acquire got no reply: releasing in cleanup.
    Cleanup,
    /// Inside, with its permit's token.
    Inside(u16),
    /// Left: releasing.
    Releasing,
    /// Between calls, or finished.
    Idle,
}

/// One client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    /// Its current call.
    pub session: u8,
    /// Where it is.
    pub phase: Phase,
    /// Its last request failed or found the semaphore full: it may give up.
    pub retrying: bool,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SemState {
    /// `(owner, lease ticks left, token)`, sorted by owner.
    pub permits: Vec<(u8, u8, u16)>,
    /// The last token minted.
    pub fence: u16,
    /// Ticks passed.
    pub now: u8,
    /// The clients.
    pub clients: Vec<Client>,
    /// Ghost: a permit's lease lapsed while its holder was inside.
    pub lapsed_inside: bool,
    /// Ghost: a minted token was not greater than an earlier one.
    pub fence_broken: bool,
}

/// A step of the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SemAction {
    /// The client sends its phase's command.
    Send {
        /// Which client.
        client: u8,
        /// What became of the command.
        net: Net,
    },
    /// The second step of a non-atomic acquire ([`SemBug::CheckThenAdd`]).
    Add {
        /// Which client.
        client: u8,
    },
    /// The client stops retrying.
    GiveUp {
        /// Which client.
        client: u8,
    },
    /// The client starts its next call.
    Begin {
        /// Which client.
        client: u8,
    },
    /// The holder renews its permit.
    Renew {
        /// Which client.
        client: u8,
    },
    /// The holder leaves the section.
    Leave {
        /// Which client.
        client: u8,
    },
    /// One tick of the store's clock.
    Tick,
}

impl SemModel {
    fn mint(&self, s: &mut SemState) -> u16 {
        let token = if self.has(SemBug::MintFromCount) {
            s.permits.len() as u16 + 1
        } else {
            s.fence + 1
        };
        if token <= s.fence {
            s.fence_broken = true;
        }
        s.fence = s.fence.max(token);
        token
    }

    fn add(&self, s: &mut SemState, owner: u8) -> u16 {
        let token = self.mint(s);
        s.permits.push((owner, self.lease, token));
        s.permits.sort_unstable();
        token
    }

    /// The acquire script: `Some(token)` when `owner` holds a permit after it.
    fn acquire(&self, s: &mut SemState, owner: u8) -> Option<u16> {
        if let Some(p) = s.permits.iter_mut().find(|p| p.0 == owner) {
            p.1 = self.lease;
            return Some(p.2);
        }
        if s.permits.len() < usize::from(self.limit) {
            return Some(self.add(s, owner));
        }
        None
    }

    fn release(&self, s: &mut SemState, owner: u8) {
        let before = s.permits.len();
        s.permits.retain(|p| p.0 != owner);
        if s.permits.len() == before && self.has(SemBug::LateReleaseFreesAnother) {
            s.permits.pop();
        }
    }
}

impl Model for SemModel {
    type State = SemState;
    type Action = SemAction;

    fn init_states(&self) -> Vec<SemState> {
        vec![SemState {
            permits: Vec::new(),
            fence: 0,
            now: 0,
            clients: vec![
                Client {
                    session: 0,
                    phase: Phase::Acquiring,
                    retrying: false,
                };
                usize::from(self.clients)
            ],
            lapsed_inside: false,
            fence_broken: false,
        }]
    }

    fn actions(&self, s: &SemState, actions: &mut Vec<SemAction>) {
        for (i, c) in s.clients.iter().enumerate() {
            let client = i as u8;
            match c.phase {
                Phase::Acquiring | Phase::Cleanup | Phase::Releasing => {
                    for &net in self.nets() {
                        actions.push(SemAction::Send { client, net });
                    }
                    if c.retrying {
                        actions.push(SemAction::GiveUp { client });
                    }
                }
                Phase::Checked => actions.push(SemAction::Add { client }),
                Phase::Inside(_) => {
                    actions.push(SemAction::Renew { client });
                    actions.push(SemAction::Leave { client });
                }
                Phase::Idle => {
                    if c.session + 1 < self.sessions {
                        actions.push(SemAction::Begin { client });
                    }
                }
            }
        }
        if s.now < self.horizon {
            actions.push(SemAction::Tick);
        }
    }

    fn next_state(&self, last: &SemState, action: SemAction) -> Option<SemState> {
        let mut s = last.clone();
        match action {
            SemAction::Send { client, net } => {
                let i = usize::from(client);
                let c = s.clients[i];
                let me = self.owner(client, c.session);
                let runs = net != Net::RequestLost;
                let answered = net == Net::Delivered;
                match c.phase {
                    Phase::Acquiring if self.has(SemBug::CheckThenAdd) => {
                        // Only the count is read here; the add is a later step.
                        if !answered {
                            return None;
                        }
                        let room = s.permits.len() < usize::from(self.limit);
                        let c = &mut s.clients[i];
                        c.retrying = !room;
                        c.phase = if room {
                            Phase::Checked
                        } else {
                            Phase::Acquiring
                        };
                    }
                    Phase::Acquiring => {
                        let granted = if runs { self.acquire(&mut s, me) } else { None };
                        let c = &mut s.clients[i];
                        c.retrying = false;
                        c.phase = match (answered, granted) {
                            (true, Some(token)) => Phase::Inside(token),
                            (true, None) => {
                                c.retrying = true;
                                Phase::Acquiring
                            }
                            (false, _) => Phase::Cleanup,
                        };
                    }
                    Phase::Cleanup | Phase::Releasing => {
                        if runs {
                            self.release(&mut s, me);
                        }
                        let c = &mut s.clients[i];
                        if answered {
                            c.retrying = false;
                            c.phase = Phase::Idle;
                        } else {
                            c.retrying = true;
                        }
                    }
                    Phase::Checked | Phase::Inside(_) | Phase::Idle => return None,
                }
            }
            SemAction::Add { client } => {
                let i = usize::from(client);
                let me = self.owner(client, s.clients[i].session);
                let token = self.add(&mut s, me);
                s.clients[i].phase = Phase::Inside(token);
            }
            SemAction::GiveUp { client } => {
                let c = &mut s.clients[usize::from(client)];
                c.retrying = false;
                c.phase = Phase::Idle;
            }
            SemAction::Begin { client } => {
                let c = &mut s.clients[usize::from(client)];
                c.session += 1;
                c.phase = Phase::Acquiring;
            }
            SemAction::Renew { client } => {
                let i = usize::from(client);
                let me = self.owner(client, s.clients[i].session);
                match s.permits.iter_mut().find(|p| p.0 == me) {
                    Some(p) if p.1 == self.lease => return None,
                    Some(p) => p.1 = self.lease,
                    // The renewal finds the permit gone: the hold is lost, the call ends.
                    None => s.clients[i].phase = Phase::Idle,
                }
            }
            SemAction::Leave { client } => {
                s.clients[usize::from(client)].phase = Phase::Releasing;
            }
            SemAction::Tick => {
                s.now += 1;
                for p in &mut s.permits {
                    p.1 = p.1.saturating_sub(1);
                }
                let sessions = self.sessions;
                let lapsed: Vec<u8> = s.permits.iter().filter(|p| p.1 == 0).map(|p| p.0).collect();
                for owner in lapsed {
                    let (client, session) = (owner / sessions, owner % sessions);
                    let c = s.clients[usize::from(client)];
                    if c.session == session && matches!(c.phase, Phase::Inside(_)) {
                        s.lapsed_inside = true;
                    }
                }
                s.permits.retain(|p| p.1 > 0);
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        fn inside(s: &SemState) -> usize {
            s.clients
                .iter()
                .filter(|c| matches!(c.phase, Phase::Inside(_)))
                .count()
        }
        vec![
            Property::always(LIMIT_ONLY_BY_EXPIRY, |m: &SemModel, s: &SemState| {
                inside(s) <= usize::from(m.limit) || s.lapsed_inside
            }),
            Property::always(STORE_LIMIT, |m: &SemModel, s: &SemState| {
                s.permits.len() <= usize::from(m.limit)
            }),
            Property::always(FENCE_ORDER, |_: &SemModel, s: &SemState| !s.fence_broken),
            Property::sometimes(REACH_FULL, |m: &SemModel, s: &SemState| {
                inside(s) == usize::from(m.limit)
            }),
            Property::sometimes(REACH_OVER_BY_LAPSE, |m: &SemModel, s: &SemState| {
                inside(s) > usize::from(m.limit)
            }),
        ]
    }
}
