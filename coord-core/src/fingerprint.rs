//! Fingerprints: a digest of the parameters an idempotency key was used with.

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::provider::Fingerprint;

/// Hashes the parameters named in `fingerprint = [..]`.
///
/// Each value is serialized to JSON and fed to SHA-256 with its length in front, so the
/// boundaries between values count. The digest is stable across processes and builds as long
/// as the values serialize the same way: use ordered maps (`BTreeMap`), not `HashMap`, inside
/// fingerprinted values.
#[derive(Debug, Default)]
pub struct FingerprintHasher {
    hasher: Sha256,
    failed: Option<String>,
}

impl FingerprintHasher {
    /// An empty hasher.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one parameter.
    pub fn param<T: Serialize + ?Sized>(mut self, value: &T) -> Self {
        match serde_json::to_vec(value) {
            Ok(bytes) => {
                self.hasher.update((bytes.len() as u64).to_le_bytes());
                self.hasher.update(&bytes);
            }
            Err(err) => self.failed = Some(err.to_string()),
        }
        self
    }

    /// The first 128 bits of the digest, or the serialization error of a parameter.
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
