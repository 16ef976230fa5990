//! `#[single_flight(scope = "cluster")]`: concurrent calls with one key on every instance
//! sharing the provider share one run.
//!
//! Two steps. First the process flight ([`single_flight_in`]), per coordinator: the calls of
//! one instance coalesce locally, so only one of them (the local leader) reaches the provider.
//! Then the local leader takes part in the cluster flight through the provider's
//! [`FlightStore`]: it claims the key with a short lease and runs the body, or it waits for the
//! outcome the leader elsewhere hands over (pub/sub for Redis, no polling) and shares it with
//! its local followers.
//!
//! The leader answers its own callers once its hand-over request has been *sent*, not once it
//! is answered: the request is written to the connection's socket first (the provider says
//! when, through [`FlightStore::flight_finish_noting_sent`]), and its reply is read in the
//! background (a failure is counted in [`Metrics::hand_overs_not_written`] and logged).
//! Followers that miss it fall back as for a leader that stopped answering (below). Later
//! calls of the same process on the same key wait for that write before claiming, so they run
//! the body again rather than join a flight whose caller was already answered; a call on
//! another instance that claims in that window joins the flight and gets its outcome.
//!
//! ## Why the leader waits for the send, and only for it
//!
//! A leader process that exits right after its callers are answered (a batch job, a command
//! line tool, any `main` that returns without `Coordinator::shutdown`) drops the tasks of its
//! runtime, a hand-over still to be written among them. Answering before the write even left
//! the process lost it: its followers waited out the lease, then one of them ran the body
//! again (4 processes x 25 calls on one key, lease 10 s: 4 runs, 10 s apart). Three ways out
//! were weighed:
//!
//! * **Send, then answer** (this). Bytes the kernel has accepted leave with the process's
//!   exit: the server reads them and runs the finish, which removes the claim, stores the
//!   outcome and wakes the followers. It costs the leader a hand-off to the connection's writer
//!   and one `write`, not the round trip the earlier synchronous hand-over cost. Under failure
//!   it promises no more than before: a connection that breaks with the request unsent or half
//!   read, or a process killed before the write, leaves the claim to its lease, which bounds
//!   every follower's wait as it always did; a finish that lands after its caller's process
//!   is gone is as good as any other (its reply is simply never read).
//! * **Tell the followers at once that the leader is gone** (a claim tied to its connection
//!   or session). Followers would stop waiting sooner, but the leader's outcome would still
//!   be lost: one of them would run the body again, so the cost of an exit stays a second run.
//!   Redis also has no per-connection keys; it would take polling for the leader's connection.
//! * **Wait at the end of the leader's call only when the process is about to exit**: the
//!   runtime cannot know that a `main` is returning, and waiting for the whole reply always is
//!   the synchronous hand-over this layer moved away from.
//!
//! How early "sent" is known depends on the provider: Redis over its plain TCP and Unix sockets
//! (the default redis-rs client) sees the kernel accept the request's last byte; a provider or
//! connection that cannot see its writes (TLS, Cluster, the fred client, PostgreSQL) says so
//! when the reply is in, the earlier synchronous hand-over, one round trip later but never
//! early. The wait is bounded by [`HAND_OVER`]: a hand-over sent later than that is of no use.
//!
//! [`Metrics::hand_overs_not_written`]: crate::telemetry::Metrics::hand_overs_not_written
//!
//! A leader that is cancelled gives its claim up at once (in the background), so a waiting
//! instance takes over; a leader that crashes holds its claim until the lease runs out, then a
//! waiting instance takes over. Exactly one does: claiming is atomic. A leader renews its claim
//! while its body runs; one whose claim lapsed anyway keeps running, but its outcome is refused
//! (fenced) and only its own callers get it.
//!
//! The hand-over is the outcome encoded with the coordinator's codec behind a two-byte header
//! (format version, then what it holds), kept by the provider for [`HAND_OVER`] only. `Ok` is
//! always handed over; `Err` when its type is serialisable (the macro picks that at the call
//! site), else the followers get [`CoordError::LeaderFailed`]. A hand-over that does not decode
//! (another build, another format) is a [`CoordError::Codec`] for the followers: never a panic,
//! never a wrong value.

