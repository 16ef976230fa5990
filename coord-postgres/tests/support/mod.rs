//! What the tests share: one PostgreSQL server per test binary with coord's tables migrated,
//! and providers and coordinators over it, each in a namespace of its own.

#![allow(dead_code)]

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::Coordinator;
use coord_postgres::PostgresProvider;
use coord_postgres_testing::PostgresServer;

/// Runs `fut` to completion on a runtime of its own, on a thread of its own (so it can be
/// called from inside another runtime).
pub fn block_on<F>(fut: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(fut)
    })
    .join()
    .expect("the blocking task panicked")
}

/// The process's shared server, with the default schema migrated.
pub fn server() -> &'static PostgresServer {
    static MIGRATED: OnceLock<()> = OnceLock::new();
    let server = PostgresServer::shared();
    MIGRATED.get_or_init(|| {
        let url = server.url();
        block_on(async move { PostgresProvider::migrate(&url).await })
            .expect("migrate the shared server");
    });
    server
}

/// A namespace no other call in this process returned.
pub fn namespace(prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("{prefix}{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A provider over the shared server with the default options.
pub async fn provider() -> PostgresProvider {
    PostgresProvider::builder(server().url())
        .command_timeout(Duration::from_secs(2))
        .pool_size(4)
        .connect()
        .await
        .expect("connect to the test server")
}

/// A coordinator over a fresh provider, in a fresh namespace.
pub async fn fresh_coordinator() -> Coordinator {
    let provider = provider().await;
    Coordinator::builder()
        .namespace(namespace("conf"))
        .provider(provider)
        .build()
        .expect("coordinator")
}
