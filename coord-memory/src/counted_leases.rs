//! Leased holds with a counter: what the semaphore and the read-write lock tables share.
//!
//! Both keep, per key, a set of holds that are leases with fencing tokens, a count of the
//! callers waiting on the key and one wake-up those waiters listen on. [`CountedLeases`] is
//! that map with its fencing counter; it runs one attempt under the key's shard lock (the kind
//! decides what is granted), the wait loop around the attempts, and the waiter's clean-up when
//! it leaves. What a hold may be granted against (a limit of permits, readers against a
//! writer and its claim) stays with each kind.

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use tokio::sync::Notify;
use tokio::time::Instant;

use coord_contract::{FencingToken, HoldInfo, LossCause, OwnerToken, RenewOutcome};

use crate::deadline_after;
use crate::fence::Fence;

/// One hold: its owner, when its lease ends, and its fencing token.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lease {
    pub(crate) owner: OwnerToken,
    pub(crate) expires_at: Instant,
    pub(crate) token: FencingToken,
}

impl Lease {
    /// Whether the lease still has time left at `now`.
    pub(crate) fn is_live(&self, now: Instant) -> bool {
        self.expires_at > now
    }

    /// The hold as the operations API shows it at `now`.
    pub(crate) fn info(&self, now: Instant) -> HoldInfo {
        HoldInfo::new(
            self.owner,
            self.expires_at.saturating_duration_since(now),
            Some(self.token),
        )
    }
}

/// The live holds among `holds` at `now`, soonest-ending first, as the operations API shows
/// them.
pub(crate) fn live_infos<'a>(
    holds: impl Iterator<Item = &'a Lease>,
    now: Instant,
) -> Vec<HoldInfo> {
    let mut live: Vec<&Lease> = holds.filter(|h| h.is_live(now)).collect();
    live.sort_by_key(|h| h.expires_at);
    live.into_iter().map(|h| h.info(now)).collect()
}

/// A renewal of `hold` (the renewing owner's, if it has one) to end at `lease_end`: renewed
/// while the lease is live at `now`; an ended lease is never revived.
pub(crate) fn renew(hold: Option<&mut Lease>, now: Instant, lease_end: Instant) -> RenewOutcome {
    match hold {
        Some(hold) if hold.is_live(now) => {
            hold.expires_at = lease_end;
            RenewOutcome::Renewed
        }
        _ => RenewOutcome::Lost(LossCause::Expired),
    }
}

/// The callers waiting on one key, and the wake-up they listen on.
#[derive(Default)]
pub(crate) struct Waiters {
    /// Callers waiting on this key; the entry stays while there are any.
    pub(crate) waiting: usize,
    /// Released holds are announced here (every waiter looks again; one of them may win).
    pub(crate) freed: Arc<Notify>,
}

/// One key's state in a [`CountedLeases`] map.
pub(crate) trait CountedEntry: Default {
    /// The key's waiters.
    fn waiters(&mut self) -> &mut Waiters;

    /// True when the entry holds nothing anybody needs (no holds, claims or waiters), so it
    /// may go.
    fn is_unused(&self) -> bool;

    /// `owner`, a waiter, stopped waiting (granted, out of time, or dropped); called after it
    /// is no longer counted.
    fn waiter_left(&mut self, _owner: OwnerToken) {}
}

/// Which look at a key an attempt is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Look {
    /// The only one: the caller does not wait if refused.
    Once,
    /// The first of a caller that waits if refused; a refusal counts it among the waiters.
    First,
    /// A later one, by a caller already counted.
    Again,
}

impl Look {
    /// Whether the caller waits if refused.
    pub(crate) fn waits(self) -> bool {
        self != Look::Once
    }
}

/// What one attempt found.
pub(crate) enum Try {
    Granted(FencingToken),
    /// Not now: look again at this instant at the latest, or when this wakes.
    Blocked(Instant, Arc<Notify>),
}

