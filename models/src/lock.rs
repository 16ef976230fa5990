//! The lock protocol behind `#[distributed_lock]`, with fencing tokens.
//!
//! # The store
//!
//! One key. The lock is either free or held by `(owner, lease, token)`; next to it lives the
//! fence counter: the last token minted for the key. Commands are atomic steps:
//!
//! * `acquire(o)` (`SET NX PX`, and the fence mint in the same step): free → held by `o` with a
//!   full lease and a new token `max(last + 1, now * M)`; held by `o` already (a resent
//!   acquire whose first send landed) → granted again with the stored token, nothing minted;
//!   held by another → *contended*.
//! * `release(o)`: compare-and-delete; frees the lock only if `o` holds it.
//! * `renew(o)`: compare-and-pexpire; resets the lease only if `o` holds it, and answers
//!   whether it did.
//!
//! Time advances in ticks ([`LockAction::Tick`](crate::holders::Action::Tick), up to [`LockModel::horizon`]); a tick takes
//! one tick off the lease and a lease at zero frees the lock. `now * M` stands for the
//! server clock in the token's unit: `M` (`clients * sessions + 1`) is more than the number of
//! tokens the model can mint in one tick, as a microsecond clock is finer than any real
//! acquisition rate; so after at least one tick the clock alone outruns every earlier token.
//!
//! **Failover** ([`LockModel::failover`], at most once): the store reverts to a replica that
//! missed the last write (the replica is modelled as the store before its last write; leases
//! tick on both), and the clock advances one tick with it (a failover takes far longer than
//! the clock's unit). [`LockBug::FailoverWithoutClockAdvance`] drops that assumption.
//!
//! # The client (one `#[distributed_lock]` call per session)
//!
//! Each client makes up to [`LockModel::sessions`] calls, one after another, each with a new
//! owner token:
//!
//! 1. Send `acquire`. Granted: enter the section with the token. Contended: retry, or give up.
//!    **No reply** (it may or may not have run): do not enter; release (owner-checked) in
//!    cleanup, retried on error, or give up (the lock then frees itself by lease).
//! 2. Inside: write to the resource with the token, renew the lease (a renewal that finds the
//!    lock gone ends the call: the hold is lost), and leave.
//! 3. Send `release`, retried on error (a retry after a lost reply finds the lock no longer
//!    ours and changes nothing), or give up.
//!
//! With [`LockModel::delayed_requests`], a command the client saw fail (timed out) can stay
//! in the network and run later, after the client's next commands (at most one per client at
//! a time): a stale acquire can then take the lock for an owner that has already given up.
//! This client is [`crate::holders`]', which the semaphore and read-write lock models share.
//!
//! A paused client is a client that takes no step while ticks pass: its local view still
//! says it holds the lock. Renewals whose replies are lost change nothing the client acts on,
//! and are modelled as either running or not running.
//!
//! # The resource
//!
//! Accepts a write with token `t` iff `t` is at least the highest token it accepted (equal is
//! allowed so one holder can write several times), and remembers the highest token and who
//! wrote with it.
//!
//! # Properties
//!
//! * [`FENCE_ORDER`]: of two writes accepted one after the other from different owners, the
//!   later carries the strictly greater token (so tokens never go back, and no two holders
//!   share one).
//! * [`OVERLAP_ONLY_BY_EXPIRY`]: two clients inside the section at once only in histories
//!   where a lease lapsed while its holder was inside, or a failover happened (ghost flags set
//!   when those happen). A lost reply or a retried release alone never causes an overlap.
//!
//! Reachability: [`REACH_OVERLAP`], [`REACH_STALE_REFUSED`].

use stateright::Property;

use crate::holders::{self, Action, Frame, Protocol, holders_model};
pub use crate::holders::{Command, Net};

/// Property: tokens accepted from different owners strictly increase.
pub const FENCE_ORDER: &str = "fenced writes from different holders strictly increase";
/// Property: overlapping holders only after a lease lapsed under a holder, or a failover.
pub const OVERLAP_ONLY_BY_EXPIRY: &str = "two holders overlap only through expiry or failover";
/// Reachability: two clients are inside at once.
pub const REACH_OVERLAP: &str = "two holders inside at once";
/// Reachability: the resource refuses a stale holder's write.
pub const REACH_STALE_REFUSED: &str = "a stale write is refused";

