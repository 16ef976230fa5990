//! Taking a lock, a semaphore permit or a read-write hold: the checks before any attempt
//! ([`Acquisition::admit`]), the first step that runs without awaiting ([`begin`]: the
//! in-process provider's table answers a free lock there, in [`Acquisition::in_process`]), and
//! the wait for any other answer ([`Pending::finish`]). The attribute and the handle API take
//! the same path; what it ends in is a [`Grant`], which the guard file holds.

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::time::Instant;

use crate::error::CoordError;
use crate::provider::CallKey;
use crate::provider::replicas;
use crate::provider::{
    BackendError, BoxFuture, Capability, LockGrant, LockRequest, OwnerToken, PermitRequest, RwMode,
};
use crate::report::LockOutcome;
use crate::runtime::call::{backend_fault, replica_acks_refused};
use crate::runtime::held;
use crate::runtime::lease_guard::{LeaseGuard, LeaseStore, unanswered_grant_bound};
use crate::runtime::renewal::{Hold, HoldKind, HoldTerms, Registration};
use crate::runtime::spec::LockSpec;
use crate::runtime::state::Coordinator;
use crate::telemetry::Elapsed;
use coord_memory::{Attempt, MemoryProvider};

/// A lock just granted, before anyone holds it as a guard: the attribute keeps it in a
/// `CallHold`, the handle API in a [`LockGuard`](super::LockGuard).
pub(crate) struct Grant {
    pub(super) hold: Arc<Hold>,
    pub(super) renewal: Option<Registration>,
    /// `Acquired` or `Contended`.
    pub(super) outcome: LockOutcome,
    /// How long taking the lock took.
    pub(super) waited: Elapsed,
    /// When the grant was in (this process's clock): what the attribute times its body from.
    pub(super) granted_at: Instant,
}

impl Grant {
    /// The grant of one key of a multi-key lock (see `runtime::multi_lock`), whose hold the
    /// multi-key acquisition built: from here on it is held, renewed, lost and given back like
    /// any lock.
    pub(crate) fn of_hold(
        coordinator: &Coordinator,
        hold: Arc<Hold>,
        renew: Option<Duration>,
        contended: bool,
        started: Instant,
        granted_at: Instant,
    ) -> Grant {
        let renewal = renew.map(|every| coordinator.renewer().register(hold.clone(), every));
        Grant {
            hold,
            renewal,
            outcome: if contended {
                LockOutcome::Contended
            } else {
                LockOutcome::Acquired
            },
            waited: Elapsed::Between(started, granted_at),
            granted_at,
        }
    }
}

/// What one acquisition came to.
pub(crate) enum Acquired {
    /// The lock is held.
    Granted(Grant),
    /// The call is refused: not acquired within `wait`, reentrant, or a backend fault under
    /// `fail_closed`.
    Refused(CoordError, LockOutcome),
    /// The backend failed and the policy is `fail_open`: run without the lock (counted and
    /// logged already).
    Unguarded,
}

/// What the first step of an acquisition came to: an answer, or an answer to wait for.
pub(crate) enum Begun<'a> {
    /// Answered without awaiting: refused before any attempt, or the in-process table's grant
    /// or refusal.
    Done(Acquired),
    /// The provider's answer is to be awaited ([`Pending::finish`]).
    Waiting(Pending<'a>),
}

/// Takes the lock of `key` on the terms of `spec`: the one acquisition path of the attribute
/// and the handle API ([`begin`], then [`Pending::finish`] when the answer must be awaited).
/// If this future is dropped while the acquire is in flight, the acquire (which may have
/// landed) is released in the background.
pub(crate) async fn acquire_lock(
    coordinator: &Coordinator,
    key: &CallKey,
    spec: &LockSpec,
) -> Acquired {
    match begin(coordinator, key, spec) {
        Begun::Done(acquired) => acquired,
        Begun::Waiting(pending) => pending.finish().await,
    }
}

