//! Crashes the history can see: a run whose lock holds span a server's kill and restart, and
//! whose completed idempotent keys are asked again after each restart, so that a lock or a
//! record the server lost in the crash shows as a violation.
//!
//! Each cycle of [`crash_run`]:
//!
//! 1. a **spanning hold** takes a renewing fenced lock of [`SPANNING_KEY`] with a long lease
//!    ([`CrashPlan::lease`], longer than the server's downtime) and writes `enter`; its body
//!    waits until the server is back and the asks below are done, then writes `exit`;
//! 2. a **contender** asks for the same lock over and over (short waits) from the holder's
//!    `enter` to the cycle's end;
//! 3. idempotent calls complete on fresh keys one after another, up to the kill;
//! 4. the test's `crash` kills the server and restarts it (with its data, or, in the control,
//!    without), recorded as one fault;
//! 5. every key completed so far, in this cycle and the ones before, is **asked again**.
//!
//! A server that kept its data keeps the lock and the records: the contender waits until the
//! holder lets go, and each key asked again replays its first answer without running its
//! body. A server that lost them grants the lock again at once with a token older than (or
//! equal to) the holder's: [`crate::Promise::TokensGrow`] (a grant older than a token already
//! admitted) or an overlap of admitted holds; a renewing hold that still answered `Ok` is
//! [`crate::Promise::HeldThroughout`]; and a key asked again runs its body a second time:
//! [`crate::Promise::AtMostOnce`] and [`crate::Promise::SameAnswer`]. The crash is recorded
//! without `data_loss` on purpose: the run judges the server as if it had promised to keep
//! its data, which is what the control must be caught breaking.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use coord_core::{CoordError, Coordinator, fencing_token};
use tokio::sync::watch;

use crate::clock::now_ns;
use crate::event::{Event, Fault, Op, Outcome, Phase};
use crate::recorder::{Ending, Recorder};
use crate::witness::WitnessClient;
use crate::workload::{LAPSED, classify};

/// The key (a prefix; each cycle adds its number) of the holds that span a crash.
pub const SPANNING_KEY: &str = "cs";
/// The key prefix of the idempotent calls asked again after each crash.
pub const ASKED_KEY: &str = "ca";

/// How a crash run goes.
#[derive(Debug, Clone)]
pub struct CrashPlan {
    /// Kill-and-restart cycles.
    pub cycles: usize,
    /// The lease of the spanning holds and the contender: longer than the server's downtime
    /// with room to spare, so that a server that kept its data still has the lock when it is
    /// back. Renewed every third of it.
    pub lease: Duration,
    /// How many keys must have completed in a cycle before its crash.
    pub keys_before_crash: usize,
    /// The fault's name in the history (`server-kill-restart`, or the control's own name).
    pub fault: String,
}

/// What a crash run did, beside its history.
#[derive(Debug, Clone, Default)]
pub struct CrashFigures {
    /// Spanning holds whose call was in flight from before the kill to after the restart.
    pub spanning: usize,
    /// Of those, the ones that ended `Ok` (the lock was kept across the crash).
    pub spanning_ok: usize,
    /// Idempotent keys completed before a crash and asked again after it (counted once per
    /// crash they were asked after).
    pub asked_again: usize,
    /// Of those asks, the ones that answered `Ok` with the key's first answer.
    pub replayed_same: usize,
    /// Lock grants the contender got while a spanning holder was inside its body.
    pub contender_grants_inside: usize,
    /// The longest kill-to-restarted time, in milliseconds.
    pub longest_downtime_ms: u64,
}

impl std::fmt::Display for CrashFigures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} holds spanned a crash ({} ended Ok), {} keys asked again after a crash ({} replayed their first answer), {} contender grants while a spanning holder was inside, longest downtime {} ms",
            self.spanning,
            self.spanning_ok,
            self.asked_again,
            self.replayed_same,
            self.contender_grants_inside,
            self.longest_downtime_ms
        )
    }
}