/// A deliberate defect (or a dropped environment assumption), to show that each property can
/// fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockBug {
    /// `release` deletes the lock whoever holds it. Breaks [`OVERLAP_ONLY_BY_EXPIRY`] through
    /// a retried release.
    ReleaseWithoutOwnerCheck,
    /// A client whose acquire got no reply enters the section anyway (without a token).
    /// Breaks [`OVERLAP_ONLY_BY_EXPIRY`] through a lost reply.
    EnterAfterLostAcquire,
    /// Tokens are minted from the clock alone (`now * M`, no `last + 1`). Breaks
    /// [`FENCE_ORDER`]: two holders in one tick share a token.
    MintFromClockOnly,
    /// A failover happens within one unit of the clock (or onto a replica whose clock is
    /// behind). Breaks [`FENCE_ORDER`]: the lost token is minted again for another holder.
    FailoverWithoutClockAdvance,
}

/// The bounds and switches of one lock-protocol model.
#[derive(Clone, Debug)]
pub struct LockModel {
    /// Number of clients (keep to 2-3).
    pub clients: u8,
    /// Calls each client makes, one after another (1-2).
    pub sessions: u8,
    /// Lease in ticks (at least 1).
    pub lease: u8,
    /// Ticks the clock can advance; after it, leases stop running out.
    pub horizon: u8,
    /// Whether commands can lose their reply or not run at all.
    pub lost_replies: bool,
    /// Whether a command the client saw fail can run later, after the client's next commands.
    pub delayed_requests: bool,
    /// Whether one failover can happen.
    pub failover: bool,
    /// A deliberate defect, or `None` for the protocol as specified.
    pub bug: Option<LockBug>,
}

impl LockModel {
    /// Two clients with two calls each, lease 2, horizon 3, lost replies and failover on, no
    /// defect.
    pub fn new() -> LockModel {
        LockModel {
            clients: 2,
            sessions: 2,
            lease: 2,
            horizon: 3,
            lost_replies: true,
            delayed_requests: false,
            failover: true,
            bug: None,
        }
    }

    /// The clock's weight in a token: more than the tokens mintable in one tick.
    fn clock_unit(&self) -> u16 {
        u16::from(self.clients) * u16::from(self.sessions) + 1
    }
}

/// The lock as one copy of the store holds it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Store {
    /// `(owner, lease ticks left, token)` of the holder.
    pub holder: Option<(u8, u8, u16)>,
    /// The last token minted.
    pub fence: u16,
}

/// Where a client is: inside, with the token it was granted (`None` only under
/// [`LockBug::EnterAfterLostAcquire`]).
pub type Phase = holders::Phase<Option<u16>>;

/// One client.
pub type Client = holders::Client<Option<u16>>;

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LockState {
    /// The clock, in ticks.
    pub now: u8,
    /// The store clients talk to.
    pub primary: Store,
    /// The replica: the store before its last write.
    pub replica: Store,
    /// Clients.
    pub clients: Vec<Client>,
    /// The resource: highest accepted token and its writer.
    pub resource: Option<(u16, u8)>,
    /// Ghost: a failover happened.
    pub failed_over: bool,
    /// Ghost: a lease lapsed while its holder was inside.
    pub lapsed_inside: bool,
    /// Ghost: the resource accepted, from a different owner, a token not above the last one.
    pub fence_broken: bool,
    /// Ghost: the resource refused a stale write.
    pub stale_refused: bool,
}

/// One step of the system: the shared client steps, [`Action::Tick`], and the lock's own
/// [`Action::Write`], [`Action::Deliver`] and [`Action::Failover`].
pub type LockAction = Action;

impl LockModel {
    /// Writes `next` to the primary, the replica keeping the state before this write.
    fn write(s: &mut LockState, next: Store) {
        if next != s.primary {
            s.replica = s.primary;
            s.primary = next;
        }
    }

    /// `acquire(owner)` on the primary: the token granted, or `None` when another owner holds
    /// the lock.
    fn take(&self, s: &mut LockState, owner: u8) -> Option<u16> {
        let mut st = s.primary;
        match st.holder {
            None => {
                let clock = u16::from(s.now) * self.clock_unit();
                let token = if self.has(LockBug::MintFromClockOnly) {
                    clock
                } else {
                    (st.fence + 1).max(clock)
                };
                st.fence = token;
                st.holder = Some((owner, self.lease, token));
                Self::write(s, st);
                Some(token)
            }
            Some((holder, _, token)) if holder == owner => Some(token),
            Some(_) => None,
        }
    }