/// A hold granted by [`CountedLeases::acquire`].
pub(crate) struct Granted {
    pub(crate) token: FencingToken,
    /// Whether the caller had to wait.
    pub(crate) contended: bool,
    /// When the lease began (the table's clock).
    pub(crate) lease_began: Instant,
}

/// Keys to their leased holds, with one fencing counter.
#[derive(Default)]
pub(crate) struct CountedLeases<E> {
    entries: DashMap<Arc<str>, E>,
    fence: Fence,
}

impl<E: CountedEntry> CountedLeases<E> {
    /// The per-key entries.
    pub(crate) fn entries(&self) -> &DashMap<Arc<str>, E> {
        &self.entries
    }

    /// One attempt on `key`, under its shard lock: `decide` grants a hold (with a token from
    /// the fence it is given) or says until when the caller should wait at the latest. A
    /// refused [`Look::First`] counts the caller as waiting; an entry left unused goes.
    pub(crate) fn attempt(
        &self,
        key: &str,
        look: Look,
        decide: impl FnOnce(&mut E, &Fence) -> Result<FencingToken, Instant>,
    ) -> Try {
        let mut slot = self.entries.entry(Arc::from(key)).or_default();
        let entry = slot.value_mut();
        let next = match decide(entry, &self.fence) {
            Ok(token) => return Try::Granted(token),
            Err(next) => next,
        };
        let waiters = entry.waiters();
        if look == Look::First {
            waiters.waiting += 1;
        }
        let freed = waiters.freed.clone();
        let unused = entry.is_unused();
        drop(slot);
        if unused {
            // A refusal that leaves nothing behind (a limit of zero, which the runtime never
            // asks for) keeps no entry.
            self.entries.remove_if(key, |_, e| e.is_unused());
        }
        Try::Blocked(next, freed)
    }

    /// Takes a hold of `key` for `owner` with `attempt`, waiting up to `wait` (zero: one
    /// attempt). While it waits, the caller is counted on the key and looks again whenever
    /// the key's wake-up fires or the instant the last refusal named comes; its wake-up is
    /// armed before each look, so a release in between is not missed. `None` when every look
    /// was refused.
    pub(crate) async fn acquire(
        &self,
        key: &str,
        owner: OwnerToken,
        wait: Duration,
        mut attempt: impl FnMut(Look) -> Try,
    ) -> Option<Granted> {
        let started = Instant::now();
        let first = if wait.is_zero() {
            Look::Once
        } else {
            Look::First
        };
        let (next, freed) = match attempt(first) {
            Try::Granted(token) => {
                return Some(Granted {
                    token,
                    contended: false,
                    lease_began: started,
                });
            }
            Try::Blocked(..) if wait.is_zero() => return None,
            Try::Blocked(next, freed) => (next, freed),
        };
        let _waiting = Waiting {
            leases: self,
            key,
            owner,
        };
        let deadline = deadline_after(started, wait);
        let mut next = next;
        loop {
            let notified = freed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match attempt(Look::Again) {
                Try::Granted(token) => {
                    return Some(Granted {
                        token,
                        contended: true,
                        lease_began: Instant::now(),
                    });
                }
                Try::Blocked(again, _) => next = again.min(next.max(Instant::now())),
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(next.min(deadline)) => {}
            }
            next = deadline;
        }
    }
}

/// Counts a waiter on its key while it waits; when it leaves, lets the entry know and
/// removes the entry if nobody needs it any more.
struct Waiting<'a, E: CountedEntry> {
    leases: &'a CountedLeases<E>,
    key: &'a str,
    owner: OwnerToken,
}

impl<E: CountedEntry> Drop for Waiting<'_, E> {
    fn drop(&mut self) {
        if let Entry::Occupied(mut slot) = self.leases.entries.entry(Arc::from(self.key)) {
            let entry = slot.get_mut();
            let waiters = entry.waiters();
            waiters.waiting = waiters.waiting.saturating_sub(1);
            entry.waiter_left(self.owner);
            if entry.is_unused() {
                slot.remove();
            }
        }
    }
}
