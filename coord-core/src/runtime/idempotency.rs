//! The `#[idempotent]` layer.

use std::future::Future;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use std::time::Duration;

use crate::error::{CoordError, NotStoredCause};
use crate::policy::{OnAbandoned, OnBackendError, OnLost, OnMissingKey, OnStoreError};
use crate::provider::CallKey;
use crate::provider::background::spawn_retried;
use crate::provider::replicas;
use crate::provider::time::deadline_after;
use crate::provider::{BackendError, BackendErrorKind};
use crate::provider::{
    ClaimOutcome, ClaimRequest, CompleteOutcome, CompleteRequest, Fingerprint, IdempotencyStore,
    OwnerToken,
};
use crate::report::IdempotencyOutcome;
use crate::runtime::call::{Call, replica_acks_refused};
use crate::runtime::detach::DetachOnDrop;
use crate::runtime::lease_guard::{LeaseGuard, LeaseStore};
use crate::runtime::outcome::GuardedResult;
use crate::runtime::renewal::{Hold, HoldKind, HoldTerms, Registration, Renewer, lease_checked};
use crate::runtime::spec::IdempotencySpec;

/// The one place fingerprints are compared. A record stored without a fingerprint (the
/// operation had none when it was written), or a call without one, is not compared.
fn check_fingerprint(
    call: &Call<'_>,
    ours: Option<Fingerprint>,
    stored: Option<Fingerprint>,
) -> Result<(), CoordError> {
    match (ours, stored) {
        (Some(ours), Some(stored)) if ours != stored => Err(CoordError::KeyReused {
            key: call.key.clone(),
        }),
        _ => Ok(()),
    }
}

enum Claim<R> {
    /// Claimed; the claim was sent at this instant (the marker's lease began no earlier).
    Owned(tokio::time::Instant),
    Answer(R),
    Unguarded,
}

/// What the layer decided before the body: answer without it, run it without the layer, or
/// run it as the owner of a fresh in-flight marker. Shared by the plain and the transactional
/// form, so both refuse, replay and wait alike.
pub(crate) enum Admission<R> {
    /// A replay or a refusal: the body does not run.
    Answer(R),
    /// Run the body without the layer (`fail_open`, `on_missing_key = "run_unprotected"`).
    Unguarded,
    /// The key is claimed: the body runs as the owner of its marker.
    Owned {
        owner: OwnerToken,
        /// When the claim was sent (the marker's lease began no earlier).
        claimed_at: tokio::time::Instant,
        fingerprint: Option<Fingerprint>,
    },
}

/// Everything before the body: the profile, the key, the fingerprint, the claim (with its
/// waits and replays). `transactional` claims are refused on a store that does not take them,
/// whatever the backend-fault policy: running the body unguarded would write its effects with
/// no record to match.
pub(crate) async fn admit<R>(
    call: &Call<'_>,
    fingerprint: Option<Result<Fingerprint, String>>,
    transactional: bool,
) -> Admission<R>
where
    R: GuardedResult,
    R::Ok: DeserializeOwned,
{
    if let Some(err) = call.profile_error() {
        return Admission::Answer(R::from_coord_error(err));
    }
    let spec = call
        .idempotency
        .as_ref()
        .expect("the macro emits an idempotency spec with #[idempotent]");
    let store = call.coordinator.idempotency_store();
    if transactional && !store.transactional_claims() {
        let err = CoordError::Backend(
            BackendError::new(
                BackendErrorKind::Config,
                "this coordinator's provider cannot write idempotency records in a database transaction (it does not take transactional claims); use the provider whose records live in the transaction's database",
            )
            .with_key(&call.key),
        );
        call.record_idempotency(IdempotencyOutcome::BackendError);
        call.record_error(&err);
        return Admission::Answer(R::from_coord_error(err));
    }
    if let Some(part) = call.absent_part {
        return match missing_key(call, spec, part) {
            Ok(()) => Admission::Unguarded,
            Err(err) => Admission::Answer(R::from_coord_error(err)),
        };
    }
    let fingerprint = match fingerprint.transpose() {
        Ok(fp) => fp,
        Err(message) => {
            return Admission::Answer(R::from_coord_error(CoordError::Codec {
                key: call.key.clone(),
                message: format!("fingerprint parameters did not serialize: {message}"),
            }));
        }
    };
    let owner = OwnerToken::new();
    match claim(call, store, owner, fingerprint, transactional).await {
        Claim::Answer(answer) => Admission::Answer(answer),
        Claim::Unguarded => Admission::Unguarded,
        Claim::Owned(claimed_at) => {
            call.record_idempotency(IdempotencyOutcome::Executed);
            Admission::Owned {
                owner,
                claimed_at,
                fingerprint,
            }
        }
    }
}