use std::collections::HashMap;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::codec::Codec;
use crate::error::CoordError;
use crate::provider::CallKey;
use crate::provider::OwnerToken;
use crate::provider::background::{spawn_detached, spawn_retried};
use crate::provider::{FlightClaim, FlightStore, FlightWait, ReplicaAcks, SentNotice, replicas};
use crate::report::FlightOutcome;
use crate::runtime::call::{Call, replica_acks_refused};
use crate::runtime::flight::single_flight_in;

/// How long the provider keeps a leader's outcome for its followers to read. Followers that
/// were waiting read it within a pub/sub hop; a call that starts after the flight ended finds
/// no claim and runs again, so this is not a cache.
pub const HAND_OVER: Duration = Duration::from_secs(5);

/// The lease of a cluster flight's claim when none is given.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);

/// The version byte of a hand-over.
const FORMAT: u8 = 1;
/// What a hand-over holds (its second byte).
const TAG_OK: u8 = b'o';
const TAG_ERR: u8 = b'e';
const TAG_FAILED: u8 = b'f';
const TAG_UNENCODABLE: u8 = b'c';

/// `#[single_flight(scope = "cluster")]` options, resolved at compile time (or by the handle
/// API at run time).
#[derive(Debug, Clone, Copy)]
pub struct ClusterFlightSpec {
    /// The lease of the leader's claim: how long followers wait for a leader that stopped
    /// answering before one of them takes over. Renewed every third of it while the body runs.
    pub lease: Duration,
    /// `replica_acks = ..`: the replica acknowledgement of the leader's claim, its renewals
    /// and its hand-over write, overriding the provider's; `None` leaves the provider's. It is
    /// in scope for those requests only, never for the body (a lock the body takes follows
    /// its own setting). A request for one or more replicas on a provider without
    /// [`Capability::ReplicaAcks`](crate::provider::Capability::ReplicaAcks) is refused
    /// before anything is claimed.
    pub replica_acks: Option<ReplicaAcks>,
}

/// The output of a cluster-scope single-flight function.
#[diagnostic::on_unimplemented(
    message = "`#[single_flight(scope = \"cluster\")]` hands the outcome to callers on other instances: the function must return `Result<T, E>` with `T: serde::Serialize + serde::de::DeserializeOwned + Clone + Send + 'static` and `E: From<coord_core::CoordError> + Clone + Send + 'static`; `{Self}` is not such a type",
    label = "this return type cannot be handed to other instances",
    note = "derive `Serialize` and `Deserialize` for the value, give the error type a `From<CoordError>` conversion, or use `scope = \"process\"`"
)]
pub trait ClusterOutput: Clone + Send + 'static {
    /// The success value encoded (`None` for an `Err`).
    fn encode_ok(&self, codec: Codec) -> Option<Result<Vec<u8>, String>>;
    /// A success value decoded.
    fn decode_ok(bytes: &[u8], codec: Codec) -> Result<Self, String>;
    /// The error value for a failure coord reports.
    fn from_coord_error(err: CoordError) -> Self;
}

impl<T, E> ClusterOutput for Result<T, E>
where
    T: Serialize + DeserializeOwned + Clone + Send + 'static,
    E: From<CoordError> + Clone + Send + 'static,
{
    fn encode_ok(&self, codec: Codec) -> Option<Result<Vec<u8>, String>> {
        self.as_ref().ok().map(|ok| codec.encode_checked(ok))
    }

    fn decode_ok(bytes: &[u8], codec: Codec) -> Result<Self, String> {
        codec.decode::<T>(bytes).map(Ok)
    }

    fn from_coord_error(err: CoordError) -> Self {
        Err(E::from(err))
    }
}

type EncodeErr<R> = fn(&R, Codec) -> Option<Result<Vec<u8>, String>>;
type DecodeErr<R> = fn(&[u8], Codec) -> Result<R, String>;

/// How an operation's `Err` outcomes cross to other instances: encoded with the codec when the
/// error type is serialisable, else not at all (followers get [`CoordError::LeaderFailed`]).
pub struct ErrorForm<R> {
    encode: Option<EncodeErr<R>>,
    decode: Option<DecodeErr<R>>,
}

impl<R> std::fmt::Debug for ErrorForm<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ErrorForm")
            .field("shared", &self.encode.is_some())
            .finish()
    }
}

