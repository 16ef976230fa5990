//! coord's metrics for Prometheus: serves `/metrics` on a loopback port while a small load
//! runs, so a Prometheus (and the Grafana dashboard in `dashboards/coord.json`) can scrape it.
//!
//! Run: `cargo run -p coord-examples --features prometheus --example prometheus` (then
//! `curl http://127.0.0.1:9464/metrics`). `COORD_METRICS_ADDR` picks another address;
//! `COORD_DEMO_SECONDS` how long it runs (default 60).

use std::time::{Duration, Instant};

use coord_core::Coordinator;
use coord_examples::{install_prometheus, small_load};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::var("COORD_METRICS_ADDR").unwrap_or_else(|_| "127.0.0.1:9464".into());
    let seconds: u64 = std::env::var("COORD_DEMO_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    install_prometheus(Some(addr.parse()?))?;
    println!("serving http://{addr}/metrics for {seconds} s");
    let c = Coordinator::builder().namespace("demo").memory().build()?;
    let until = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < until {
        small_load(&c, 5).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}
