//! The read-write lock protocol behind `#[distributed_lock(mode = "read" | "write")]`, with
//! one fencing counter per key shared by both modes and writer preference by a waiting
//! writer's claim.
//!
//! # The store
//!
//! One key: a set of read holds `(owner, lease ticks left, token)`, at most one write hold of
//! the same shape, at most one waiting writer's claim `(owner, claim ticks left)`, and the
//! fence counter. Commands are atomic steps, as the providers' scripts are; each first drops
//! the holds and claim that ran out (ticks do that here):
//!
//! * `acquire(o, read)`: `o`'s own read hold (a resent acquire) is granted again with its
//!   token; otherwise, with no write hold and no claim, adds `o`'s read hold with token
//!   `last + 1`; otherwise *refused*.
//! * `acquire(o, write)`: `o`'s own write hold is granted again; otherwise, with no holds at
//!   all and no claim but `o`'s, adds `o`'s write hold with token `last + 1` and removes the
//!   claim; otherwise *refused*, and, when no other writer's claim exists, `o`'s claim is set
//!   to a full claim.
//! * `release(o, mode)`: removes `o`'s hold of that mode if it has one (and, for a writer, its
//!   claim); changes nothing else.
//!
//! Time advances in ticks ([`RwAction::Tick`], up to [`RwModel::horizon`]); a tick takes one
//! tick off every lease and claim, and one at zero is dropped.
//!
//! # The client (one call per session)
//!
//! Clients `0..writers` write, the others read. Each call has a new owner token: send
//! `acquire` (granted: enter with the token; refused: retry or give up, a writer's claim left
//! behind as a crashed waiting writer's would be; **no reply**: do not enter, release in
//! cleanup); inside, renew or leave; then send `release`, retried on a lost reply, or give up.
//!
//! # Properties
//!
//! * [`EXCLUSION_ONLY_BY_EXPIRY`]: a writer inside together with anyone else only in histories
//!   where a lease lapsed while its holder was inside (a ghost flag).
//! * [`STORE_EXCLUSION`]: the store never holds a write hold beside another hold.
//! * [`FENCE_ORDER`]: every minted token, read or write, is greater than every earlier one.
//! * [`WRITER_PREFERENCE`]: no read hold is granted while another writer's claim is live.
//!
//! Reachability: [`REACH_SHARED`] (two readers inside at once), [`REACH_WRITER`] (a writer
//! inside), [`REACH_CLAIM`] (a reader refused because of a claim).

use stateright::{Model, Property};

use crate::semaphore::Net;

/// Property: a writer shares the key only after a lease lapsed under a holder.
pub const EXCLUSION_ONLY_BY_EXPIRY: &str = "a writer is alone, except through expiry";
/// Property: the store never keeps a write hold beside another hold.
pub const STORE_EXCLUSION: &str = "the store holds a write hold alone";
/// Property: minted tokens strictly increase across both modes.
pub const FENCE_ORDER: &str = "tokens strictly increase across modes";
/// Property: no reader is let in while another writer's claim is live.
pub const WRITER_PREFERENCE: &str = "no reader gets in past a waiting writer's claim";
/// Reachability: two readers inside at once.
pub const REACH_SHARED: &str = "two readers inside at once";
/// Reachability: a writer inside.
pub const REACH_WRITER: &str = "a writer inside";
/// Reachability: a reader refused by a waiting writer's claim.
pub const REACH_CLAIM: &str = "a reader held back by a claim";

/// A deliberate defect, to show that each property can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RwBug {
    /// The peers' bug: a read release that finds no read hold of its owner deletes the write
    /// hold. Breaks [`EXCLUSION_ONLY_BY_EXPIRY`] through a read release retried after a lost
    /// reply once a writer got in: the next reader joins the writer still inside (the store
    /// itself stays consistent, having forgotten the writer).
    ReadReleaseDeletesWrite,
    /// A write acquire checks the write hold only, not the readers. Breaks
    /// [`STORE_EXCLUSION`].
    WriterIgnoresReaders,
    /// Readers and writers mint from counters of their own. Breaks [`FENCE_ORDER`].
    CounterPerMode,
    /// A read acquire ignores the claim. Breaks [`WRITER_PREFERENCE`].
    ReaderIgnoresClaim,
}

/// The bounds and switches of one read-write lock model.
#[derive(Clone, Debug)]
pub struct RwModel {
    /// Number of clients (2-3).
    pub clients: u8,
    /// How many of them (the first ones) write; the others read.
    pub writers: u8,
    /// Calls each client makes, one after another (1-2).
    pub sessions: u8,
    /// Lease in ticks (at least 1).
    pub lease: u8,
    /// A waiting writer's claim in ticks (at least 1).
    pub claim: u8,
    /// Ticks the clock can advance.
    pub horizon: u8,
    /// Whether commands can lose their reply or not run at all.
    pub lost_replies: bool,
    /// A deliberate defect, or `None` for the protocol as specified.
    pub bug: Option<RwBug>,
}