/// Runs `plan` against the server `coord` talks to: `crash` (blocking; it runs on a blocking
/// thread) kills the server and starts it again, and returns once it accepts connections.
/// Records everything in `rec` and writes at the witness `witness`; returns the figures.
pub async fn crash_run(
    coord: &Coordinator,
    rec: &Recorder,
    witness: std::net::SocketAddr,
    plan: &CrashPlan,
    crash: Arc<dyn Fn() + Send + Sync>,
) -> CrashFigures {
    let witness = Arc::new(
        WitnessClient::connect(witness)
            .await
            .expect("the witness listens on loopback"),
    );
    let mut figures = CrashFigures::default();
    // Keys completed so far, with their first answer.
    let mut completed: Vec<(String, String)> = Vec::new();
    for cycle in 0..plan.cycles {
        let name = format!("{SPANNING_KEY}{cycle}");
        // The cycle is over (the server back and every ask done): the spanning body may end.
        let (over_tx, over_rx) = watch::channel(false);
        let entered = Arc::new(AtomicU64::new(0));
        let holder = tokio::spawn(spanning_hold(
            coord.clone(),
            rec.clone(),
            witness.clone(),
            name.clone(),
            plan.lease,
            over_rx.clone(),
            entered.clone(),
        ));
        // Wait (bounded) for the holder's enter: the crash is aimed inside its body.
        let deadline = Instant::now() + Duration::from_secs(10);
        while entered.load(Ordering::Acquire) == 0 && Instant::now() < deadline {
            if holder.is_finished() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            entered.load(Ordering::Acquire) != 0,
            "the spanning hold of cycle {cycle} never entered its body"
        );
        let contender = tokio::spawn(contend(
            coord.clone(),
            rec.clone(),
            witness.clone(),
            name.clone(),
            plan.lease,
            over_rx.clone(),
        ));
        // Keys completed up to the kill.
        let crashing = Arc::new(AtomicBool::new(false));
        let (done_tx, mut done_rx) = watch::channel(0usize);
        let asker = tokio::spawn(complete_keys(
            coord.clone(),
            rec.clone(),
            witness.clone(),
            format!("{ASKED_KEY}{cycle}-"),
            crashing.clone(),
            done_tx,
        ));
        let wanted = plan.keys_before_crash;
        tokio::time::timeout(Duration::from_secs(20), done_rx.wait_for(|n| *n >= wanted))
            .await
            .expect("keys complete before the crash within 20 s")
            .expect("the key task runs until told to stop");
        // The crash: recorded as one fault, from the kill to the server accepting again.
        let killed_at = now_ns();
        rec.push(Event::Fault(Fault {
            at: killed_at,
            fault: plan.fault.clone(),
            start: true,
            data_loss: false,
        }));
        let crash_fn = crash.clone();
        tokio::task::spawn_blocking(move || crash_fn())
            .await
            .expect("the crash ran");
        crashing.store(true, Ordering::Release);
        let restarted_at = now_ns();
        rec.push(Event::Fault(Fault {
            at: restarted_at,
            fault: plan.fault.clone(),
            start: false,
            data_loss: false,
        }));
        figures.longest_downtime_ms = figures
            .longest_downtime_ms
            .max((restarted_at - killed_at) / 1_000_000);
        let mut mine = asker.await.expect("the key task does not panic");
        completed.append(&mut mine);
        // Every key completed so far, asked again.
        let caller = crate::workload::Caller {
            coord,
            rec,
            witness: &witness,
            client: 3,
        };
        for (key, first) in &completed {
            figures.asked_again += 1;
            if let Some(answer) = ask(&caller, key).await
                && &answer == first
            {
                figures.replayed_same += 1;
            }
        }
        over_tx.send_replace(true);
        let spanned = holder.await.expect("the spanning hold does not panic");
        if let Some((invoked, ended, ok)) = spanned
            && invoked < killed_at
            && ended > restarted_at
        {
            figures.spanning += 1;
            figures.spanning_ok += usize::from(ok);
        }
        let grants = contender.await.expect("the contender does not panic");
        if let Some((_, ended, _)) = spanned {
            let inside = entered.load(Ordering::Acquire);
            figures.contender_grants_inside += grants
                .iter()
                .filter(|at| **at > inside && **at < ended)
                .count();
        }
    }
    figures
}

