//! Per-call overhead of the attributes on the in-process provider, beside baselines measured
//! in the same run: a plain call, a bare `tokio::sync::Mutex`, and a hand-written
//! DashMap-of-leases lock (the least a correct in-process lease lock must do).
//!
//! Run: `cargo bench -p coord-core --bench memory_overhead`

#[path = "support/per_call_cases.rs"]
mod per_call_cases;

use criterion::{Criterion, criterion_group, criterion_main};
use per_call_cases::{LeaseMap, Service};

fn overhead(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let service = Service::new();
    let leases = LeaseMap::default();
    let mutex = tokio::sync::Mutex::new(0u64);
    rt.block_on(service.once(1)).unwrap();

    let mut group = c.benchmark_group("per_call");
    group.bench_function("baseline/plain_call", |b| {
        b.iter(|| rt.block_on(service.plain(1)))
    });
    group.bench_function("baseline/tokio_mutex", |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut guard = mutex.lock().await;
                *guard += 1;
                std::hint::black_box(*guard)
            })
        })
    });
    group.bench_function("baseline/dashmap_lease_lock", |b| {
        let mut owner = 0u128;
        b.iter(|| {
            owner += 1;
            rt.block_on(leases.locked(1, owner))
        })
    });
    group.bench_function("coord/distributed_lock_uncontended", |b| {
        b.iter(|| rt.block_on(service.locked(1)))
    });
    group.bench_function("coord/single_flight_leader", |b| {
        b.iter(|| rt.block_on(service.coalesced(1)))
    });
    group.bench_function("coord/idempotent_replay", |b| {
        b.iter(|| rt.block_on(service.once(1)))
    });
    group.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
