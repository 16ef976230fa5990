//! Holds an operator forced free: the forced release itself, and the markers that let the
//! former holder's release and renewal say so for a while.

use std::sync::Arc;

use tokio::time::Instant;

use coord_contract::{FORCED_RELEASE_MEMORY, ForcedRelease, OwnerToken};

use super::{Freed, LockTable};
use crate::deadline_after;

/// The owner whose live hold an operator forced free, and until when that is remembered.
pub(super) struct ForcedMarker {
    owner: OwnerToken,
    until: Instant,
}

impl LockTable {
    /// Frees `key` whoever holds it, as its holder's release would: the longest-waiting caller
    /// gets the lock, and with no one waiting the entry goes. Answers
    /// [`ForcedRelease::Released`] with the owner whose live lease was ended, or
    /// [`ForcedRelease::NotHeld`] when nobody held the key (a lapsed entry is cleaned up all the
    /// same); never [`ForcedRelease::RemovedCorrupt`], as nothing but this table writes its
    /// entries. An operator's tool: the holder is not told, and finds out at its next renewal
    /// or its release, which answer [`LossCause::ForceReleased`](coord_contract::LossCause::ForceReleased) /
    /// [`ReleaseOutcome::ForceReleased`](coord_contract::ReleaseOutcome::ForceReleased) for the rest of the released lease plus
    /// [`FORCED_RELEASE_MEMORY`] (the table keeps a marker naming the released owner that
    /// long). The fencing counter is left alone.
    pub fn force_release(&self, key: &str) -> ForcedRelease {
        match self.free(key, None, Instant::now()) {
            Some(Freed {
                owner,
                expires_at,
                live: true,
            }) => {
                self.remember_forced(key, owner, expires_at);
                ForcedRelease::Released { owner }
            }
            _ => ForcedRelease::NotHeld,
        }
    }

    /// Remembers that `owner`'s hold of `key`, whose lease would have ended at `expires_at`,
    /// was forced free; forgets every marker whose time is up (forced releases are rare, so
    /// this sweep is what keeps the markers bounded).
    fn remember_forced(&self, key: &str, owner: OwnerToken, expires_at: Instant) {
        let now = Instant::now();
        self.forced.retain(|_, marker| marker.until > now);
        let until = deadline_after(expires_at, FORCED_RELEASE_MEMORY);
        self.forced
            .insert(Arc::from(key), ForcedMarker { owner, until });
    }

    /// True when an operator forced `owner`'s hold of `key` free and that is still
    /// remembered. A marker whose time is up is removed on the way.
    pub(super) fn was_forced(&self, key: &str, owner: OwnerToken) -> bool {
        if self.forced.is_empty() {
            return false;
        }
        let now = Instant::now();
        let found = self
            .forced
            .get(key)
            .map(|marker| (marker.owner == owner, marker.until > now));
        match found {
            Some((ours, true)) => ours,
            Some((_, false)) => {
                self.forced.remove_if(key, |_, marker| marker.until <= now);
                false
            }
            None => false,
        }
    }
}
