//! Deciding each promise on a whole history.
//!
//! | promise | judged on | violation |
//! |---|---|---|
//! | [`Promise::NoOverlap`] | the resource's fenced writes | two calls both had their `enter` and `exit` admitted, and the two spans overlap in the resource's order |
//! | [`Promise::TokensGrow`] | the resource's writes, and lock calls' invocations | an admitted token older than one admitted before for that key, or one token admitted for two calls; or a call invoked after a token was admitted that was granted a token not newer (admitted or refused: a server that lost its lock state in a crash) |
//! | [`Promise::HeldThroughout`] | renewing lock holds that returned `Ok`, and the resource's writes | between the hold's `enter` and `exit`, the resource admitted a write of a newer token by another call, or refused one of the hold's own writes |
//! | [`Promise::AtMostOnce`] | the effects of idempotent bodies | two body effects for one key (within one data epoch) |
//! | [`Promise::SameAnswer`] | idempotent calls' answers | the calls of one key are not linearizable as a write-once register (stateright's tester up to 8 calls a key, an exact direct check beyond), or a call answered what no body of that key produced |
//! | [`Promise::FlightOnce`] | single-flight bodies and answers | two bodies of one key overlapped in one process, or a caller answered what no flight open during its call produced (open: from the body's start to its leader's return) |
//! | [`Promise::CacheFresh`] | cached reads and source writes | a read answered a version that had been replaced for longer than its bound when the read began |
//!
//! Calls whose outcome is unknown (`info`) may have had their effect or not; the checks allow
//! both. A fault with `data_loss` (the server restarted without its data) splits stored-state
//! promises (at-most-once and answers) into epochs: each is judged within one epoch; a call
//! that straddles the loss belongs to both sides, with its answer counted as unknown.
//!
//! Lock holds are judged at the resource, not as a linearizable mutex: a lease lock is not one
//! by design (a holder paused past its lease still believes it holds; the Jepsen analyses of
//! etcd and Redis locks conclude the same), and what it promises is that fencing keeps such a
//! holder's writes out. Holds the clients believed they had at the same time show up as a
//! figure only by the resource's refusals ([`Report::writes_refused`]), not as violations.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::event::{CallId, Complete, Effect, EffectKind, Event, Invoke, Op, Outcome, Phase};
use crate::linearizable::{Call, linearizable};

/// A promise the checker decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Promise {
    /// No two admitted fenced holds of one key overlap at the resource.
    NoOverlap,
    /// Tokens admitted at the resource grow per key, each belonging to one holder; and a lock
    /// call invoked after a token was admitted is granted a newer one (a server that lost its
    /// lock state or token counter in a crash grants an older one, which fencing refuses but
    /// this check still sees).
    TokensGrow,
    /// A renewing hold that returned `Ok` held throughout its body: no newer token reached
    /// the resource between its `enter` and its `exit`. Judged only for holds recorded with
    /// their renewal ([`crate::recorder::Recorder::invoke_renewing_lock`]): an unrenewed lease
    /// promises nothing of the kind. It holds for a renewing holder whose process was paused,
    /// or whose clock stalled or jumped, past its lease too: such a hold must end `LockLost`,
    /// not `Ok` (the shared workload's renewing holds run under every nemesis).
    HeldThroughout,
    /// An idempotent body's effect happens at most once per key.
    AtMostOnce,
    /// Every answer of an idempotent key is the first one stored (linearizable write-once).
    SameAnswer,
    /// A single-flight group runs its body at most once per flight.
    FlightOnce,
    /// A cached read is never older than its staleness bound.
    CacheFresh,
}

/// One broken promise, with the events that show it.
#[derive(Debug, Clone)]
pub struct Violation {
    pub promise: Promise,
    pub key: String,
    pub what: String,
    pub events: Vec<Event>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{:?} on {}: {}", self.promise, self.key, self.what)?;
        for e in &self.events {
            writeln!(f, "    {}", e.to_line())?;
        }
        Ok(())
    }
}

