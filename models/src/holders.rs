//! The client side that the lock, semaphore and read-write lock models share: each client makes
//! calls one after another (its sessions), each with a new owner token; a call sends `acquire`,
//! holds what it was granted, and sends `release`, over a network that can lose a request or
//! its reply, or (the lock model only) hold a request back to run later.
//!
//! A call, in every one of these models:
//!
//! 1. Sends `acquire`. Granted: enters with its token. Refused: retries, or gives up. **No
//!    reply** (it may or may not have run): does not enter; releases (owner-checked) in
//!    cleanup.
//! 2. Inside: renews (a renewal that finds its hold gone ends the call: the hold is lost), or
//!    leaves.
//! 3. Sends `release`, retried on a lost reply, or gives up (the lease frees the hold).
//!
//! A paused client is one that takes no step while ticks pass. What differs between the models
//! is the store (what `acquire`, `release`, `renew` and a tick do to it) and a few steps of
//! their own; each model says those through a crate-private trait, and its
//! `stateright::Model` is the shared step function over them.

use stateright::Model;

/// What happens to one request on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Net {
    /// It runs and the client gets the reply.
    Delivered,
    /// It runs; the client sees an error.
    ReplyLost,
    /// It never runs; the client sees an error.
    RequestLost,
    /// It does not run now; the client sees an error; it may run later ([`Action::Deliver`]
    /// in the lock model with `delayed_requests`, `RecordAction::Deliver` in the record
    /// model).
    Delayed,
}

/// Where a client's call is. `T` is what a holder knows of its hold: its token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase<T = u16> {
    /// Sending acquire.
    Acquiring,
    /// Saw room and will take its hold in a second step (the semaphore model's
    /// `SemBug::CheckThenAdd` only).
    Checked,
    /// Its acquire got no reply: releasing in cleanup.
    Cleanup,
    /// Inside, with what it was granted.
    Inside(T),
    /// Left: releasing.
    Releasing,
    /// Between calls, or finished.
    Idle,
}

/// A store command held in the network by [`Net::Delayed`], with the owner it was sent for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    /// `acquire` for this owner.
    Acquire(u8),
    /// `release` for this owner.
    Release(u8),
}

/// One client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Client<T = u16> {
    /// Its current call (owner token = `client * sessions + session`).
    pub session: u8,
    /// Where it is.
    pub phase: Phase<T>,
    /// Its last request in this phase failed or was refused: it may give up.
    pub retrying: bool,
    /// A command it saw fail that is still in the network and may yet run.
    pub pending: Option<Command>,
}

/// One step of a model. Each model takes the steps its protocol has: the client steps and
/// `Tick` in all of them, the others where their documentation says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The client sends the command its phase calls for (acquire or release).
    Send {
        /// Which client.
        client: u8,
        /// What the network does with it.
        net: Net,
    },
    /// The second step of a non-atomic acquire (the semaphore model's `SemBug::CheckThenAdd`).
    Add {
        /// Which client.
        client: u8,
    },
    /// The client stops retrying and ends its call.
    GiveUp {
        /// Which client.
        client: u8,
    },
    /// The client starts its next call.
    Begin {
        /// Which client.
        client: u8,
    },
    /// The holder writes to the resource with its token (the lock model).
    Write {
        /// Which client.
        client: u8,
    },
    /// The holder renews its hold (reply delivered).
    Renew {
        /// Which client.
        client: u8,
    },
    /// The holder leaves the section.
    Leave {
        /// Which client.
        client: u8,
    },
    /// A delayed command of the client runs now; its reply goes nowhere (the lock model).
    Deliver {
        /// Whose command.
        client: u8,
    },
    /// One tick of the store's clock.
    Tick,
    /// The store reverts to its replica (the lock model).
    Failover,
}

/// The bounds and state fields every one of these models keeps under the same names
/// (`sessions` and `horizon` in the model, `clients` and `now` in its state): written by
/// [`holders_model!`].
pub(crate) trait Frame: Model<Action = Action> {
    /// What a holder knows of its hold.
    type Token: Copy;

    /// Calls each client makes.
    fn calls_per_client(&self) -> u8;
    /// Ticks the clock can advance.
    fn last_tick(&self) -> u8;
    /// The state's clients.
    fn clients_in(s: &Self::State) -> &[Client<Self::Token>];
    /// The state's clients, to change.
    fn clients_in_mut(s: &mut Self::State) -> &mut [Client<Self::Token>];
    /// Ticks passed.
    fn clock(s: &Self::State) -> u8;

    /// The owner token of `client`'s call `session`.
    fn owner(&self, client: u8, session: u8) -> u8 {
        client * self.calls_per_client() + session
    }
}