/// Errors are not handed over: followers of a failed leader get [`CoordError::LeaderFailed`].
pub const fn opaque_errors<R>() -> ErrorForm<R> {
    ErrorForm {
        encode: None,
        decode: None,
    }
}

/// Errors are handed over with the coordinator's codec.
pub const fn shared_errors<T, E>() -> ErrorForm<Result<T, E>>
where
    E: Serialize + DeserializeOwned,
{
    fn encode<T, E: Serialize + DeserializeOwned>(
        value: &Result<T, E>,
        codec: Codec,
    ) -> Option<Result<Vec<u8>, String>> {
        value.as_ref().err().map(|err| codec.encode_checked(err))
    }
    fn decode<T, E: DeserializeOwned>(bytes: &[u8], codec: Codec) -> Result<Result<T, E>, String> {
        codec.decode::<E>(bytes).map(Err)
    }
    ErrorForm {
        encode: Some(encode::<T, E>),
        decode: Some(decode::<T, E>),
    }
}

/// Picks the [`ErrorForm`] of an output type where the type is concrete (the generated code):
/// `(&&FlightProbe::<R>::new()).error_form()` with [`SharedErrorProbe`] and
/// [`OpaqueErrorProbe`] in scope resolves to the shared form when `R` is `Result<T, E>` with a
/// serialisable `E`, and to the opaque form otherwise.
pub struct FlightProbe<R>(PhantomData<fn() -> R>);

impl<R> FlightProbe<R> {
    /// A probe for `R`.
    pub const fn new() -> FlightProbe<R> {
        FlightProbe(PhantomData)
    }
}

impl<R> Default for FlightProbe<R> {
    fn default() -> Self {
        FlightProbe::new()
    }
}

/// The preferred form: errors serialisable, so they are shared.
pub trait SharedErrorProbe<R> {
    /// The form for `R`.
    fn error_form(&self) -> ErrorForm<R>;
}

impl<T, E> SharedErrorProbe<Result<T, E>> for &FlightProbe<Result<T, E>>
where
    E: Serialize + DeserializeOwned,
{
    fn error_form(&self) -> ErrorForm<Result<T, E>> {
        shared_errors::<T, E>()
    }
}

/// The fallback form: errors are not shared.
pub trait OpaqueErrorProbe<R> {
    /// The form for `R`.
    fn error_form(&self) -> ErrorForm<R>;
}

impl<R> OpaqueErrorProbe<R> for FlightProbe<R> {
    fn error_form(&self) -> ErrorForm<R> {
        opaque_errors::<R>()
    }
}

/// Joins or leads the flight for the call's key across every instance sharing the provider.
pub async fn cluster_single_flight<R, F>(
    call: &Call<'_>,
    spec: ClusterFlightSpec,
    errors: ErrorForm<R>,
    body: F,
) -> R
where
    R: ClusterOutput,
    F: Future<Output = R>,
{
    // A profile the coordinator does not have is refused before anything is claimed, as the
    // other layers that reach the provider do.
    if let Some(err) = call.profile_error() {
        call.record_error(&err);
        return R::from_coord_error(err);
    }
    // Refused as the lock and idempotency layers refuse it: before this instance's callers
    // coalesce or anything is claimed, whatever the backend-fault policy, so a flight never
    // runs without the acknowledgement it asked for.
    if let Some(err) = replica_acks_refused(call.coordinator, spec.replica_acks, &call.key) {
        call.record_error(&err);
        return R::from_coord_error(err);
    }
    let group = call.coordinator.identity();
    single_flight_in(call, group, across(call, spec, errors, body)).await
}