/// The part of an acquisition that needs no await: the checks, then the attempt. A lock of the
/// in-process provider is answered here unless the caller queues for it; every other provider,
/// and every semaphore permit and read-write hold, is asked, and its answer is left to
/// [`Pending::finish`].
pub(crate) fn begin<'a>(
    coordinator: &'a Coordinator,
    key: &'a CallKey,
    spec: &'a LockSpec,
) -> Begun<'a> {
    let acquisition = match Acquisition::admit(coordinator, key, spec) {
        Ok(acquisition) => acquisition,
        Err(refused) => return Begun::Done(refused),
    };
    let (acquisition, answer) = match acquisition.lock_table() {
        Some(table) => match acquisition.in_process(table) {
            InProcess::Answered(acquired) => return Begun::Done(acquired),
            InProcess::Queued(acquisition, answer) => (acquisition, answer),
        },
        None => {
            let answer = acquisition.ask();
            (acquisition, answer)
        }
    };
    Begun::Waiting(acquisition.pending(answer))
}

/// One acquisition as asked, once admitted: what it is for, its owner token, the task's
/// innermost hold (the node the new hold links to) and the clock reading it is timed from.
struct Acquisition<'a> {
    coordinator: &'a Coordinator,
    key: &'a CallKey,
    spec: &'a LockSpec,
    owner: OwnerToken,
    outer: Option<Arc<Hold>>,
    /// Read before the attempt: the lease is timed from here, or from when the provider says
    /// it began.
    started: Instant,
}

/// What the in-process table said to one attempt.
enum InProcess<'a> {
    /// Granted, or held by others with nothing to wait for.
    Answered(Acquired),
    /// Held by others, and the caller is queued: its grant is to be awaited.
    Queued(Acquisition<'a>, GrantAnswer<'a>),
}

/// A provider's answer to an acquisition, as a lock grant (`None`: not granted within `wait`).
type GrantAnswer<'a> = BoxFuture<'a, Result<Option<LockGrant>, BackendError>>;

