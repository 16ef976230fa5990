//! One case of the per-call benches in a loop, for an instruction-counting profiler: wall time
//! on a shared machine moves with its neighbours, instruction counts do not.
//!
//! ```sh
//! cargo bench -p coord-core --bench per_call_profile --no-run
//! valgrind --tool=callgrind <the bench binary> lock 20000
//! ```
//!
//! Cases (`sizes` prints the size of each case's future instead; `ratios <rounds>` measures
//! wall time in interleaved rounds, see [`interleaved_ratios`]): `plain`, `dashmap` (the DashMap-of-leases baseline), `lock`, `flight`, `replay`.
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
    if case == "ratios" {
        interleaved_ratios(&rt, &service, &leases, iterations);
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

/// Wall time per call of each case, measured in short rounds that alternate between the cases
/// (so a neighbour's load hits every case alike), and the median over the rounds of each
/// case's ratio to the DashMap-of-leases baseline of the same round. Two rows take the lock
/// call apart: `key` builds a call key like the lock's, `provider` takes and releases the lock
/// through the provider contract, without the attribute.
fn interleaved_ratios(
    rt: &tokio::runtime::Runtime,
    service: &Service,
    leases: &LeaseMap,
    rounds: u64,
) {
    const CALLS: u32 = 20_000;
    let mut owner = 0u128;
    let provider = service.coord.lock_provider().clone();
    let key = coord_core::CallKey::builder("bench", "bench.provider")
        .part(&1u64)
        .finish();
    let mut per_call = |case: &str| -> f64 {
        let started = std::time::Instant::now();
        for _ in 0..CALLS {
            let out = match case {
                "dashmap" => {
                    owner += 1;
                    rt.block_on(leases.locked(1, owner))
                }
                // Building a call key like the lock's, alone.
                "key" => rt.block_on(async {
                    let built = coord_core::CallKey::builder("bench", "bench.lock")
                        .part(&1u64)
                        .finish();
                    std::hint::black_box(built);
                    Ok(1)
                }),
                // The in-process provider's acquire and release through the contract, alone.
                "provider" => rt.block_on(async {
                    let owner = coord_core::provider::OwnerToken::new();
                    let granted = provider
                        .acquire(coord_core::provider::LockRequest {
                            key: &key,
                            owner,
                            lease: std::time::Duration::from_secs(30),
                            wait: std::time::Duration::ZERO,
                            fenced: false,
                        })
                        .await;
                    assert!(matches!(granted, Ok(Some(_))));
                    let _ = provider.release(&key, owner).await;
                    Ok(1)
                }),
                "lock" => rt.block_on(service.locked(1)),
                "replay" => rt.block_on(service.once(1)),
                _ => rt.block_on(service.plain(1)),
            };
            std::hint::black_box(out.expect("an uncontended call succeeds"));
        }
        started.elapsed().as_nanos() as f64 / f64::from(CALLS)
    };
    let cases = ["plain", "dashmap", "key", "provider", "lock", "replay"];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for round in 0..rounds.max(1) {
        // Alternate the order each round: no case always runs right after another.
        let order: Vec<usize> = if round % 2 == 0 {
            (0..cases.len()).collect()
        } else {
            (0..cases.len()).rev().collect()
        };
        for i in order {
            times[i].push(per_call(cases[i]));
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let baseline = &times[1];
    for (i, case) in cases.iter().enumerate() {
        let ratios: Vec<f64> = times[i].iter().zip(baseline).map(|(t, b)| t / b).collect();
        println!(
            "{case:8} median {:8.1} ns/call   median ratio to dashmap {:.2}x",
            median(times[i].clone()),
            median(ratios)
        );
    }
}