/// The cluster step, run by this instance's local leader only.
async fn across<R, F>(call: &Call<'_>, spec: ClusterFlightSpec, errors: ErrorForm<R>, body: F) -> R
where
    R: ClusterOutput,
    F: Future<Output = R>,
{
    let store = call.coordinator.flight_store().clone();
    let owner = OwnerToken::new();
    let mut took_over = false;
    PendingHandOvers::settled(&store, &call.key, spec.lease).await;
    loop {
        // Armed before the claim is first polled, so before the command can leave the process:
        // a claim whose answer this call never reads (dropped mid-claim, or a fault that may
        // hide a claim that landed) is given up, so the other instances do not wait a whole
        // lease for a body that runs nowhere (owner-checked, so harmless if it never landed).
        let mut guard = ClaimGuard {
            store: store.clone(),
            key: call.key.clone(),
            owner,
            lease: spec.lease,
            armed: true,
            answered: false,
        };
        let claim = replicas::scoped(
            spec.replica_acks,
            store.flight_claim(&call.key, owner, spec.lease),
        );
        let claim = match claim.await {
            Ok(claim) => claim,
            Err(err) => {
                guard.armed = err.kind() != crate::provider::BackendErrorKind::Config;
                drop(guard);
                return degrade(call, err, body).await;
            }
        };
        guard.answered = true;
        let (leader, lease_left) = match claim {
            FlightClaim::Claimed => {
                call.record_flight(if took_over {
                    FlightOutcome::ClusterTookOver
                } else {
                    FlightOutcome::ClusterLed
                });
                return lead(call, store, guard, owner, spec, &errors, body).await;
            }
            FlightClaim::Joined { leader, lease_left } => {
                guard.armed = false;
                (leader, lease_left)
            }
        };
        // Wait at most what is left of the leader's lease (and a little, for the store's clock
        // to agree that it ended), then look again: a leader that renews is still there, one
        // that crashed has left the claim free for exactly one of us.
        let timeout = lease_left.saturating_add(Duration::from_millis(20));
        match store.flight_wait(&call.key, leader, timeout).await {
            Ok(FlightWait::Finished(bytes)) => {
                call.record_flight(FlightOutcome::ClusterJoined);
                return hand_over_received(call, &errors, &bytes);
            }
            Ok(FlightWait::Vacant | FlightWait::Expired) => {
                took_over = true;
                tokio::task::yield_now().await;
            }
            Err(err) => return degrade(call, err, body).await,
        }
    }
}

/// The provider failed: under `fail_open` the call keeps its process flight (this body runs
/// for this instance's callers only); under `fail_closed` it is refused.
async fn degrade<R, F>(call: &Call<'_>, err: crate::BackendError, body: F) -> R
where
    R: ClusterOutput,
    F: Future<Output = R>,
{
    match call.backend_fault(None, err, "single_flight") {
        Ok(()) => {
            call.record_flight(FlightOutcome::FailedOpen);
            body.await
        }
        Err(err) => {
            call.record_error(&err);
            R::from_coord_error(err)
        }
    }
}

/// Gives the claim up in the background if the call stops before handing over: its claim was
/// dropped or failed before the answer was read, its caller was cancelled while leading, or
/// the body panicked; so a follower takes over at once.
struct ClaimGuard {
    store: Arc<dyn FlightStore>,
    key: CallKey,
    owner: OwnerToken,
    lease: Duration,
    armed: bool,
    /// Whether the claim's answer was read. Before that, an abandon that finds nothing proves
    /// nothing (the claim may still land), so it is retried until one removes the claim.
    answered: bool,
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if self.answered {
            abandon_detached(&self.store, &self.key, self.owner, self.lease);
        } else {
            abandon_until_removed(&self.store, &self.key, self.owner, self.lease);
        }
    }
}

/// Gives the claim up, owner-checked, in the background; done at the first answer.
fn abandon_detached(
    store: &Arc<dyn FlightStore>,
    key: &CallKey,
    owner: OwnerToken,
    lease: Duration,
) {
    let store = store.clone();
    spawn_retried(
        "giving up the single-flight claim",
        key.clone(),
        lease,
        move |key| {
            let store = store.clone();
            async move { store.flight_abandon(&key, owner).await.map(|_| true) }
        },
    );
}

/// Gives up a claim whose answer was never read: retried, with backoff, until an abandon
/// removes it or a lease has passed (a claim cannot outlive its lease, however late it lands).
fn abandon_until_removed(
    store: &Arc<dyn FlightStore>,
    key: &CallKey,
    owner: OwnerToken,
    lease: Duration,
) {
    let store = store.clone();
    spawn_retried(
        "giving up an unanswered single-flight claim",
        key.clone(),
        lease,
        move |key| {
            let store = store.clone();
            async move { store.flight_abandon(&key, owner).await }
        },
    );
}

async fn lead<R, F>(
    call: &Call<'_>,
    store: Arc<dyn FlightStore>,
    mut guard: ClaimGuard,
    owner: OwnerToken,
    spec: ClusterFlightSpec,
    errors: &ErrorForm<R>,
    body: F,
) -> R
where
    R: ClusterOutput,
    F: Future<Output = R>,
{
    let output = renewing(call, &store, owner, spec, body).await;
    guard.armed = false;

    let codec = call.coordinator.codec();
    let bytes = encode_hand_over(&output, codec, errors);
    // The caller is answered once the hand-over request has left the process (see the module
    // docs); its reply is read in the background. Followers that miss it (the write failed, or
    // the process stopped before it was sent) fall back as they do for a leader that stopped
    // answering: an abandoned claim lets one of them take over at once, a claim left behind
    // lapses with its lease. Calls of this process on the same key wait for the write first
    // (see `PendingHandOvers`), so a call that starts after this one returned runs the body
    // again instead of joining the flight that just ended.
    let pending = PendingHandOvers::begin(&store, &call.key);
    let coordinator = call.coordinator.clone();
    let key = call.key.clone();
    let (sent, on_the_wire) = SentNotice::new();
    // The operation's replica acknowledgement is a task-local: it does not follow the spawn,
    // so the spawned future carries it itself.
    spawn_detached(replicas::scoped(
        spec.replica_acks,
        Box::pin(async move {
            let finished = store
                .flight_finish_noting_sent(&key, owner, &bytes, HAND_OVER, sent)
                .await;
            match finished {
                Ok(true) => {}
                Ok(false) => {
                    coordinator.metrics().count_hand_over_not_written();
                    tracing::warn!(key = %key, "coord: the single-flight claim lapsed while the body ran (renewals failed); the outcome was not handed over, and another instance may have run the body too")
                }
                Err(err) => {
                    coordinator.metrics().count_hand_over_not_written();
                    crate::telemetry::backend_error(
                        "single_flight",
                        key.operation().unwrap_or(""),
                        &err,
                    );
                    tracing::warn!(key = %key, error = %err, "coord: handing the single-flight outcome over failed; giving the claim up so a follower runs instead");
                    abandon_detached(&store, &key, owner, spec.lease);
                }
            }
            drop(pending);
        }),
    ));
    // Resolves when the request left the process, or when the write ended without saying so
    // (answered, failed, or given up). Bounded all the same: past the hand-over's own time the
    // outcome would be of no use to anyone, and the caller is owed its answer.
    let _ = tokio::time::timeout(HAND_OVER, on_the_wire).await;
    output
}

/// Hand-overs this process is still writing, per flight store and key: a call that starts
/// after its leader answered waits for the write before it claims, so it does not join (and
/// get the outcome of) a flight whose caller already has its answer.
struct PendingHandOvers {
    slot: (usize, CallKey),
    id: u64,
    done: Option<tokio::sync::watch::Sender<()>>,
}

type PendingMap = HashMap<(usize, CallKey), (u64, tokio::sync::watch::Receiver<()>)>;

fn pending_map() -> std::sync::MutexGuard<'static, PendingMap> {
    static PENDING: OnceLock<Mutex<PendingMap>> = OnceLock::new();
    PENDING
        .get_or_init(Mutex::default)
        .lock()
        // Every critical section is one insert, look-up or remove: a poisoned map is whole.
        .unwrap_or_else(|e| e.into_inner())
}