/// What a history held and what it broke.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Calls invoked, by kind.
    pub calls: BTreeMap<String, usize>,
    /// Completions by outcome (`ok`, `fail`, `info`), and calls never completed.
    pub outcomes: BTreeMap<String, usize>,
    /// Faults started, by kind.
    pub faults: BTreeMap<String, usize>,
    /// Fenced writes the resource admitted / refused.
    pub writes_accepted: usize,
    pub writes_refused: usize,
    /// Body effects witnessed.
    pub effects: usize,
    /// The double-holder window: the longest time, in nanoseconds, during which two calls'
    /// bodies on one key both believed they held it, measured at the resource from each
    /// body's `enter` to its `exit` (admitted or refused; bodies cancelled before their `exit`
    /// are not counted).
    pub double_holder: u64,
    /// The longest time from invocation to completion, in nanoseconds.
    pub longest_call: u64,
    /// The longest caller wait under each kind of fault, in nanoseconds: the longest time
    /// from invocation to completion among the calls whose span overlaps a window of that
    /// kind (from its start to its heal; a fault never healed lasts to the end of the
    /// history). `none` holds the calls that overlap no fault at all. Calls that never
    /// completed are not counted here (see [`Report::outcomes`]).
    pub longest_by_fault: BTreeMap<String, u64>,
    /// The error kinds of the calls that ended `fail` or `info`, and how many of each.
    pub errors: BTreeMap<String, usize>,
    /// The `info` share broken down by cause: the error kinds of the calls that ended `info`
    /// (outcome unknown), and how many of each.
    pub info_causes: BTreeMap<String, usize>,
    /// New versions written to cached sources.
    pub source_writes: usize,
    /// How many times each kind of fault bit: the calls whose span overlaps a window of that
    /// kind (start to heal) and that did not end `ok` (a `fail`, an `info`, or never
    /// completed), plus the fenced writes the resource refused during such a window. Kinds
    /// injected that bit nothing are listed with 0.
    pub bites: BTreeMap<String, usize>,
    /// Renewing lock holds ([`crate::recorder::Recorder::invoke_renewing_lock`]) that ended
    /// `LockLost`: the runtime saw the hold lost and stopped its body.
    pub renewing_lost: usize,
    /// Renewing lock holds recorded, all outcomes.
    pub renewing_holds: usize,
    /// Idempotent calls whose span overlaps a fault window and that ended `ok`: calls that met
    /// a fault and still answered (whose answers the same-answer and at-most-once checks
    /// judge).
    pub idempotent_through_faults: usize,
    /// The span of the history, first to last event, in nanoseconds.
    pub span: u64,
    pub violations: Vec<Violation>,
}

impl Report {
    /// Calls invoked, all kinds.
    pub fn total_calls(&self) -> usize {
        self.calls.values().sum()
    }

    /// Faults started, all kinds.
    pub fn total_faults(&self) -> usize {
        self.faults.values().sum()
    }

    /// The share of completed calls that ended `info` (outcome unknown), 0 to 1.
    pub fn info_share(&self) -> f64 {
        let info = self.outcomes.get("info").copied().unwrap_or(0);
        let done: usize = ["ok", "fail", "info"]
            .iter()
            .map(|o| self.outcomes.get(*o).copied().unwrap_or(0))
            .sum();
        if done == 0 {
            0.0
        } else {
            info as f64 / done as f64
        }
    }

    /// One line per fault kind injected: how many times it was started and how many times it
    /// bit ([`Report::bites`]).
    pub fn bite_lines(&self) -> Vec<String> {
        self.faults
            .iter()
            .map(|(kind, started)| {
                format!(
                    "fault {kind}: started {started}, bit {}",
                    self.bites.get(kind).copied().unwrap_or(0)
                )
            })
            .collect()
    }

    /// The figures a run proves its faults by, in one line: calls, the `info` share (by
    /// cause), fenced writes refused, renewing holds lost, idempotent calls answered through a
    /// fault.
    pub fn bite_summary(&self) -> String {
        format!(
            "calls {}, info {:.1} % {:?}, refusals {}, losses {} of {} renewing holds, idempotent ok through faults {}",
            self.total_calls(),
            self.info_share() * 100.0,
            self.info_causes,
            self.writes_refused,
            self.renewing_lost,
            self.renewing_holds,
            self.idempotent_through_faults
        )
    }

