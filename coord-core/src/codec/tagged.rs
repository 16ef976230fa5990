//! The entry points of coord's tagged format: a stored record, a canonical encoding for
//! fingerprints, a finiteness check, and decoding. The layout is described in `format.rs`.

use super::de::decode;
use super::format::{Error, MAGIC, VERSION};
use super::ser::{Encoder, Mode};

/// Encodes `value` as a record: header, then the value.
pub(crate) fn to_record<T: serde::Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, Error> {
    let mut enc = Encoder::new(Mode::Stored);
    // What serde_json starts with: most outcomes fit without growing.
    enc.out.reserve(128);
    enc.out.push(MAGIC);
    enc.out.push(VERSION);
    enc.run(value)?;
    Ok(enc.out)
}

/// The canonical encoding of `value` (no header): equal values give equal bytes.
pub(crate) fn to_canonical<T: serde::Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, Error> {
    let mut enc = Encoder::new(Mode::Canonical);
    enc.run(value)?;
    Ok(enc.out)
}

/// Walks `value` and fails on the first NaN or infinite float, writing nothing that lasts.
pub(crate) fn check_finite<T: serde::Serialize + ?Sized>(value: &T) -> Result<(), Error> {
    let mut enc = Encoder::new(Mode::FiniteOnly);
    enc.out.reserve(128);
    enc.run(value)
}

/// Decodes a record written by [`to_record`].
pub(crate) fn from_record<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    match bytes {
        [] => Err(Error::new("empty record")),
        [MAGIC] => Err(Error::new("record ends after its format byte")),
        [MAGIC, VERSION, body @ ..] => decode(body),
        [MAGIC, version, ..] => Err(Error::new(format!(
            "record is in version {version} of the tagged format; this build of coord reads \
             version {VERSION} only"
        ))),
        [first, ..] if looks_like_json(*first) => Err(Error::new(
            "record is not in the tagged format: it looks like JSON (written with Codec::Json?)",
        )),
        [first, ..] => Err(Error::new(format!(
            "record is not in the tagged format: it starts with byte {first:#04x}"
        ))),
    }
}

/// Whether a record starting with `byte` could be a JSON document.
pub(crate) fn looks_like_json(byte: u8) -> bool {
    matches!(
        byte,
        b'{' | b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n'
    ) || byte.is_ascii_whitespace()
}
