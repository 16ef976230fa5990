//! How the outcomes of `#[idempotent]` calls are encoded for storage.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The encoding of stored outcomes, chosen on the coordinator builder.
///
/// Every process that shares a backend must use the same codec: a record written in one
/// encoding does not decode in another, and coord reports that as [`CoordError::Codec`]
/// rather than running the call again.
///
/// [`CoordError::Codec`]: crate::CoordError::Codec
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Codec {
    /// `serde_json`: readable in `redis-cli`, tolerant of added fields. The default.
    #[default]
    Json,
}

impl Codec {
    /// Encodes `value`.
    pub fn encode<T: Serialize + ?Sized>(self, value: &T) -> Result<Vec<u8>, String> {
        match self {
            Codec::Json => serde_json::to_vec(value).map_err(|e| e.to_string()),
        }
    }

    /// Decodes a value encoded by [`Codec::encode`].
    pub fn decode<T: DeserializeOwned>(self, bytes: &[u8]) -> Result<T, String> {
        match self {
            Codec::Json => serde_json::from_slice(bytes).map_err(|e| e.to_string()),
        }
    }
}
