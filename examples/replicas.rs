//! Three processes coordinating through Redis: who ran what.
//!
//! Run with `cargo run -p coord-examples --features redis --example replicas`.
//!
//! Uses the Redis at `COORD_REDIS_URL` if set; otherwise starts a private `redis-server` on a
//! free loopback port for the demo (the binary must be installed). The example then starts
//! three copies of itself, "replicas", which all try to rebuild the same tenants under
//! `#[distributed_lock]` and all charge the same order under `#[idempotent]`. Each replica is
//! configured the way the README shows, only through its environment
//! (`coord_redis::coordinator_from_env()`): `COORD_REDIS_URL` and `COORD_NAMESPACE`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use coord_core::{CoordError, distributed_lock, fencing_token, idempotent, observe};

/// Rebuilds one tenant; one replica at a time per tenant, the others skip it.
#[distributed_lock(
    key_from = "tenant",
    name = "demo.rebuild",
    lease = "30s",
    wait = "0s",
    fenced = true
)]
async fn rebuild(tenant: u32) -> Result<u64, CoordError> {
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(fencing_token().expect("fenced").get())
}

/// Charges one order; whichever replica gets there first runs it, the others replay.
#[idempotent(key_from = "order", name = "demo.charge", wait = "10s")]
async fn charge(order: &str, replica: u32) -> Result<String, CoordError> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(format!("charged {order} once, by replica {replica}"))
}

async fn replica(id: u32) {
    // COORD_REDIS_URL and COORD_NAMESPACE, set by the parent, are all the configuration.
    coord_redis::coordinator_from_env()
        .await
        .expect("a Redis coordinator from the environment")
        .install()
        .expect("install it");

    for tenant in 1..=3 {
        match rebuild(tenant).await {
            Ok(token) => println!("replica {id}: rebuilt tenant {tenant} (fencing token {token})"),
            Err(CoordError::LockNotAcquired { .. }) => {
                println!("replica {id}: tenant {tenant} is being rebuilt elsewhere, skipped")
            }
            Err(err) => println!("replica {id}: tenant {tenant}: {err}"),
        }
    }
    let (receipt, report) = observe(charge("order-42", id)).await;
    match receipt {
        Ok(receipt) => println!(
            "replica {id}: {receipt} ({})",
            if report.replayed() {
                "replayed"
            } else {
                "ran it"
            }
        ),
        Err(err) => println!("replica {id}: charge failed: {err}"),
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    if let Ok(id) = std::env::var("REPLICA_ID") {
        runtime.block_on(replica(id.parse().expect("replica id")));
        return;
    }

    // Keep a private server alive for the demo when no Redis was given.
    let (url, _server) = match std::env::var("COORD_REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let server = coord_redis_testing::RedisServer::start();
            println!("started a private redis-server at {}", server.url());
            (server.url(), Some(server))
        }
    };
    let namespace = format!("replicas-demo-{}", std::process::id());
    let children: Vec<_> = (1..=3)
        .map(|id| {
            Command::new(std::env::current_exe().expect("own path"))
                .env("REPLICA_ID", id.to_string())
                .env("COORD_REDIS_URL", &url)
                .env("COORD_NAMESPACE", &namespace)
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a replica")
        })
        .collect();
    let mut lines = Vec::new();
    for mut child in children {
        let out = child.stdout.take().expect("piped");
        lines.extend(BufReader::new(out).lines().map_while(Result::ok));
        let status = child.wait().expect("replica exit");
        assert!(status.success(), "a replica failed");
    }
    lines.sort();
    for line in lines {
        println!("{line}");
    }
}
