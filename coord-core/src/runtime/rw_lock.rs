//! Read-write locks in the lock layer: a read or write hold (`mode = "read" | "write"`,
//! `Coordinator::rw_lock`) is taken through the lock's one acquisition path (see
//! [`acquire_lock`](crate::runtime::lock::acquire_lock)) and then held, renewed, lost and
//! released like a lock, through the read-write lock store ([`HoldKind::Rw`]). This module
//! holds what differs: the check of the task's chain of holds, and the store's request.
//!
//! [`HoldKind::Rw`]: crate::runtime::renewal::HoldKind::Rw

use futures_util::FutureExt;

use crate::error::CoordError;
use crate::provider::{
    BackendError, BoxFuture, CallKey, LockGrant, OwnerToken, RwLockRequest, RwMode, default_claim,
};
use crate::runtime::held;
use crate::runtime::renewal::Hold;
use crate::runtime::spec::LockSpec;
use crate::runtime::state::Coordinator;

/// Why this task may not take the read-write lock `key` in `mode` now, if it may not: it holds
/// that lock already (in any mode) somewhere up its chain of held locks.
///
/// * holding it for reading and asking to write: [`CoordError::LockUpgrade`] (an upgrade
///   would wait for the task's own read hold);
/// * any other second hold of the same key: [`CoordError::Reentrant`], as for locks (a
///   second read hold would deadlock behind a waiting writer, which waits for the first).
pub(crate) fn reentry(outer: Option<&Hold>, key: &CallKey, mode: RwMode) -> Option<CoordError> {
    match (held::chain_holds_rw(outer, key)?, mode) {
        (RwMode::Read, RwMode::Write) => Some(CoordError::LockUpgrade { key: key.clone() }),
        _ => Some(CoordError::Reentrant { key: key.clone() }),
    }
}

/// The acquisition of a hold of the read-write lock `key` in `mode`, answered as a lock grant:
/// a read-write lock's hold is always fenced.
pub(crate) fn acquire<'a>(
    coordinator: &'a Coordinator,
    key: &'a CallKey,
    owner: OwnerToken,
    mode: RwMode,
    spec: &LockSpec,
) -> BoxFuture<'a, Result<Option<LockGrant>, BackendError>> {
    let answer = coordinator.rw_lock_store().acquire_rw(RwLockRequest {
        key,
        owner,
        mode,
        lease: spec.lease,
        wait: spec.wait,
        claim: default_claim(spec.lease),
    });
    Box::pin(answer.map(|granted| {
        granted.map(|grant| {
            grant.map(|grant| LockGrant {
                fencing_token: Some(grant.fencing_token),
                contended: grant.contended,
                lease_began: grant.lease_began,
            })
        })
    }))
}
