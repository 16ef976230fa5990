//! Runnable examples of coord: see `quickstart.rs`. This library holds what more than one
//! example (or an example and its test) shares, among it the payments service of
//! `payments_http`.

#[cfg(feature = "http")]
pub mod payments;

use std::time::Duration;

use coord_core::{CoordError, Coordinator, distributed_lock, idempotent, single_flight};
#[cfg(feature = "prometheus")]
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

/// Installs a Prometheus recorder for coord's metrics with histogram buckets (the exporter
/// renders summaries without them, which cannot be aggregated across instances) and, when
/// `listen` is given, serves `/metrics` there. Call from inside a tokio runtime.
#[cfg(feature = "prometheus")]
pub fn install_prometheus(
    listen: Option<std::net::SocketAddr>,
) -> Result<PrometheusHandle, BuildError> {
    let seconds = [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ];
    let bytes = [
        64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
    ];
    let mut builder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &seconds)?
        .set_buckets_for_metric(Matcher::Suffix("_bytes".into()), &bytes)?;
    let handle = match listen {
        Some(addr) => {
            builder = builder.with_http_listener(addr);
            let (recorder, exporter) = builder.build()?;
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder)
                .map_err(BuildError::FailedToSetGlobalRecorder)?;
            tokio::spawn(exporter);
            handle
        }
        None => builder.install_recorder()?,
    };
    coord_core::telemetry::describe_metrics();
    Ok(handle)
}

#[distributed_lock(name = "demo.rebuild", key_from = "tenant", coordinator = c, wait = "50ms")]
async fn rebuild(c: &Coordinator, tenant: u32) -> Result<(), CoordError> {
    tokio::time::sleep(Duration::from_millis(2 + u64::from(tenant % 5))).await;
    Ok(())
}

// A duplicate that arrives while the first call runs waits for its answer and replays it (as
// a service would want), so every duplicate is a replay, whichever runs first.
#[idempotent(name = "demo.charge", key_from = "request", coordinator = c, wait = "5s")]
async fn charge(c: &Coordinator, request: u32) -> Result<String, CoordError> {
    Ok(format!("receipt {request}"))
}

#[single_flight(name = "demo.quote", key_from = "symbol")]
async fn quote(symbol: u32) -> u32 {
    tokio::time::sleep(Duration::from_millis(1)).await;
    symbol
}

/// A small mixed load for `rounds` rounds: contended locks (some give up), idempotent calls
/// with replays, and coalesced reads, so every kind of series has values.
pub async fn small_load(c: &Coordinator, rounds: u32) {
    for round in 0..rounds {
        let mut tasks = Vec::new();
        for worker in 0..8u32 {
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                let _ = rebuild(&c, worker % 3).await;
                let _ = charge(&c, round * 4 + worker % 4).await;
                quote(worker % 2).await
            }));
        }
        for task in tasks {
            let _ = task.await;
        }
    }
}
