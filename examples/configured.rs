//! A coordinator from configuration: a TOML file plus `COORD_` environment variables, merged
//! with figment, and attributes that take their durations from a named profile.
//!
//! ```sh
//! cargo run -p coord-examples --features config --example configured
//! # a profile's field from the environment (figment nests on `__`):
//! COORD_PROFILES__REPORTS__WAIT=0s cargo run -p coord-examples --features config --example configured
//! # Redis instead of the in-process provider:
//! COORD_PROVIDER__KIND=redis COORD_PROVIDER__URL=redis://127.0.0.1:6379 \
//!   cargo run -p coord-examples --features config --example configured
//! ```
//!
//! The file is `examples/configured.toml`, or the one `COORD_CONFIG_FILE` names. config-rs
//! (or any serde source) works the same way: `CoordConfig` is a plain `Deserialize` type.
//! Without a configuration library, `CoordConfig::from_env()` reads the flat `COORD_*`
//! variables the README lists (`COORD_REDIS_URL`, `COORD_PROFILE_REPORTS_WAIT`, ...).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use coord_core::{CoordConfig, CoordError, Coordinator, distributed_lock, idempotent};
use figment::Figment;
use figment::providers::{Env, Format, Toml};

static CHARGES: AtomicU32 = AtomicU32::new(0);

/// Retention and wait come from `[profiles.payments]`; the literal `retention` is what runs
/// when the configuration's profile leaves it out.
#[idempotent(key_from = "order_id", coordinator = coord, name = "payments.charge", retention = "24h", profile = "payments")]
async fn charge(coord: &Coordinator, order_id: &str, cents: u64) -> Result<u32, CoordError> {
    let _ = (order_id, cents);
    Ok(CHARGES.fetch_add(1, Ordering::SeqCst) + 1)
}

/// Lease, wait and renewal come from `[profiles.reports]`: waiting `0s` as written here
/// would refuse the second caller at once; the profile's `3s` lets it wait its turn.
#[distributed_lock(key_from = "tenant", coordinator = coord, name = "reports.rebuild", wait = "0s", profile = "reports")]
async fn rebuild(coord: &Coordinator, tenant: u64, who: &str) -> Result<(), CoordError> {
    println!("  {who}: rebuilding tenant {tenant}'s reports");
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(())
}

fn load() -> Result<CoordConfig, Box<figment::Error>> {
    let file = std::env::var("COORD_CONFIG_FILE")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/configured.toml").to_owned());
    Figment::new()
        .merge(Toml::file(file))
        // `COORD_PROFILES__REPORTS__WAIT` -> `profiles.reports.wait`. Only nested keys and the
        // two top-level fields are taken, so unrelated `COORD_*` variables are left alone.
        .merge(Env::prefixed("COORD_").split("__").filter(|key| {
            key.as_str().contains('.') || key == "namespace" || key == "command_timeout"
        }))
        .extract()
        .map_err(Box::new)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_target(false).init();
    let config = load()?;
    config.validate()?;
    println!("configuration:\n{}", serde_json::to_string_pretty(&config)?);
    // Redis, Sentinel or Cluster when the configuration names one; in-process otherwise.
    let coord = coord_redis::coordinator_from_config(&config).await?;
    println!(
        "namespace {:?}, {}",
        coord.namespace(),
        if coord.is_in_process_only() {
            "in-process"
        } else {
            "Redis"
        }
    );

    let first = charge(&coord, "order-7", 1250).await?;
    let again = charge(&coord, "order-7", 1250).await?;
    println!("charge order-7: charge #{first}, then replayed #{again}");

    let started = Instant::now();
    let (a, b) = tokio::join!(
        rebuild(&coord, 42, "worker a"),
        rebuild(&coord, 42, "worker b")
    );
    println!(
        "two workers, one tenant: {:?} and {:?} after {:?} (the profile's wait decides whether the second one queues)",
        a.is_ok(),
        b.as_ref().map(|_| ()).map_err(|e| e.to_string()),
        started.elapsed()
    );

    // A profile the configuration does not have is an error at the call, never a default.
    let unknown = coord
        .lock(coord.key("reports.rebuild").part(&43u64).finish())
        .profile("nightly")
        .acquire()
        .await;
    println!("a profile that is not configured: {}", unknown.unwrap_err());
    Ok(())
}
