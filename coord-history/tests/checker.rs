//! The checker on hand-made histories: each promise passes when kept and fails, naming the
//! offending events, when broken; histories survive a round trip through JSON lines.

use coord_history::event::{ResourceWrite, SourceWrite};
use coord_history::{
    CallId, Complete, Effect, EffectKind, Event, Fault, Invoke, Op, Outcome, Phase, Promise, check,
    read_jsonl, write_jsonl,
};

fn call(pid: u32, n: u32) -> CallId {
    CallId((u64::from(pid) << 32) | u64::from(n))
}

fn invoke(at: u64, c: CallId, op: Op, key: &str, proposal: Option<&str>) -> Event {
    Event::Invoke(Invoke {
        at,
        pid: c.pid(),
        client: 0,
        call: c,
        op,
        key: key.into(),
        owner: None,
        proposal: proposal.map(Into::into),
        bound: None,
        renew: None,
    })
}

fn done(at: u64, c: CallId, op: Op, key: &str, outcome: Outcome, answer: Option<&str>) -> Event {
    Event::Complete(Complete {
        at,
        pid: c.pid(),
        client: 0,
        call: c,
        op,
        key: key.into(),
        outcome,
        token: None,
        answer: answer.map(Into::into),
        error: None,
    })
}

fn write(seq: u64, c: CallId, token: u64, phase: Phase, accepted: bool) -> Event {
    Event::Resource(ResourceWrite {
        seq,
        at: seq,
        key: "r".into(),
        token,
        call: c,
        phase,
        accepted,
    })
}

fn effect(at: u64, c: CallId, key: &str, kind: EffectKind) -> Event {
    Event::Effect(Effect {
        seq: at,
        at,
        key: key.into(),
        call: c,
        kind,
    })
}

#[test]
fn fenced_holds_in_turn_pass_and_a_refused_late_exit_is_no_hold() {
    let (a, b) = (call(1, 1), call(2, 1));
    let events = vec![
        write(1, a, 5, Phase::Enter, true),
        write(2, b, 6, Phase::Enter, true),
        write(3, a, 5, Phase::Exit, false), // a was paused past its lease: refused
        write(4, b, 6, Phase::Exit, true),
    ];
    let report = check(&events);
    assert!(report.violations.is_empty(), "{report}");
    assert_eq!(report.writes_refused, 1);
}

#[test]
fn overlapping_holds_and_a_shared_token_are_violations() {
    let (a, b) = (call(1, 1), call(2, 1));
    let events = vec![
        write(1, a, 1, Phase::Enter, true),
        write(2, b, 1, Phase::Enter, true),
        write(3, a, 1, Phase::Exit, true),
        write(4, b, 1, Phase::Exit, true),
    ];
    let report = check(&events);
    assert_eq!(report.count(Promise::NoOverlap), 1, "{report}");
    assert!(report.count(Promise::TokensGrow) >= 1, "{report}");
    assert!(
        report.violations.iter().all(|v| v.events.len() >= 2),
        "{report}"
    );
}

/// A lock call on the resource key `r`, renewing or not, that returned `Ok` with `token`.
fn lock_ok(at: (u64, u64), c: CallId, token: u64, renewing: bool) -> [Event; 2] {
    let Event::Invoke(mut invoke) = invoke(at.0, c, Op::Lock, "r", None) else {
        unreachable!()
    };
    invoke.renew = renewing.then_some(250_000_000);
    let Event::Complete(mut complete) = done(at.1, c, Op::Lock, "r", Outcome::Ok, None) else {
        unreachable!()
    };
    complete.token = Some(token);
    [Event::Invoke(invoke), Event::Complete(complete)]
}

#[test]
fn a_renewing_hold_that_returned_ok_while_a_newer_token_wrote_is_a_violation() {
    let (a, b) = (call(1, 1), call(2, 1));
    // b got a newer token during a's body (a failover lost a's grant); fencing kept a's exit
    // out, yet a returned Ok.
    let mut events = vec![
        write(2, a, 5, Phase::Enter, true),
        write(3, b, 6, Phase::Enter, true),
        write(4, b, 6, Phase::Exit, true),
        write(5, a, 5, Phase::Exit, false),
    ];
    events.extend(lock_ok((1, 6), a, 5, true));
    events.extend(lock_ok((2, 5), b, 6, true));
    let report = check(&events);
    assert_eq!(report.count(Promise::HeldThroughout), 1, "{report}");
    assert_eq!(
        report.count(Promise::NoOverlap),
        0,
        "fencing held: {report}"
    );
    // Both bodies believed they held from b's enter to b's exit.
    assert_eq!(report.double_holder, 1, "{report}");

    // The same history without renewal promises nothing of the kind (a lease lock is not a
    // mutex); holds in turn pass either way.
    let mut unrenewed = events[..4].to_vec();
    unrenewed.extend(lock_ok((1, 6), a, 5, false));
    unrenewed.extend(lock_ok((2, 5), b, 6, false));
    assert_eq!(check(&unrenewed).count(Promise::HeldThroughout), 0);
    let mut in_turn = vec![
        write(2, a, 5, Phase::Enter, true),
        write(3, a, 5, Phase::Exit, true),
        write(4, b, 6, Phase::Enter, true),
        write(5, b, 6, Phase::Exit, true),
    ];
    in_turn.extend(lock_ok((1, 4), a, 5, true));
    in_turn.extend(lock_ok((3, 6), b, 6, true));
    let report = check(&in_turn);
    assert!(report.violations.is_empty(), "{report}");
    assert_eq!(report.double_holder, 0);
}