/// What a model's store does, and the steps of its own: what the shared client side asks of
/// each model.
pub(crate) trait Protocol: Frame {
    /// What the network may do with a command `client` sends now.
    fn nets(&self, client: &Client<Self::Token>) -> &'static [Net];
    /// The store's `acquire` for `owner`, sent by `client`: what the holder is granted, or
    /// `None` when refused.
    fn acquire(&self, s: &mut Self::State, client: u8, owner: u8) -> Option<Self::Token>;
    /// The store's `release` for `owner`, sent by `client`.
    fn release(&self, s: &mut Self::State, client: u8, owner: u8);
    /// The store's `renew` for `owner`, sent by `client`: `Some(true)` when renewed,
    /// `Some(false)` when the hold is gone, `None` when the renewal would change nothing.
    fn renew(&self, s: &mut Self::State, client: u8, owner: u8) -> Option<bool>;
    /// One tick of the store's clock.
    fn tick(&self, s: &mut Self::State);

    /// Where a call goes when its acquire got no reply: cleanup, unless the model has a bug
    /// that lets it in.
    fn after_lost_acquire(&self) -> Phase<Self::Token> {
        Phase::Cleanup
    }
    /// Sends `client`'s acquire: [`send_acquire`], unless the model acquires otherwise.
    fn send_acquire(&self, s: &mut Self::State, client: u8, owner: u8, net: Net) -> Option<()> {
        send_acquire(self, s, client, owner, net);
        Some(())
    }
    /// Steps of the model's own a holder may take, before it renews or leaves.
    fn holder_actions(&self, _client: u8, _token: Self::Token, _actions: &mut Vec<Action>) {}
    /// Steps of the model's own while the clock may still advance.
    fn clock_actions(&self, _s: &Self::State, _actions: &mut Vec<Action>) {}
    /// A step of the model's own: `None` when it does not apply.
    fn own_step(&self, _s: &mut Self::State, _action: Action) -> Option<()> {
        None
    }
}

/// Clients at the start: each about to send its first acquire.
pub(crate) fn starting<T>(clients: u8) -> Vec<Client<T>>
where
    T: Copy,
{
    vec![
        Client {
            session: 0,
            phase: Phase::Acquiring,
            retrying: false,
            pending: None,
        };
        usize::from(clients)
    ]
}

/// What the network may do with a command, with lost replies or without.
pub(crate) fn nets(lost_replies: bool) -> &'static [Net] {
    if lost_replies {
        &[Net::Delivered, Net::ReplyLost, Net::RequestLost]
    } else {
        &[Net::Delivered]
    }
}

/// How many clients are inside, whatever they hold.
pub(crate) fn inside<T>(clients: &[Client<T>]) -> usize {
    clients
        .iter()
        .filter(|c| matches!(c.phase, Phase::Inside(_)))
        .count()
}

/// Whether any of the `lapsed` owners' holds belonged to a call still inside: the ghost flag
/// every "only through expiry" property allows for.
pub(crate) fn lapsed_inside<T>(
    clients: &[Client<T>],
    sessions: u8,
    lapsed: impl IntoIterator<Item = u8>,
) -> bool {
    lapsed.into_iter().any(|owner| {
        let c = &clients[usize::from(owner / sessions)];
        c.session == owner % sessions && matches!(c.phase, Phase::Inside(_))
    })
}

/// A renewal of `hold` (`(owner, lease ticks left, token)`, the renewing owner's if it still
/// has one): [`Protocol::renew`]'s answer, resetting the lease to `lease`.
pub(crate) fn renew_hold(hold: Option<&mut (u8, u8, u16)>, lease: u8) -> Option<bool> {
    match hold {
        // A full lease: the renewal would change nothing.
        Some(h) if h.1 == lease => None,
        Some(h) => {
            h.1 = lease;
            Some(true)
        }
        None => Some(false),
    }
}

/// Every step the model can take from `s`.
pub(crate) fn actions<M: Protocol>(m: &M, s: &M::State, actions: &mut Vec<Action>) {
    for (i, c) in M::clients_in(s).iter().enumerate() {
        let client = i as u8;
        if c.pending.is_some() {
            actions.push(Action::Deliver { client });
        }
        match c.phase {
            Phase::Acquiring | Phase::Cleanup | Phase::Releasing => {
                for &net in m.nets(c) {
                    actions.push(Action::Send { client, net });
                }
                if c.retrying {
                    actions.push(Action::GiveUp { client });
                }
            }
            Phase::Checked => actions.push(Action::Add { client }),
            Phase::Inside(token) => {
                m.holder_actions(client, token, actions);
                actions.push(Action::Renew { client });
                actions.push(Action::Leave { client });
            }
            Phase::Idle => {
                if c.session + 1 < m.calls_per_client() {
                    actions.push(Action::Begin { client });
                }
            }
        }
    }
    if M::clock(s) < m.last_tick() {
        actions.push(Action::Tick);
        m.clock_actions(s, actions);
    }
}

