//! Multi-key locks: `#[distributed_lock(key_from_each = "..")]` and
//! [`Coordinator::multi_lock`](crate::Coordinator::multi_lock).
//!
//! A multi-key lock is a set of plain locks held by one owner token. Its keys are sorted by
//! their bytes and de-duplicated first (the canonical order), so any two callers that take
//! overlapping sets take the keys they share in the same order, and neither can hold a key
//! the other needs while waiting for one the other holds: no deadlock by order.
//!
//! Two ways to take them, chosen per acquisition:
//!
//! * **Together**: when the provider has the atomic path
//!   ([`MultiLockStore`](crate::provider::MultiLockStore)) and says it keeps this set of keys
//!   together (one Redis server or hash slot, one process), one atomic step takes them all or
//!   none; a waiter waits on the first key it could not take and retries the whole set.
//! * **In order**: otherwise the keys are taken one by one in canonical order through the
//!   plain lock provider, each waiting for what is left of the caller's `wait`. When a key
//!   cannot be had (not acquired within the wait, a backend fault), everything already taken
//!   is released before the answer comes back. If the acquiring future is dropped half way,
//!   every key taken or in flight is released in the background (owner-checked).
//!
//! Either way, once granted every key is an ordinary hold (the same `Hold`, renewal, loss and
//! guard as a single lock), so a single-key lock and a multi-key lock on an overlapping key
//! exclude each other, and each key's fencing token comes from that key's own counter.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{join_all, select_all};
use tokio::time::Instant;

use crate::error::CoordError;
use crate::policy::OnLost;
use crate::provider::replicas;
use crate::provider::{
    BackendError, BackendErrorKind, CallKey, Capability, FencingToken, LockProvider, LockRequest,
    LossCause, MultiLockRequest, OwnerToken,
};
use crate::report::LockOutcome;
use crate::runtime::call::{Call, backend_fault, replica_acks_refused};
use crate::runtime::held;
use crate::runtime::lease_guard::{LeaseGuard, LeaseStore, unanswered_grant_bound};
use crate::runtime::lock::{Grant, LockGuard};
use crate::runtime::outcome::GuardedResult;
use crate::runtime::renewal::{Hold, HoldKind, HoldTerms};
use crate::runtime::spec::LockSpec;
use crate::runtime::state::Coordinator;

/// Sorts `keys` by their bytes and removes duplicates: the one order every multi-key lock
/// takes its keys in.
pub(crate) fn canonical(mut keys: Vec<CallKey>) -> Vec<CallKey> {
    keys.sort_unstable_by(|a, b| a.qualified().as_bytes().cmp(b.qualified().as_bytes()));
    keys.dedup();
    keys
}

/// What one multi-key acquisition came to.
pub(crate) enum MultiAcquired {
    /// Every key is held.
    Granted(MultiLockGuard),
    /// Refused: some key not acquired within `wait`, reentrant, shut down, or a backend fault
    /// under `fail_closed`. Nothing is held.
    Refused(CoordError),
    /// The backend failed and the policy is `fail_open`: run without the locks. Nothing is
    /// held (what was taken is released).
    Unguarded,
}

/// One key taken, before its hold exists.
struct TakenKey {
    key: CallKey,
    token: FencingToken,
    /// When its lease began, at the latest (this process's clock).
    lease_from: Instant,
}

/// The keys a multi-key acquisition has taken (or may have: a request in flight), released in
/// the background if the acquisition stops before they are handed to guards: a dropped
/// future, a refusal half way. Disarmed key by key as they are handed over.
struct Pending<'a> {
    locks: &'a Arc<dyn LockProvider>,
    owner: OwnerToken,
    keys: Vec<CallKey>,
    /// How long a clean-up can matter: a lease after the last attempt.
    bound: Duration,
    /// The keys' grant was not read yet (the atomic step in flight): a release that finds
    /// nothing proves nothing, so a drop's release keeps trying until it removes the key.
    unanswered: bool,
}