impl<'a> Acquisition<'a> {
    /// The checks before any attempt: reentrancy (against the task's chain of held locks),
    /// shutdown, and what the provider must support. Then the owner token and the clock
    /// reading the acquisition is timed from.
    fn admit(
        coordinator: &'a Coordinator,
        key: &'a CallKey,
        spec: &'a LockSpec,
    ) -> Result<Acquisition<'a>, Acquired> {
        // One look at the task's chain of held locks: the reentrancy check, and the node the
        // new hold links to.
        let outer = held::innermost();
        let permit = spec.permits > 0;
        let refused = |err, outcome| Err(Acquired::Refused(err, outcome));
        if let Some(mode) = spec.rw {
            if let Some(err) = crate::runtime::rw_lock::reentry(outer.as_deref(), key, mode) {
                return refused(err, LockOutcome::Reentrant);
            }
        } else if held::chain_holds(outer.as_deref(), key, permit) {
            return refused(
                CoordError::Reentrant { key: key.clone() },
                LockOutcome::Reentrant,
            );
        }
        if coordinator.lifecycle().is_shut_down() {
            return refused(
                CoordError::ShutDown { key: key.clone() },
                LockOutcome::ShutDown,
            );
        }
        if permit && !coordinator.supports(Capability::Semaphores) {
            // Refused before the provider is asked, whatever the backend-fault policy: running
            // the body without the limit would be a silent no-op of the semaphore.
            let err = CoordError::Unsupported {
                capability: Capability::Semaphores,
                key: key.clone(),
            };
            return refused(err, LockOutcome::BackendError);
        }
        if spec.rw.is_some() && !coordinator.supports(Capability::ReadWriteLocks) {
            // As for semaphores: never a read-write lock that silently excludes nobody.
            let err = CoordError::Unsupported {
                capability: Capability::ReadWriteLocks,
                key: key.clone(),
            };
            return refused(err, LockOutcome::BackendError);
        }
        if let Some(err) = replica_acks_refused(coordinator, spec.replica_acks, key) {
            return refused(err, LockOutcome::BackendError);
        }
        Ok(Acquisition {
            coordinator,
            key,
            spec,
            owner: OwnerToken::new(),
            outer,
            started: Instant::now(),
        })
    }

    /// The in-process provider's lock table, when this acquisition is a plain lock there.
    fn lock_table(&self) -> Option<&'a MemoryProvider> {
        match self.spec.rw {
            None if self.spec.permits == 0 => self.coordinator.in_process_locks(),
            _ => None,
        }
    }

    /// The free in-process grant, one step for every caller: the table answers at once, at
    /// this acquisition's own clock reading (the lease runs from `started`, which the table
    /// takes as the attempt's time: it reads no clock of its own), and nothing can drop the
    /// call between the attempt and the grant. A held lock is refused at once when the call
    /// does not wait; a caller that waits is queued, and its grant awaited.
    fn in_process(self, table: &'a MemoryProvider) -> InProcess<'a> {
        let spec = self.spec;
        let attempt = table.attempt_lock_at(
            self.key,
            self.owner,
            spec.lease,
            spec.wait,
            spec.fenced,
            self.started,
        );
        match attempt {
            Attempt::Granted(grant) => {
                let started = self.started;
                InProcess::Answered(Acquired::Granted(self.granted(grant, started)))
            }
            Attempt::Held => InProcess::Answered(self.not_acquired()),
            Attempt::Queued(waiter) => {
                InProcess::Queued(self, Box::pin(async move { Ok(waiter.wait().await) }))
            }
        }
    }

    /// The request to the provider of this kind of hold.
    fn ask(&self) -> GrantAnswer<'a> {
        let (coordinator, key, owner, spec) = (self.coordinator, self.key, self.owner, self.spec);
        if let Some(mode) = spec.rw {
            crate::runtime::rw_lock::acquire(coordinator, key, owner, mode, spec)
        } else if spec.permits > 0 {
            acquire_permit(coordinator, key, owner, spec)
        } else {
            coordinator.lock_provider().acquire(LockRequest {
                key,
                owner,
                lease: spec.lease,
                wait: spec.wait,
                fenced: spec.fenced,
            })
        }
    }

    /// `answer` to be awaited, under a drop guard that releases what it may have taken.
    fn pending(self, answer: GrantAnswer<'a>) -> Pending<'a> {
        let spec = self.spec;
        // Dropped armed, the answer was not read: a grant may have landed or may still land,
        // so the release keeps trying until it removes one.
        let guard = LeaseGuard::new(
            lease_store(self.coordinator, spec.permits > 0, spec.rw),
            self.key,
            self.owner,
            unanswered_grant_bound(spec.lease),
        )
        .unanswered();
        Pending {
            answer: replicas::scoped(spec.replica_acks, answer),
            guard,
            acquisition: self,
        }
    }

    /// The refusal of a lock that stayed held by others for all of `wait`.
    fn not_acquired(&self) -> Acquired {
        let err = CoordError::LockNotAcquired {
            key: self.key.clone(),
            waited: self.started.elapsed(),
        };
        Acquired::Refused(err, LockOutcome::NotAcquired)
    }

    /// The grant, in at `granted_at`: its hold (linked to the task's innermost hold) and its
    /// renewal.
    fn granted(self, grant: LockGrant, granted_at: Instant) -> Grant {
        let (spec, started) = (self.spec, self.started);
        // The lease began no earlier than the successful attempt was sent: for a first-attempt
        // grant that is `started`; after waiting, the last attempt was just now.
        let lease_from = match grant.lease_began {
            Some(at) => at,
            None if grant.contended => granted_at,
            None => started,
        };
        let waited = Elapsed::Between(started, grant.lease_began.unwrap_or(granted_at));
        let hold = Hold::new(HoldTerms {
            kind: match spec.rw {
                Some(mode) => HoldKind::Rw(mode),
                None if spec.permits > 0 => HoldKind::Permit,
                None => HoldKind::Lock,
            },
            key: self.key.clone(),
            owner: self.owner,
            lease: spec.lease,
            acquired_at: lease_from,
            fencing_token: grant.fencing_token,
            outer: self.outer,
            replica_acks: spec.replica_acks,
        });
        let renewal = spec
            .renew
            .map(|every| self.coordinator.renewer().register(hold.clone(), every));
        let outcome = if grant.contended {
            LockOutcome::Contended
        } else {
            LockOutcome::Acquired
        };
        Grant {
            hold,
            renewal,
            outcome,
            waited,
            granted_at,
        }
    }
}

