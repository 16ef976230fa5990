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
//! Time advances in ticks ([`SemAction::Tick`](crate::holders::Action::Tick), up to [`SemModel::horizon`]); a tick takes one
//! tick off every lease and a lease at zero drops its permit. (The fence counter's own expiry
//! and failover are the lock model's: the semaphore mints the same way.)
//!
//! # The client (one call per session)
//!
//! Each client makes up to [`SemModel::sessions`] calls, each with a new owner token: send
//! `acquire` (granted: enter with the token; full: retry or give up; **no reply**: do not
//! enter, release owner-checked in cleanup); inside, renew or leave; then send `release`,
//! retried on a lost reply, or give up (the lease frees the permit). A paused client is one
//! that takes no step while ticks pass. This is the client of [`crate::holders`], which the
//! lock and read-write lock models share.
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

use stateright::Property;

use crate::holders::{self, Action, Frame, Protocol, holders_model};
pub use crate::holders::{Client, Net, Phase};

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

/// A step of the system: the shared client steps, [`Action::Tick`], and [`Action::Add`] (the
/// second step of a [`SemBug::CheckThenAdd`] acquire).
pub type SemAction = Action;

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
    fn take(&self, s: &mut SemState, owner: u8) -> Option<u16> {
        if let Some(p) = s.permits.iter_mut().find(|p| p.0 == owner) {
            p.1 = self.lease;
            return Some(p.2);
        }
        if s.permits.len() < usize::from(self.limit) {
            return Some(self.add(s, owner));
        }
        None
    }

    fn initial(&self) -> SemState {
        SemState {
            permits: Vec::new(),
            fence: 0,
            now: 0,
            clients: holders::starting(self.clients),
            lapsed_inside: false,
            fence_broken: false,
        }
    }

    fn checks(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(LIMIT_ONLY_BY_EXPIRY, |m: &SemModel, s: &SemState| {
                holders::inside(&s.clients) <= usize::from(m.limit) || s.lapsed_inside
            }),
            Property::always(STORE_LIMIT, |m: &SemModel, s: &SemState| {
                s.permits.len() <= usize::from(m.limit)
            }),
            Property::always(FENCE_ORDER, |_: &SemModel, s: &SemState| !s.fence_broken),
            Property::sometimes(REACH_FULL, |m: &SemModel, s: &SemState| {
                holders::inside(&s.clients) == usize::from(m.limit)
            }),
            Property::sometimes(REACH_OVER_BY_LAPSE, |m: &SemModel, s: &SemState| {
                holders::inside(&s.clients) > usize::from(m.limit)
            }),
        ]
    }
}

holders_model!(SemModel, SemState, u16, SemBug, initial, checks);

impl Protocol for SemModel {
    fn nets(&self, _: &Client) -> &'static [Net] {
        holders::nets(self.lost_replies)
    }

    fn acquire(&self, s: &mut SemState, _: u8, owner: u8) -> Option<u16> {
        self.take(s, owner)
    }

    fn release(&self, s: &mut SemState, _: u8, owner: u8) {
        let before = s.permits.len();
        s.permits.retain(|p| p.0 != owner);
        if s.permits.len() == before && self.has(SemBug::LateReleaseFreesAnother) {
            s.permits.pop();
        }
    }

    fn renew(&self, s: &mut SemState, _: u8, owner: u8) -> Option<bool> {
        holders::renew_hold(s.permits.iter_mut().find(|p| p.0 == owner), self.lease)
    }

    fn tick(&self, s: &mut SemState) {
        s.now += 1;
        for p in &mut s.permits {
            p.1 = p.1.saturating_sub(1);
        }
        let lapsed = s.permits.iter().filter(|p| p.1 == 0).map(|p| p.0);
        if holders::lapsed_inside(&s.clients, self.sessions, lapsed) {
            s.lapsed_inside = true;
        }
        s.permits.retain(|p| p.1 > 0);
    }

    /// With [`SemBug::CheckThenAdd`], only the count is read here, and only an answered one
    /// counts; the add is the later [`Action::Add`].
    fn send_acquire(&self, s: &mut SemState, client: u8, owner: u8, net: Net) -> Option<()> {
        if !self.has(SemBug::CheckThenAdd) {
            holders::send_acquire(self, s, client, owner, net);
            return Some(());
        }
        if net != Net::Delivered {
            return None;
        }
        let room = s.permits.len() < usize::from(self.limit);
        let c = &mut s.clients[usize::from(client)];
        c.retrying = !room;
        c.phase = if room {
            Phase::Checked
        } else {
            Phase::Acquiring
        };
        Some(())
    }

    fn own_step(&self, s: &mut SemState, action: Action) -> Option<()> {
        let Action::Add { client } = action else {
            return None;
        };
        let i = usize::from(client);
        let me = self.owner(client, s.clients[i].session);
        let token = self.add(s, me);
        s.clients[i].phase = Phase::Inside(token);
        Some(())
    }
}