impl Pending<'_> {
    /// Releases every key now, owner-checked and awaited (so a caller refused half way sees
    /// none of them held once it has its answer); a release that fails is retried in the
    /// background.
    async fn roll_back(&mut self) {
        let keys = std::mem::take(&mut self.keys);
        let (locks, owner) = (self.locks, self.owner);
        let released = join_all(keys.iter().map(|key| locks.release(key, owner))).await;
        for (key, outcome) in keys.into_iter().zip(released) {
            if let Err(err) = outcome {
                tracing::warn!(key = %key, error = %err, "coord: releasing a key of a multi-key lock that could not be completed failed; retrying in the background until its lease ends");
                locks.clone().release_detached(key, owner, self.bound);
            }
        }
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        for key in self.keys.drain(..) {
            let locks = self.locks.clone();
            if self.unanswered {
                locks.release_unanswered_detached(key, self.owner, self.bound);
            } else {
                locks.release_detached(key, self.owner, self.bound);
            }
        }
    }
}

/// Takes every key of `keys` on the terms of `spec` (its `fenced` and `permits` are ignored:
/// every key of a multi-key lock is fenced). `runtime`: where the guards release when dropped
/// outside one.
pub(crate) async fn acquire_multi(
    coordinator: &Coordinator,
    keys: Vec<CallKey>,
    spec: &LockSpec,
    runtime: Option<tokio::runtime::Handle>,
) -> MultiAcquired {
    let keys = canonical(keys);
    let Some(first) = keys.first() else {
        return MultiAcquired::Refused(CoordError::Backend(BackendError::new(
            BackendErrorKind::Config,
            "a multi-key lock needs at least one key (the list was empty)",
        )));
    };
    let outer = held::innermost();
    if let Some(key) = keys
        .iter()
        .find(|key| held::chain_holds(outer.as_deref(), key, false))
    {
        return MultiAcquired::Refused(CoordError::Reentrant { key: key.clone() });
    }
    if coordinator.lifecycle().is_shut_down() {
        return MultiAcquired::Refused(CoordError::ShutDown { key: first.clone() });
    }
    if let Some(err) = replica_acks_refused(coordinator, spec.replica_acks, first) {
        return MultiAcquired::Refused(err);
    }
    let owner = OwnerToken::new();
    let started = Instant::now();
    let together = coordinator.supports(Capability::MultiKeyLocks)
        && coordinator.multi_lock_store().takes_together(&keys);
    let taking = async {
        if together {
            take_together(coordinator, &keys, owner, spec, started).await
        } else {
            take_in_order(coordinator, &keys, owner, spec, started).await
        }
    };
    // Every grant of the set, on either path, with the operation's replica acknowledgement.
    let taken = match spec.replica_acks {
        None => taking.await,
        Some(acks) => replicas::scope(acks, taking).await,
    };
    let (taken, contended) = match taken {
        Ok(Some(taken)) => taken,
        Ok(None) => {
            return MultiAcquired::Refused(CoordError::LockNotAcquired {
                key: first.clone(),
                waited: started.elapsed(),
            });
        }
        Err((key, err)) => {
            return match backend_fault(coordinator, &key, spec.on_backend_error, err, "lock") {
                Ok(()) => MultiAcquired::Unguarded,
                Err(err) => MultiAcquired::Refused(err),
            };
        }
    };
    let granted_at = Instant::now();
    // Each key's hold links to the previous one, so inside the body the task's chain of held
    // locks holds every key: reentrancy on any of them is seen, and `fencing_token_of` finds
    // each one's token.
    let mut chain = outer;
    let mut guards = Vec::with_capacity(taken.len());
    for TakenKey {
        key,
        token,
        lease_from,
    } in taken
    {
        let hold = Hold::new(HoldTerms {
            kind: HoldKind::Lock,
            key,
            owner,
            lease: spec.lease,
            acquired_at: lease_from,
            fencing_token: Some(token),
            outer: chain.take(),
            replica_acks: spec.replica_acks,
        });
        chain = Some(hold.clone());
        let grant = Grant::of_hold(
            coordinator,
            hold,
            spec.renew,
            contended,
            started,
            granted_at,
        );
        guards.push(LockGuard::new(coordinator, grant, runtime.clone()));
    }
    MultiAcquired::Granted(MultiLockGuard { guards, together })
}

