//! The in-process provider keeps no per-key state once keys are released.

use std::sync::Arc;

use coord_core::handle::open_flights;
use coord_core::memory::MemoryProvider;
use coord_core::{CoordError, Coordinator, distributed_lock, single_flight};

#[single_flight(key_from = "id")]
#[distributed_lock(key_from = "id", coordinator = c, name = "bounds")]
async fn touch(c: &Coordinator, id: u64) -> Result<u64, CoordError> {
    Ok(id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_released_keys_leave_no_state() {
    let provider = Arc::new(MemoryProvider::new());
    let c = Coordinator::builder()
        .namespace("bounds")
        .provider(provider.clone())
        .build()
        .unwrap();
    let tasks: Vec<_> = (0..4u64)
        .map(|shard| {
            let c = c.clone();
            tokio::spawn(async move {
                for i in 0..250_000u64 {
                    let id = shard * 250_000 + i;
                    assert_eq!(touch(&c, id).await.unwrap(), id);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        provider.lock_keys(),
        0,
        "no lock entry survives its release"
    );
    assert_eq!(open_flights(), 0, "no flight entry survives its flight");
}