    /// What a run under faults must show to prove its faults bit: at least one fenced write
    /// refused at the resource, one renewing hold ended `LockLost`, and one idempotent call
    /// answered through a fault. `Err` names what is missing.
    pub fn faults_bit(&self) -> Result<(), String> {
        let mut missing = Vec::new();
        if self.writes_refused == 0 {
            missing.push("no fenced write was refused at the resource");
        }
        if self.renewing_lost == 0 {
            missing.push("no renewing hold ended LockLost");
        }
        if self.idempotent_through_faults == 0 {
            missing.push("no idempotent call answered through a fault");
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("the nemesis did not bite: {}", missing.join("; ")))
        }
    }

    /// Violations of `promise`.
    pub fn count(&self, promise: Promise) -> usize {
        self.violations
            .iter()
            .filter(|v| v.promise == promise)
            .count()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "history: {} calls {:?}, outcomes {:?}, {} faults {:?}, resource writes {} admitted / {} refused, {} effects, double-holder window {} ms, longest call {} ms, span {} ms, {} violations",
            self.total_calls(),
            self.calls,
            self.outcomes,
            self.total_faults(),
            self.faults,
            self.writes_accepted,
            self.writes_refused,
            self.effects,
            self.double_holder / 1_000_000,
            self.longest_call / 1_000_000,
            self.span / 1_000_000,
            self.violations.len()
        )?;
        if !self.longest_by_fault.is_empty() {
            let waits: Vec<String> = self
                .longest_by_fault
                .iter()
                .map(|(k, ns)| format!("{k} {} ms", ns / 1_000_000))
                .collect();
            writeln!(f, "  longest call by fault: {}", waits.join(", "))?;
        }
        if !self.errors.is_empty() {
            writeln!(f, "  errors: {:?}", self.errors)?;
        }
        for v in &self.violations {
            write!(f, "  {v}")?;
        }
        Ok(())
    }
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Lock => "lock",
        Op::Idempotent => "idempotent",
        Op::SingleFlight => "single_flight",
        Op::CacheRead => "cache_read",
    }
}

/// One call with its completion, if it completed.
struct Paired<'a> {
    invoke: &'a Invoke,
    complete: Option<&'a Complete>,
}

impl Paired<'_> {
    fn end(&self) -> Option<u64> {
        self.complete.map(|c| c.at)
    }
    fn ok_answer(&self) -> Option<&str> {
        self.complete
            .filter(|c| c.outcome == Outcome::Ok)
            .and_then(|c| c.answer.as_deref())
    }
    fn events(&self) -> Vec<Event> {
        let mut out = vec![Event::Invoke(self.invoke.clone())];
        if let Some(c) = self.complete {
            out.push(Event::Complete(c.clone()));
        }
        out
    }
}

/// Decides every promise on `events` (in any order; several processes' histories may simply
/// be concatenated).
pub fn check(events: &[Event]) -> Report {
    let mut report = Report::default();
    let mut invokes: Vec<&Invoke> = Vec::new();
    let mut completes: HashMap<CallId, &Complete> = HashMap::new();
    let mut writes = Vec::new();
    let mut effects: Vec<&Effect> = Vec::new();
    let mut losses: Vec<u64> = Vec::new();
    let mut fault_events: Vec<&crate::event::Fault> = Vec::new();
    let mut sources: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
    for e in events {
        match e {
            Event::Invoke(i) => {
                *report.calls.entry(op_name(i.op).into()).or_default() += 1;
                invokes.push(i);
            }
            Event::Complete(c) => {
                let name = match c.outcome {
                    Outcome::Ok => "ok",
                    Outcome::Fail => "fail",
                    Outcome::Info => "info",
                };
                *report.outcomes.entry(name.into()).or_default() += 1;
                if let Some(kind) = &c.error {
                    *report.errors.entry(kind.clone()).or_default() += 1;
                    if c.outcome == Outcome::Info {
                        *report.info_causes.entry(kind.clone()).or_default() += 1;
                    }
                }
                completes.insert(c.call, c);
            }
            Event::Resource(w) => {
                if w.accepted {
                    report.writes_accepted += 1;
                } else {
                    report.writes_refused += 1;
                }
                writes.push(w);
            }
            Event::Effect(x) => {
                report.effects += 1;
                effects.push(x);
            }
            Event::Fault(f) => {
                fault_events.push(f);
                if f.start {
                    *report.faults.entry(f.fault.clone()).or_default() += 1;
                    if f.data_loss {
                        losses.push(f.at);
                    }
                }
            }
            Event::SourceWrite(s) => {
                report.source_writes += 1;
                sources
                    .entry(s.key.as_str())
                    .or_default()
                    .push((s.at, s.version));
            }
        }
    }
    losses.sort_unstable();
    let first = events.iter().map(Event::at).min().unwrap_or(0);
    let last = events.iter().map(Event::at).max().unwrap_or(0);
    report.span = last - first;
    let calls: Vec<Paired<'_>> = invokes
        .iter()
        .map(|i| Paired {
            invoke: i,
            complete: completes.get(&i.call).copied(),
        })
        .collect();
    let never = calls.iter().filter(|c| c.complete.is_none()).count();
    if never > 0 {
        report.outcomes.insert("never_completed".into(), never);
    }
    report.longest_call = calls
        .iter()
        .filter_map(|c| c.end().map(|e| e.saturating_sub(c.invoke.at)))
        .max()
        .unwrap_or(0);
    report.longest_by_fault = longest_by_fault(&calls, &fault_events, last);
    bites(&calls, &writes, &fault_events, last, &mut report);

    let invoked_at: HashMap<CallId, u64> = calls
        .iter()
        .filter(|c| c.invoke.op == Op::Lock)
        .map(|c| (c.invoke.call, c.invoke.at))
        .collect();
    check_resource(&writes, &invoked_at, &losses, &mut report);
    check_held_throughout(&writes, &calls, &mut report);
    check_idempotent(&calls, &effects, &losses, &mut report);
    check_flights(&calls, &effects, &mut report);
    check_cache(&calls, &sources, &mut report);
    report
}

