//! How the outcomes of `#[idempotent]` calls are encoded for storage.

mod de;
mod format;
mod ser;
pub(crate) mod tagged;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The encoding of stored outcomes, chosen on the coordinator builder.
///
/// Every process that shares a backend must use the same codec: a record written in one
/// encoding does not decode in another, and coord reports that as [`CoordError::Codec`]
/// rather than running the call again. Both codecs recognise the other's records and say so
/// in that error.
///
/// [`CoordError::Codec`]: crate::CoordError::Codec
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Codec {
    /// coord's tagged binary format. The default.
    ///
    /// A replay equals what the first call returned, for every type serde can serialize:
    /// `Option<Option<T>>` keeps `Some(None)` apart from `None`, `()` and unit structs come
    /// back, floats keep their exact bits (NaN, infinities, `-0.0`), `i128`/`u128` keep every
    /// bit, maps and every enum shape (externally, internally, adjacently tagged, untagged)
    /// round-trip, and `#[serde(flatten)]` works.
    ///
    /// Structs are stored by field name, not by position, so a record stays readable when a
    /// field is added with `#[serde(default)]`, when a field is removed, or when fields are
    /// reordered; renaming a field, or changing its type to one that does not accept the old
    /// value, makes old records fail to decode (a [`CoordError::Codec`]).
    ///
    /// Records start with a format byte that no text starts with and a version byte, so a
    /// JSON record, or one from a later version of the format, is reported as such.
    ///
    /// [`CoordError::Codec`]: crate::CoordError::Codec
    #[default]
    Tagged,
    /// `serde_json`: readable in `redis-cli`, tolerant of added fields. Opt-in.
    ///
    /// JSON cannot tell `Some(None)` from `None` (nor `Some(())` from `None`), and has no NaN
    /// or infinity: values containing a NaN or infinite float are refused at encode rather
    /// than stored as `null`. Replays of values JSON cannot represent exactly are not exact;
    /// [`Codec::encode_checked`] catches those whose bytes would not decode at all.
    Json,
}

impl Codec {
    /// Encodes `value`.
    ///
    /// Fails when the value's `Serialize` implementation fails, and with [`Codec::Json`] when
    /// the value holds a NaN or infinite float or a map key JSON cannot write. Success does
    /// not promise the bytes decode back into the same type: use [`Codec::encode_checked`]
    /// for that.
    pub fn encode<T: Serialize + ?Sized>(self, value: &T) -> Result<Vec<u8>, String> {
        match self {
            Codec::Tagged => tagged::to_record(value).map_err(|e| e.to_string()),
            Codec::Json => {
                tagged::check_finite(value).map_err(|e| e.to_string())?;
                serde_json::to_vec(value).map_err(|e| e.to_string())
            }
        }
    }

    /// Encodes `value`, then decodes the bytes back into `T` and fails if that fails.
    ///
    /// This is what coord stores outcomes with, so that no record that cannot be decoded is
    /// ever stored: the failure shows when the call completes, not on every later replay. It
    /// checks that the bytes decode, not that the decoded value equals `value` (`T` need not
    /// implement `PartialEq`); with [`Codec::Tagged`] the two are equal whenever `T`'s
    /// `Serialize` and `Deserialize` implementations agree with each other.
    pub fn encode_checked<T: Serialize + DeserializeOwned>(
        self,
        value: &T,
    ) -> Result<Vec<u8>, String> {
        let bytes = self.encode(value)?;
        if let Err(err) = self.decode::<T>(&bytes) {
            return Err(format!(
                "a `{}` encoded with {self:?} does not decode back: {err}",
                std::any::type_name::<T>()
            ));
        }
        Ok(bytes)
    }

    /// Decodes a value encoded by [`Codec::encode`] with the same codec.
    ///
    /// Fails, never panics, on any bytes that are not such a value: truncated, corrupt,
    /// written by the other codec or by a later format version, or encoding a value that does
    /// not fit `T` (for instance one stored by an older version of the program, with another
    /// type).
    pub fn decode<T: DeserializeOwned>(self, bytes: &[u8]) -> Result<T, String> {
        match self {
            Codec::Tagged => tagged::from_record(bytes).map_err(|e| e.to_string()),
            Codec::Json => match bytes.first() {
                Some(&format::MAGIC) => Err(
                    "record is in coord's tagged format, not JSON (written with Codec::Tagged?)"
                        .to_owned(),
                ),
                _ => serde_json::from_slice(bytes).map_err(|e| e.to_string()),
            },
        }
    }
}
