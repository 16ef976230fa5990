//! What `replica_acks(1, ..)` costs: the latency of a claim, a lock grant and a renewal with
//! the `WAIT` after each, against the same provider without it, measured in alternating rounds
//! in one run against one private primary with one replica on loopback.
//!
//! Run: `cargo bench -p coord-redis --bench replica_acks --features fred`
//! (without `fred`, only the redis-rs rows; about 20 seconds).

use std::time::{Duration, Instant};

use coord_core::CallKey;
use coord_core::provider::{
    ClaimRequest, CompleteRequest, IdempotencyStore, LockProvider, LockRequest, OwnerToken,
};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::RedisServer;

const ROUNDS: usize = 6;
const OPS_PER_ROUND: usize = 300;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Claim,
    Complete,
    Grant,
    Renew,
}

const OPS: [Op; 4] = [Op::Claim, Op::Complete, Op::Grant, Op::Renew];

fn clients() -> Vec<Client> {
    vec![
        #[cfg(feature = "redis-client")]
        Client::RedisRs,
        #[cfg(feature = "fred")]
        Client::Fred,
    ]
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

/// One round of `OPS_PER_ROUND` sequential operations of each kind; returns each op's
/// latencies.
async fn round(p: &RedisProvider, round_no: usize) -> Vec<(Op, Duration)> {
    let mut out = Vec::with_capacity(OPS_PER_ROUND * OPS.len());
    let lease = Duration::from_secs(30);
    for i in 0..OPS_PER_ROUND {
        let key = CallKey::builder("bench", "acks")
            .part(&(round_no as u64))
            .part(&(i as u64))
            .finish();
        let owner = OwnerToken::new();
        let t = Instant::now();
        p.claim(ClaimRequest {
            key: &key,
            owner,
            in_flight_lease: lease,
            fingerprint: None,
            keep_abandoned_for: None,
            transactional: false,
        })
        .await
        .expect("claim");
        out.push((Op::Claim, t.elapsed()));
        let t = Instant::now();
        p.complete(CompleteRequest {
            key: &key,
            owner,
            payload: b"done".to_vec().into(),
            retention: lease,
            fingerprint: None,
        })
        .await
        .expect("complete");
        out.push((Op::Complete, t.elapsed()));
        let t = Instant::now();
        p.acquire(LockRequest {
            key: &key,
            owner,
            lease,
            wait: Duration::ZERO,
            fenced: true,
        })
        .await
        .expect("acquire")
        .expect("the key is free");
        out.push((Op::Grant, t.elapsed()));
        let t = Instant::now();
        p.renew(&key, owner, lease).await.expect("renew");
        out.push((Op::Renew, t.elapsed()));
        p.release(&key, owner).await.expect("release");
    }
    out
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let primary = RedisServer::start();
    let port = primary.port().to_string();
    let _replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !primary
        .command(&["INFO", "replication"])
        .text()
        .unwrap_or_default()
        .contains("state=online")
    {
        assert!(Instant::now() < deadline, "the replica never came online");
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "replica_acks: {ROUNDS} alternating rounds x {OPS_PER_ROUND} sequential operations of each \
         kind, one primary and one replica on loopback"
    );
    println!(
        "{:<8} {:<9} {:>12} {:>12} {:>12} {:>12} {:>7}",
        "client", "write", "p50 without", "p50 with", "p99 without", "p99 with", "ratio"
    );
    for client in clients() {
        let plain = RedisProvider::builder(primary.url())
            .client(client)
            .connect()
            .await
            .expect("connect");
        let acked = RedisProvider::builder(primary.url())
            .client(client)
            .replica_acks(1, Duration::from_millis(500))
            .connect()
            .await
            .expect("connect");
        let mut without: Vec<(Op, Duration)> = Vec::new();
        let mut with: Vec<(Op, Duration)> = Vec::new();
        // A warm-up round each (script loading, connections), then alternate.
        round(&plain, 10_000).await;
        round(&acked, 10_001).await;
        for r in 0..ROUNDS {
            if r % 2 == 0 {
                without.extend(round(&plain, 2 * r).await);
                with.extend(round(&acked, 2 * r + 1).await);
            } else {
                with.extend(round(&acked, 2 * r + 1).await);
                without.extend(round(&plain, 2 * r).await);
            }
        }
        for op in OPS {
            let pick = |all: &[(Op, Duration)]| {
                let mut v: Vec<Duration> = all
                    .iter()
                    .filter(|(o, _)| *o == op)
                    .map(|(_, d)| *d)
                    .collect();
                v.sort();
                v
            };
            let (a, b) = (pick(&without), pick(&with));
            let us = |d: Duration| format!("{:.0} µs", d.as_secs_f64() * 1e6);
            let ratio = percentile(&b, 0.5).as_secs_f64() / percentile(&a, 0.5).as_secs_f64();
            println!(
                "{:<8} {:<9} {:>12} {:>12} {:>12} {:>12} {:>6.2}x",
                format!("{client:?}"),
                format!("{op:?}"),
                us(percentile(&a, 0.5)),
                us(percentile(&b, 0.5)),
                us(percentile(&a, 0.99)),
                us(percentile(&b, 0.99)),
                ratio
            );
        }
    }
}
