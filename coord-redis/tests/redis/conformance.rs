//! The provider conformance suite (the same cases the in-process provider passes) against a
//! real redis-server, once per client.

use std::sync::atomic::{AtomicUsize, Ordering};

use coord_core::Coordinator;
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::RedisServer;

async fn fresh(client: Client) -> Coordinator {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let ns = format!("conf{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let provider = RedisProvider::builder(RedisServer::shared().url())
        .client(client)
        .connect()
        .await
        .expect("connect to the test redis-server");
    Coordinator::builder()
        .namespace(ns)
        .provider(provider)
        .build()
        .expect("coordinator")
}

#[cfg(feature = "redis-client")]
mod redis_rs {
    async fn fresh_coordinator() -> coord_core::Coordinator {
        super::fresh(coord_redis::Client::RedisRs).await
    }
    coord_conformance::conformance_suite!(fresh_coordinator);
}

#[cfg(feature = "fred")]
mod fred {
    async fn fresh_coordinator() -> coord_core::Coordinator {
        super::fresh(coord_redis::Client::Fred).await
    }
    coord_conformance::conformance_suite!(fresh_coordinator);
}