/// Runs `body` at most once per key within the retention period, replaying a stored success.
pub async fn idempotent<R, F>(
    call: &Call<'_>,
    fingerprint: Option<Result<Fingerprint, String>>,
    body: F,
) -> R
where
    R: GuardedResult,
    R::Ok: Serialize + DeserializeOwned,
    F: Future<Output = R>,
{
    let (owner, claimed_at, fingerprint) = match admit(call, fingerprint, false).await {
        Admission::Answer(answer) => return answer,
        Admission::Unguarded => return body.await,
        Admission::Owned {
            owner,
            claimed_at,
            fingerprint,
        } => (owner, claimed_at, fingerprint),
    };
    let spec = call.idempotency.as_ref().expect("admitted with a spec");
    let store = call.coordinator.idempotency_store();

    // The marker as a lease: renewed while the body runs when asked, and while completion
    // retries in any case; its local end bounds how long completion keeps trying.
    let hold = Hold::new(HoldTerms {
        kind: HoldKind::Marker,
        key: call.key.clone(),
        owner,
        lease: spec.in_flight_lease,
        acquired_at: claimed_at,
        fencing_token: None,
        outer: None,
        replica_acks: spec.replica_acks,
    });
    // Listed for shutdown's report while the body runs and its outcome is stored.
    let _registered = call.coordinator.lifecycle().register_marker(hold.clone());
    // Clears the marker if the call stops before settling it (cancelled or panicked), so
    // duplicates are not blocked until its lease ends. Under `on_abandoned = "fail"` only until
    // the body starts: a body stopped half-way may have had effects, so its marker is never
    // cleared for a duplicate to run again, but its lease is ended at once, owner-checked, in
    // the background: it is the abandoned record (`OutcomeUnknown`) from then on, not a key
    // blocked `InFlight` for work that has stopped. A call dropped before its body was first
    // polled (while a lock was awaited, say) did nothing, and leaves nothing.
    let mut marker = LeaseGuard::new(
        LeaseStore::Marker(store),
        &call.key,
        owner,
        spec.in_flight_lease,
    )
    .held_as(&hold);
    if spec.on_abandoned == OnAbandoned::Fail {
        marker = marker.ending_lease_once(call.body_started());
    }
    let output = if spec.renew.is_some() || spec.on_lost.is_some() {
        let renewal = spec
            .renew
            .map(|every| call.coordinator.renewer().register(hold.clone(), every));
        let output = run_marked(&hold, spec.on_lost, renewal.as_ref(), body).await;
        drop(renewal);
        match output {
            Some(output) => output,
            None => {
                // The marker is gone or about to be: the abandon on drop is an owner-checked
                // no-op at worst, and the caller learns its work was stopped.
                call.record_idempotency(IdempotencyOutcome::Lost);
                call.record_loss(hold.loss_cause());
                return R::from_coord_error(CoordError::LockLost {
                    key: call.key.clone(),
                    held_for: hold.held_for(),
                    cause: hold.loss_cause(),
                });
            }
        }
    } else {
        body.await
    };
    // From here on the work is done: settling the record must survive the caller dropping us.
    marker.disarm();
    let Some(ok) = output.ok_ref() else {
        // A failure leaves no trace: free the key for a retry.
        if !abandon_marker(Arc::clone(store), hold.clone()).await {
            call.record_settling_in_background();
        }
        return output;
    };
    // Encode, and decode back before storing: a record that could not be replayed is never
    // written. A value the codec cannot carry is reported like any other unstored outcome; the
    // marker is left to lapse, so `on_abandoned` decides what a duplicate gets.
    let payload = match call.coordinator.codec().encode_checked(ok) {
        Ok(bytes) => Arc::<[u8]>::from(bytes),
        Err(message) => return not_stored(call, spec, output, NotStoredCause::Codec(message)),
    };
    call.telemetry().record_size(payload.len());
    // Counted for shutdown, which gives completions time to finish, also when the caller
    // stopped waiting and the write goes on in the background.
    let completing = call.coordinator.lifecycle().completing();
    // The caller waits for a few attempts only (each bounded by the provider's command
    // timeout); if the store has not answered by then, the rest of the retries go on in the
    // background and the caller learns now that its outcome is not stored (yet).
    let hand_over = Arc::new(HandOver::default());
    let write = store_outcome(
        Arc::clone(store),
        call.coordinator.renewer().clone(),
        hold.clone(),
        payload,
        spec.retention,
        fingerprint,
        Some(hand_over.clone()),
    );
    let mut stored = DetachOnDrop::new(async move {
        let stored = write.await;
        drop(completing);
        stored
    });
    // Waiting on a `Notify` rather than a channel: a write that ends on its own wakes nobody
    // (a dropped sender would wake this task once more after the call returned, and whoever
    // polls the task next would take that for a wake-up of its own).
    let gave_up = hand_over.notify.notified();
    let stored = tokio::select! {
        biased;
        stored = &mut stored => stored,
        () = gave_up => {
            let last_error = hand_over
                .last_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .expect("the write hands over its latest error before notifying");
            // Dropping the write hands it to the background, where it keeps trying while the
            // marker can be ours.
            drop(stored);
            call.record_settling_in_background();
            return not_stored(call, spec, output, NotStoredCause::Backend(last_error));
        }
    };
    match stored {
        Ok(CompleteOutcome::StoredWithoutMarker) => {
            tracing::warn!(key = %call.key, "coord: the in-flight marker was gone at completion (lease lapsed, evicted, or the server restarted); nobody had claimed the key, so the outcome was stored anyway");
            output
        }
        Ok(_) => output,
        Err(cause) => not_stored(call, spec, output, cause),
    }
}

