//! A 4-key multi-key lock against 4 single locks taken in sequence, on one private
//! redis-server (so the four keys are taken by one script): acquire every key, then release
//! every key, per iteration. The single locks are fenced, as every key of a multi-key lock is.
//!
//! Run: `cargo bench -p coord-redis --bench multi_lock --features fred`
//! (without `fred`, only the redis-rs rows).

use std::time::Duration;

use coord_core::{CallKey, Coordinator};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::RedisServer;
use criterion::{Criterion, criterion_group, criterion_main};

const LEASE: Duration = Duration::from_secs(30);

fn clients() -> Vec<(Client, &'static str)> {
    vec![
        #[cfg(feature = "redis-client")]
        (Client::RedisRs, "redis-rs"),
        #[cfg(feature = "fred")]
        (Client::Fred, "fred"),
    ]
}

fn four_keys(c: &mut Criterion) {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut group = c.benchmark_group("four_keys");
    for (client, name) in clients() {
        let coord = rt.block_on(async {
            let provider = RedisProvider::builder(server.url())
                .client(client)
                .connect()
                .await
                .expect("connect to the bench redis-server");
            Coordinator::builder()
                .namespace(format!("bench-{name}"))
                .provider(provider)
                .build()
                .expect("a coordinator")
        });
        let keys: Vec<CallKey> = (0..4)
            .map(|i| coord.key("transfer").part(&format!("acc-{i}")).finish())
            .collect();
        group.bench_function(format!("{name}/multi_lock"), |b| {
            b.to_async(&rt).iter(|| async {
                let guard = coord
                    .multi_lock(keys.iter().cloned())
                    .lease(LEASE)
                    .acquire()
                    .await
                    .expect("the keys are free");
                assert!(guard.taken_together());
                guard.release().await.expect("released");
            })
        });
        group.bench_function(format!("{name}/single_locks_in_sequence"), |b| {
            b.to_async(&rt).iter(|| async {
                let mut guards = Vec::with_capacity(keys.len());
                for key in &keys {
                    guards.push(
                        coord
                            .lock(key.clone())
                            .lease(LEASE)
                            .fenced()
                            .acquire()
                            .await
                            .expect("the key is free"),
                    );
                }
                for guard in guards {
                    guard.release().await.expect("released");
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, four_keys);
criterion_main!(benches);
