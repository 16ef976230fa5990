//! The `#[single_flight]` layer: concurrent calls with one key in this process share one run.
//!
//! Every caller brings its own body future. The first one (the leader) polls it; the others
//! (followers) wait, with their bodies unpolled, and receive a clone of the leader's outcome.
//! If the leader's future is dropped, exactly one follower wakes up as the new leader and runs
//! its own body: the state change happens under the flight's mutex, so there is never more
//! than one leader, and the flight stays open while any follower waits, so never none.
//! If the leader panics, every follower panics too, with a message naming the key: a panic is
//! a bug, and re-running the body once per follower would turn one crash into a stampede.

use std::any::{Any, TypeId};
use std::future::Future;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use tokio::sync::Notify;

use crate::provider::CallKey;
use crate::report::FlightOutcome;
use crate::runtime::call::Call;

/// Output type, group (0 for process scope; a coordinator's identity for the local step of a
/// cluster-scope call) and call key.
type FlightKey = (TypeId, usize, CallKey);

/// Flights in progress, by output type and call key. An entry lives exactly as long as its
/// flight: it is removed when the flight completes, its leader panics, or its last participant
/// leaves.
static FLIGHTS: LazyLock<DashMap<FlightKey, Arc<dyn Any + Send + Sync>>> =
    LazyLock::new(DashMap::new);

/// How many flights are open right now (for tests and metrics).
pub fn open_flights() -> usize {
    FLIGHTS.len()
}

enum State<R> {
    /// A leader is running its body.
    Running,
    /// The leader was dropped; the first follower to see this becomes the leader.
    Vacant,
    Done(R),
    Panicked,
    /// Nobody is left; the entry is being removed and must not be joined.
    Closed,
}

struct Flight<R> {
    state: Mutex<FlightState<R>>,
    changed: Notify,
}

struct FlightState<R> {
    state: State<R>,
    followers: usize,
}

impl<R> Flight<R> {
    fn lock(&self) -> MutexGuard<'_, FlightState<R>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn remove_entry(key: &FlightKey, flight: &Arc<dyn Any + Send + Sync>) {
    FLIGHTS.remove_if(key, |_, current| Arc::ptr_eq(current, flight));
}

/// Settles the flight when the leader's run ends in any way but a normal return.
struct LeaderGuard<'a, R: Clone + Send + 'static> {
    key: &'a FlightKey,
    erased: &'a Arc<dyn Any + Send + Sync>,
    flight: &'a Flight<R>,
    finished: bool,
}

impl<R: Clone + Send + 'static> Drop for LeaderGuard<'_, R> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut st = self.flight.lock();
        if std::thread::panicking() {
            st.state = State::Panicked;
            drop(st);
            remove_entry(self.key, self.erased);
        } else if st.followers > 0 {
            st.state = State::Vacant;
        } else {
            st.state = State::Closed;
            drop(st);
            remove_entry(self.key, self.erased);
        }
        self.flight.changed.notify_waiters();
    }
}

/// Leaves the flight when a follower stops waiting (its own caller dropped it).
struct FollowerGuard<'a, R> {
    key: &'a FlightKey,
    erased: &'a Arc<dyn Any + Send + Sync>,
    flight: &'a Flight<R>,
    waiting: bool,
}

impl<R> Drop for FollowerGuard<'_, R> {
    fn drop(&mut self) {
        if !self.waiting {
            return;
        }
        let mut st = self.flight.lock();
        st.followers -= 1;
        if st.followers == 0 && matches!(st.state, State::Vacant) {
            st.state = State::Closed;
            drop(st);
            remove_entry(self.key, self.erased);
        }
    }
}

