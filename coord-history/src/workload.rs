//! The calls every recorded-history run makes, whatever the provider: a fenced lock hold, an
//! idempotent call and a single-flight call, each invoked and completed in the [`Recorder`]
//! with its effects written at the protected resource (the [`WitnessClient`]).
//!
//! A run (the Redis and the PostgreSQL `histories` tests) picks the keys, the durations and
//! the mix; the calls here decide what is recorded, so that the checker judges every provider
//! by the same events. With `COORD_HISTORY_WATCHDOG=1` set, [`start_watchdog`] prints the calls
//! of a process that stay in flight far longer than any call's own bounds allow, with every
//! thread's stack: a hang shows in a history only as a call never completed.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use coord_core::{CoordError, Coordinator, fencing_token};

use crate::event::{CallId, EffectKind, Op, Outcome, Phase};
use crate::nemesis::schedule::Rng;
use crate::recorder::{Ending, Recorder};
use crate::witness::WitnessClient;

/// The error kind recorded for a hold whose lease ran out on the local clock before its body
/// began (its process paused, or its clock jumped, between the grant and the body):
/// `fencing_token()` answers `None` then, and the body writes nothing.
pub const LAPSED: &str = "LeaseRanOutBeforeBody";

/// The key (a prefix; runs add a suffix) of the long unrenewed holds, the ones a client pause
/// is aimed at: a holder paused inside one outlives its lease, a successor writes with a newer
/// token, and the holder's `exit` after the pause is refused at the resource.
pub const UNRENEWED_KEY: &str = "lu";
/// The key prefix of the long renewing holds, the ones a server pause is aimed at: renewals
/// go unanswered for a whole lease while the body still runs, and the hold ends `LockLost`.
pub const RENEWING_KEY: &str = "lr";
/// How recently a renewing hold must have come in for a server pause aimed at it to start:
/// its body (at least [`RENEWING_BODY_MS`]`.0`, 2 s) then runs on for at least 1.3 s of the
/// pause, past the whole lease (1 s in the runs) of unanswered renewals that ends it.
pub const AIM_FRESH: Duration = Duration::from_millis(700);
/// The body of a long renewing hold, milliseconds (min, max): longer than a lease plus
/// [`AIM_FRESH`] with room to spare, so that a lease of unanswered renewals ends it first.
pub const RENEWING_BODY_MS: (u64, u64) = (2_000, 3_000);

/// What a long-hold task does ([`Caller::long_hold`]): the processes the nemesis pauses run
/// one of each of the first two, the process it never pauses runs the third.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LongHolds {
    /// Long unrenewed holds of [`UNRENEWED_KEY`] (300 to 700 ms, inside a lease), one after
    /// another: what a client pause is aimed at.
    Unrenewed,
    /// Long renewing holds of [`RENEWING_KEY`] (with `0` or `1` after it; bodies of
    /// [`RENEWING_BODY_MS`]), one after another: what a server pause is aimed at.
    Renewing,
    /// Short holds of [`UNRENEWED_KEY`] one after another, so that a paused holder's lapsed
    /// lease is taken at once and written with a newer token.
    Successor,
}

/// How a failed call is recorded: `fail` when it certainly had no effect (the lock was not
/// taken, the key is in flight or reused), `info` (unknown) otherwise; and its error kind, the
/// backend's kind for a backend error, else the variant's name. The calls of [`Caller`] also
/// record `fail` for any error when their body never started, which they see for themselves.
pub fn classify(err: &CoordError) -> (Outcome, String) {
    let outcome = match err {
        CoordError::LockNotAcquired { .. }
        | CoordError::InFlight { .. }
        | CoordError::KeyReused { .. } => Outcome::Fail,
        _ => Outcome::Info,
    };
    let kind = match err {
        CoordError::Backend(b) => format!("Backend({:?})", b.kind()),
        other => {
            let debug = format!("{other:?}");
            debug
                .split([' ', '{', '('])
                .next()
                .unwrap_or_default()
                .to_owned()
        }
    };
    (outcome, kind)
}

/// One caller of a run: the coordinator it calls through, where it records, the resource its
/// bodies write to, and its number within its process.
pub struct Caller<'a> {
    /// The coordinator under test.
    pub coord: &'a Coordinator,
    /// This process's recorder.
    pub rec: &'a Recorder,
    /// The protected resource.
    pub witness: &'a WitnessClient,
    /// The caller's number within its process (a task).
    pub client: u32,
}