/// An acquisition whose answer is awaited: the provider's request (or the in-process queue's
/// wait), and the guard that releases whatever it may have taken if this is dropped first.
pub(crate) struct Pending<'a> {
    acquisition: Acquisition<'a>,
    // Declared before the guard, so dropped before it (see `finish`).
    answer: GrantAnswer<'a>,
    guard: LeaseGuard<'a>,
}

impl Pending<'_> {
    /// Awaits the answer. Reads the clock once the grant is in when the call had to wait for
    /// it (the wait's end).
    pub(crate) async fn finish(self) -> Acquired {
        // Kept whole while the answer is awaited: if this is dropped then, the fields drop in
        // their declared order, the provider's request before the guard. That order matters:
        // the request's drop is what tells the provider a statement of this owner is still in
        // flight (PostgreSQL drains it before any later statement), and only then may the
        // guard's background release be sent; released first, on another connection and
        // another worker thread, it could overtake the acquire and leave the lock held.
        let mut pending = self;
        // Whether the provider answered in the first poll: then this call never waited for it.
        let mut at_once = true;
        let answered = std::future::poll_fn(|cx| {
            let polled = pending.answer.as_mut().poll(cx);
            at_once &= polled.is_ready();
            polled
        })
        .await;
        let Pending {
            acquisition,
            answer,
            mut guard,
        } = pending;
        drop(answer);
        let grant = match answered {
            Ok(Some(grant)) => grant,
            Ok(None) => {
                guard.disarm();
                return acquisition.not_acquired();
            }
            // The acquire may have landed before the fault, or may land after it: the guard
            // stays armed and releases it, until a release removes it.
            Err(err) => {
                drop(guard);
                let Acquisition {
                    coordinator,
                    key,
                    spec,
                    ..
                } = acquisition;
                return match backend_fault(coordinator, key, spec.on_backend_error, err, "lock") {
                    Ok(()) => Acquired::Unguarded,
                    Err(err) => Acquired::Refused(err, LockOutcome::BackendError),
                };
            }
        };
        guard.disarm();
        // A first-attempt grant answered in the first poll took only the provider's own work
        // in this poll: it is timed as granted at `started`, which saves a clock read (as long
        // as that whole attempt on a virtual machine). Any other grant kept this call waiting,
        // and the wait's end is read.
        let granted_at = if at_once && !grant.contended {
            acquisition.started
        } else {
            Instant::now()
        };
        Acquired::Granted(acquisition.granted(grant, granted_at))
    }
}

/// The acquisition of one permit of the semaphore `key` (`spec.permits` of them), answered as
/// a lock grant: a permit is always fenced.
fn acquire_permit<'a>(
    coordinator: &'a Coordinator,
    key: &'a CallKey,
    owner: OwnerToken,
    spec: &LockSpec,
) -> GrantAnswer<'a> {
    let answer = coordinator.semaphore_store().acquire_permit(PermitRequest {
        key,
        owner,
        limit: spec.permits,
        lease: spec.lease,
        wait: spec.wait,
    });
    Box::pin(answer.map(|granted| {
        granted.map(|grant| {
            grant.map(|grant| LockGrant {
                fencing_token: Some(grant.fencing_token),
                contended: grant.contended,
                lease_began: grant.lease_began,
            })
        })
    }))
}

/// Where a hold of this kind lives, for its drop guard.
pub(super) fn lease_store(
    coordinator: &Coordinator,
    permit: bool,
    rw: Option<RwMode>,
) -> LeaseStore<'_> {
    if let Some(mode) = rw {
        LeaseStore::Rw(coordinator.rw_lock_store(), mode)
    } else if permit {
        LeaseStore::Permit(coordinator.semaphore_store())
    } else {
        LeaseStore::Lock(coordinator.lock_provider())
    }
}
