//! A local cache hit through `#[cached]` beside moka's own `get_with` hit in the same run: the
//! cost of the attribute (key rendering, the layer, its span and metrics) over the cache it
//! is built on.
//!
//! Run: `cargo bench -p coord-core --bench cache_hit -- --warm-up-time 2 --measurement-time 5`

use coord_core::{CoordError, Coordinator, cached};
use criterion::{Criterion, criterion_group, criterion_main};

#[cached(key_from = "tenant", coordinator = coord, name = "bench.cached", ttl = "1h")]
async fn quote(coord: &Coordinator, tenant: u64) -> Result<u64, CoordError> {
    Ok(std::hint::black_box(tenant))
}

fn cache_hit(c: &mut Criterion) {
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
    group.finish();
}

criterion_group!(benches, cache_hit);
criterion_main!(benches);