/// The keys and whether the grant came after waiting; `Err` names the key a backend fault is
/// reported against.
type Taken = Result<Option<(Vec<TakenKey>, bool)>, (CallKey, BackendError)>;

/// All keys in one atomic step of the provider.
async fn take_together(
    coordinator: &Coordinator,
    keys: &[CallKey],
    owner: OwnerToken,
    spec: &LockSpec,
    started: Instant,
) -> Taken {
    let locks = coordinator.lock_provider();
    // Until the answer is in, every key may have been taken, or may still be: a drop releases
    // them all, each until a release removes it.
    let mut pending = Pending {
        locks,
        owner,
        keys: keys.to_vec(),
        bound: unanswered_grant_bound(spec.lease),
        unanswered: true,
    };
    let answer = coordinator
        .multi_lock_store()
        .acquire_all(MultiLockRequest {
            keys,
            owner,
            lease: spec.lease,
            wait: spec.wait,
        })
        .await;
    let grant = match answer {
        Ok(Some(grant)) => grant,
        Ok(None) => {
            pending.keys.clear();
            return Ok(None);
        }
        // The step may have landed before the fault, or may land after it: `pending`
        // releases every key.
        Err(err) => return Err((keys[0].clone(), err)),
    };
    pending.unanswered = false;
    if grant.fencing_tokens.len() != keys.len() {
        let err = BackendError::new(
            BackendErrorKind::Protocol,
            format!(
                "the provider granted {} fencing tokens for a multi-key lock of {} keys",
                grant.fencing_tokens.len(),
                keys.len()
            ),
        );
        pending.roll_back().await;
        return Err((keys[0].clone(), err));
    }
    pending.keys.clear();
    let lease_from = match grant.lease_began {
        Some(at) => at,
        None if grant.contended => Instant::now(),
        None => started,
    };
    let taken = keys
        .iter()
        .zip(grant.fencing_tokens)
        .map(|(key, token)| TakenKey {
            key: key.clone(),
            token,
            lease_from,
        })
        .collect();
    Ok(Some((taken, grant.contended)))
}

/// The keys one by one in canonical order through the plain lock provider; on any failure,
/// everything taken is released before answering.
async fn take_in_order(
    coordinator: &Coordinator,
    keys: &[CallKey],
    owner: OwnerToken,
    spec: &LockSpec,
    started: Instant,
) -> Taken {
    let locks = coordinator.lock_provider();
    // `None`: a wait too long to represent; every key may wait until it is granted.
    let deadline = started.checked_add(spec.wait);
    let mut pending = Pending {
        locks,
        owner,
        keys: Vec::with_capacity(keys.len()),
        bound: spec.lease.saturating_add(spec.wait),
        // Only keys whose grant was read join it; the key in flight has its own guard.
        unanswered: false,
    };
    let mut taken = Vec::with_capacity(keys.len());
    let mut contended = false;
    for key in keys {
        let wait = match deadline {
            Some(deadline) => deadline.saturating_duration_since(Instant::now()),
            None => Duration::MAX,
        };
        let sent = Instant::now();
        // The request in flight may land even if this future is dropped before its answer,
        // or after an error: its release keeps trying until it removes the key.
        let mut in_flight = LeaseGuard::new(
            LeaseStore::Lock(locks),
            key,
            owner,
            unanswered_grant_bound(spec.lease),
        )
        .unanswered();
        let answer = locks
            .acquire(LockRequest {
                key,
                owner,
                lease: spec.lease,
                wait: if spec.wait.is_zero() {
                    Duration::ZERO
                } else {
                    wait
                },
                fenced: true,
            })
            .await;
        match answer {
            Ok(Some(grant)) => {
                in_flight.disarm();
                pending.keys.push(key.clone());
                let Some(token) = grant.fencing_token else {
                    let err = BackendError::new(
                        BackendErrorKind::Protocol,
                        "the provider granted a fenced lock without a fencing token",
                    );
                    pending.roll_back().await;
                    return Err((key.clone(), err));
                };
                contended |= grant.contended;
                let lease_from = match grant.lease_began {
                    Some(at) => at,
                    None if grant.contended => Instant::now(),
                    None => sent,
                };
                taken.push(TakenKey {
                    key: key.clone(),
                    token,
                    lease_from,
                });
            }
            Ok(None) => {
                in_flight.disarm();
                pending.roll_back().await;
                return Ok(None);
            }
            Err(err) => {
                // This key's acquire may have landed: its guard releases it in the
                // background; the keys taken before it are released now.
                drop(in_flight);
                pending.roll_back().await;
                return Err((key.clone(), err));
            }
        }
    }
    pending.keys.clear();
    Ok(Some((taken, contended)))
}