/// How the outcome's write tells its caller that it stops waiting: the latest error, then a
/// notification.
#[derive(Default)]
struct HandOver {
    last_error: std::sync::Mutex<Option<BackendError>>,
    notify: tokio::sync::Notify,
}

/// How many completion attempts a caller waits for before the outcome's write goes on in the
/// background and the caller is answered (`OutcomeNotStored`). Each attempt is bounded by the
/// provider's command timeout, so a caller waits about this many command timeouts (plus
/// 75 ms of backoff), or [`CALLER_COMPLETION_FLOOR`] if that is longer, whatever the server
/// does.
pub(crate) const CALLER_COMPLETION_ATTEMPTS: u32 = 3;

/// The least time a caller keeps trying to store its outcome, from the first attempt: attempts
/// that fail fast (a read-only or restarting server answering at once) are given this long to
/// succeed before the caller is answered. With the caller's attempts, the caller waits for
/// `max(3 attempts, 750 ms)`; a stalled server's attempts last a command timeout each.
pub(crate) const CALLER_COMPLETION_FLOOR: Duration = Duration::from_millis(750);

/// Clears the marker `hold` of a call whose body failed, owner-checked, so the key is free
/// for a retry; survives the caller dropping the call. If the abandon cannot be confirmed it
/// is retried in the background until the marker's lease ends, and `false` is returned (the
/// clean-up is not settled yet): one attempt, bounded by the provider's command timeout, is
/// all the caller waits for.
pub(crate) async fn abandon_marker(store: Arc<dyn IdempotencyStore>, hold: Arc<Hold>) -> bool {
    DetachOnDrop::new(async move {
        match store.abandon(&hold.key, hold.owner()).await {
            Ok(_) => true,
            Err(err) => {
                tracing::warn!(key = %hold.key, error = %err, "coord: clearing the in-flight marker failed; retrying in the background");
                let (key, owner, left) = (hold.key.clone(), hold.owner(), hold.lease_left());
                store.abandon_detached(key, owner, left);
                false
            }
        }
    })
    .await
}