#[test]
fn a_token_going_backwards_is_a_violation() {
    let (a, b) = (call(1, 1), call(2, 1));
    let events = vec![
        write(1, a, 7, Phase::Enter, true),
        write(2, a, 7, Phase::Exit, true),
        write(3, b, 3, Phase::Enter, true),
        write(4, b, 3, Phase::Exit, true),
    ];
    assert_eq!(check(&events).count(Promise::TokensGrow), 1);
}

#[test]
fn a_grant_older_than_a_token_already_admitted_is_a_violation_even_when_refused() {
    let (a, b, c) = (call(1, 1), call(2, 1), call(3, 1));
    // b was invoked (at 3) after a's token 7 was admitted (at 2), yet got token 2: the server
    // lost its lock state (a crash without its data). Fencing refused b's writes.
    let mut events = vec![
        write(2, a, 7, Phase::Enter, true),
        write(4, b, 2, Phase::Enter, false),
        write(5, b, 2, Phase::Exit, false),
        write(6, a, 7, Phase::Exit, true),
    ];
    events.extend(lock_ok((1, 7), a, 7, true));
    events.push(invoke(3, b, Op::Lock, "r", None));
    let report = check(&events);
    assert_eq!(report.count(Promise::TokensGrow), 1, "{report}");
    assert_eq!(report.count(Promise::NoOverlap), 0, "{report}");

    // A holder granted before a's token was admitted, writing late (paused), is no violation.
    let mut paused = events[..4].to_vec();
    paused.extend(lock_ok((1, 7), a, 7, true));
    paused.push(invoke(1, b, Op::Lock, "r", None));
    assert!(check(&paused).violations.is_empty());

    // Nor one invoked after a data loss (a new epoch: the server's counter starts again).
    let mut after_loss = events.clone();
    after_loss.push(Event::Fault(Fault {
        at: 3,
        fault: "server-kill-wipe".into(),
        start: true,
        data_loss: true,
    }));
    assert_eq!(
        check(&after_loss).count(Promise::TokensGrow),
        0,
        "{}",
        check(&after_loss)
    );

    // A later grant with a newer token passes.
    let mut in_order = events[..1].to_vec();
    in_order.push(write(4, c, 8, Phase::Enter, true));
    in_order.push(write(5, c, 8, Phase::Exit, true));
    in_order.push(write(3, a, 7, Phase::Exit, true));
    in_order.extend(lock_ok((1, 3), a, 7, true));
    in_order.push(invoke(3, c, Op::Lock, "r", None));
    assert!(check(&in_order).violations.is_empty());
}

#[test]
fn idempotent_replays_pass_a_second_body_and_a_fresh_answer_fail() {
    let (a, b) = (call(1, 1), call(2, 1));
    let good = vec![
        invoke(0, a, Op::Idempotent, "k", Some("A")),
        effect(1, a, "k", EffectKind::Body),
        done(2, a, Op::Idempotent, "k", Outcome::Ok, Some("A")),
        invoke(3, b, Op::Idempotent, "k", Some("B")),
        done(4, b, Op::Idempotent, "k", Outcome::Ok, Some("A")),
    ];
    let report = check(&good);
    assert!(report.violations.is_empty(), "{report}");
    let bad = vec![
        invoke(0, a, Op::Idempotent, "k", Some("A")),
        effect(1, a, "k", EffectKind::Body),
        done(2, a, Op::Idempotent, "k", Outcome::Ok, Some("A")),
        invoke(3, b, Op::Idempotent, "k", Some("B")),
        effect(4, b, "k", EffectKind::Body),
        done(5, b, Op::Idempotent, "k", Outcome::Ok, Some("B")),
    ];
    let report = check(&bad);
    assert_eq!(report.count(Promise::AtMostOnce), 1, "{report}");
    assert_eq!(report.count(Promise::SameAnswer), 1, "{report}");
}