impl RwModel {
    /// One writer and two readers with one call each, lease 2, claim 1, horizon 3, lost
    /// replies on.
    pub fn new() -> RwModel {
        RwModel {
            clients: 3,
            writers: 1,
            sessions: 1,
            lease: 2,
            claim: 1,
            horizon: 3,
            lost_replies: true,
            bug: None,
        }
    }

    fn has(&self, bug: RwBug) -> bool {
        self.bug == Some(bug)
    }

    fn owner(&self, client: u8, session: u8) -> u8 {
        client * self.sessions + session
    }

    fn writes(&self, client: u8) -> bool {
        client < self.writers
    }

    fn nets(&self) -> &'static [Net] {
        if self.lost_replies {
            &[Net::Delivered, Net::ReplyLost, Net::RequestLost]
        } else {
            &[Net::Delivered]
        }
    }
}

impl Default for RwModel {
    fn default() -> Self {
        RwModel::new()
    }
}

/// Where a client is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Sending acquire.
    Acquiring,
    /// Its acquire got no reply: releasing in cleanup.
    Cleanup,
    /// Inside, with its hold's token.
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
    /// Its last request failed or was refused: it may give up.
    pub retrying: bool,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RwState {
    /// Read holds `(owner, lease ticks left, token)`, sorted by owner.
    pub readers: Vec<(u8, u8, u16)>,
    /// The write hold.
    pub writer: Option<(u8, u8, u16)>,
    /// A waiting writer's claim `(owner, ticks left)`.
    pub claim: Option<(u8, u8)>,
    /// The last token minted (the readers' own with [`RwBug::CounterPerMode`]).
    pub fence: u16,
    /// The writers' own counter ([`RwBug::CounterPerMode`] only).
    pub write_fence: u16,
    /// Ticks passed.
    pub now: u8,
    /// The clients.
    pub clients: Vec<Client>,
    /// Ghost: a lease lapsed while its holder was inside.
    pub lapsed_inside: bool,
    /// Ghost: the highest token minted so far, whichever counter minted it.
    pub highest: u16,
    /// Ghost: a minted token was not greater than an earlier one.
    pub fence_broken: bool,
    /// Ghost: a read hold was granted while another writer's claim was live.
    pub read_past_claim: bool,
    /// Ghost: a reader was refused because of a claim alone.
    pub held_back: bool,
}