/// Fault windows per kind, from each start to its heal (the next heal of that kind), or to
/// `last` when never healed. Steps of one kind never overlap, so each kind's windows come out
/// sorted by start and by end alike.
fn fault_windows(faults: &[&crate::event::Fault], last: u64) -> BTreeMap<String, Vec<(u64, u64)>> {
    let mut sorted: Vec<&crate::event::Fault> = faults.to_vec();
    sorted.sort_by_key(|f| (f.at, !f.start));
    let mut open: HashMap<&str, std::collections::VecDeque<u64>> = HashMap::new();
    let mut windows: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    for f in sorted {
        if f.start {
            open.entry(f.fault.as_str()).or_default().push_back(f.at);
        } else if let Some(start) = open.get_mut(f.fault.as_str()).and_then(|q| q.pop_front()) {
            windows
                .entry(f.fault.clone())
                .or_default()
                .push((start, f.at));
        }
    }
    for (kind, starts) in open {
        for start in starts {
            windows
                .entry(kind.to_owned())
                .or_default()
                .push((start, last));
        }
    }
    for w in windows.values_mut() {
        w.sort_unstable();
    }
    windows
}

/// Whether a window of `ws` (sorted) overlaps `start..=end`.
fn overlaps(ws: &[(u64, u64)], start: u64, end: u64) -> bool {
    // The first window that ends at or after `start` overlaps if it began by `end`.
    let i = ws.partition_point(|(_, e)| *e < start);
    ws.get(i).is_some_and(|(s, _)| *s <= end)
}