/// One spanning hold: a renewing fenced lock of `name` whose body writes `enter`, waits until
/// the cycle is over (bounded), lingers a moment for the contender, and writes `exit`.
/// Returns (invoked, completed, ended `Ok`) on the history's clock, once it entered.
async fn spanning_hold(
    coord: Coordinator,
    rec: Recorder,
    witness: Arc<WitnessClient>,
    name: String,
    lease: Duration,
    mut over: watch::Receiver<bool>,
    entered: Arc<AtomicU64>,
) -> Option<(u64, u64, bool)> {
    let renew = lease / 3;
    let invoked_at = now_ns();
    let invoked = rec.invoke_renewing_lock(2, &name, renew);
    let call = invoked.call;
    let seen = AtomicU64::new(0);
    // The key the workload's fenced holds (the contender's) take.
    let key = coord.key("hist.lock").part(name.as_str()).finish();
    let result: Result<Option<u64>, CoordError> = coord
        .lock(key)
        .lease(lease)
        .renew(renew)
        .wait(Duration::from_secs(5))
        .fenced()
        .run(|| async {
            let Some(token) = fencing_token() else {
                return Ok(None);
            };
            let token = token.get();
            seen.store(token, Ordering::Relaxed);
            witness.fenced_write(&name, token, call, Phase::Enter).await;
            entered.store(now_ns(), Ordering::Release);
            // Bounded: a cycle whose crash never comes back fails on its own.
            let _ = tokio::time::timeout(Duration::from_secs(60), over.wait_for(|o| *o)).await;
            // A moment more inside, for a contender granted the lock anew to write in it.
            tokio::time::sleep(Duration::from_millis(200)).await;
            witness.fenced_write(&name, token, call, Phase::Exit).await;
            Ok(Some(token))
        })
        .await;
    let ending = match result {
        Ok(Some(token)) => Ending::ok(None, Some(token)),
        Ok(None) => Ending::failed(Outcome::Fail, LAPSED),
        Err(err) => {
            let (outcome, kind) = classify(&err);
            let token = Some(seen.load(Ordering::Relaxed)).filter(|t| *t != 0);
            let mut ending = Ending::failed(
                if token.is_none() {
                    Outcome::Fail
                } else {
                    outcome
                },
                kind,
            );
            ending.token = token;
            ending
        }
    };
    let ok = ending.outcome == Outcome::Ok;
    rec.complete(&invoked, ending);
    (entered.load(Ordering::Acquire) != 0).then(|| (invoked_at, now_ns(), ok))
}

/// The contender: short fenced holds of `name` one after another until the cycle is over.
/// Returns when each was granted (the history's clock).
async fn contend(
    coord: Coordinator,
    rec: Recorder,
    witness: Arc<WitnessClient>,
    name: String,
    lease: Duration,
    over: watch::Receiver<bool>,
) -> Vec<u64> {
    let caller = crate::workload::Caller {
        coord: &coord,
        rec: &rec,
        witness: &witness,
        client: 1,
    };
    let mut grants = Vec::new();
    while !*over.borrow() {
        let before = granted_holds(&rec, &name);
        caller
            .fenced_hold(&name, lease, Duration::from_millis(20))
            .await;
        if granted_holds(&rec, &name) > before {
            grants.push(now_ns());
        }
        // A server that is down refuses at once: no tight loop of reconnects.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    grants
}

/// How many lock calls of `name` in `rec` ended with a token (granted).
fn granted_holds(rec: &Recorder, name: &str) -> usize {
    rec.events()
        .iter()
        .filter(|e| matches!(e, Event::Complete(c) if c.op == Op::Lock && c.key == name && c.token.is_some()))
        .count()
}

/// Idempotent calls on fresh keys `prefix0`, `prefix1`, ... one after another until
/// `crashing`; returns the keys that answered `Ok`, with their answer, and counts them on
/// `done`.
async fn complete_keys(
    coord: Coordinator,
    rec: Recorder,
    witness: Arc<WitnessClient>,
    prefix: String,
    crashing: Arc<AtomicBool>,
    done: watch::Sender<usize>,
) -> Vec<(String, String)> {
    let caller = crate::workload::Caller {
        coord: &coord,
        rec: &rec,
        witness: &witness,
        client: 0,
    };
    let mut completed = Vec::new();
    let mut n = 0;
    while !crashing.load(Ordering::Acquire) {
        let key = format!("{prefix}{n}");
        n += 1;
        if let Some(answer) = ask(&caller, &key).await {
            completed.push((key, answer));
            done.send_replace(completed.len());
        } else {
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    }
    completed
}

/// One idempotent call of `key` through `caller` (recorded as the workload records it);
/// its answer when it ended `Ok`.
async fn ask(caller: &crate::workload::Caller<'_>, key: &str) -> Option<String> {
    caller.idempotent(key, Duration::from_secs(5)).await;
    caller.rec.events().iter().rev().find_map(|e| match e {
        Event::Complete(c) if c.op == Op::Idempotent && c.key == key => Some(
            (c.outcome == Outcome::Ok)
                .then(|| c.answer.clone())
                .flatten(),
        ),
        _ => None,
    })?
}