/// A held multi-key lock: from [`MultiLock::acquire`](crate::handle::MultiLock::acquire).
///
/// One guard for every key, in canonical order (sorted by the key's bytes, duplicates removed).
/// Each key is an ordinary lock of this guard's owner, with its own fencing token from that
/// key's own counter ([`MultiLockGuard::fencing_token`]) and its own lease, renewed (when
/// asked for) like any lock's; the guard is lost as soon as any key is
/// ([`MultiLockGuard::lost`]), and releases every key when released or dropped (owner-checked,
/// in the background when dropped; renewal stops first, so no renewal outlives the release).
///
/// What it does not promise: the keys are not one lease. Each can be lost on its own (an
/// operator, a backend failover, a lease outrun), and between the loss of one key and the
/// release of the others the guard still holds those others; pass each key's token to the
/// resource that key protects.
#[must_use = "dropping the guard releases every key"]
pub struct MultiLockGuard {
    /// One per key, in canonical order.
    guards: Vec<LockGuard>,
    together: bool,
}

impl std::fmt::Debug for MultiLockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiLockGuard")
            .field("keys", &self.guards)
            .field("taken_together", &self.together)
            .finish()
    }
}

impl MultiLockGuard {
    /// The locked keys, in canonical order (sorted by their bytes, without duplicates).
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &CallKey> {
        self.guards.iter().map(LockGuard::key)
    }

    /// The fencing token of `key`, while this guard holds it (not known lost, its lease not
    /// run out on the local clock); `None` for a key the guard does not hold or no longer
    /// holds. Greater than every token minted before it for `key` by any lock, single or
    /// multi-key.
    pub fn fencing_token(&self, key: &CallKey) -> Option<FencingToken> {
        self.guards
            .iter()
            .find(|guard| guard.key() == key)
            .and_then(LockGuard::fencing_token)
    }

    /// Every key with its fencing token (`None` once that key is no longer held), in
    /// canonical order.
    pub fn fencing_tokens(
        &self,
    ) -> impl ExactSizeIterator<Item = (&CallKey, Option<FencingToken>)> {
        self.guards
            .iter()
            .map(|guard| (guard.key(), guard.fencing_token()))
    }

    /// True while every key is held (not known lost, lease not run out locally). A best
    /// effort, as for a single lock.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// True when the keys were taken in one atomic step of the provider (all or nothing); false
    /// when they were taken one by one in canonical order (a provider without
    /// [`Capability::MultiKeyLocks`], or keys it does not keep together, such as keys of
    /// different Redis Cluster hash slots).
    pub fn taken_together(&self) -> bool {
        self.together
    }

    /// Resolves once any key is lost, with that key and why (see [`LockGuard::lost`]).
    pub async fn lost(&self) -> (&CallKey, LossCause) {
        let watches = self.guards.iter().map(|guard| {
            Box::pin(async move { (guard.key(), guard.lost().await) })
                as std::pin::Pin<Box<dyn Future<Output = _> + Send + '_>>
        });
        select_all(watches).await.0
    }

    /// How long the keys have been held (since the first was granted).
    pub fn held_for(&self) -> Duration {
        self.guards
            .iter()
            .map(LockGuard::held_for)
            .max()
            .unwrap_or_default()
    }

