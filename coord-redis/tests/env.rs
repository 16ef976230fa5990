//! `RedisProvider::from_env`. Alone in its test binary: it changes the process environment,
//! which must not race with other threads reading it.

use std::time::Duration;

use coord_core::provider::{BackendErrorKind, LockProvider, LockRequest, OwnerToken};
use coord_redis::{RedisProvider, URL_ENV};
use coord_redis_testing::RedisServer;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn from_env_reads_the_url() {
    let server = RedisServer::start();

    // SAFETY: this binary has this one test, and no runtime or other thread is alive while
    // the environment changes.
    unsafe { std::env::remove_var(URL_ENV) };
    let err = runtime().block_on(RedisProvider::from_env()).unwrap_err();
    assert_eq!(err.kind(), BackendErrorKind::Config);
    assert!(err.message().contains(URL_ENV), "{err}");

    // SAFETY: as above; the previous runtime is gone.
    unsafe { std::env::set_var(URL_ENV, server.url()) };
    runtime().block_on(async {
        let p = RedisProvider::from_env().await.unwrap();
        assert_eq!(
            p.command_timeout(),
            Duration::from_secs(1),
            "the default timeout"
        );
        let grant = p
            .acquire(LockRequest {
                key: &coord_core::CallKey::builder("env", "op").part("k").finish(),
                owner: OwnerToken::new(),
                lease: Duration::from_secs(30),
                wait: Duration::ZERO,
                fenced: false,
            })
            .await
            .unwrap();
        assert!(grant.is_some());
    });
}