fn store_id(store: &Arc<dyn FlightStore>) -> usize {
    Arc::as_ptr(store) as *const () as usize
}

impl PendingHandOvers {
    fn begin(store: &Arc<dyn FlightStore>, key: &CallKey) -> PendingHandOvers {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = tokio::sync::watch::channel(());
        let slot = (store_id(store), key.clone());
        pending_map().insert(slot.clone(), (id, rx));
        PendingHandOvers {
            slot,
            id,
            done: Some(tx),
        }
    }

    /// Waits (at most `limit`) for a hand-over of `key` this process is still writing.
    async fn settled(store: &Arc<dyn FlightStore>, key: &CallKey, limit: Duration) {
        let waiting = {
            let map = pending_map();
            map.get(&(store_id(store), key.clone()))
                .map(|(_, rx)| rx.clone())
        };
        if let Some(mut rx) = waiting {
            // Resolves with an error once the writer is done (its sender dropped).
            let _ =
                tokio::time::timeout(limit, async { while rx.changed().await.is_ok() {} }).await;
        }
    }
}

impl Drop for PendingHandOvers {
    fn drop(&mut self) {
        let mut map = pending_map();
        if map.get(&self.slot).is_some_and(|(id, _)| *id == self.id) {
            map.remove(&self.slot);
        }
        drop(map);
        self.done.take();
    }
}