    /// Releases every key. `Ok(true)`: each was ours and is free now; `Ok(false)`: some key was
    /// not ours any more (its lease had lapsed or an operator forced it free: the section was
    /// not exclusive throughout on that key; logged with the cause). A backend error means some
    /// release may not have landed: it is retried in the background until its lease is over;
    /// the other keys are released all the same.
    pub async fn release(self) -> Result<bool, CoordError> {
        let released = join_all(self.guards.into_iter().map(LockGuard::release)).await;
        let mut all_ours = true;
        let mut first_err = None;
        for outcome in released {
            match outcome {
                Ok(ours) => all_ours &= ours,
                Err(err) => {
                    first_err.get_or_insert(err);
                }
            }
        }
        match first_err {
            Some(err) => Err(err),
            None => Ok(all_ours),
        }
    }

    /// The innermost hold (the last key's), whose chain holds every key.
    fn innermost(&self) -> Arc<Hold> {
        self.guards
            .last()
            .expect("a multi-key lock holds at least one key")
            .hold()
            .clone()
    }
}

/// The fencing token of `key` among the locks the current task holds, for a body that holds
/// several (`#[distributed_lock(key_from_each = ..)]`, [`MultiLock::run`](crate::handle::MultiLock::run)):
/// `None` outside such a body, for a key it does not hold or holds unfenced, and once that
/// key's hold is known lost or its lease has run out on the local clock. Inside the body of a
/// single fenced lock it reads that lock's token as well (for its own key).
pub fn fencing_token_of(key: &CallKey) -> Option<FencingToken> {
    let mut at = held::innermost();
    while let Some(hold) = at {
        if hold.key == *key && !hold.is_permit() {
            return hold.fencing_token.filter(|_| hold.is_held());
        }
        at = hold.outer.clone();
    }
    None
}

/// Runs `body` while holding every key of `keys`: the multi-key form of
/// [`distributed_lock`](crate::runtime::lock::distributed_lock). Every key is released when the
/// body ends (or is cancelled, or panics); with `on_lost = "cancel"` (the default with
/// renewal) the loss of any key cancels the body and answers [`CoordError::LockLost`] naming
/// that key and its cause.
pub async fn distributed_multi_lock<R, F>(call: &Call<'_>, keys: Vec<CallKey>, body: F) -> R
where
    R: GuardedResult,
    F: Future<Output = R>,
{
    if let Some(err) = call.profile_error() {
        return R::from_coord_error(err);
    }
    let spec = call
        .lock
        .as_ref()
        .expect("the macro emits a lock spec with #[distributed_lock]");
    let guard = match acquire_multi(call.coordinator, keys, spec, None).await {
        MultiAcquired::Granted(guard) => guard,
        MultiAcquired::Refused(err) => {
            call.record_lock(refused_outcome(&err), None);
            call.record_error(&err);
            return R::from_coord_error(err);
        }
        MultiAcquired::Unguarded => {
            call.record_lock(LockOutcome::FailedOpen, None);
            return body.await;
        }
    };
    call.record_lock(LockOutcome::Acquired, None);
    let body = held::scope(guard.innermost(), body);
    let output = if spec.on_lost == Some(OnLost::Cancel) {
        tokio::pin!(body);
        tokio::select! {
            biased;
            (key, cause) = guard.lost() => Err((key.clone(), cause)),
            output = &mut body => Ok(output),
        }
    } else {
        Ok(body.await)
    };
    match output {
        Ok(output) => {
            if guard.release().await.is_err() {
                call.record_settling_in_background();
            }
            output
        }
        Err((key, cause)) => {
            let held_for = guard.held_for();
            // The owner-checked releases of the other keys finish in the background.
            drop(guard);
            call.record_lock(LockOutcome::Lost, None);
            call.record_lock_lost(cause);
            R::from_coord_error(CoordError::LockLost {
                key,
                held_for,
                cause,
            })
        }
    }
}

/// The report's lock outcome of a refused multi-key acquisition.
fn refused_outcome(err: &CoordError) -> LockOutcome {
    match err {
        CoordError::LockNotAcquired { .. } => LockOutcome::NotAcquired,
        CoordError::Reentrant { .. } => LockOutcome::Reentrant,
        CoordError::ShutDown { .. } => LockOutcome::ShutDown,
        _ => LockOutcome::BackendError,
    }
}

/// A collection whose elements each name one lock of `#[distributed_lock(key_from_each =
/// "..")]`: slices, arrays, `Vec`, `VecDeque`, `BTreeSet`, `HashSet` (and references and
/// boxes of them) whose elements are [`KeyPart`](crate::KeyPart)s. The generated code requires
/// it of the named parameter, so a parameter that is not such a collection fails to compile.
#[diagnostic::on_unimplemented(
    message = "`key_from_each` needs a collection of key parts, and `{Self}` is not one",
    label = "not a collection of key parts: `key_from_each` takes one lock per element",
    note = "name a parameter of type Vec, slice, array, VecDeque, BTreeSet or HashSet whose elements are key parts (integers, strings, Uuid...), or use `key_from` for one lock"
)]
pub trait EachKeyPart {
    /// Calls `each` with every element, in the collection's order.
    fn each_part(&self, each: &mut dyn FnMut(&dyn crate::KeyPart));
}