/// Joins or leads the flight for the call's key.
pub async fn single_flight<R, F>(call: &Call<'_>, body: F) -> R
where
    R: Clone + Send + 'static,
    F: Future<Output = R>,
{
    single_flight_in(call, 0, body).await
}

/// Joins or leads the flight for the call's key among the calls of `group` only.
pub(crate) async fn single_flight_in<R, F>(call: &Call<'_>, group: usize, body: F) -> R
where
    R: Clone + Send + 'static,
    F: Future<Output = R>,
{
    let key: FlightKey = (TypeId::of::<R>(), group, call.key.clone());
    let (erased, leader) = join::<R>(&key);
    let flight = erased
        .downcast_ref::<Flight<R>>()
        .expect("flights are keyed by their output type");
    if leader {
        call.record_flight(FlightOutcome::Led);
        return lead(&key, &erased, flight, body).await;
    }

    let mut follower = FollowerGuard {
        key: &key,
        erased: &erased,
        flight,
        waiting: true,
    };
    loop {
        let notified = flight.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // Decide under the lock, act after it: the guard must not live across an await.
        let next = {
            let mut st = flight.lock();
            let next = match &st.state {
                State::Done(value) => Next::Share(value.clone()),
                State::Panicked => Next::Panic,
                State::Vacant => {
                    st.state = State::Running;
                    Next::TakeOver
                }
                State::Running | State::Closed => Next::Wait,
            };
            if !matches!(next, Next::Wait) {
                st.followers -= 1;
                follower.waiting = false;
            }
            next
        };
        match next {
            Next::Share(value) => {
                call.record_flight(FlightOutcome::Joined);
                return value;
            }
            Next::Panic => panic!(
                "coord: the single-flight leader for `{}` panicked; its joined callers panic too",
                call.key
            ),
            Next::TakeOver => {
                call.record_flight(FlightOutcome::TookOver);
                tracing::debug!(key = %call.key, "coord: single-flight leader dropped; taking over");
                return lead(&key, &erased, flight, body).await;
            }
            Next::Wait => notified.await,
        }
    }
}

/// What a follower does after looking at the flight.
enum Next<R> {
    Share(R),
    Panic,
    TakeOver,
    Wait,
}

/// Finds the open flight for `key` and joins it, or opens one. Returns the flight and whether
/// the caller leads it.
fn join<R: Clone + Send + 'static>(key: &FlightKey) -> (Arc<dyn Any + Send + Sync>, bool) {
    let fresh = || -> Arc<dyn Any + Send + Sync> {
        Arc::new(Flight::<R> {
            state: Mutex::new(FlightState {
                state: State::Running,
                followers: 0,
            }),
            changed: Notify::new(),
        })
    };
    match FLIGHTS.entry(key.clone()) {
        Entry::Occupied(mut entry) => {
            let flight = entry
                .get()
                .downcast_ref::<Flight<R>>()
                .expect("flights are keyed by their output type");
            let mut st = flight.lock();
            match st.state {
                State::Running | State::Vacant => {
                    st.followers += 1;
                    drop(st);
                    (entry.get().clone(), false)
                }
                // The previous flight is over and on its way out: start a new one in its place.
                State::Done(_) | State::Panicked | State::Closed => {
                    drop(st);
                    let new = fresh();
                    entry.insert(new.clone());
                    (new, true)
                }
            }
        }
        Entry::Vacant(entry) => {
            let new = fresh();
            entry.insert(new.clone());
            (new, true)
        }
    }
}

async fn lead<R, F>(
    key: &FlightKey,
    erased: &Arc<dyn Any + Send + Sync>,
    flight: &Flight<R>,
    body: F,
) -> R
where
    R: Clone + Send + 'static,
    F: Future<Output = R>,
{
    let mut guard = LeaderGuard {
        key,
        erased,
        flight,
        finished: false,
    };
    let value = body.await;
    guard.finished = true;
    {
        let mut st = flight.lock();
        if st.followers > 0 {
            st.state = State::Done(value.clone());
        } else {
            st.state = State::Closed;
        }
    }
    remove_entry(key, erased);
    flight.changed.notify_waiters();
    value
}
