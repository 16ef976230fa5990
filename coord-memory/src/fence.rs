//! The fencing counter of one table.

use std::sync::atomic::{AtomicU64, Ordering};

use coord_contract::FencingToken;

/// The fencing counter of one table: the tokens it mints increase strictly across all the
/// table's keys, so they increase strictly per key.
#[derive(Default)]
pub(crate) struct Fence(AtomicU64);

impl Fence {
    /// The next token. Saturating: the counter cannot reach `u64::MAX` in practice (centuries
    /// of mints), but this runs under a shard lock, where even an unreachable panic is not
    /// allowed.
    pub(crate) fn mint(&self) -> FencingToken {
        FencingToken::new(self.0.fetch_add(1, Ordering::Relaxed).saturating_add(1))
    }
}
