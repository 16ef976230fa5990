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
//! Time advances in ticks ([`RwAction::Tick`](crate::holders::Action::Tick), up to [`RwModel::horizon`]); a tick takes one
//! tick off every lease and claim, and one at zero is dropped.
//!
//! # The client (one call per session)
//!
//! Clients `0..writers` write, the others read. Each call has a new owner token: send
//! `acquire` (granted: enter with the token; refused: retry or give up, a writer's claim left
//! behind as a crashed waiting writer's would be; **no reply**: do not enter, release in
//! cleanup); inside, renew or leave; then send `release`, retried on a lost reply, or give up.
//! This is the client of [`crate::holders`], which the lock and semaphore models share.
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

use stateright::Property;

use crate::holders::{self, Action, Protocol, holders_model};
pub use crate::holders::{Client, Net, Phase};

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

    fn writes(&self, client: u8) -> bool {
        client < self.writers
    }
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

/// A step of the system: the shared client steps and [`Action::Tick`].
pub type RwAction = Action;

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
    fn take(&self, s: &mut RwState, owner: u8, write: bool) -> Option<u16> {
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

    fn give_back(&self, s: &mut RwState, owner: u8, write: bool) {
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

holders_model!(RwModel, RwState, u16, RwBug, initial, checks);

impl RwModel {
    fn initial(&self) -> RwState {
        RwState {
            readers: Vec::new(),
            writer: None,
            claim: None,
            fence: 0,
            write_fence: 0,
            now: 0,
            clients: holders::starting(self.clients),
            lapsed_inside: false,
            highest: 0,
            fence_broken: false,
            read_past_claim: false,
            held_back: false,
        }
    }

    fn checks(&self) -> Vec<Property<Self>> {
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

impl Protocol for RwModel {
    fn nets(&self, _: &Client) -> &'static [Net] {
        holders::nets(self.lost_replies)
    }

    fn acquire(&self, s: &mut RwState, client: u8, owner: u8) -> Option<u16> {
        self.take(s, owner, self.writes(client))
    }

    fn release(&self, s: &mut RwState, client: u8, owner: u8) {
        self.give_back(s, owner, self.writes(client));
    }

    fn renew(&self, s: &mut RwState, client: u8, owner: u8) -> Option<bool> {
        let hold = if self.writes(client) {
            s.writer.as_mut().filter(|w| w.0 == owner)
        } else {
            s.readers.iter_mut().find(|r| r.0 == owner)
        };
        holders::renew_hold(hold, self.lease)
    }

    fn tick(&self, s: &mut RwState) {
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
        let lapsed = s.readers.iter().chain(s.writer.iter()).filter(|h| h.1 == 0);
        if holders::lapsed_inside(&s.clients, self.sessions, lapsed.map(|h| h.0)) {
            s.lapsed_inside = true;
        }
        s.readers.retain(|r| r.1 > 0);
        s.writer = s.writer.filter(|w| w.1 > 0);
        s.claim = s.claim.filter(|c| c.1 > 0);
    }
}
