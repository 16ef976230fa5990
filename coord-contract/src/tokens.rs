//! Tokens that name an acquisition and order the holders of a key.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// A random 128-bit token naming one acquisition (of a lock, or of an idempotency claim).
///
/// Release, renewal, completion and abandonment succeed only while the stored owner is this
/// token, so a holder whose lease lapsed can never free or overwrite a newer holder's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken(u128);

impl OwnerToken {
    /// A fresh token, unique within this process and, with overwhelming probability, across
    /// processes: 64 random bits drawn once per process, then a per-process counter (handed to
    /// each thread in blocks, so tokens made one after the other need not be consecutive).
    pub fn new() -> OwnerToken {
        static PROCESS_NONCE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let nonce = *PROCESS_NONCE.get_or_init(|| {
            let mut bytes = [0u8; 8];
            // If the OS has no entropy source, fall back to time and pid: tokens stay unique
            // within the process thanks to the counter, and unlikely to collide across processes.
            if getrandom::fill(&mut bytes).is_err() {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0);
                bytes = (now ^ ((std::process::id() as u64) << 32)).to_le_bytes();
            }
            u64::from_le_bytes(bytes)
        });
        // Each thread takes counters from the shared one a block at a time: blocks never
        // overlap, so counters stay unique, and a token costs no atomic read-modify-write
        // (on a virtual machine, as much as the whole in-process lock attempt) but once per
        // block. Tokens name acquisitions; nothing orders them.
        const BLOCK: u64 = 1024;
        thread_local! {
            /// The next counter of this thread's block, and the block's end.
            static BLOCK_LEFT: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
        }
        let from_block = BLOCK_LEFT.try_with(|left| {
            let (next, end) = left.get();
            if next < end {
                left.set((next + 1, end));
                next
            } else {
                let start = NEXT.fetch_add(BLOCK, Ordering::Relaxed);
                left.set((start + 1, start + BLOCK));
                start
            }
        });
        // A thread being torn down has no block left: one counter straight from the shared one.
        let counter = from_block.unwrap_or_else(|_| NEXT.fetch_add(1, Ordering::Relaxed));
        OwnerToken(((nonce as u128) << 64) | counter as u128)
    }

    /// The token as a number.
    pub fn as_u128(self) -> u128 {
        self.0
    }

    /// Rebuilds a token from [`OwnerToken::as_u128`].
    pub fn from_u128(value: u128) -> OwnerToken {
        OwnerToken(value)
    }
}

impl Default for OwnerToken {
    fn default() -> Self {
        OwnerToken::new()
    }
}

impl std::fmt::Display for OwnerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// A number minted with every fenced acquisition, strictly greater than every token minted
/// before it for the same key.
///
/// Pass it along with every write the lock protects and have the resource reject a write whose
/// token is older than the newest it has seen: a holder that stalled past its lease then gets
/// its late writes refused instead of silently overwriting its successor's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token.
    pub fn new(value: u64) -> FencingToken {
        FencingToken(value)
    }

    /// The token as a number, for storing beside the data it guards.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for FencingToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_tokens_are_unique_across_threads_and_blocks() {
        let per_thread = 3 * 1024 + 7; // several blocks each, and a partial one
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    (0..per_thread)
                        .map(|_| OwnerToken::new())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut seen = std::collections::HashSet::new();
        for thread in threads {
            for token in thread.join().expect("the thread makes tokens") {
                assert!(seen.insert(token), "{token} was handed out twice");
            }
        }
        assert_eq!(seen.len(), 4 * per_thread);
    }
}
