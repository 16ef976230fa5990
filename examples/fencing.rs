//! Why a lease needs fencing: a holder that stalls past its lease is refused at the resource.
//!
//! Run with `cargo run -p coord-examples --example fencing`.
//!
//! Holder A takes the lock (lease 200 ms, no renewal) and then stalls for 600 ms, the way a
//! process does in a long pause. Its lease lapses, holder B takes the lock and writes. When A
//! wakes up it still believes it holds the lock and writes too; the resource compares fencing
//! tokens and refuses A's older one. Without that check, A's stale write would overwrite B's.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_core::fence::{Fence, StaleToken};
use coord_core::{CoordError, Coordinator, distributed_lock, fencing_token};

/// The protected resource: a value, and the newest fencing token that wrote it.
#[derive(Default)]
struct Projection {
    fence: Fence,
    body: Mutex<String>,
}

impl Projection {
    fn write(&self, text: &str) -> Result<(), StaleToken> {
        let token = fencing_token().expect("writes happen under a fenced lock");
        // In a database this is one statement: `UPDATE .. SET body = $1, fence = $2 WHERE
        // fence <= $2`. Here the check and the write sit under one mutex for the same effect.
        let mut body = self.body.lock().unwrap();
        self.fence.admit(token)?;
        *body = text.to_owned();
        Ok(())
    }
}

#[derive(Debug)]
enum JobError {
    Coord(CoordError),
    Stale(StaleToken),
}

impl From<CoordError> for JobError {
    fn from(err: CoordError) -> Self {
        JobError::Coord(err)
    }
}

#[distributed_lock(key_from = "tenant", coordinator = coord, lease = "200ms", wait = "2s", fenced = true)]
async fn rebuild(
    coord: &Coordinator,
    tenant: u32,
    who: &str,
    stall: Duration,
    projection: Arc<Projection>,
) -> Result<(), JobError> {
    let token = fencing_token().expect("fenced");
    println!("{who}: holds the lock with fencing token {token}");
    tokio::time::sleep(stall).await;
    match projection.write(&format!("rebuilt by {who}")) {
        Ok(()) => println!("{who}: write accepted"),
        Err(stale) => {
            println!("{who}: write refused: {stale}");
            return Err(JobError::Stale(stale));
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let coord = Coordinator::builder()
        .namespace("fencing-demo")
        .memory()
        .build()
        .expect("coordinator");
    let projection = Arc::new(Projection::default());

    let paused = tokio::spawn({
        let (coord, projection) = (coord.clone(), projection.clone());
        async move {
            rebuild(
                &coord,
                7,
                "A (paused)",
                Duration::from_millis(600),
                projection,
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let successor = rebuild(&coord, 7, "B", Duration::ZERO, projection.clone()).await;

    let paused = paused.await.expect("holder A's task");
    assert!(successor.is_ok(), "B's write is accepted");
    match paused {
        Err(JobError::Stale(stale)) => println!("A's rebuild failed: {stale}"),
        Err(JobError::Coord(err)) => panic!("A was refused by coord instead: {err}"),
        Ok(()) => panic!("A's stale write must be refused"),
    }
    println!(
        "final value: {:?} (lapsed releases counted: {})",
        projection.body.lock().unwrap(),
        coord.metrics().lapsed_releases()
    );
}