#[test]
fn data_loss_starts_a_new_epoch_and_unknown_outcomes_are_allowed() {
    let (a, b, c) = (call(1, 1), call(2, 1), call(3, 1));
    let events = vec![
        invoke(0, a, Op::Idempotent, "k", Some("A")),
        effect(1, a, "k", EffectKind::Body),
        done(2, a, Op::Idempotent, "k", Outcome::Info, None),
        Event::Fault(Fault {
            at: 3,
            fault: "server-kill-wipe".into(),
            start: true,
            data_loss: true,
        }),
        invoke(4, b, Op::Idempotent, "k", Some("B")),
        effect(5, b, "k", EffectKind::Body),
        done(6, b, Op::Idempotent, "k", Outcome::Ok, Some("B")),
        invoke(7, c, Op::Idempotent, "k", Some("C")),
        done(8, c, Op::Idempotent, "k", Outcome::Ok, Some("B")),
    ];
    let report = check(&events);
    assert!(report.violations.is_empty(), "{report}");
    assert_eq!(report.faults.get("server-kill-wipe"), Some(&1));
}

#[test]
fn a_call_in_flight_across_a_data_loss_may_take_effect_after_it() {
    let (w, x) = (call(1, 1), call(2, 1));
    let events = vec![
        invoke(0, w, Op::Idempotent, "k", Some("W")),
        Event::Fault(Fault {
            at: 1,
            fault: "server-kill-wipe".into(),
            start: true,
            data_loss: true,
        }),
        effect(2, w, "k", EffectKind::Body),
        done(3, w, Op::Idempotent, "k", Outcome::Ok, Some("W")),
        invoke(4, x, Op::Idempotent, "k", Some("X")),
        done(5, x, Op::Idempotent, "k", Outcome::Ok, Some("W")),
    ];
    let report = check(&events);
    assert!(report.violations.is_empty(), "{report}");
}

#[test]
fn flights_share_one_body_and_two_concurrent_bodies_fail() {
    let (a, b) = (call(1, 1), call(1, 2));
    let good = vec![
        invoke(0, a, Op::SingleFlight, "f", Some("A")),
        effect(1, a, "f", EffectKind::FlightStart),
        invoke(2, b, Op::SingleFlight, "f", Some("B")),
        effect(3, a, "f", EffectKind::FlightEnd),
        done(4, a, Op::SingleFlight, "f", Outcome::Ok, Some("A")),
        done(4, b, Op::SingleFlight, "f", Outcome::Ok, Some("A")),
    ];
    let report = check(&good);
    assert!(report.violations.is_empty(), "{report}");
    let bad = vec![
        invoke(0, a, Op::SingleFlight, "f", Some("A")),
        effect(1, a, "f", EffectKind::FlightStart),
        invoke(2, b, Op::SingleFlight, "f", Some("B")),
        effect(3, b, "f", EffectKind::FlightStart),
        effect(4, a, "f", EffectKind::FlightEnd),
        effect(5, b, "f", EffectKind::FlightEnd),
        done(6, a, Op::SingleFlight, "f", Outcome::Ok, Some("A")),
        done(6, b, Op::SingleFlight, "f", Outcome::Ok, Some("B")),
    ];
    assert_eq!(check(&bad).count(Promise::FlightOnce), 1);
}

#[test]
fn cached_reads_within_their_bound_pass_older_ones_fail() {
    let a = call(1, 1);
    let source = |at, version| {
        Event::SourceWrite(SourceWrite {
            at,
            key: "c".into(),
            version,
        })
    };
    let read = |at_start: u64, bound: u64, version: &str| {
        vec![
            Event::Invoke(Invoke {
                at: at_start,
                pid: 1,
                client: 0,
                call: a,
                op: Op::CacheRead,
                key: "c".into(),
                owner: None,
                proposal: None,
                bound: Some(bound),
                renew: None,
            }),
            done(
                at_start + 1,
                a,
                Op::CacheRead,
                "c",
                Outcome::Ok,
                Some(version),
            ),
        ]
    };
    let mut fresh = vec![source(0, 1), source(100, 2)];
    fresh.extend(read(150, 100, "1"));
    assert!(check(&fresh).violations.is_empty());
    let mut stale = vec![source(0, 1), source(100, 2)];
    stale.extend(read(300, 100, "1"));
    assert_eq!(check(&stale).count(Promise::CacheFresh), 1);
}

