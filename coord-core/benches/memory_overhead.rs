//! Per-call overhead of the attributes on the in-process provider, beside baselines measured
//! in the same run: a plain call, a bare `tokio::sync::Mutex`, and a hand-written
//! DashMap-of-leases lock (the least a correct in-process lease lock must do).
//!
//! Run: `cargo bench -p coord-core --bench memory_overhead`

use std::time::{Duration, Instant};

use coord_core::{CoordError, Coordinator, distributed_lock, idempotent, single_flight};
use criterion::{Criterion, criterion_group, criterion_main};
use dashmap::DashMap;

struct Service {
    coord: Coordinator,
}

impl Service {
    #[distributed_lock(key_from = "tenant", coordinator = self.coord, name = "bench.lock")]
    async fn locked(&self, tenant: u64) -> Result<u64, CoordError> {
        Ok(std::hint::black_box(tenant))
    }

    #[single_flight(key_from = "tenant")]
    async fn coalesced(&self, tenant: u64) -> Result<u64, CoordError> {
        Ok(std::hint::black_box(tenant))
    }

    #[idempotent(key_from = "tenant", coordinator = self.coord, name = "bench.idem")]
    async fn once(&self, tenant: u64) -> Result<u64, CoordError> {
        Ok(std::hint::black_box(tenant))
    }

    async fn plain(&self, tenant: u64) -> Result<u64, CoordError> {
        Ok(std::hint::black_box(tenant))
    }
}

/// The baseline lock: a lease per key in a DashMap, owner-checked release.
struct LeaseMap {
    leases: DashMap<String, (u128, Instant)>,
}

impl LeaseMap {
    async fn locked(&self, tenant: u64, owner: u128) -> Result<u64, CoordError> {
        let key = format!("bench:bench.lock:{tenant}");
        let now = Instant::now();
        let acquired = match self.leases.entry(key.clone()) {
            dashmap::mapref::entry::Entry::Vacant(slot) => {
                slot.insert((owner, now + Duration::from_secs(30)));
                true
            }
            dashmap::mapref::entry::Entry::Occupied(mut slot) if slot.get().1 <= now => {
                slot.insert((owner, now + Duration::from_secs(30)));
                true
            }
            dashmap::mapref::entry::Entry::Occupied(_) => false,
        };
        assert!(acquired);
        let out = std::hint::black_box(tenant);
        self.leases
            .remove_if(&key, |_, (holder, _)| *holder == owner);
        Ok(out)
    }
}

fn overhead(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let service = Service {
        coord: Coordinator::builder()
            .namespace("bench")
            .memory()
            .build()
            .unwrap(),
    };
    let leases = LeaseMap {
        leases: DashMap::new(),
    };
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
