//! The idempotency record as a sequential object, checked with stateright's linearizability
//! tester rather than a search of our own.
//!
//! The record of one key is a write-once register read by every call: a call proposes the
//! answer its body would give; the first call to take effect stores its proposal, and every
//! call answers what is stored. Linearizable means: there is one order of the calls, each
//! taking effect between its invocation and its completion, in which every call that answered
//! got exactly what that order says. Calls whose outcome is unknown (`info`) are left in flight:
//! the tester may place them anywhere after their invocation or leave them out.

use stateright::semantics::{ConsistencyTester, LinearizabilityTester, SequentialSpec};

/// The write-once register of one idempotency key.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FirstAnswer(Option<String>);

impl SequentialSpec for FirstAnswer {
    /// A call proposing this answer.
    type Op = String;
    /// The answer it got.
    type Ret = String;

    fn invoke(&mut self, proposal: &String) -> String {
        self.0.get_or_insert_with(|| proposal.clone()).clone()
    }
}

/// One call on one key: invoked at `start`, answered `answer` at `end` (`None`: unknown).
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub start: u64,
    pub end: Option<u64>,
    pub proposal: String,
    pub answer: Option<String>,
}

/// Histories up to this many calls go to stateright's tester; longer ones to [`direct`]. The
/// tester searches interleavings without memory, so its time grows exponentially with the
/// number of concurrent calls on a key (a 30-call key under faults did not finish in minutes).
pub(crate) const TESTER_LIMIT: usize = 8;

/// Whether `calls` (all on one key) are linearizable as a [`FirstAnswer`].
pub(crate) fn linearizable(calls: &[Call]) -> bool {
    if calls.len() <= TESTER_LIMIT {
        let verdict = tester(calls);
        debug_assert_eq!(
            verdict,
            direct(calls),
            "the two checks disagree on {calls:?}"
        );
        verdict
    } else {
        direct(calls)
    }
}

/// The same decision without a search, exact for a write-once register: every answer is one
/// value `v`; `v` is the proposal of a call `w` (which may have answered, or be unknown); and
/// `w` began before every answering call ended (each can then take effect after `w`, and
/// every call that did not answer can be left after them or out).
pub(crate) fn direct(calls: &[Call]) -> bool {
    let mut answers = calls.iter().filter_map(|c| c.answer.as_ref());
    let Some(v) = answers.next() else {
        return true;
    };
    if answers.any(|a| a != v) {
        return false;
    }
    let Some(w) = calls.iter().find(|c| &c.proposal == v) else {
        return false;
    };
    calls
        .iter()
        .filter(|c| c.answer.is_some())
        .all(|c| c.end.is_some_and(|end| end >= w.start))
}

/// stateright's linearizability tester on `calls`.
pub(crate) fn tester(calls: &[Call]) -> bool {
    // Feed invocations and returns in time order; at equal times, invocations first (the
    // calls then count as concurrent, the weaker claim).
    let mut steps: Vec<(u64, u8, usize)> = Vec::new();
    for (i, c) in calls.iter().enumerate() {
        steps.push((c.start, 0, i));
        if let (Some(end), Some(_)) = (c.end, &c.answer) {
            steps.push((end, 1, i));
        }
    }
    steps.sort();
    // Each call is its own thread: real-time order comes from the feeding order.
    let mut tester = LinearizabilityTester::new(FirstAnswer::default());
    for (_, kind, i) in steps {
        let thread = i;
        let result = if kind == 0 {
            tester
                .on_invoke(thread, calls[i].proposal.clone())
                .map(|_| ())
        } else {
            let answer = calls[i].answer.clone().expect("returns only for answers");
            tester.on_return(thread, answer).map(|_| ())
        };
        if result.is_err() {
            return false;
        }
    }
    tester.is_consistent()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(start: u64, end: u64, proposal: &str, answer: Option<&str>) -> Call {
        Call {
            start,
            end: Some(end),
            proposal: proposal.into(),
            answer: answer.map(Into::into),
        }
    }

    #[test]
    fn replays_of_the_first_answer_are_linearizable() {
        let calls = [
            call(0, 10, "a", Some("a")),
            call(5, 20, "b", Some("a")),
            call(30, 40, "c", Some("a")),
        ];
        assert!(linearizable(&calls));
    }

    #[test]
    fn concurrent_calls_may_take_either_answer() {
        let calls = [call(0, 10, "a", Some("b")), call(1, 11, "b", Some("b"))];
        assert!(linearizable(&calls));
    }

    #[test]
    fn a_fresh_answer_after_a_completed_one_is_not() {
        let calls = [call(0, 10, "a", Some("a")), call(20, 30, "b", Some("b"))];
        assert!(!linearizable(&calls));
    }

    #[test]
    fn the_tester_and_the_direct_check_agree() {
        let mut rng = crate::nemesis::schedule::Rng::new(11);
        for _ in 0..2_000 {
            let n = rng.between(1, 5) as usize;
            let calls: Vec<Call> = (0..n)
                .map(|i| {
                    let start = rng.between(0, 20);
                    let answered = rng.between(0, 3) > 0;
                    Call {
                        start,
                        end: Some(start + rng.between(0, 10)),
                        proposal: format!("p{i}"),
                        answer: answered.then(|| format!("p{}", rng.between(0, n as u64 - 1))),
                    }
                })
                .collect();
            assert_eq!(tester(&calls), direct(&calls), "{calls:?}");
        }
    }

    #[test]
    fn an_unknown_call_may_have_stored_its_answer() {
        let calls = [call(0, 10, "a", None), call(20, 30, "b", Some("a"))];
        assert!(linearizable(&calls));
        let calls = [call(0, 10, "a", None), call(20, 30, "b", Some("b"))];
        assert!(linearizable(&calls));
    }
}
