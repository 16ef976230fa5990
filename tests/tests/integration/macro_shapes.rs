//! The macros' output runs: receivers, key paths, stacking order, an explicit coordinator,
//! `?` in bodies, and futures that can be spawned.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::report::{FlightOutcome, IdempotencyOutcome, LockOutcome};
use coord_core::{CoordError, Coordinator, distributed_lock, idempotent, observe, single_flight};

// The payloads are only looked at through `Debug`.
#[allow(dead_code)]
#[derive(Debug, Clone)]
enum AppError {
    Coord(CoordError),
    Parse(std::num::ParseIntError),
}

impl From<CoordError> for AppError {
    fn from(err: CoordError) -> Self {
        AppError::Coord(err)
    }
}

impl From<std::num::ParseIntError> for AppError {
    fn from(err: std::num::ParseIntError) -> Self {
        AppError::Parse(err)
    }
}

struct Counter {
    tenant: u64,
    value: u64,
}

impl Counter {
    #[distributed_lock(key_from = "self.tenant", lease = "5s")]
    async fn bump(&mut self, by: u64) -> Result<u64, CoordError> {
        self.value += by;
        Ok(self.value)
    }
}

#[tokio::test]
async fn mut_self_method_runs_the_body_under_the_lock() {
    let mut counter = Counter {
        tenant: 7,
        value: 1,
    };
    let (result, report) = observe(counter.bump(2)).await;
    assert_eq!(result.unwrap(), 3);
    assert_eq!(counter.value, 3);
    assert_eq!(report.lock(), Some(LockOutcome::Acquired));
    let key = report.key().cloned().expect("the call reports its key");
    assert!(key.op_key().ends_with("::bump:7"), "{key}");
}

static CHARGES: AtomicUsize = AtomicUsize::new(0);

// Written lock-first: the nesting still puts idempotency outside, so a replay skips the lock.
#[distributed_lock(lease = "10s")]
#[idempotent(key_from = "request_id", retention = "1m")]
async fn charge(request_id: String, cents: u64) -> Result<u64, AppError> {
    CHARGES.fetch_add(1, Ordering::SeqCst);
    Ok(cents)
}

#[tokio::test]
async fn stacked_layers_nest_idempotency_outermost() {
    let (first, report) = observe(charge("req-1".to_owned(), 500)).await;
    assert_eq!(first.unwrap(), 500);
    assert_eq!(report.idempotency(), Some(IdempotencyOutcome::Executed));
    assert_eq!(report.lock(), Some(LockOutcome::Acquired));

    let (replay, report) = observe(charge("req-1".to_owned(), 500)).await;
    assert_eq!(replay.unwrap(), 500);
    assert!(report.replayed());
    assert_eq!(report.lock(), None, "a replay must not take the lock");
    assert_eq!(CHARGES.load(Ordering::SeqCst), 1);
}

struct Service {
    coordinator: Coordinator,
    fetches: AtomicUsize,
}

impl Service {
    #[single_flight(key_from = "symbol", coordinator = self.coordinator)]
    async fn quote(self: Arc<Self>, symbol: String) -> Result<u64, Arc<str>> {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(symbol.len() as u64)
    }
}

#[tokio::test]
async fn arc_self_single_flight_shares_one_run() {
    let service = Arc::new(Service {
        coordinator: Coordinator::builder()
            .namespace("shapes")
            .memory()
            .build()
            .unwrap(),
        fetches: AtomicUsize::new(0),
    });
    let (a, b) = tokio::join!(
        observe(service.clone().quote("ACME".to_owned())),
        observe(service.clone().quote("ACME".to_owned())),
    );
    assert_eq!(a.0.unwrap(), 4);
    assert_eq!(b.0.unwrap(), 4);
    let outcomes = [a.1.flight(), b.1.flight()];
    assert!(outcomes.contains(&Some(FlightOutcome::Led)), "{outcomes:?}");
    assert!(
        outcomes.contains(&Some(FlightOutcome::Joined)),
        "{outcomes:?}"
    );
    assert_eq!(service.fetches.load(Ordering::SeqCst), 1);
    let key = a.1.key().cloned().unwrap();
    assert!(key.op_key().ends_with("::quote:ACME"), "{key}");
}

struct Order {
    customer_id: u64,
    amount: String,
}

// A field path in the key, `?` converting an error in the body, and a `return` in the body.
#[idempotent(key_from = ["order.customer_id", "attempt"], name = "orders.place")]
async fn place(order: Order, attempt: u32) -> Result<u64, AppError> {
    if attempt == 0 {
        return Ok(0);
    }
    let amount: u64 = order.amount.parse()?;
    Ok(amount * u64::from(attempt))
}

#[tokio::test]
async fn field_paths_question_mark_and_return() {
    let order = |amount: &str| Order {
        customer_id: 42,
        amount: amount.to_owned(),
    };
    let (result, report) = observe(place(order("12"), 2)).await;
    assert_eq!(result.unwrap(), 24);
    assert_eq!(report.key().unwrap().to_string(), "orders.place:42:2");
    assert!(matches!(
        place(order("x"), 3).await,
        Err(AppError::Parse(_))
    ));
    assert_eq!(place(order("x"), 0).await.unwrap(), 0);
}

#[distributed_lock]
#[idempotent(key_from = "id")]
async fn guarded(id: String) -> Result<usize, AppError> {
    tokio::task::yield_now().await;
    Ok(id.len())
}

// Single-flight futures are left out until the runtime's flight future is `Send`.
#[tokio::test]
async fn generated_futures_are_send() {
    let handle = tokio::spawn(observe(guarded("abc".to_owned())));
    let (result, report) = handle.await.unwrap();
    assert_eq!(result.unwrap(), 3);
    assert_eq!(report.idempotency(), Some(IdempotencyOutcome::Executed));
    assert_eq!(report.lock(), Some(LockOutcome::Acquired));
}

#[single_flight(key_from = "id")]
#[distributed_lock]
#[idempotent]
async fn all_layers(id: String) -> Result<usize, AppError> {
    tokio::task::yield_now().await;
    Ok(id.len())
}

#[tokio::test]
async fn all_three_layers_report() {
    let (result, report) = observe(all_layers("abcd".to_owned())).await;
    assert_eq!(result.unwrap(), 4);
    assert_eq!(report.idempotency(), Some(IdempotencyOutcome::Executed));
    assert_eq!(report.flight(), Some(FlightOutcome::Led));
    assert_eq!(report.lock(), Some(LockOutcome::Acquired));
    let (again, report) = observe(all_layers("abcd".to_owned())).await;
    assert_eq!(again.unwrap(), 4);
    assert!(report.replayed());
    assert_eq!((report.flight(), report.lock()), (None, None));
}

#[distributed_lock(key_from = "id", fenced = true)]
async fn fenced(id: u32) -> Result<bool, CoordError> {
    Ok(coord_core::fencing_token().is_some())
}

#[tokio::test]
async fn fenced_lock_exposes_a_token_to_the_body() {
    let (result, report) = observe(fenced(1)).await;
    assert!(result.unwrap());
    assert!(report.fencing_token().is_some());
}