impl<T: crate::KeyPart> EachKeyPart for [T] {
    fn each_part(&self, each: &mut dyn FnMut(&dyn crate::KeyPart)) {
        for part in self {
            each(part);
        }
    }
}

impl<T: crate::KeyPart, const N: usize> EachKeyPart for [T; N] {
    fn each_part(&self, each: &mut dyn FnMut(&dyn crate::KeyPart)) {
        self.as_slice().each_part(each);
    }
}

impl<T: crate::KeyPart> EachKeyPart for Vec<T> {
    fn each_part(&self, each: &mut dyn FnMut(&dyn crate::KeyPart)) {
        self.as_slice().each_part(each);
    }
}

impl<T: crate::KeyPart> EachKeyPart for std::collections::VecDeque<T> {
    fn each_part(&self, each: &mut dyn FnMut(&dyn crate::KeyPart)) {
        for part in self {
            each(part);
        }
    }
}

impl<T: crate::KeyPart> EachKeyPart for std::collections::BTreeSet<T> {
    fn each_part(&self, each: &mut dyn FnMut(&dyn crate::KeyPart)) {
        for part in self {
            each(part);
        }
    }
}

impl<T: crate::KeyPart, S> EachKeyPart for std::collections::HashSet<T, S> {
    fn each_part(&self, each: &mut dyn FnMut(&dyn crate::KeyPart)) {
        for part in self {
            each(part);
        }
    }
}

impl<C: EachKeyPart + ?Sized> EachKeyPart for &C {
    fn each_part(&self, each: &mut dyn FnMut(&dyn crate::KeyPart)) {
        (**self).each_part(each);
    }
}

impl<C: EachKeyPart + ?Sized> EachKeyPart for &mut C {
    fn each_part(&self, each: &mut dyn FnMut(&dyn crate::KeyPart)) {
        (**self).each_part(each);
    }
}

impl<C: EachKeyPart + ?Sized> EachKeyPart for Box<C> {
    fn each_part(&self, each: &mut dyn FnMut(&dyn crate::KeyPart)) {
        (**self).each_part(each);
    }
}

impl<C: EachKeyPart + ?Sized> EachKeyPart for Arc<C> {
    fn each_part(&self, each: &mut dyn FnMut(&dyn crate::KeyPart)) {
        (**self).each_part(each);
    }
}

/// The keys of a `key_from_each` call: one per element of `items`, each the operation's key
/// with that element as its one part (named `name`, the parameter, for the missing-key
/// error). What the generated code calls.
pub fn each_key<C: EachKeyPart + ?Sized>(
    call: &Call<'_>,
    items: &C,
    name: &'static str,
) -> Vec<CallKey> {
    let mut keys = Vec::new();
    items.each_part(&mut |part| {
        keys.push(
            CallKey::builder(call.coordinator.namespace(), call.spec.name)
                .named_part(name, part)
                .finish(),
        );
    });
    keys
}