/// The state after `action` from `last`, or `None` when it does not apply.
pub(crate) fn next_state<M: Protocol>(m: &M, last: &M::State, action: Action) -> Option<M::State>
where
    M::State: Clone,
{
    let mut s = last.clone();
    match action {
        Action::Send { client, net } => {
            let c = M::clients_in(&s)[usize::from(client)];
            let me = m.owner(client, c.session);
            match c.phase {
                Phase::Acquiring => m.send_acquire(&mut s, client, me, net)?,
                Phase::Cleanup | Phase::Releasing => send_release(m, &mut s, client, me, net),
                Phase::Checked | Phase::Inside(_) | Phase::Idle => return None,
            }
        }
        Action::GiveUp { client } => {
            let c = &mut M::clients_in_mut(&mut s)[usize::from(client)];
            c.retrying = false;
            c.phase = Phase::Idle;
        }
        Action::Begin { client } => {
            let c = &mut M::clients_in_mut(&mut s)[usize::from(client)];
            c.session += 1;
            c.phase = Phase::Acquiring;
        }
        Action::Renew { client } => {
            let me = m.owner(client, M::clients_in(&s)[usize::from(client)].session);
            if !m.renew(&mut s, client, me)? {
                // The renewal finds the hold gone: the call learns its hold is lost and ends
                // without a release (there is nothing of its own to release).
                M::clients_in_mut(&mut s)[usize::from(client)].phase = Phase::Idle;
            }
        }
        Action::Leave { client } => {
            M::clients_in_mut(&mut s)[usize::from(client)].phase = Phase::Releasing;
        }
        Action::Tick => m.tick(&mut s),
        Action::Add { .. } | Action::Write { .. } | Action::Deliver { .. } | Action::Failover => {
            m.own_step(&mut s, action)?;
        }
    }
    Some(s)
}

/// `client` sends its acquire for `owner`: granted with an answer, it enters; refused, it may
/// retry; without an answer, it goes where [`Protocol::after_lost_acquire`] says. A delayed
/// request stays pending.
pub(crate) fn send_acquire<M: Protocol>(m: &M, s: &mut M::State, client: u8, owner: u8, net: Net) {
    let runs = matches!(net, Net::Delivered | Net::ReplyLost);
    let granted = if runs {
        m.acquire(s, client, owner)
    } else {
        None
    };
    let c = &mut M::clients_in_mut(s)[usize::from(client)];
    if net == Net::Delayed {
        c.pending = Some(Command::Acquire(owner));
    }
    c.retrying = false;
    c.phase = match (net == Net::Delivered, granted) {
        (true, Some(token)) => Phase::Inside(token),
        (true, None) => {
            c.retrying = true;
            Phase::Acquiring
        }
        (false, _) => m.after_lost_acquire(),
    };
}

/// `client` sends its release for `owner`, in cleanup or after leaving: answered, the call
/// ends; otherwise it may retry. A delayed request stays pending.
fn send_release<M: Protocol>(m: &M, s: &mut M::State, client: u8, owner: u8, net: Net) {
    if matches!(net, Net::Delivered | Net::ReplyLost) {
        m.release(s, client, owner);
    }
    let c = &mut M::clients_in_mut(s)[usize::from(client)];
    if net == Net::Delayed {
        c.pending = Some(Command::Release(owner));
    }
    if net == Net::Delivered {
        c.retrying = false;
        c.phase = Phase::Idle;
    } else {
        c.retrying = true;
    }
}

/// Writes the [`Frame`] and the `stateright::Model` of a model that implements [`Protocol`]:
/// its initial state from `$initial`, its steps from [`actions`] and [`next_state`], its
/// properties from `$properties`. Also the model's `Default` (its `new()`) and `has(bug)`,
/// whether its deliberate defect is `bug`.
macro_rules! holders_model {
    ($model:ident, $state:ty, $token:ty, $bug:ty, $initial:ident, $properties:ident) => {
        impl Default for $model {
            fn default() -> Self {
                $model::new()
            }
        }

        impl $model {
            fn has(&self, bug: $bug) -> bool {
                self.bug == Some(bug)
            }
        }

        impl $crate::holders::Frame for $model {
            type Token = $token;

            fn calls_per_client(&self) -> u8 {
                self.sessions
            }

            fn last_tick(&self) -> u8 {
                self.horizon
            }

            fn clients_in(s: &$state) -> &[$crate::holders::Client<$token>] {
                &s.clients
            }

            fn clients_in_mut(s: &mut $state) -> &mut [$crate::holders::Client<$token>] {
                &mut s.clients
            }

            fn clock(s: &$state) -> u8 {
                s.now
            }
        }

        impl stateright::Model for $model {
            type State = $state;
            type Action = $crate::holders::Action;

            fn init_states(&self) -> Vec<$state> {
                vec![self.$initial()]
            }

            fn actions(&self, s: &$state, actions: &mut Vec<Self::Action>) {
                $crate::holders::actions(self, s, actions)
            }

            fn next_state(&self, last: &$state, action: Self::Action) -> Option<$state> {
                $crate::holders::next_state(self, last, action)
            }

            fn properties(&self) -> Vec<stateright::Property<Self>> {
                self.$properties()
            }
        }
    };
}
pub(crate) use holders_model;