/// A key part was `None`: refuse (the error), or run without the layer (`Ok`), as the
/// operation chose.
fn missing_key(
    call: &Call<'_>,
    spec: &IdempotencySpec,
    part: Option<&'static str>,
) -> Result<(), CoordError> {
    match spec.on_missing_key {
        OnMissingKey::Fail => {
            call.record_idempotency(IdempotencyOutcome::MissingKey);
            Err(CoordError::MissingKey {
                op: call.spec.name.to_owned(),
                part: part.map(str::to_owned),
            })
        }
        OnMissingKey::RunUnprotected => {
            call.record_idempotency(IdempotencyOutcome::Unprotected);
            call.coordinator.metrics().count_unprotected();
            tracing::warn!(
                op = call.spec.name,
                part,
                "coord: idempotency key absent; running without idempotency (on_missing_key = run_unprotected)"
            );
            Ok(())
        }
    }
}

/// The body ran and its `Ok` is not stored: say so, through the error or, when the operation
/// opted in, through the report alone.
fn not_stored<R: GuardedResult>(
    call: &Call<'_>,
    spec: &IdempotencySpec,
    output: R,
    cause: NotStoredCause,
) -> R {
    call.record_idempotency(IdempotencyOutcome::NotStored);
    call.coordinator.metrics().count_not_stored();
    tracing::error!(key = %call.key, cause = %cause, "coord: the body ran but its outcome was not stored; a duplicate may not replay it");
    match spec.on_store_error {
        OnStoreError::Error => R::from_coord_error(CoordError::OutcomeNotStored {
            key: call.key.clone(),
            cause,
        }),
        OnStoreError::ReturnOk => output,
    }
}

