//! Several locks of one [`LockTable`] taken together (the in-process provider's
//! [`MultiLockStore`](coord_contract::MultiLockStore)).
//!
//! The keys (distinct, in canonical order) are tried in one synchronous pass over the table,
//! with no await in it: either every key is free and the pass takes them all, or it meets a
//! held key, gives back what it took in that same pass, and the caller waits on that key
//! alone, holding nothing. Once the held key is handed to the waiter (its holder released it,
//! or its lease ran out), the pass runs again with that key already the waiter's. A caller
//! therefore never waits while holding some of its keys, and never returns holding some of
//! them: two callers with overlapping sets cannot deadlock.
//!
//! What the pass does not give: it is atomic for this process's tasks that are not running
//! at that very moment on another thread. A single-key attempt on another thread, during the
//! microseconds of a pass, can find a key taken that the pass then gives back (and be told it
//! is held). Redis, whose script no other client can see half done, gives the stronger form.

use std::sync::Arc;
use std::time::Duration;

use coord_contract::{FencingToken, MultiLockGrant, MultiLockRequest, OwnerToken};
use tokio::time::Instant;

use crate::{Attempt, LockTable};

/// What one pass over the keys found.
enum Pass {
    /// Every key is the caller's: one token per key, in order.
    Taken(Vec<FencingToken>),
    /// The key at this index is held by another owner; nothing is held by the caller.
    Blocked(usize),
}

impl LockTable {
    /// One pass: takes every key of `keys` for `owner`, except the one at `already` (with its
    /// token), which the caller holds already; stops at the first key held by someone else and
    /// gives back everything taken, `already` included.
    fn pass(
        &self,
        keys: &[Arc<str>],
        owner: OwnerToken,
        lease: Duration,
        already: Option<(usize, FencingToken)>,
    ) -> Pass {
        let mut tokens = Vec::with_capacity(keys.len());
        for (at, key) in keys.iter().enumerate() {
            if let Some((_, token)) = already.filter(|(held_at, _)| *held_at == at) {
                tokens.push(token);
                continue;
            }
            match self.attempt_shared(key, owner, lease, Duration::ZERO, true) {
                Attempt::Granted(grant) => tokens.push(
                    grant
                        .fencing_token
                        .expect("a fenced attempt mints a fencing token"),
                ),
                // One attempt was asked for, so the table never queues here.
                Attempt::Held | Attempt::Queued(_) => {
                    for (taken, _) in keys.iter().enumerate().filter(|(i, _)| {
                        *i < at || already.is_some_and(|(held_at, _)| held_at == *i)
                    }) {
                        self.release(&keys[taken], owner);
                    }
                    return Pass::Blocked(at);
                }
            }
        }
        Pass::Taken(tokens)
    }

    /// Takes every key of `req.keys` for `req.owner`, all or none, waiting up to `req.wait`
    /// (see the module docs). `None` when some key stayed held throughout.
    pub async fn acquire_all(&self, req: &MultiLockRequest<'_>) -> Option<MultiLockGrant> {
        let started = Instant::now();
        let keys: Vec<Arc<str>> = req.keys.iter().map(|key| key.shared().clone()).collect();
        let deadline = started.checked_add(req.wait);
        let mut already = None;
        // When the lease of the key handed to this waiter began: the earliest of the set's.
        let mut already_began = None;
        let mut contended = false;
        loop {
            let pass_began = Instant::now();
            let blocked = match self.pass(&keys, req.owner, req.lease, already.take()) {
                Pass::Taken(fencing_tokens) => {
                    let began: Option<Instant> = already_began;
                    return Some(MultiLockGrant {
                        fencing_tokens,
                        contended,
                        lease_began: Some(began.map_or(pass_began, |at| at.min(pass_began))),
                    });
                }
                Pass::Blocked(at) => at,
            };
            let now = Instant::now();
            let wait = match deadline {
                Some(deadline) if deadline <= now => return None,
                Some(deadline) => deadline - now,
                None => Duration::MAX,
            };
            if req.wait.is_zero() {
                return None;
            }
            contended = true;
            // Holding nothing, wait on the key that blocked the pass: its release (or its
            // holder's lease running out) hands it over; then the whole set is tried again.
            let handed = match self.attempt_shared(&keys[blocked], req.owner, req.lease, wait, true)
            {
                Attempt::Granted(grant) => Some(grant),
                Attempt::Held => None,
                Attempt::Queued(waiter) => waiter.wait().await,
            };
            let grant = handed?;
            let token = grant
                .fencing_token
                .expect("a fenced attempt mints a fencing token");
            already_began = grant.lease_began;
            already = Some((blocked, token));
        }
    }
}