#[test]
fn histories_round_trip_through_json_lines() {
    let a = call(1, 1);
    let events = vec![
        invoke(0, a, Op::Lock, "l", None),
        write(1, a, 3, Phase::Enter, true),
        done(2, a, Op::Lock, "l", Outcome::Ok, None),
    ];
    let path = std::env::temp_dir().join(format!("coord-history-{}.jsonl", std::process::id()));
    write_jsonl(&path, &events).unwrap();
    let back = read_jsonl(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(back, events);
}

fn fault(at: u64, name: &str, start: bool) -> Event {
    Event::Fault(Fault {
        at,
        fault: name.into(),
        start,
        data_loss: false,
    })
}

#[test]
fn the_longest_wait_is_kept_per_fault_overlapping_the_call_and_errors_are_counted() {
    let (a, b, c, d) = (call(1, 1), call(1, 2), call(1, 3), call(1, 4));
    let mut failed = done(95, d, Op::Lock, "k", Outcome::Info, None);
    if let Event::Complete(x) = &mut failed {
        x.error = Some("Backend(OutOfMemory)".into());
    }
    let events = vec![
        fault(10, "server-full", true),
        fault(20, "server-full", false),
        fault(50, "clock-stall", true),
        fault(60, "clock-stall", false),
        fault(80, "server-full", true), // never healed: lasts to the end
        // Spans a's whole fault window and more: 40 under server-full only.
        invoke(5, a, Op::Lock, "k", None),
        done(45, a, Op::Lock, "k", Outcome::Ok, None),
        // Overlaps no fault.
        invoke(25, b, Op::Lock, "k", None),
        done(30, b, Op::Lock, "k", Outcome::Ok, None),
        // Ends inside the stall: 35 under clock-stall.
        invoke(20 + 1, c, Op::Lock, "k", None),
        done(56, c, Op::Lock, "k", Outcome::Ok, None),
        // Begins before the unhealed fault.
        invoke(70, d, Op::Lock, "k", None),
        failed,
    ];
    let report = check(&events);
    let waits: Vec<(&str, u64)> = report
        .longest_by_fault
        .iter()
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    assert_eq!(
        waits,
        [("clock-stall", 35), ("none", 5), ("server-full", 40)],
        "{report}"
    );
    assert_eq!(
        report.errors.get("Backend(OutOfMemory)"),
        Some(&1),
        "{report}"
    );
}

#[test]
fn bites_are_counted_per_fault_and_a_run_that_did_not_bite_is_told_what_is_missing() {
    let (hold, stale, lost, idem, calm) =
        (call(1, 1), call(2, 1), call(2, 2), call(1, 3), call(1, 4));
    let mut lost_end = done(48, lost, Op::Lock, "r", Outcome::Info, None);
    if let Event::Complete(x) = &mut lost_end {
        x.error = Some("LockLost".into());
    }
    let mut renewing = invoke(12, lost, Op::Lock, "r", None);
    if let Event::Invoke(x) = &mut renewing {
        x.renew = Some(300);
    }
    let events = vec![
        fault(10, "client-pause", true),
        fault(50, "client-pause", false),
        fault(60, "proxy-delay", true),
        fault(70, "proxy-delay", false),
        fault(90, "proxy-reset", true),
        fault(95, "proxy-reset", false),
        // A stale holder's exit refused during the pause: one bite of client-pause.
        write(11, stale, 5, Phase::Enter, true),
        write(20, hold, 6, Phase::Enter, true),
        write(30, stale, 5, Phase::Exit, false),
        write(31, hold, 6, Phase::Exit, true),
        // A renewing hold lost during the pause: a second bite, and a loss.
        renewing,
        lost_end,
        // An idempotent call through the delay that answered: no bite, through a fault.
        invoke(55, idem, Op::Idempotent, "i", Some("a")),
        effect(62, idem, "i", EffectKind::Body),
        done(65, idem, Op::Idempotent, "i", Outcome::Ok, Some("a")),
        // A call clear of every fault.
        invoke(75, calm, Op::Idempotent, "j", Some("b")),
        effect(76, calm, "j", EffectKind::Body),
        done(80, calm, Op::Idempotent, "j", Outcome::Ok, Some("b")),
    ];
    let report = check(&events);
    assert!(report.violations.is_empty(), "{report}");
    let bites: Vec<(&str, usize)> = report.bites.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(
        bites,
        [("client-pause", 2), ("proxy-delay", 0), ("proxy-reset", 0)],
        "{report}"
    );
    assert_eq!((report.renewing_holds, report.renewing_lost), (1, 1));
    assert_eq!(report.idempotent_through_faults, 1);
    assert_eq!(report.info_causes.get("LockLost"), Some(&1));
    assert!(report.faults_bit().is_ok(), "{}", report.bite_summary());
    assert_eq!(
        report.bite_lines(),
        [
            "fault client-pause: started 1, bit 2",
            "fault proxy-delay: started 1, bit 0",
            "fault proxy-reset: started 1, bit 0"
        ]
    );
    // The same faults with nothing refused, lost or answered through them.
    let quiet: Vec<Event> = events[..6]
        .iter()
        .cloned()
        .chain(events[15..].iter().cloned())
        .collect();
    let missing = check(&quiet).faults_bit().expect_err("nothing bit");
    for what in ["refused", "LockLost", "idempotent"] {
        assert!(missing.contains(what), "{missing}");
    }
}
