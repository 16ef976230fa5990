//! Housekeeping: deleting rows past their expiry, in small batches.
//!
//! An expired row is already absent to every statement (each compares its expiry with the
//! server's clock), so sweeping changes no answer: it only keeps the tables (and their
//! indexes) the size of what is live. Each batch is one statement that skips rows other
//! sessions hold (`FOR UPDATE SKIP LOCKED`), so a sweeper never waits for a caller, never
//! blocks one, and several processes sweeping at once share the work.

use std::sync::Weak;
use std::time::Duration;

use coord_core::BackendError;

use crate::connection::{Drivers, Link};
use crate::sql::Sql;

/// Rows deleted per statement.
const BATCH: usize = 500;

/// The most batches per table per round: a backlog is worked off over several rounds.
const BATCHES_PER_ROUND: usize = 20;

/// Starts the sweeper on the provider's runtime: every `every` (jittered by up to a quarter),
/// until the provider is dropped.
pub(crate) fn start(drivers: &Drivers, link: Weak<Link>, statements: Vec<Sql>, every: Duration) {
    drivers.spawn(async move {
        loop {
            let spread = (every.as_millis() as u64 / 4).max(1);
            let pause = every + Duration::from_millis(rand::random_range(0..spread));
            tokio::time::sleep(pause).await;
            let Some(link) = link.upgrade() else { return };
            for _ in 0..BATCHES_PER_ROUND {
                match sweep_once(&link, &statements, BATCH).await {
                    Ok(n) if n >= BATCH as u64 => continue,
                    Ok(_) => break,
                    Err(err) => {
                        tracing::debug!(error = %err, "coord-postgres: sweeping expired rows failed; the next round tries again");
                        break;
                    }
                }
            }
        }
    });
}

/// One batch on every table: deletes at most `batch` expired rows from each, and returns how
/// many it deleted in all.
pub(crate) async fn sweep_once(
    link: &Link,
    statements: &[Sql],
    batch: usize,
) -> Result<u64, BackendError> {
    let limit = batch.clamp(1, 100_000) as i64;
    let mut swept = 0u64;
    for statement in statements {
        let rows = link
            .query(statement, &[&limit], "sweeping expired rows")
            .await?;
        let n: i64 = rows.first().and_then(|r| r.try_get(0).ok()).unwrap_or(0);
        swept += n.max(0) as u64;
    }
    Ok(swept)
}