/// Runs the body as the holder of the marker `hold`, watching for its loss as `on_lost` says.
pub(crate) async fn run_marked<F: Future>(
    hold: &Arc<Hold>,
    on_lost: Option<OnLost>,
    renewal: Option<&Registration>,
    body: F,
) -> Option<F::Output> {
    tokio::pin!(body);
    let driver = async {
        match renewal {
            Some(registration) => registration.keep_driver_alive().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(driver);
    let cancel_on_loss = on_lost == Some(OnLost::Cancel);
    // The marker's lease is checked before each poll of the body: after a stall, its loss wins.
    let checked = lease_checked(hold, cancel_on_loss, body);
    tokio::select! {
        biased;
        output = checked => output,
        _ = hold.lost(), if cancel_on_loss => None,
        _ = &mut driver => None,
    }
}

/// Stores the outcome, retrying while the in-flight marker can still be ours.
///
/// Each failed attempt is followed by a new one (a new command, on a healthy connection) with
/// backoff; while retrying, the marker is renewed so a slow store does not let a duplicate in.
/// Gives up, after at least three attempts, once the marker can no longer be ours (its lease
/// ended by the local clock, renewals that the backend confirms extending it) or once a whole
/// lease has passed since the first failure: a store that renews but never completes must not
/// keep the caller (and the key) forever. A completion that finds the marker gone but the key
/// unclaimed stores the record anyway (the provider does it in one step); one that finds
/// another owner reports the double run.
///
/// `caller`: told the latest error once [`CALLER_COMPLETION_ATTEMPTS`] attempts failed over at
/// least [`CALLER_COMPLETION_FLOOR`] and more are to come, so the caller can answer while this
/// goes on without it.
async fn store_outcome(
    store: Arc<dyn IdempotencyStore>,
    renewer: Renewer,
    hold: Arc<Hold>,
    payload: Arc<[u8]>,
    retention: Duration,
    fingerprint: Option<Fingerprint>,
    mut caller: Option<Arc<HandOver>>,
) -> Result<CompleteOutcome, NotStoredCause> {
    let mut renewal = None;
    let mut backoff = Duration::from_millis(25);
    let mut attempts = 0u32;
    let mut give_up_at = None;
    let first_sent = tokio::time::Instant::now();
    loop {
        attempts += 1;
        let completing = store.complete(CompleteRequest {
            key: &hold.key,
            owner: hold.owner(),
            payload: payload.clone(),
            retention,
            fingerprint,
        });
        let outcome = replicas::scoped(hold.replica_acks(), completing).await;
        let err = match outcome {
            Ok(CompleteOutcome::Superseded { other, completed }) => {
                tracing::error!(
                    key = %hold.key,
                    owner = %hold.owner(),
                    other_owner = ?other.map(|o| o.to_string()),
                    other_completed = completed,
                    "coord: the in-flight marker was lost and another caller claimed the key: the body ran twice; this outcome was not stored"
                );
                return Err(NotStoredCause::DoubleRun { other });
            }
            Ok(stored) => {
                if caller.is_none() {
                    tracing::info!(key = %hold.key, attempts, "coord: the outcome was stored in the background after the caller was answered; duplicates replay it");
                }
                return Ok(stored);
            }
            Err(err) => err,
        };
        let now = tokio::time::Instant::now();
        let give_up_at = *give_up_at.get_or_insert_with(|| deadline_after(now, hold.lease()));
        let exhausted = !hold.is_held() || now >= give_up_at;
        if !err.kind().is_transient() || (exhausted && attempts >= 3) {
            if caller.is_none() {
                tracing::warn!(key = %hold.key, error = %err, attempts, "coord: storing the outcome in the background failed until the in-flight marker could no longer be ours; it is not stored");
            }
            return Err(NotStoredCause::Backend(err));
        }
        if attempts >= CALLER_COMPLETION_ATTEMPTS
            && now.saturating_duration_since(first_sent) >= CALLER_COMPLETION_FLOOR
            && let Some(caller) = caller.take()
        {
            // The caller stops waiting here (a permit is kept if it is between polls); if it
            // is gone already, nothing is lost.
            *caller.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(err.clone());
            caller.notify.notify_one();
        }
        if renewal.is_none() {
            let every = (hold.lease() / 3).max(Duration::from_millis(1));
            renewal = Some(renewer.register(hold.clone(), every));
        }
        tracing::warn!(key = %hold.key, error = %err, attempt = attempts, "coord: storing the outcome failed; retrying while the in-flight marker is ours");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

async fn claim<R>(
    call: &Call<'_>,
    store: &Arc<dyn IdempotencyStore>,
    owner: OwnerToken,
    fingerprint: Option<Fingerprint>,
    transactional: bool,
) -> Claim<R>
where
    R: GuardedResult,
    R::Ok: DeserializeOwned,
{
    let spec = call.idempotency.as_ref().expect("checked by caller");
    let key = &call.key;
    // A duplicate in flight is waited for until `wait` after the first claim was sent, timed
    // from the clock read that times the marker's lease: a replay reads the clock once.
    let mut wait_until = None;
    let refuse = |outcome, err: CoordError| {
        call.record_idempotency(outcome);
        call.record_error(&err);
        Claim::Answer(R::from_coord_error(err))
    };
    if call.coordinator.lifecycle().is_shut_down() {
        let err = CoordError::ShutDown { key: key.clone() };
        return refuse(IdempotencyOutcome::ShutDown, err);
    }
    if let Some(err) = replica_acks_refused(call.coordinator, spec.replica_acks, key) {
        return refuse(IdempotencyOutcome::BackendError, err);
    }
    loop {
        let sent_at = tokio::time::Instant::now();
        let wait_until = *wait_until.get_or_insert_with(|| deadline_after(sent_at, spec.wait));
        // Armed before the claim is first polled, so before the command can leave the process
        // on any path (a pooled connection's first use, a dial or redial, a script load): if
        // this future is dropped before the answer is in, or the answer is a fault that may
        // hide a landed claim, the claim is cleared, owner-checked, whatever became of it.
        let mut unanswered = UnansweredClaim {
            store,
            key,
            owner,
            lease: spec.in_flight_lease,
            armed: true,
        };
        let claiming = store.claim(ClaimRequest {
            key,
            owner,
            in_flight_lease: spec.in_flight_lease,
            fingerprint,
            keep_abandoned_for: match spec.on_abandoned {
                OnAbandoned::Rerun => None,
                OnAbandoned::Fail => Some(spec.retention),
            },
            transactional,
        });
        let found = replicas::scoped(spec.replica_acks, claiming).await;
        let found = match found {
            Ok(found) => {
                // Answered: a claim is the marker guard's from here on, anything else left
                // nothing of ours behind.
                unanswered.armed = false;
                found
            }
            Err(err) => {
                // Only a transient fault can hide a claim that landed; the guard clears it.
                unanswered.armed = err.kind().is_transient();
                drop(unanswered);
                return backend_fault(call, spec.on_backend_error, err);
            }
        };
        match found {
            ClaimOutcome::Claimed => return Claim::Owned(sent_at),
            ClaimOutcome::Completed {
                payload,
                fingerprint: stored,
                age,
            } => {
                if let Err(err) = check_fingerprint(call, fingerprint, stored) {
                    return refuse(IdempotencyOutcome::KeyReused, err);
                }
                return match call.coordinator.codec().decode::<R::Ok>(&payload) {
                    Ok(value) => {
                        call.record_replay_age(age);
                        call.record_idempotency(IdempotencyOutcome::Replayed);
                        Claim::Answer(R::from_ok(value))
                    }
                    Err(message) => refuse(
                        IdempotencyOutcome::BackendError,
                        CoordError::Codec {
                            key: call.key.clone(),
                            message,
                        },
                    ),
                };
            }
            ClaimOutcome::Abandoned {
                fingerprint: stored,
            } => {
                if let Err(err) = check_fingerprint(call, fingerprint, stored) {
                    return refuse(IdempotencyOutcome::KeyReused, err);
                }
                tracing::error!(key = %call.key, "coord: an earlier call was abandoned mid-flight; its outcome is unknown (on_abandoned = fail): reconcile, then purge the record");
                return refuse(
                    IdempotencyOutcome::OutcomeUnknown,
                    CoordError::OutcomeUnknown {
                        key: call.key.clone(),
                    },
                );
            }
            ClaimOutcome::InFlight {
                fingerprint: stored,
                ..
            } => {
                if let Err(err) = check_fingerprint(call, fingerprint, stored) {
                    return refuse(IdempotencyOutcome::KeyReused, err);
                }
                let left = wait_until.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() {
                    return refuse(
                        IdempotencyOutcome::InFlight,
                        CoordError::InFlight {
                            key: call.key.clone(),
                        },
                    );
                }
                if let Err(err) = store.wait_settled(key, left).await {
                    return backend_fault(call, spec.on_backend_error, err);
                }
            }
        }
    }
}

/// A claim sent (or about to be) whose answer this call will never read: its future was
/// dropped mid-claim (a timeout around the call, a client that disconnected), or it failed
/// with a fault that may hide a claim that landed. Dropped armed, it clears the claim.
struct UnansweredClaim<'a> {
    store: &'a Arc<dyn IdempotencyStore>,
    key: &'a CallKey,
    owner: OwnerToken,
    lease: Duration,
    armed: bool,
}

impl Drop for UnansweredClaim<'_> {
    fn drop(&mut self) {
        if self.armed {
            clear_unanswered_claim(self.store, self.key.clone(), self.owner, self.lease);
        }
    }
}

/// A claim whose reply never came may have landed, or may still land (it can sit in a frozen
/// server or a slow network, or in a client's queue): clear it, owner-checked, so the key is
/// free at once rather than blocked (or, under `on_abandoned = "fail"`, reported unknown) for a
/// body that never ran. The abandon deletes the marker also when it was claimed to be kept as
/// abandoned: no body ran under it.
///
/// An abandon that finds nothing proves nothing (the claim may land after it), so this keeps
/// trying, with backoff, until one removes our marker or the marker's lease has passed since
/// the failure. Providers bound how late a claim can still take effect (the Redis provider
/// refuses a claim that executes after twice its command timeout plus a grace): with a lease
/// longer than that bound, any late claim is cleared.
fn clear_unanswered_claim(
    store: &Arc<dyn IdempotencyStore>,
    key: CallKey,
    owner: OwnerToken,
    lease: Duration,
) {
    let store = Arc::clone(store);
    spawn_retried("clearing an unanswered claim", key, lease, move |key| {
        let store = store.clone();
        // Done only once an abandon removed our marker: `false` proves nothing yet.
        async move { store.abandon(&key, owner).await }
    });
}

fn backend_fault<R: GuardedResult>(
    call: &Call<'_>,
    policy: Option<OnBackendError>,
    err: BackendError,
) -> Claim<R> {
    match call.backend_fault(policy, err, "idempotency") {
        Ok(()) => {
            call.record_idempotency(IdempotencyOutcome::FailedOpen);
            Claim::Unguarded
        }
        Err(err) => {
            call.record_idempotency(IdempotencyOutcome::BackendError);
            Claim::Answer(R::from_coord_error(err))
        }
    }
}
