//! One case of the per-call benches in a loop, for an instruction-counting profiler: wall time
//! on a shared machine moves with its neighbours, instruction counts do not.
//!
//! ```sh
//! cargo bench -p coord-core --bench per_call_profile --no-run
//! valgrind --tool=callgrind <the bench binary> lock 20000
//! ```
//!
//! Cases (`sizes` prints the size of each case's future instead): `plain`, `dashmap` (the DashMap-of-leases baseline), `lock`, `flight`, `replay`.
//! Each call runs in its own `block_on` on a current-thread runtime, as in `memory_overhead`,
//! after 1000 calls of warm-up. Two runs with different iteration counts give the cost of one
//! call as the difference of their totals divided by the difference of the counts, free of
//! start-up and warm-up.

#[path = "support/per_call_cases.rs"]
mod per_call_cases;

use per_call_cases::{LeaseMap, Service};

const WARM_UP: u64 = 1000;

fn main() {
    // `cargo bench` passes `--bench`; anything starting with `-` is not ours.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let case = args.first().map(String::as_str).unwrap_or("lock");
    let iterations: u64 = args
        .get(1)
        .map(|n| n.parse().expect("the iteration count is a number"))
        .unwrap_or(10_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let service = Service::new();
    let leases = LeaseMap::default();
    rt.block_on(service.once(1)).expect("the stored outcome");
    if case == "sizes" {
        println!(
            "future sizes in bytes: plain {}, dashmap {}, lock {}, flight {}, replay {}",
            size_of_val(&service.plain(1)),
            size_of_val(&leases.locked(1, 1)),
            size_of_val(&service.locked(1)),
            size_of_val(&service.coalesced(1)),
            size_of_val(&service.once(1)),
        );
        return;
    }
    let mut owner = 0u128;
    let mut one = |rt: &tokio::runtime::Runtime| -> u64 {
        match case {
            "plain" => rt.block_on(service.plain(1)),
            "dashmap" => {
                owner += 1;
                rt.block_on(leases.locked(1, owner))
            }
            "lock" => rt.block_on(service.locked(1)),
            "flight" => rt.block_on(service.coalesced(1)),
            "replay" => rt.block_on(service.once(1)),
            other => panic!("unknown case {other}: plain, dashmap, lock, flight or replay"),
        }
        .expect("an uncontended call succeeds")
    };
    for _ in 0..WARM_UP {
        one(&rt);
    }
    let mut sum = 0u64;
    for _ in 0..iterations {
        sum = sum.wrapping_add(one(&rt));
    }
    println!("{case}: {iterations} calls after {WARM_UP} of warm-up (checksum {sum})");
}
