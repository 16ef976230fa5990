//! Fingerprints: a digest of the parameters an idempotency key was used with.

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::codec::tagged;
use crate::provider::Fingerprint;

/// Hashed first, so that a change of the canonical encoding changes every fingerprint rather
/// than silently making different parameters collide with old ones. Version 1 was JSON.
const FINGERPRINT_VERSION: u8 = 2;

/// Hashes the parameters named in `fingerprint = [..]`.
///
/// Each value is written in coord's canonical tagged encoding and fed to SHA-256 with its
/// length in front, so the boundaries between values count; a version byte comes first.
///
/// # What is canonical
///
/// Equal values of the same type fingerprint equally in every process and on every run:
///
/// * map entries are ordered by their encoded keys, so a `HashMap` (whose iteration order
///   differs between processes) fingerprints like a `BTreeMap` with the same entries;
/// * every NaN is the same NaN, whatever its sign or payload, and `-0.0` is `0.0` (they
///   compare equal);
/// * struct fields are taken in declaration order, which a build does not change.
///
/// Every distinction the data model makes is kept: NaN, `+inf`, `-inf`, `None`, `Some(None)`,
/// `""`, `()` and a unit struct all differ from each other, and so do `1i64`, `1u64`, `1i32`
/// and `1.0f64` (a parameter that changes type changes its fingerprint).
///
/// Not canonical: sets and sequences keep their iteration order, so a `HashSet` fingerprints
/// differently from one process to the next; use a `BTreeSet` (or a sorted `Vec`) in
/// fingerprinted values. Type names are not hashed: two struct types with the same fields
/// and values fingerprint equally. A value whose `Serialize` output depends on anything but
/// the value (addresses, clocks) fingerprints accordingly.
#[derive(Debug)]
pub struct FingerprintHasher {
    hasher: Sha256,
    failed: Option<String>,
}

impl Default for FingerprintHasher {
    fn default() -> Self {
        let mut hasher = Sha256::new();
        hasher.update([FINGERPRINT_VERSION]);
        Self {
            hasher,
            failed: None,
        }
    }
}

impl FingerprintHasher {
    /// An empty hasher.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one parameter. A serialization error is kept and reported by
    /// [`finish`](Self::finish); later parameters are then ignored.
    pub fn param<T: Serialize + ?Sized>(mut self, value: &T) -> Self {
        if self.failed.is_some() {
            return self;
        }
        match tagged::to_canonical(value) {
            Ok(bytes) => {
                self.hasher.update((bytes.len() as u64).to_le_bytes());
                self.hasher.update(&bytes);
            }
            Err(err) => self.failed = Some(err.to_string()),
        }
        self
    }

    /// The first 128 bits of the digest, or the first serialization error of a parameter.
    pub fn finish(self) -> Result<Fingerprint, String> {
        if let Some(err) = self.failed {
            return Err(err);
        }
        let digest = self.hasher.finalize();
        let mut out = [0u8; 16];
        out.copy_from_slice(&digest[..16]);
        Ok(Fingerprint(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundaries_between_values_count() {
        let a = FingerprintHasher::new()
            .param("ab")
            .param("c")
            .finish()
            .unwrap();
        let b = FingerprintHasher::new()
            .param("a")
            .param("bc")
            .finish()
            .unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn same_values_same_fingerprint() {
        let a = FingerprintHasher::new().param(&(1, "x")).finish().unwrap();
        let b = FingerprintHasher::new().param(&(1, "x")).finish().unwrap();
        assert_eq!(a, b);
    }
}