/// Fills [`Report::bites`], [`Report::renewing_lost`], [`Report::renewing_holds`] and
/// [`Report::idempotent_through_faults`].
fn bites(
    calls: &[Paired<'_>],
    writes: &[&crate::event::ResourceWrite],
    faults: &[&crate::event::Fault],
    last: u64,
    report: &mut Report,
) {
    let windows = fault_windows(faults, last);
    for kind in report.faults.keys() {
        report.bites.insert(kind.clone(), 0);
    }
    for c in calls {
        let start = c.invoke.at;
        let end = c.end().unwrap_or(last);
        let outcome = c.complete.map(|d| d.outcome);
        if c.invoke.op == Op::Lock && c.invoke.renew.is_some() {
            report.renewing_holds += 1;
            if c.complete
                .is_some_and(|d| d.error.as_deref() == Some("LockLost"))
            {
                report.renewing_lost += 1;
            }
        }
        let mut through_fault = false;
        for (kind, ws) in &windows {
            if overlaps(ws, start, end) {
                through_fault = true;
                if outcome != Some(Outcome::Ok) {
                    *report.bites.entry(kind.clone()).or_default() += 1;
                }
            }
        }
        if through_fault && c.invoke.op == Op::Idempotent && outcome == Some(Outcome::Ok) {
            report.idempotent_through_faults += 1;
        }
    }
    for w in writes.iter().filter(|w| !w.accepted) {
        for (kind, ws) in &windows {
            if overlaps(ws, w.at, w.at) {
                *report.bites.entry(kind.clone()).or_default() += 1;
            }
        }
    }
}

fn longest_by_fault(
    calls: &[Paired<'_>],
    faults: &[&crate::event::Fault],
    last: u64,
) -> BTreeMap<String, u64> {
    let windows = fault_windows(faults, last);
    let mut longest: BTreeMap<String, u64> = BTreeMap::new();
    for c in calls {
        let Some(end) = c.end() else { continue };
        let start = c.invoke.at;
        let wait = end.saturating_sub(start);
        let mut any = false;
        for (kind, ws) in &windows {
            // The first window that ends at or after the call began; it overlaps the call if
            // it also began no later than the call ended.
            let i = ws.partition_point(|(_, e)| *e < start);
            if ws.get(i).is_some_and(|(s, _)| *s <= end) {
                any = true;
                let slot = longest.entry(kind.clone()).or_default();
                *slot = (*slot).max(wait);
            }
        }
        if !any {
            let slot = longest.entry("none".into()).or_default();
            *slot = (*slot).max(wait);
        }
    }
    longest
}

fn check_resource(
    writes: &[&crate::event::ResourceWrite],
    invoked_at: &HashMap<CallId, u64>,
    losses: &[u64],
    report: &mut Report,
) {
    let mut by_key: BTreeMap<&str, Vec<&crate::event::ResourceWrite>> = BTreeMap::new();
    for w in writes {
        by_key.entry(w.key.as_str()).or_default().push(w);
    }
    for (key, mut ws) in by_key {
        ws.sort_by_key(|w| w.seq);
        check_granted_after(key, &ws, invoked_at, losses, report);
        // Tokens grow, each belonging to one holder.
        let mut newest: Option<&crate::event::ResourceWrite> = None;
        let mut reported = std::collections::HashSet::new();
        for w in ws.iter().filter(|w| w.accepted) {
            if let Some(prev) = newest {
                if reported.contains(&w.call) {
                    // One violation per offending holder.
                } else if w.token < prev.token {
                    reported.insert(w.call);
                    report.violations.push(Violation {
                        promise: Promise::TokensGrow,
                        key: key.into(),
                        what: format!("token {} admitted after token {}", w.token, prev.token),
                        events: vec![Event::Resource(prev.clone()), Event::Resource((*w).clone())],
                    });
                } else if w.token == prev.token && w.call != prev.call {
                    reported.insert(w.call);
                    report.violations.push(Violation {
                        promise: Promise::TokensGrow,
                        key: key.into(),
                        what: format!(
                            "token {} admitted for two holders, calls {} and {}",
                            w.token, prev.call, w.call
                        ),
                        events: vec![Event::Resource(prev.clone()), Event::Resource((*w).clone())],
                    });
                }
            }
            if newest.is_none_or(|p| w.token >= p.token) {
                newest = Some(w);
            }
        }
        // Admitted holds: both ends admitted.
        let mut spans: BTreeMap<
            CallId,
            (
                Option<&crate::event::ResourceWrite>,
                Option<&crate::event::ResourceWrite>,
            ),
        > = BTreeMap::new();
        for w in ws.iter().filter(|w| w.accepted) {
            let span = spans.entry(w.call).or_default();
            match w.phase {
                Phase::Enter => span.0 = Some(w),
                Phase::Exit => span.1 = Some(w),
            }
        }
        let mut holds: Vec<(&crate::event::ResourceWrite, &crate::event::ResourceWrite)> = spans
            .values()
            .filter_map(|(a, b)| Some(((*a)?, (*b)?)))
            .collect();
        holds.sort_by_key(|(enter, _)| enter.seq);
        for pair in holds.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if b.0.seq < a.1.seq {
                report.violations.push(Violation {
                    promise: Promise::NoOverlap,
                    key: key.into(),
                    what: format!(
                        "holds of calls {} (token {}) and {} (token {}) overlap at the resource",
                        a.0.call, a.0.token, b.0.call, b.0.token
                    ),
                    events: [a.0, a.1, b.0, b.1]
                        .into_iter()
                        .map(|w| Event::Resource(w.clone()))
                        .collect(),
                });
            }
        }
    }
}

/// Tokens granted in order: a lock call invoked after the resource admitted token `t` of
/// another call on the key (within one data epoch) was granted after `t` was, so its own token
/// must be newer, whether the resource admitted its writes or not. A token at or below `t`
/// means the server handed out a grant it had already passed: its lock state or token counter
/// went back (a crash that lost them). Fencing keeps such a write out at the resource, so only
/// this check sees it; a holder that was granted early and wrote late (paused) was invoked
/// before `t` was admitted and is not judged by it.
fn check_granted_after(
    key: &str,
    ws: &[&crate::event::ResourceWrite],
    invoked_at: &HashMap<CallId, u64>,
    losses: &[u64],
    report: &mut Report,
) {
    // Admitted writes by time, with the newest token admitted so far within each epoch.
    let mut admitted: Vec<&crate::event::ResourceWrite> =
        ws.iter().copied().filter(|w| w.accepted).collect();
    admitted.sort_by_key(|w| w.at);
    let mut newest: Vec<&crate::event::ResourceWrite> = Vec::with_capacity(admitted.len());
    for (i, w) in admitted.iter().enumerate() {
        let carried = i
            .checked_sub(1)
            .map(|p| newest[p])
            .filter(|p| epoch(losses, p.at) == epoch(losses, w.at) && p.token >= w.token);
        newest.push(carried.unwrap_or(w));
    }
    let mut reported = std::collections::HashSet::new();
    for w in ws.iter().filter(|w| w.phase == Phase::Enter) {
        let Some(&invoked) = invoked_at.get(&w.call) else {
            continue;
        };
        let before = admitted.partition_point(|a| a.at < invoked);
        let Some(prev) = before.checked_sub(1).map(|p| newest[p]) else {
            continue;
        };
        if prev.call == w.call
            || w.token > prev.token
            || epoch(losses, prev.at) != epoch(losses, invoked)
            || !reported.insert(w.call)
        {
            continue;
        }
        report.violations.push(Violation {
            promise: Promise::TokensGrow,
            key: key.into(),
            what: format!(
                "call {} was invoked after token {} (call {}) was admitted, yet was granted token {}: the server handed out a grant it had already passed",
                w.call, prev.token, prev.call, w.token
            ),
            events: vec![Event::Resource(prev.clone()), Event::Resource((*w).clone())],
        });
    }
}

fn check_held_throughout(
    writes: &[&crate::event::ResourceWrite],
    calls: &[Paired<'_>],
    report: &mut Report,
) {
    let mut by_key: HashMap<&str, Vec<&crate::event::ResourceWrite>> = HashMap::new();
    for w in writes {
        by_key.entry(w.key.as_str()).or_default().push(w);
    }
    for ws in by_key.values_mut() {
        ws.sort_by_key(|w| w.seq);
    }
    // The double-holder window, from every body's enter and exit as the resource saw them.
    for ws in by_key.values() {
        let mut spans: BTreeMap<CallId, (Option<u64>, Option<u64>)> = BTreeMap::new();
        for w in ws {
            let span = spans.entry(w.call).or_default();
            match w.phase {
                Phase::Enter => span.0 = Some(w.at),
                Phase::Exit => span.1 = Some(w.at),
            }
        }
        let mut spans: Vec<(u64, u64)> = spans
            .values()
            .filter_map(|(a, b)| Some(((*a)?, (*b)?)))
            .collect();
        spans.sort_unstable();
        let mut latest_end: Option<u64> = None;
        for (start, end) in spans {
            if let Some(prev) = latest_end {
                let overlap = prev.min(end).saturating_sub(start);
                report.double_holder = report.double_holder.max(overlap);
            }
            latest_end = Some(latest_end.map_or(end, |p| p.max(end)));
        }
    }
    for c in calls {
        if c.invoke.op != Op::Lock || c.invoke.renew.is_none() {
            continue;
        }
        let Some(done) = c.complete.filter(|d| d.outcome == Outcome::Ok) else {
            continue;
        };
        let Some(token) = done.token else { continue };
        let Some(ws) = by_key.get(c.invoke.key.as_str()) else {
            continue;
        };
        let own: Vec<&&crate::event::ResourceWrite> =
            ws.iter().filter(|w| w.call == c.invoke.call).collect();
        let Some(enter) = own.iter().find(|w| w.phase == Phase::Enter) else {
            continue;
        };
        let end = own
            .iter()
            .find(|w| w.phase == Phase::Exit)
            .map_or(u64::MAX, |w| w.seq);
        let newer = ws.iter().find(|w| {
            w.accepted
                && w.call != c.invoke.call
                && w.token > token
                && w.seq > enter.seq
                && w.seq < end
        });
        let refused = own.iter().find(|w| !w.accepted);
        let what = match (newer, refused) {
            (Some(w), _) => format!(
                "call {} returned Ok holding token {token}, yet the resource admitted token {} of call {} during its body",
                c.invoke.call, w.token, w.call
            ),
            (None, Some(_)) => format!(
                "call {} returned Ok holding token {token}, yet the resource refused its write (a newer token had reached it)",
                c.invoke.call
            ),
            (None, None) => continue,
        };
        let mut events = c.events();
        events.extend(own.iter().map(|w| Event::Resource((**w).clone())));
        if let Some(w) = newer {
            events.push(Event::Resource((*w).clone()));
        }
        report.violations.push(Violation {
            promise: Promise::HeldThroughout,
            key: c.invoke.key.clone(),
            what,
            events,
        });
    }
}

fn epoch(losses: &[u64], at: u64) -> usize {
    losses.partition_point(|&l| l <= at)
}

fn check_idempotent(
    calls: &[Paired<'_>],
    effects: &[&Effect],
    losses: &[u64],
    report: &mut Report,
) {
    // At most one body effect per key and epoch.
    let mut bodies: BTreeMap<(&str, usize), Vec<&Effect>> = BTreeMap::new();
    for e in effects.iter().filter(|e| e.kind == EffectKind::Body) {
        bodies
            .entry((e.key.as_str(), epoch(losses, e.at)))
            .or_default()
            .push(e);
    }
    for ((key, _), runs) in &bodies {
        if runs.len() > 1 {
            report.violations.push(Violation {
                promise: Promise::AtMostOnce,
                key: (*key).into(),
                what: format!(
                    "the body ran {} times (calls {})",
                    runs.len(),
                    runs.iter()
                        .map(|r| r.call.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                events: runs.iter().map(|e| Event::Effect((*e).clone())).collect(),
            });
        }
    }
    // Answers: linearizable per key and epoch, and each produced by a body of that key.
    let mut by_key: BTreeMap<(&str, usize), Vec<&Paired<'_>>> = BTreeMap::new();
    // A call belongs to every epoch its span touches: one in flight across a data loss may
    // take effect on either side of it (its answer then counts as unknown).
    for c in calls.iter().filter(|c| c.invoke.op == Op::Idempotent) {
        let first = epoch(losses, c.invoke.at);
        let last = c.end().map_or(losses.len(), |end| epoch(losses, end));
        for ep in first..=last {
            by_key
                .entry((c.invoke.key.as_str(), ep))
                .or_default()
                .push(c);
        }
    }
    let proposals: HashMap<CallId, &str> = calls
        .iter()
        .filter_map(|c| Some((c.invoke.call, c.invoke.proposal.as_deref()?)))
        .collect();
    // What the bodies of each key answer, gathered once (a long run has thousands of keys).
    let mut produced: HashMap<&str, Vec<&str>> = HashMap::new();
    for e in effects.iter().filter(|e| e.kind == EffectKind::Body) {
        if let Some(p) = proposals.get(&e.call) {
            produced.entry(e.key.as_str()).or_default().push(p);
        }
    }
    for ((key, ep), group) in by_key {
        let ran: &[&str] = produced.get(key).map_or(&[], Vec::as_slice);
        let mut lin = Vec::new();
        for c in &group {
            let Some(proposal) = c.invoke.proposal.clone() else {
                continue;
            };
            if c.complete.is_some_and(|x| x.outcome == Outcome::Fail) {
                continue; // certainly no effect: not part of the register's history
            }
            let straddles = epoch(losses, c.invoke.at) != ep
                || c.end().is_some_and(|end| epoch(losses, end) != ep);
            let answer = if straddles {
                None
            } else {
                c.ok_answer().map(str::to_owned)
            };
            if let Some(a) = &answer
                && !ran.contains(&a.as_str())
            {
                report.violations.push(Violation {
                    promise: Promise::SameAnswer,
                    key: key.into(),
                    what: format!(
                        "call {} answered {a:?}, which no body of this key produced",
                        c.invoke.call
                    ),
                    events: c.events(),
                });
            }
            lin.push(Call {
                start: c.invoke.at,
                end: c.end(),
                proposal,
                answer,
            });
        }
        if !linearizable(&lin) {
            let answers: Vec<String> = lin.iter().filter_map(|c| c.answer.clone()).collect();
            report.violations.push(Violation {
                promise: Promise::SameAnswer,
                key: key.into(),
                what: format!(
                    "the answers are not those of one stored outcome (not linearizable as a write-once record): {answers:?}"
                ),
                events: group.iter().flat_map(|c| c.events()).collect(),
            });
        }
    }
}

/// A flight body's start and end effects, as far as seen.
type FlightRun<'a> = (Option<&'a Effect>, Option<&'a Effect>);

fn check_flights(calls: &[Paired<'_>], effects: &[&Effect], report: &mut Report) {
    // Body runs per (process, key): start and end times, and the proposal they answer.
    let proposals: HashMap<CallId, &str> = calls
        .iter()
        .filter_map(|c| Some((c.invoke.call, c.invoke.proposal.as_deref()?)))
        .collect();
    let mut runs: BTreeMap<(u32, &str), BTreeMap<CallId, FlightRun<'_>>> = BTreeMap::new();
    for e in effects {
        let slot = match e.kind {
            EffectKind::FlightStart => 0,
            EffectKind::FlightEnd => 1,
            EffectKind::Body => continue,
        };
        let run = runs
            .entry((e.call.pid(), e.key.as_str()))
            .or_default()
            .entry(e.call)
            .or_default();
        if slot == 0 {
            run.0 = Some(e);
        } else {
            run.1 = Some(e);
        }
    }
    for ((_, key), group) in &runs {
        let mut spans: Vec<(u64, u64, &Effect)> = group
            .values()
            .filter_map(|(s, e)| {
                let s = (*s)?;
                Some((s.at, e.map_or(u64::MAX, |e| e.at), s))
            })
            .collect();
        spans.sort_by_key(|s| s.0);
        for pair in spans.windows(2) {
            if pair[1].0 < pair[0].1 {
                report.violations.push(Violation {
                    promise: Promise::FlightOnce,
                    key: (*key).into(),
                    what: format!(
                        "bodies of calls {} and {} ran at the same time in one process",
                        pair[0].2.call, pair[1].2.call
                    ),
                    events: vec![
                        Event::Effect(pair[0].2.clone()),
                        Event::Effect(pair[1].2.clone()),
                    ],
                });
            }
        }
    }
    let by_proposal: HashMap<&str, CallId> =
        proposals.iter().map(|(call, p)| (*p, *call)).collect();
    let leader_end: HashMap<CallId, u64> = calls
        .iter()
        .filter_map(|c| Some((c.invoke.call, c.end()?)))
        .collect();
    for c in calls.iter().filter(|c| c.invoke.op == Op::SingleFlight) {
        let (Some(answer), Some(end)) = (c.ok_answer(), c.end()) else {
            continue;
        };
        // Proposals name their call, so the one run that could have produced the answer is
        // found directly (a long run has thousands of runs per key).
        let fits = by_proposal
            .get(answer)
            .and_then(|call| {
                let (s, _) = runs
                    .get(&(c.invoke.pid, c.invoke.key.as_str()))?
                    .get(call)?;
                Some((call, s))
            })
            .is_some_and(|(call, s)| {
                // A flight is open from its body's start until its leader's call returns
                // (callers may join after the body's last effect, before the answer is out).
                let open_until = leader_end.get(call).copied().unwrap_or(u64::MAX);
                s.is_some_and(|s| s.at <= end) && open_until >= c.invoke.at
            });
        if !fits {
            report.violations.push(Violation {
                promise: Promise::FlightOnce,
                key: c.invoke.key.clone(),
                what: format!(
                    "call {} answered {answer:?}, from no body of its process running during the call",
                    c.invoke.call
                ),
                events: c.events(),
            });
        }
    }
}

/// One source's writes as (at, version) sorted by version, and for each the moment its
/// version was first replaced (`u64::MAX`: never).
type SourceVersions = (Vec<(u64, u64)>, Vec<u64>);

fn check_cache(
    calls: &[Paired<'_>],
    sources: &HashMap<&str, Vec<(u64, u64)>>,
    report: &mut Report,
) {
    // Each source's writes by version, and the earliest moment each version was replaced (the
    // first write of any newer version), so that a read is judged in logarithmic time.
    let mut replaced_at: HashMap<&str, SourceVersions> = HashMap::new();
    for (key, writes) in sources {
        let mut by_version = writes.clone();
        by_version.sort_unstable_by_key(|(at, v)| (*v, *at));
        let mut replaced = vec![u64::MAX; by_version.len()];
        // Walk the versions from the newest down, one group of equal versions at a time,
        // carrying the earliest write of any newer version.
        let mut newer = u64::MAX;
        let mut end = by_version.len();
        while end > 0 {
            let version = by_version[end - 1].1;
            let start = by_version[..end].partition_point(|(_, v)| *v < version);
            replaced[start..end].fill(newer);
            for (at, _) in &by_version[start..end] {
                newer = newer.min(*at);
            }
            end = start;
        }
        replaced_at.insert(key, (by_version, replaced));
    }
    for c in calls.iter().filter(|c| c.invoke.op == Op::CacheRead) {
        let Some(answer) = c.ok_answer() else {
            continue;
        };
        let bound = c.invoke.bound.unwrap_or(0);
        let (writes, replaced_list) = replaced_at
            .get(c.invoke.key.as_str())
            .map_or((&[][..], &[][..]), |(w, r)| (w.as_slice(), r.as_slice()));
        let Ok(version) = answer.parse::<u64>() else {
            report.violations.push(Violation {
                promise: Promise::CacheFresh,
                key: c.invoke.key.clone(),
                what: format!("call {} answered {answer:?}, not a version", c.invoke.call),
                events: c.events(),
            });
            continue;
        };
        let first = writes.partition_point(|(_, v)| *v < version);
        if writes.get(first).is_none_or(|(_, v)| *v != version) {
            report.violations.push(Violation {
                promise: Promise::CacheFresh,
                key: c.invoke.key.clone(),
                what: format!(
                    "call {} read version {version}, which was never written",
                    c.invoke.call
                ),
                events: c.events(),
            });
            continue;
        }
        // When the version read was first replaced.
        let replaced = Some(replaced_list[first]).filter(|at| *at != u64::MAX);
        if let Some(replaced) = replaced
            && replaced.saturating_add(bound) < c.invoke.at
        {
            report.violations.push(Violation {
                    promise: Promise::CacheFresh,
                    key: c.invoke.key.clone(),
                    what: format!(
                        "call {} read version {version}, replaced {} ms before the read began (bound {} ms)",
                        c.invoke.call,
                        (c.invoke.at - replaced) / 1_000_000,
                        bound / 1_000_000
                    ),
                    events: c.events(),
                });
        }
    }
}
