//! Running a model checker and reading its verdicts.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::hash::Hash;
use std::time::Instant;

use stateright::{Checker, Expectation, HasDiscoveries, Model};

/// Explores every reachable state of `model` (breadth first, one thread: the machines that
/// run these tests are small) and asserts that no `always` property has a counterexample and
/// that each of `reached` (names of `sometimes` properties) was reached.
pub fn assert_holds<M>(label: &str, model: M, reached: &[&'static str])
where
    M: Model + Send + Sync + 'static,
    M::State: Clone + Debug + Hash + PartialEq + Send + Sync + 'static,
    M::Action: Clone + Debug + PartialEq + Send + Sync + 'static,
{
    check(label, model, reached, &[]);
}

/// Like [`assert_holds`], except that each `always` property named in `broken` must have a
/// counterexample; returns those counterexamples' actions, in the order of `broken`.
#[allow(dead_code)] // not every test file expects a property to break
pub fn check<M>(
    label: &str,
    model: M,
    reached: &[&'static str],
    broken: &[&str],
) -> Vec<Vec<M::Action>>
where
    M: Model + Send + Sync + 'static,
    M::State: Clone + Debug + Hash + PartialEq + Send + Sync + 'static,
    M::Action: Clone + Debug + PartialEq + Send + Sync + 'static,
{
    let started = Instant::now();
    let checker = model.checker().threads(1).spawn_bfs().join();
    eprintln!(
        "{label}: {} unique states ({} generated), depth {}, {:?}",
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    assert!(
        checker.is_done(),
        "{label}: the state space was not exhausted"
    );
    let mut found = Vec::new();
    for property in checker.model().properties() {
        if reached.contains(&property.name) {
            checker.assert_any_discovery(property.name);
        } else if broken.contains(&property.name) {
            let path = checker.assert_any_discovery(property.name);
            found.push(path.into_actions());
        } else if !matches!(property.expectation, Expectation::Sometimes) {
            checker.assert_no_discovery(property.name);
        }
    }
    assert_eq!(
        found.len(),
        broken.len(),
        "{label}: unknown property in {broken:?}"
    );
    found
}

/// Runs `model` until it finds a counterexample to the `always` property `property`, asserts
/// that it did, and returns the offending trace's actions for the caller to inspect.
pub fn assert_broken<M>(label: &str, model: M, property: &'static str) -> Vec<M::Action>
where
    M: Model + Send + Sync + 'static,
    M::State: Clone + Debug + Hash + PartialEq + Send + Sync + 'static,
    M::Action: Clone + Debug + PartialEq + Send + Sync + 'static,
{
    let started = Instant::now();
    let checker = model
        .checker()
        .threads(1)
        .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
        .spawn_bfs()
        .join();
    let path = checker.discovery(property).unwrap_or_else(|| {
        panic!(
            "{label}: no counterexample to {property:?} after {} states",
            checker.unique_state_count()
        )
    });
    let actions = path.into_actions();
    eprintln!(
        "{label}: counterexample to {property:?} after {} unique states, {:?}: {actions:?}",
        checker.unique_state_count(),
        started.elapsed()
    );
    actions
}
