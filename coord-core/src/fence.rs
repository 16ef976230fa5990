//! Checking fencing tokens at the resource: the half of fencing that makes a lease safe.
//!
//! A lock holder can stall past its lease and wake up while a successor holds the lock. Its
//! late writes are harmless only if the resource refuses them: store, next to the data, the
//! newest fencing token that wrote it, and refuse any write carrying an older one.
//!
//! * In memory: [`Fence`].
//! * In Redis: `coord_redis::fence` (a script that writes only when the token is not older
//!   than the last one seen).
//! * In SQL, make the token part of the write's condition, in the same statement:
//!
//! ```sql
//! -- once: ALTER TABLE projections ADD COLUMN fence BIGINT NOT NULL DEFAULT 0;
//! UPDATE projections
//!    SET body = $1, fence = $2
//!  WHERE tenant_id = $3 AND fence <= $2;
//! -- 0 rows updated: a newer holder has written since; this holder is stale and must stop.
//! ```
//!
//! For an insert-or-update, use `INSERT .. ON CONFLICT (tenant_id) DO UPDATE SET .. WHERE
//! projections.fence <= EXCLUDED.fence`. A token equal to the stored one is admitted, so one
//! holder can write several times.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::provider::FencingToken;

/// A write was refused because a newer holder has written since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleToken {
    /// The token the refused write carried.
    pub presented: FencingToken,
    /// The newest token the resource has admitted.
    pub newest: FencingToken,
}

impl std::fmt::Display for StaleToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stale fencing token {} (the resource has seen {}): the lock was lost to a newer holder",
            self.presented, self.newest
        )
    }
}

impl std::error::Error for StaleToken {}

/// The newest fencing token an in-memory resource has admitted.
///
/// `admit` is atomic: of two racing writers, the older token can never be admitted after the
/// newer one.
#[derive(Debug, Default)]
pub struct Fence {
    newest: AtomicU64,
}

impl Fence {
    /// A fence that has admitted nothing yet.
    pub fn new() -> Fence {
        Fence::default()
    }

    /// Admits a write carrying `token` if it is not older than every token admitted before.
    pub fn admit(&self, token: FencingToken) -> Result<(), StaleToken> {
        let presented = token.get();
        let mut newest = self.newest.load(Ordering::Acquire);
        loop {
            if presented < newest {
                return Err(StaleToken {
                    presented: token,
                    newest: FencingToken::new(newest),
                });
            }
            match self.newest.compare_exchange_weak(
                newest,
                presented,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(()),
                Err(actual) => newest = actual,
            }
        }
    }

    /// The newest token admitted so far, if any.
    pub fn newest(&self) -> Option<FencingToken> {
        match self.newest.load(Ordering::Acquire) {
            0 => None,
            n => Some(FencingToken::new(n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_tokens_are_refused_equal_ones_admitted() {
        let fence = Fence::new();
        assert!(fence.admit(FencingToken::new(5)).is_ok());
        assert!(fence.admit(FencingToken::new(5)).is_ok());
        let stale = fence.admit(FencingToken::new(4)).unwrap_err();
        assert_eq!(stale.newest, FencingToken::new(5));
        assert!(fence.admit(FencingToken::new(9)).is_ok());
        assert_eq!(fence.newest(), Some(FencingToken::new(9)));
    }
}
