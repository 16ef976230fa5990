//! `Coordinator::shutdown` against a real redis-server: the locks this process holds are
//! deleted from the server at once, not left to their leases.

use crate::support;

use std::time::Duration;

use coord_core::{Coordinator, LossCause};
use coord_redis::Client;
use coord_redis_testing::RedisServer;
use support::{provider, redis_key};

async fn locks_are_given_back_at_shutdown(client: Client) {
    let server = RedisServer::start();
    let c = Coordinator::builder()
        .namespace("sd")
        .provider(provider(&server, client).await)
        .build()
        .unwrap();
    let keys: Vec<_> = (0..3u32)
        .map(|i| c.key("sd.job").part(&i).finish())
        .collect();
    let mut guards = Vec::new();
    for key in &keys {
        let guard = c
            .lock(key.clone())
            .lease(Duration::from_secs(600))
            .renew(Duration::from_secs(200))
            .acquire()
            .await
            .unwrap();
        guards.push(guard);
    }
    for key in &keys {
        assert_eq!(
            server.command(&["EXISTS", &redis_key(key, "lock")]).int(),
            Some(1)
        );
    }
    let report = c.shutdown(Duration::from_secs(5)).await;
    assert_eq!(report.released.len(), 3, "{report:?}");
    assert!(report.is_clean(), "{report:?}");
    for key in &keys {
        assert_eq!(
            server.command(&["EXISTS", &redis_key(key, "lock")]).int(),
            Some(0),
            "released at once, not after its 600 s lease"
        );
    }
    assert_eq!(c.active_renewals(), 0, "renewals stopped");
    for guard in guards {
        assert_eq!(guard.lost().await, LossCause::ShutDown);
    }
}

per_client!(locks_are_given_back_at_shutdown);
