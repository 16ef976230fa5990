//! coord in one process, with no setup: the three attributes on a small payments service.
//!
//! Run with `cargo run -p coord-examples --example quickstart`.
//!
//! The coordinator comes from the environment, the way the README shows for production:
//! `Coordinator::from_env()` is coord-core's form of `coord_redis::coordinator_from_env()`,
//! and applies every `COORD_*` variable (`COORD_WAIT=2s cargo run ...` changes the waits).
//! Without coord-redis it builds the in-process provider and logs one warning saying so:
//! exclusion holds within this process only. A service with several replicas adds coord-redis
//! and sets `COORD_REDIS_URL` (see the README).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use coord_core::report::FlightOutcome;
use coord_core::{
    CoordError, Coordinator, distributed_lock, fencing_token, idempotent, observe, single_flight,
};
use serde::{Deserialize, Serialize};

#[derive(Debug)]
enum PaymentError {
    Declined,
    Coord(CoordError),
}

impl From<CoordError> for PaymentError {
    fn from(err: CoordError) -> Self {
        PaymentError::Coord(err)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    customer_id: u64,
    cents: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    charge_id: u32,
    cents: u64,
}

#[derive(Default)]
struct Payments {
    charges_made: AtomicU32,
    rebuilds: AtomicU32,
    quotes_fetched: AtomicU32,
}

impl Payments {
    /// Charges at most once per idempotency key: a retry gets the first receipt back.
    #[idempotent(key_from = "idempotency_key", retention = "24h", fingerprint = ["order"])]
    async fn charge(&self, idempotency_key: String, order: Order) -> Result<Receipt, PaymentError> {
        if order.cents == 0 {
            return Err(PaymentError::Declined);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let charge_id = self.charges_made.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Receipt {
            charge_id,
            cents: order.cents,
        })
    }

    /// Rebuilds a tenant's projections; one rebuild per tenant at a time, fenced.
    #[distributed_lock(key_from = "tenant_id", lease = "5m", wait = "0s", fenced = true)]
    async fn rebuild(&self, tenant_id: u64) -> Result<u64, CoordError> {
        let token = fencing_token().expect("fenced locks carry a token");
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.rebuilds.fetch_add(1, Ordering::SeqCst);
        Ok(token.get())
    }

    /// A hot key: concurrent callers share one upstream fetch.
    #[single_flight(key_from = "symbol")]
    async fn quote(&self, symbol: &str) -> Result<u64, Arc<String>> {
        self.quotes_fetched.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(symbol.bytes().map(u64::from).sum())
    }
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    Coordinator::from_env()
        .expect("the COORD_* variables are well-formed")
        .install()
        .expect("installed once, before the first call");
    let service = Arc::new(Payments::default());

    println!("== #[idempotent]: a retried charge is answered from the stored receipt");
    let order = Order {
        customer_id: 42,
        cents: 1999,
    };
    let (first, report) = observe(service.charge("order-7-try".into(), order.clone())).await;
    println!(
        "first call:  {:?} (replayed: {})",
        first.as_ref().map_err(|_| ()),
        report.replayed()
    );
    let (retry, report) = observe(service.charge("order-7-try".into(), order.clone())).await;
    println!(
        "retry:       {:?} (replayed: {})",
        retry.as_ref().map_err(|_| ()),
        report.replayed()
    );
    let key = report.key().expect("an intercepted call reports its key");
    println!(
        "the call's key: {key} (operation `{}`: no `name`, so the module path and the function)",
        key.shown_operation()
    );
    let tampered = Order { cents: 1, ..order };
    match service.charge("order-7-try".into(), tampered).await {
        Err(PaymentError::Coord(err @ CoordError::KeyReused { .. })) => {
            println!("same key, other order: refused ({err})")
        }
        other => println!("same key, other order: unexpected {other:?}"),
    }
    println!(
        "charges actually made: {}",
        service.charges_made.load(Ordering::SeqCst)
    );

    println!("\n== #[distributed_lock]: one rebuild per tenant at a time");
    let (a, b) = tokio::join!(service.rebuild(1), service.rebuild(1));
    for (who, outcome) in [("caller A", a), ("caller B", b)] {
        match outcome {
            Ok(token) => println!("{who}: rebuilt tenant 1 with fencing token {token}"),
            Err(err) => println!("{who}: {err}"),
        }
    }
    let again = service.rebuild(1).await.expect("free again after release");
    println!("a later rebuild gets a newer token: {again}");

    println!("\n== #[single_flight]: 100 concurrent quotes, one upstream fetch");
    let calls: Vec<_> = (0..100)
        .map(|_| {
            let service = service.clone();
            tokio::spawn(async move { observe(service.quote("ACME")).await })
        })
        .collect();
    let mut joined = 0;
    for call in calls {
        let (quote, report) = call.await.expect("quote task");
        assert!(quote.is_ok());
        if report.flight() == Some(FlightOutcome::Joined) {
            joined += 1;
        }
    }
    println!(
        "upstream fetches: {}, callers that joined a flight: {joined}",
        service.quotes_fetched.load(Ordering::SeqCst)
    );
}
