//! The subjects of the per-call benches, shared by `memory_overhead` (criterion, wall time)
//! and `per_call_profile` (one case in a loop, for an instruction-counting profiler): the
//! attributes on the in-process provider, and the hand-written baselines they are judged
//! against.

use std::time::{Duration, Instant};

use coord_core::{CoordError, Coordinator, distributed_lock, idempotent, single_flight};
use dashmap::DashMap;

/// The annotated functions, on a coordinator of their own (namespace `bench`).
pub struct Service {
    pub coord: Coordinator,
}

impl Service {
    pub fn new() -> Service {
        Service {
            coord: Coordinator::builder()
                .namespace("bench")
                .memory()
                .build()
                .expect("an in-process coordinator"),
        }
    }

    #[distributed_lock(key_from = "tenant", coordinator = self.coord, name = "bench.lock")]
    pub async fn locked(&self, tenant: u64) -> Result<u64, CoordError> {
        Ok(std::hint::black_box(tenant))
    }

    #[single_flight(key_from = "tenant")]
    pub async fn coalesced(&self, tenant: u64) -> Result<u64, CoordError> {
        Ok(std::hint::black_box(tenant))
    }

    #[idempotent(key_from = "tenant", coordinator = self.coord, name = "bench.idem")]
    pub async fn once(&self, tenant: u64) -> Result<u64, CoordError> {
        Ok(std::hint::black_box(tenant))
    }

    pub async fn plain(&self, tenant: u64) -> Result<u64, CoordError> {
        Ok(std::hint::black_box(tenant))
    }
}

/// The baseline lock: a lease per key in a DashMap, owner-checked release.
#[derive(Default)]
pub struct LeaseMap {
    leases: DashMap<String, (u128, Instant)>,
}

impl LeaseMap {
    pub async fn locked(&self, tenant: u64, owner: u128) -> Result<u64, CoordError> {
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