impl Caller<'_> {
    /// A fenced `lock` hold of `name` (lease `lease`, waiting up to 2 s) whose body writes
    /// `enter` and `exit` with its token at the resource, `hold` apart. A body that finds no
    /// token (its lease ran out here first) writes nothing and is recorded as failed with
    /// [`LAPSED`]; a failed call keeps the token its body saw, if any.
    pub async fn fenced_hold(&self, name: &str, lease: Duration, hold: Duration) {
        let invoked = self.rec.invoke(self.client, Op::Lock, name, None, None);
        let call = invoked.call;
        let _watched = Watched::new(call, &format!("lock {name}"));
        let seen = AtomicU64::new(0);
        let key = self.coord.key("hist.lock").part(name).finish();
        let result: Result<Option<u64>, CoordError> = self
            .coord
            .lock(key)
            .lease(lease)
            .wait(Duration::from_secs(2))
            .fenced()
            .run(|| async {
                let Some(token) = fencing_token() else {
                    return Ok(None);
                };
                let token = token.get();
                seen.store(token, Ordering::Relaxed);
                self.witness
                    .fenced_write(name, token, call, Phase::Enter)
                    .await;
                tokio::time::sleep(hold).await;
                self.witness
                    .fenced_write(name, token, call, Phase::Exit)
                    .await;
                Ok(Some(token))
            })
            .await;
        let ending = match result {
            Ok(Some(token)) => Ending::ok(None, Some(token)),
            // The body did nothing: certainly no effect at the resource.
            Ok(None) => Ending::failed(Outcome::Fail, LAPSED),
            Err(err) => {
                let (outcome, kind) = classify(&err);
                let token = Some(seen.load(Ordering::Relaxed)).filter(|t| *t != 0);
                // A body that never took its token wrote nothing: certainly no effect at the
                // resource, whatever the error (refused before it was sent, a script that
                // failed, or a reply lost after a grant the body never used).
                let outcome = if token.is_none() {
                    Outcome::Fail
                } else {
                    outcome
                };
                let mut ending = Ending::failed(outcome, kind);
                ending.token = token;
                ending
            }
        };
        self.rec.complete(&invoked, ending);
    }

    /// A fenced `lock` hold of `name` renewed every `renew` (lease `lease`, waiting up to 2 s),
    /// recorded as renewing so that the checker holds an `Ok` to having held throughout
    /// ([`crate::check::Promise::HeldThroughout`]); the body writes `enter` and `exit` with its
    /// token at the resource, `hold` apart. A hold that outlasts a fault (a pause of its
    /// process or of the server, a clock moved) must end `LockLost`, not `Ok`.
    pub async fn renewing_hold(
        &self,
        name: &str,
        lease: Duration,
        renew: Duration,
        hold: Duration,
    ) {
        let invoked = self.rec.invoke_renewing_lock(self.client, name, renew);
        let call = invoked.call;
        let _watched = Watched::new(call, &format!("renewing lock {name}"));
        let seen = AtomicU64::new(0);
        let key = self.coord.key("hist.lock").part(name).finish();
        let result: Result<Option<u64>, CoordError> = self
            .coord
            .lock(key)
            .lease(lease)
            .renew(renew)
            .wait(Duration::from_secs(2))
            .fenced()
            .run(|| async {
                let Some(token) = fencing_token() else {
                    return Ok(None);
                };
                let token = token.get();
                seen.store(token, Ordering::Relaxed);
                self.witness
                    .fenced_write(name, token, call, Phase::Enter)
                    .await;
                tokio::time::sleep(hold).await;
                self.witness
                    .fenced_write(name, token, call, Phase::Exit)
                    .await;
                Ok(Some(token))
            })
            .await;
        let ending = match result {
            Ok(Some(token)) => Ending::ok(None, Some(token)),
            Ok(None) => Ending::failed(Outcome::Fail, LAPSED),
            Err(err) => {
                let (outcome, kind) = classify(&err);
                let token = Some(seen.load(Ordering::Relaxed)).filter(|t| *t != 0);
                // A body that never took its token wrote nothing: certainly no effect at the
                // resource, whatever the error (refused before it was sent, a script that
                // failed, or a reply lost after a grant the body never used).
                let outcome = if token.is_none() {
                    Outcome::Fail
                } else {
                    outcome
                };
                let mut ending = Ending::failed(outcome, kind);
                ending.token = token;
                ending
            }
        };
        self.rec.complete(&invoked, ending);
    }

    /// One call of a process's long-hold task (see [`LongHolds`]), on keys named with
    /// `suffix` (a run's data generation, say); the nemesis aims its pauses at these holds
    /// through [`crate::witness::WitnessServer::inside`].
    pub async fn long_hold(&self, role: LongHolds, lease: Duration, suffix: &str, rng: &mut Rng) {
        let ms = Duration::from_millis;
        match role {
            LongHolds::Renewing => {
                let name = format!("{RENEWING_KEY}{}{suffix}", rng.between(0, 1));
                let hold = ms(rng.between(RENEWING_BODY_MS.0, RENEWING_BODY_MS.1));
                self.renewing_hold(&name, lease, lease / 3, hold).await;
                // A call that failed at once (the server unreachable) is not retried in a
                // tight loop: a run counts calls, not reconnect attempts.
                tokio::time::sleep(ms(rng.between(20, 60))).await;
            }
            LongHolds::Unrenewed => {
                let name = format!("{UNRENEWED_KEY}{suffix}");
                self.fenced_hold(&name, lease, ms(rng.between(300, 700)))
                    .await;
                tokio::time::sleep(ms(rng.between(20, 60))).await;
            }
            LongHolds::Successor => {
                let name = format!("{UNRENEWED_KEY}{suffix}");
                self.fenced_hold(&name, lease, ms(rng.between(5, 40))).await;
                // Long enough between holds for a holder waiting on the key to take it.
                tokio::time::sleep(ms(rng.between(100, 200))).await;
            }
        }
    }

    /// An `idempotent` call of `name` (in-flight lease `in_flight`, waiting up to 3 s,
    /// retention 10 min) whose body records its effect at the resource and answers a value
    /// naming its call.
    pub async fn idempotent(&self, name: &str, in_flight: Duration) {
        let (invoked, proposal) =
            self.rec
                .invoke_proposing(self.client, Op::Idempotent, name, |call| {
                    format!("answer-of-{call}")
                });
        let _watched = Watched::new(invoked.call, &format!("idempotent {name}"));
        let ran = AtomicBool::new(false);
        let key = self.coord.key("hist.idem").part(name).finish();
        let result: Result<String, CoordError> = self
            .coord
            .idempotent(key)
            .in_flight_lease(in_flight)
            .wait(Duration::from_secs(3))
            .retention(Duration::from_secs(600))
            .run(|| async {
                ran.store(true, Ordering::Relaxed);
                self.witness
                    .effect(name, invoked.call, EffectKind::Body)
                    .await;
                tokio::time::sleep(Duration::from_millis(10)).await;
                Ok(proposal.clone())
            })
            .await;
        let ending = match result {
            Ok(answer) => Ending::ok(Some(answer), None),
            Err(err) => {
                let (outcome, kind) = classify(&err);
                // A call whose body never started wrote no answer and had no effect, whatever
                // became of its claim: certainly nothing to this key's register.
                let outcome = if ran.load(Ordering::Relaxed) {
                    outcome
                } else {
                    Outcome::Fail
                };
                Ending::failed(outcome, kind)
            }
        };
        self.rec.complete(&invoked, ending);
    }

    /// A process-scope `single_flight` call of `name` whose body records its start and end at
    /// the resource and answers a value naming its call.
    pub async fn single_flight(&self, name: &str) {
        let (invoked, proposal) =
            self.rec
                .invoke_proposing(self.client, Op::SingleFlight, name, |call| {
                    format!("answer-of-{call}")
                });
        let _watched = Watched::new(invoked.call, &format!("single-flight {name}"));
        let key = self.coord.key("hist.flight").part(name).finish();
        let answer: String = self
            .coord
            .single_flight(key)
            .run(|| async {
                self.witness
                    .effect(name, invoked.call, EffectKind::FlightStart)
                    .await;
                tokio::time::sleep(Duration::from_millis(20)).await;
                self.witness
                    .effect(name, invoked.call, EffectKind::FlightEnd)
                    .await;
                proposal.clone()
            })
            .await;
        self.rec.complete(&invoked, Ending::ok(Some(answer), None));
    }
}

