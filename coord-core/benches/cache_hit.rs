//! `#[cached]` beside the caches people already use, in one run, so the ratios compare like
//! with like on the same machine at the same moment.
//!
//! * `local_hit`: a hit through `#[cached(scope = "local")]` beside moka's own `get_with` hit
//!   (bare, and inside `block_on`, the floor every attribute row carries) and beside a hit of
//!   the `cached` crate's `#[cached]` attribute on an async fn.
//! * `stampede`: 64 concurrent callers of one cold key, until every one has the value: coord's
//!   `#[cached]` with `#[single_flight]` beside moka's `future::Cache::get_with`, both of which
//!   run the loader once. Each iteration uses a fresh key; the bench checks at the end that the
//!   loader ran exactly once per iteration on both.
//!
//! Run: `cargo bench -p coord-core --bench cache_hit -- --warm-up-time 2 --measurement-time 5`

use std::sync::atomic::{AtomicU64, Ordering};

use coord_core::{CoordError, Coordinator, cached, single_flight};
use criterion::{Criterion, criterion_group, criterion_main};

const CALLERS: usize = 64;

#[cached(key_from = "tenant", coordinator = coord, name = "bench.cached", ttl = "1h")]
async fn quote(coord: &Coordinator, tenant: u64) -> Result<u64, CoordError> {
    Ok(std::hint::black_box(tenant))
}

#[::cached::macros::cached(max_size = 10000, ttl = 3600)]
async fn quote_cached_crate(tenant: u64) -> u64 {
    std::hint::black_box(tenant)
}

/// How many times the stampede loaders ran (coord, moka).
static COORD_LOADS: AtomicU64 = AtomicU64::new(0);
static MOKA_LOADS: AtomicU64 = AtomicU64::new(0);

/// The loader both stampede rows share: it yields once, so every caller has arrived (and
/// joined the flight or moka's pending entry) before the value is ready.
async fn load(tenant: u64) -> u64 {
    tokio::task::yield_now().await;
    std::hint::black_box(tenant)
}

#[cached(key_from = "tenant", coordinator = coord, name = "bench.stampede", ttl = "1h")]
#[single_flight(key_from = "tenant")]
async fn stampede_coord(coord: &Coordinator, tenant: u64) -> Result<u64, CoordError> {
    COORD_LOADS.fetch_add(1, Ordering::Relaxed);
    Ok(load(tenant).await)
}

fn local_hit(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let coord = Coordinator::builder()
        .namespace("bench")
        .memory()
        .build()
        .expect("coordinator");
    rt.block_on(quote(&coord, 7)).expect("warm the entry");
    rt.block_on(quote_cached_crate(7));

    let moka: moka::sync::Cache<u64, Result<u64, CoordError>> = moka::sync::Cache::builder()
        .max_capacity(10_000)
        .time_to_live(std::time::Duration::from_secs(3600))
        .build();
    let _ = moka.get_with(7, || Ok(7));

    let mut group = c.benchmark_group("local_hit");
    group.bench_function("moka_get_with", |b| {
        b.iter(|| moka.get_with(std::hint::black_box(7), || Ok(7)))
    });
    group.bench_function("cached_attribute", |b| {
        b.iter(|| rt.block_on(quote(&coord, std::hint::black_box(7))))
    });
    group.bench_function("moka_get_with_in_block_on", |b| {
        b.iter(|| rt.block_on(async { moka.get_with(std::hint::black_box(7), || Ok(7)) }))
    });
    group.bench_function("cached_crate_attribute", |b| {
        b.iter(|| rt.block_on(quote_cached_crate(std::hint::black_box(7))))
    });
    group.finish();
}

fn stampede(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let coord = Coordinator::builder()
        .namespace("bench")
        .memory()
        .build()
        .expect("coordinator");
    let moka: moka::future::Cache<u64, u64> = moka::future::Cache::builder()
        .max_capacity(1_000_000)
        .time_to_live(std::time::Duration::from_secs(3600))
        .build();
    // Fresh keys per iteration: a stampede is on a cold key.
    let next_key = AtomicU64::new(0);
    let mut coord_iterations = 0u64;
    let mut moka_iterations = 0u64;

    let mut group = c.benchmark_group("stampede");
    group.bench_function("cached_single_flight_64", |b| {
        b.iter(|| {
            let key = next_key.fetch_add(1, Ordering::Relaxed);
            coord_iterations += 1;
            rt.block_on(async {
                let calls = (0..CALLERS).map(|_| stampede_coord(&coord, key));
                for got in futures_util::future::join_all(calls).await {
                    assert_eq!(got.expect("value"), key);
                }
            })
        })
    });
    group.bench_function("moka_future_get_with_64", |b| {
        b.iter(|| {
            let key = next_key.fetch_add(1, Ordering::Relaxed);
            moka_iterations += 1;
            rt.block_on(async {
                let calls = (0..CALLERS).map(|_| {
                    moka.get_with(key, async {
                        MOKA_LOADS.fetch_add(1, Ordering::Relaxed);
                        load(key).await
                    })
                });
                for got in futures_util::future::join_all(calls).await {
                    assert_eq!(got, key);
                }
            })
        })
    });
    group.finish();

    let (coord_loads, moka_loads) = (
        COORD_LOADS.load(Ordering::Relaxed),
        MOKA_LOADS.load(Ordering::Relaxed),
    );
    println!(
        "stampede loader runs: coord {coord_loads} in {coord_iterations} iterations, moka {moka_loads} in {moka_iterations} iterations ({CALLERS} callers each)"
    );
    assert_eq!(
        coord_loads, coord_iterations,
        "coord ran the loader once per stampede"
    );
    assert_eq!(
        moka_loads, moka_iterations,
        "moka ran the loader once per stampede"
    );
}

criterion_group!(benches, local_hit, stampede);
criterion_main!(benches);