/// Runs the body while renewing the claim every third of its lease. A renewal that finds the
/// claim gone stops renewing (the finish will be refused); a failed renewal (a fault, or too
/// few replicas acknowledged it) is retried at the next tick. The body keeps running either
/// way: the flight is an optimisation, and the caller is owed its outcome. Only the renewals
/// carry the operation's replica acknowledgement, not the body.
async fn renewing<R, F>(
    call: &Call<'_>,
    store: &Arc<dyn FlightStore>,
    owner: OwnerToken,
    spec: ClusterFlightSpec,
    body: F,
) -> R
where
    F: Future<Output = R>,
{
    let lease = spec.lease;
    let every = (lease / 3).max(Duration::from_millis(1));
    let renewals = async {
        loop {
            tokio::time::sleep(every).await;
            let renewal = replicas::scoped(
                spec.replica_acks,
                store.flight_renew(&call.key, owner, lease),
            );
            match renewal.await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(key = %call.key, "coord: the single-flight claim was lost while the body ran; another instance may take over");
                    return std::future::pending::<()>().await;
                }
                Err(err) => {
                    tracing::debug!(key = %call.key, error = %err, "coord: renewing the single-flight claim failed; retrying");
                }
            }
        }
    };
    tokio::pin!(body);
    tokio::pin!(renewals);
    tokio::select! {
        biased;
        output = &mut body => output,
        () = &mut renewals => unreachable!("the renewal loop never ends"),
    }
}

fn encode_hand_over<R: ClusterOutput>(output: &R, codec: Codec, errors: &ErrorForm<R>) -> Vec<u8> {
    let (tag, encoded) = match output.encode_ok(codec) {
        Some(ok) => (TAG_OK, ok),
        None => match errors.encode.and_then(|encode| encode(output, codec)) {
            Some(err) => (TAG_ERR, err),
            None => (TAG_FAILED, Ok(Vec::new())),
        },
    };
    let (tag, payload) = match encoded {
        Ok(payload) => (tag, payload),
        Err(message) => (TAG_UNENCODABLE, message.into_bytes()),
    };
    let mut bytes = Vec::with_capacity(2 + payload.len());
    bytes.push(FORMAT);
    bytes.push(tag);
    bytes.extend_from_slice(&payload);
    bytes
}

fn hand_over_received<R: ClusterOutput>(call: &Call<'_>, errors: &ErrorForm<R>, bytes: &[u8]) -> R {
    let codec = call.coordinator.codec();
    let codec_error = |message: String| {
        let err = CoordError::Codec {
            key: call.key.clone(),
            message,
        };
        call.record_error(&err);
        R::from_coord_error(err)
    };
    let decoded = match bytes {
        [FORMAT, TAG_OK, payload @ ..] => R::decode_ok(payload, codec),
        [FORMAT, TAG_ERR, payload @ ..] => match errors.decode {
            Some(decode) => decode(payload, codec),
            // The leader's build shares this error type; ours does not: we cannot read it.
            None => {
                let err = CoordError::LeaderFailed {
                    key: call.key.clone(),
                };
                call.record_error(&err);
                return R::from_coord_error(err);
            }
        },
        [FORMAT, TAG_FAILED, ..] => {
            let err = CoordError::LeaderFailed {
                key: call.key.clone(),
            };
            call.record_error(&err);
            return R::from_coord_error(err);
        }
        [FORMAT, TAG_UNENCODABLE, message @ ..] => Err(format!(
            "the leader's outcome did not encode: {}",
            String::from_utf8_lossy(message)
        )),
        _ => Err("the single-flight hand-over is not in a format this build reads (written by another version, or not by coord)".to_owned()),
    };
    match decoded {
        Ok(value) => value,
        Err(message) => {
            tracing::warn!(key = %call.key, error = %message, "coord: the single-flight leader's outcome did not decode");
            codec_error(message)
        }
    }
}
