//! Multi-key locks in one statement: the atomic path of
//! [`MultiLockStore`](coord_core::provider::MultiLockStore).
//!
//! One call of the function `lock_acquire_all` (migration 3) takes every key of the set in
//! the runtime's canonical order inside one transaction, each exactly as a fenced single
//! acquire takes it (the same `locks` rows, the same fencing sequence), and only when every key
//! is free or already the caller's; a key found held rolls back the keys taken before it, so
//! no other session sees the set half taken and a refusal leaves nothing. Every set is kept
//! together: all keys live in one database.
//!
//! Waiting reuses the single lock's wake-ups: a set blocked by a key marks that key's holder
//! as waited for and joins that key's queue, exactly as a single waiter does, so the holder's
//! release wakes it; the waiter then sends the whole set again. A waiter blocked by a
//! different key on a later look moves its watch to that key.

use coord_core::provider::{BoxFuture, MultiLockGrant, MultiLockRequest, MultiLockStore};
use coord_core::{BackendError, FencingToken};
use tokio::time::Instant;

use super::{Inner, PostgresProvider, check_key, from_ms, millis, uuid_of, wake_payload};
use crate::waiters::{Cue, Look, Wake};

/// The statement for the schema whose quoted name is `schema`.
pub(crate) fn statement(schema: &str) -> String {
    format!(
        "SELECT tokens, blocked, left_ms FROM {schema}.lock_acquire_all($1::text[], $2::uuid, \
         $3::bigint, $4::boolean)"
    )
}

/// What one attempt at the whole set found.
enum SetAttempt {
    /// Every key is ours: one token per key, in the request's order.
    Won(Vec<FencingToken>),
    /// The key at `at` (from 0) is held by another owner, whose lease ends within `left`.
    Held {
        at: usize,
        left: std::time::Duration,
    },
}

/// How one watch of a blocking key ended.
enum Watch {
    Won(Vec<FencingToken>),
    /// Another key blocks the set now.
    Moved(usize),
    TimedOut,
}

impl Inner {
    /// One attempt; `watch` marks the blocking holder so that its release notifies.
    async fn try_set(
        &self,
        req: &MultiLockRequest<'_>,
        keys: &[&str],
        watch: bool,
    ) -> Result<SetAttempt, BackendError> {
        let what = "multi-key lock acquire";
        let first = &req.keys[0];
        let rows = self
            .query(
                &self.lock_acquire_all,
                &[&keys, &uuid_of(req.owner), &millis(req.lease), &watch],
                what,
                first,
            )
            .await?;
        let row = self.one(&rows, what, first)?;
        let tokens: Option<Vec<i64>> = self.get(row, 0, what, first)?;
        let blocked: Option<i32> = self.get(row, 1, what, first)?;
        let left: Option<i64> = self.get(row, 2, what, first)?;
        match (tokens, blocked) {
            (Some(tokens), None) if tokens.len() == keys.len() => Ok(SetAttempt::Won(
                tokens
                    .into_iter()
                    .map(|t| FencingToken::new(t.max(0) as u64))
                    .collect(),
            )),
            (None, Some(at)) if at >= 1 && (at as usize) <= keys.len() => Ok(SetAttempt::Held {
                at: at as usize - 1,
                left: from_ms(left.unwrap_or(0)),
            }),
            _ => Err(self.protocol(what, first, "unexpected answer")),
        }
    }

    async fn acquire_all(
        &self,
        req: MultiLockRequest<'_>,
    ) -> Result<Option<MultiLockGrant>, BackendError> {
        if req.keys.is_empty() {
            return Ok(Some(grant(Vec::new(), false)));
        }
        for key in req.keys {
            check_key(key, "multi-key lock acquire")?;
        }
        let keys: Vec<&str> = req.keys.iter().map(|k| k.qualified()).collect();
        let mut blocked = match self.try_set(&req, &keys, false).await? {
            SetAttempt::Won(tokens) => return Ok(Some(grant(tokens, false))),
            SetAttempt::Held { .. } if req.wait.is_zero() => return Ok(None),
            SetAttempt::Held { at, .. } => at,
        };
        // `None`: a wait too long to represent: until granted or dropped.
        let deadline = Instant::now().checked_add(req.wait);
        let (rq, ks) = (&req, keys.as_slice());
        loop {
            // Watch the key that blocked the set, in its single lock's queue: its release
            // wakes this waiter once it is the head. A look that finds another key blocking
            // ends this watch (handing the head on) and starts one on that key.
            let look = move |_: Cue| async move {
                Ok(match self.try_set(rq, ks, true).await? {
                    SetAttempt::Won(tokens) => Look::Done(Watch::Won(tokens)),
                    SetAttempt::Held { at, .. } if at != blocked => Look::Done(Watch::Moved(at)),
                    SetAttempt::Held { left, .. } => Look::Pending(Some(left)),
                })
            };
            let watched = self
                .hub
                .wait(
                    wake_payload("lock", &req.keys[blocked]),
                    Wake::Head,
                    deadline,
                    Watch::TimedOut,
                    look,
                )
                .await?;
            match watched {
                Watch::Won(tokens) => return Ok(Some(grant(tokens, true))),
                Watch::Moved(at) => blocked = at,
                Watch::TimedOut => return Ok(None),
            }
        }
    }
}

fn grant(fencing_tokens: Vec<FencingToken>, contended: bool) -> MultiLockGrant {
    MultiLockGrant {
        fencing_tokens,
        contended,
        lease_began: None,
    }
}

/// Every set of keys is taken in one statement (all keys live in one database): all or none,
/// never observed half taken by another session, each key with its own token from the shared
/// sequence.
impl MultiLockStore for PostgresProvider {
    fn supports_multi_locks(&self) -> bool {
        true
    }

    fn acquire_all<'a>(
        &'a self,
        req: MultiLockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<MultiLockGrant>, BackendError>> {
        Box::pin(self.inner.acquire_all(req))
    }
}
