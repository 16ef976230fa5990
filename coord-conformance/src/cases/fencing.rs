//! Fencing: fenced grants carry strictly increasing tokens, unfenced ones none.

use std::time::Duration;

use coord_core::provider::{LockRequest, OwnerToken};
use coord_core::{Coordinator, FencingToken};

use super::durations::LONG;
use super::requests::{key, lock_req};

/// Fenced acquisitions mint strictly increasing tokens; unfenced ones mint none.
pub async fn lock_fencing_tokens_increase_only_when_fenced(c: Coordinator) {
    let p = c.lock_provider();
    let k = key(&c, "fence");
    let mut last: Option<FencingToken> = None;
    for _ in 0..5 {
        let me = OwnerToken::new();
        let grant = p
            .acquire(LockRequest {
                fenced: true,
                ..lock_req(&k, me, LONG, Duration::ZERO)
            })
            .await
            .unwrap()
            .unwrap();
        let token = grant.fencing_token.expect("a fenced grant carries a token");
        if let Some(last) = last {
            assert!(token > last, "tokens must increase: {last} then {token}");
        }
        last = Some(token);
        p.release(&k, me).await.unwrap();
    }
    let me = OwnerToken::new();
    let unfenced = p
        .acquire(lock_req(&k, me, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        unfenced.fencing_token, None,
        "no token is made up for unfenced locks"
    );
    p.release(&k, me).await.unwrap();
}