    /// `release(owner)` on the primary: compare-and-delete.
    fn give_back(&self, s: &mut LockState, owner: u8) {
        let mut st = s.primary;
        let ours = matches!(st.holder, Some((o, _, _)) if o == owner);
        if ours || self.has(LockBug::ReleaseWithoutOwnerCheck) {
            st.holder = None;
            Self::write(s, st);
        }
    }

    fn tick_store(st: &mut Store) -> Option<u8> {
        if let Some((owner, lease, token)) = st.holder {
            if lease > 1 {
                st.holder = Some((owner, lease - 1, token));
            } else {
                st.holder = None;
                return Some(owner);
            }
        }
        None
    }
}

holders_model!(LockModel, LockState, Option<u16>, LockBug, initial, checks);

impl LockModel {
    fn initial(&self) -> LockState {
        LockState {
            now: 0,
            primary: Store::default(),
            replica: Store::default(),
            clients: holders::starting(self.clients),
            resource: None,
            failed_over: false,
            lapsed_inside: false,
            fence_broken: false,
            stale_refused: false,
        }
    }

    fn checks(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(FENCE_ORDER, |_: &LockModel, s: &LockState| !s.fence_broken),
            Property::always(OVERLAP_ONLY_BY_EXPIRY, |_: &LockModel, s: &LockState| {
                holders::inside(&s.clients) <= 1 || s.lapsed_inside || s.failed_over
            }),
            Property::sometimes(REACH_OVERLAP, |_: &LockModel, s: &LockState| {
                holders::inside(&s.clients) >= 2
            }),
            Property::sometimes(REACH_STALE_REFUSED, |_: &LockModel, s: &LockState| {
                s.stale_refused
            }),
        ]
    }

    /// The holder `client` writes to the resource with its token.
    fn write_resource(&self, s: &mut LockState, client: u8) -> Option<()> {
        let c = s.clients[usize::from(client)];
        let me = self.owner(client, c.session);
        let Phase::Inside(Some(token)) = c.phase else {
            return None;
        };
        match s.resource {
            Some((highest, _)) if token < highest => {
                if s.stale_refused {
                    return None;
                }
                s.stale_refused = true;
            }
            Some((highest, writer)) if highest == token && writer == me => return None,
            Some((highest, writer)) => {
                if writer != me && token <= highest {
                    s.fence_broken = true;
                }
                s.resource = Some((token, me));
            }
            None => s.resource = Some((token, me)),
        }
        Some(())
    }
}

impl Protocol for LockModel {
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

    fn acquire(&self, s: &mut LockState, _: u8, owner: u8) -> Option<Option<u16>> {
        self.take(s, owner).map(Some)
    }

    fn release(&self, s: &mut LockState, _: u8, owner: u8) {
        self.give_back(s, owner);
    }

    fn renew(&self, s: &mut LockState, _: u8, owner: u8) -> Option<bool> {
        let mut st = s.primary;
        let renewed = holders::renew_hold(st.holder.as_mut().filter(|h| h.0 == owner), self.lease)?;
        if renewed {
            Self::write(s, st);
        }
        Some(renewed)
    }

    fn tick(&self, s: &mut LockState) {
        s.now += 1;
        Self::tick_store(&mut s.replica);
        let lapsed = Self::tick_store(&mut s.primary);
        if holders::lapsed_inside(&s.clients, self.sessions, lapsed) {
            s.lapsed_inside = true;
        }
    }

    fn after_lost_acquire(&self) -> Phase {
        if self.has(LockBug::EnterAfterLostAcquire) {
            Phase::Inside(None)
        } else {
            Phase::Cleanup
        }
    }

    fn holder_actions(&self, client: u8, token: Option<u16>, actions: &mut Vec<Action>) {
        if token.is_some() {
            actions.push(Action::Write { client });
        }
    }

    fn clock_actions(&self, s: &LockState, actions: &mut Vec<Action>) {
        if self.failover && !s.failed_over {
            actions.push(Action::Failover);
        }
    }

    fn own_step(&self, s: &mut LockState, action: Action) -> Option<()> {
        match action {
            Action::Write { client } => self.write_resource(s, client)?,
            Action::Deliver { client } => match s.clients[usize::from(client)].pending.take() {
                Some(Command::Acquire(owner)) => {
                    self.take(s, owner);
                }
                Some(Command::Release(owner)) => self.give_back(s, owner),
                None => return None,
            },
            Action::Failover => {
                s.primary = s.replica;
                s.failed_over = true;
                if !self.has(LockBug::FailoverWithoutClockAdvance) {
                    self.tick(s);
                }
                s.replica = s.primary;
            }
            _ => return None,
        }
        Some(())
    }
}