/// A step of the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RwAction {
    /// The client sends its phase's command.
    Send {
        /// Which client.
        client: u8,
        /// What became of the command.
        net: Net,
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
    /// The holder renews its hold.
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

impl RwModel {
    fn mint(&self, s: &mut RwState, write: bool) -> u16 {
        let counter = if write && self.has(RwBug::CounterPerMode) {
            &mut s.write_fence
        } else {
            &mut s.fence
        };
        *counter += 1;
        let token = *counter;
        if token <= s.highest {
            s.fence_broken = true;
        }
        s.highest = s.highest.max(token);
        token
    }

    /// The acquire script: `Some(token)` when `owner` holds the key in its mode after it.
    fn acquire(&self, s: &mut RwState, owner: u8, write: bool) -> Option<u16> {
        if write {
            if let Some(w) = s.writer.as_mut().filter(|w| w.0 == owner) {
                w.1 = self.lease;
                return Some(w.2);
            }
            let readers_clear = s.readers.is_empty() || self.has(RwBug::WriterIgnoresReaders);
            let claim_ours = s.claim.is_none_or(|c| c.0 == owner);
            if s.writer.is_none() && readers_clear && claim_ours {
                let token = self.mint(s, true);
                s.writer = Some((owner, self.lease, token));
                s.claim = None;
                return Some(token);
            }
            if claim_ours {
                s.claim = Some((owner, self.claim));
            }
            return None;
        }
        if let Some(r) = s.readers.iter_mut().find(|r| r.0 == owner) {
            r.1 = self.lease;
            return Some(r.2);
        }
        let claim_blocks = s.claim.is_some() && !self.has(RwBug::ReaderIgnoresClaim);
        if s.writer.is_none() && !claim_blocks {
            if s.claim.is_some() {
                s.read_past_claim = true;
            }
            let token = self.mint(s, false);
            s.readers.push((owner, self.lease, token));
            s.readers.sort_unstable();
            return Some(token);
        }
        if s.writer.is_none() {
            s.held_back = true;
        }
        None
    }

    fn release(&self, s: &mut RwState, owner: u8, write: bool) {
        if write {
            if s.writer.is_some_and(|w| w.0 == owner) {
                s.writer = None;
            }
            if s.claim.is_some_and(|c| c.0 == owner) {
                s.claim = None;
            }
            return;
        }
        let before = s.readers.len();
        s.readers.retain(|r| r.0 != owner);
        if s.readers.len() == before && self.has(RwBug::ReadReleaseDeletesWrite) {
            s.writer = None;
        }
    }
}

impl Model for RwModel {
    type State = RwState;
    type Action = RwAction;

    fn init_states(&self) -> Vec<RwState> {
        vec![RwState {
            readers: Vec::new(),
            writer: None,
            claim: None,
            fence: 0,
            write_fence: 0,
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
            highest: 0,
            fence_broken: false,
            read_past_claim: false,
            held_back: false,
        }]
    }

    fn actions(&self, s: &RwState, actions: &mut Vec<RwAction>) {
        for (i, c) in s.clients.iter().enumerate() {
            let client = i as u8;
            match c.phase {
                Phase::Acquiring | Phase::Cleanup | Phase::Releasing => {
                    for &net in self.nets() {
                        actions.push(RwAction::Send { client, net });
                    }
                    if c.retrying {
                        actions.push(RwAction::GiveUp { client });
                    }
                }
                Phase::Inside(_) => {
                    actions.push(RwAction::Renew { client });
                    actions.push(RwAction::Leave { client });
                }
                Phase::Idle => {
                    if c.session + 1 < self.sessions {
                        actions.push(RwAction::Begin { client });
                    }
                }
            }
        }
        if s.now < self.horizon {
            actions.push(RwAction::Tick);
        }
    }

    fn next_state(&self, last: &RwState, action: RwAction) -> Option<RwState> {
        let mut s = last.clone();
        match action {
            RwAction::Send { client, net } => {
                let i = usize::from(client);
                let c = s.clients[i];
                let me = self.owner(client, c.session);
                let write = self.writes(client);
                let runs = net != Net::RequestLost;
                let answered = net == Net::Delivered;
                match c.phase {
                    Phase::Acquiring => {
                        let granted = if runs {
                            self.acquire(&mut s, me, write)
                        } else {
                            None
                        };
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
                            self.release(&mut s, me, write);
                        }
                        let c = &mut s.clients[i];
                        if answered {
                            c.retrying = false;
                            c.phase = Phase::Idle;
                        } else {
                            c.retrying = true;
                        }
                    }
                    Phase::Inside(_) | Phase::Idle => return None,
                }
            }
            RwAction::GiveUp { client } => {
                let c = &mut s.clients[usize::from(client)];
                c.retrying = false;
                c.phase = Phase::Idle;
            }
            RwAction::Begin { client } => {
                let c = &mut s.clients[usize::from(client)];
                c.session += 1;
                c.phase = Phase::Acquiring;
            }
            RwAction::Renew { client } => {
                let i = usize::from(client);
                let me = self.owner(client, s.clients[i].session);
                let lease = self.lease;
                let hold = if self.writes(client) {
                    s.writer.as_mut().filter(|w| w.0 == me)
                } else {
                    s.readers.iter_mut().find(|r| r.0 == me)
                };
                match hold {
                    Some(h) if h.1 == lease => return None,
                    Some(h) => h.1 = lease,
                    // The renewal finds the hold gone: it is lost, the call ends.
                    None => s.clients[i].phase = Phase::Idle,
                }
            }
            RwAction::Leave { client } => {
                s.clients[usize::from(client)].phase = Phase::Releasing;
            }
            RwAction::Tick => {
                s.now += 1;
                for r in &mut s.readers {
                    r.1 = r.1.saturating_sub(1);
                }
                if let Some(w) = &mut s.writer {
                    w.1 = w.1.saturating_sub(1);
                }
                if let Some(c) = &mut s.claim {
                    c.1 = c.1.saturating_sub(1);
                }
                let lapsed: Vec<u8> = s
                    .readers
                    .iter()
                    .chain(s.writer.iter())
                    .filter(|h| h.1 == 0)
                    .map(|h| h.0)
                    .collect();
                for owner in lapsed {
                    let (client, session) = (owner / self.sessions, owner % self.sessions);
                    let c = s.clients[usize::from(client)];
                    if c.session == session && matches!(c.phase, Phase::Inside(_)) {
                        s.lapsed_inside = true;
                    }
                }
                s.readers.retain(|r| r.1 > 0);
                s.writer = s.writer.filter(|w| w.1 > 0);
                s.claim = s.claim.filter(|c| c.1 > 0);
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        fn inside(m: &RwModel, s: &RwState, writers: bool) -> usize {
            s.clients
                .iter()
                .enumerate()
                .filter(|(i, c)| {
                    matches!(c.phase, Phase::Inside(_)) && m.writes(*i as u8) == writers
                })
                .count()
        }
        vec![
            Property::always(EXCLUSION_ONLY_BY_EXPIRY, |m: &RwModel, s: &RwState| {
                let (w, r) = (inside(m, s, true), inside(m, s, false));
                w == 0 || (w == 1 && r == 0) || s.lapsed_inside
            }),
            Property::always(STORE_EXCLUSION, |_: &RwModel, s: &RwState| {
                s.writer.is_none() || s.readers.is_empty()
            }),
            Property::always(FENCE_ORDER, |_: &RwModel, s: &RwState| !s.fence_broken),
            Property::always(WRITER_PREFERENCE, |_: &RwModel, s: &RwState| {
                !s.read_past_claim
            }),
            Property::sometimes(REACH_SHARED, |m: &RwModel, s: &RwState| {
                inside(m, s, false) >= 2
            }),
            Property::sometimes(REACH_WRITER, |m: &RwModel, s: &RwState| {
                inside(m, s, true) >= 1
            }),
            Property::sometimes(REACH_CLAIM, |_: &RwModel, s: &RwState| s.held_back),
        ]
    }
}