// ---------------------------------------------------------------- the watchdog

/// Calls in flight in this process (call id, when invoked, what), for the watchdog.
static WATCHED: Mutex<BTreeMap<u64, (Instant, String)>> = Mutex::new(BTreeMap::new());

/// How long a call may be in flight before the watchdog reports it: every call's own bounds
/// end it within about 5 s.
const STUCK: Duration = Duration::from_secs(12);

/// One call in flight, until dropped.
pub struct Watched(u64);

impl Watched {
    /// Notes `call` (described by `what`) as in flight until the value is dropped.
    pub fn new(call: CallId, what: &str) -> Watched {
        WATCHED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(call.0, (Instant::now(), what.to_owned()));
        Watched(call.0)
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        WATCHED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.0);
    }
}

/// With `COORD_HISTORY_WATCHDOG=1`: a thread that, once a call of this process has been in
/// flight for over 12 s, prints it with every thread's stack (through gdb, when installed),
/// once. Does nothing without the variable.
pub fn start_watchdog() {
    if std::env::var_os("COORD_HISTORY_WATCHDOG").is_none() {
        return;
    }
    std::thread::spawn(|| {
        loop {
            std::thread::sleep(Duration::from_secs(1));
            let stuck: Vec<String> = WATCHED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .filter(|(_, (at, _))| at.elapsed() > STUCK)
                .map(|(call, (at, what))| {
                    format!(
                        "{} {what} for {:.1} s",
                        CallId(*call),
                        at.elapsed().as_secs_f64()
                    )
                })
                .collect();
            if stuck.is_empty() {
                continue;
            }
            let pid = std::process::id();
            let stacks = std::process::Command::new("gdb")
                .args([
                    "-p",
                    &pid.to_string(),
                    "-batch",
                    "-ex",
                    "thread apply all bt",
                ])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_else(|e| format!("(no gdb: {e})"));
            eprintln!(
                "histories: watchdog: calls in flight for over 12 s in process {pid}: {stuck:?}\n{stacks}"
            );
            return;
        }
    });
}
