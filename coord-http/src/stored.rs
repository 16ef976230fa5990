//! The response as it is stored in the idempotency record, and as it is replayed.

use std::fmt;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What a record holds: the handler's status, the headers chosen for storing (every value, in
/// order), and the body's exact bytes, or a note that the body was too large to keep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredResponse {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, Blob)>,
    pub(crate) body: StoredBody,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum StoredBody {
    /// The exact bytes the handler sent.
    Complete(Blob),
    /// The body was longer than the layer keeps (`len` when it was announced or counted);
    /// duplicates are told the request ran but its response cannot be replayed.
    TooLarge { len: Option<u64> },
}

impl StoredResponse {
    /// Keeps `status`, the values of the headers in `keep` (in the order the handler set
    /// them), and `body`.
    pub(crate) fn capture(
        status: StatusCode,
        headers: &HeaderMap,
        keep: &[HeaderName],
        body: StoredBody,
    ) -> StoredResponse {
        let mut stored = Vec::new();
        for name in keep {
            for value in headers.get_all(name) {
                stored.push((
                    name.as_str().to_owned(),
                    Blob(Bytes::copy_from_slice(value.as_bytes())),
                ));
            }
        }
        StoredResponse {
            status: status.as_u16(),
            headers: stored,
            body,
        }
    }

    /// The status, or `None` when the record holds one `http` cannot represent (a record
    /// written by something else).
    pub(crate) fn status(&self) -> Option<StatusCode> {
        StatusCode::from_u16(self.status).ok()
    }

    /// The stored headers as a map, skipping any a record could hold that `http` refuses.
    pub(crate) fn header_map(&self) -> HeaderMap {
        let mut map = HeaderMap::with_capacity(self.headers.len());
        for (name, value) in &self.headers {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_bytes(&value.0),
            ) {
                map.append(name, value);
            }
        }
        map
    }
}

/// Bytes stored compactly: as one byte string where the codec has them (coord's tagged
/// format), as a list of numbers in JSON.
#[derive(Clone, PartialEq, Eq, Default)]
pub(crate) struct Blob(pub(crate) Bytes);

impl fmt::Debug for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Blob({} bytes)", self.0.len())
    }
}

impl Serialize for Blob {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Blob {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct BlobVisitor;
        impl<'de> Visitor<'de> for BlobVisitor {
            type Value = Blob;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("bytes")
            }

            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Blob, E> {
                Ok(Blob(Bytes::copy_from_slice(v)))
            }

            fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Blob, E> {
                Ok(Blob(Bytes::from(v)))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Blob, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(b) = seq.next_element::<u8>()? {
                    out.push(b);
                }
                Ok(Blob(Bytes::from(out)))
            }
        }
        deserializer.deserialize_bytes(BlobVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coord_core::Codec;

    fn sample() -> StoredResponse {
        let mut headers = HeaderMap::new();
        headers.append(
            "content-type",
            HeaderValue::from_static("application/octet-stream"),
        );
        headers.append("x-custom", HeaderValue::from_static("one"));
        headers.append("x-custom", HeaderValue::from_bytes(b"\xfftwo").unwrap());
        headers.append("x-dropped", HeaderValue::from_static("no"));
        let keep = [
            HeaderName::from_static("content-type"),
            HeaderName::from_static("x-custom"),
            HeaderName::from_static("x-absent"),
        ];
        let body: Vec<u8> = (0..=255u8).chain([0, 0, 255]).collect();
        StoredResponse::capture(
            StatusCode::CREATED,
            &headers,
            &keep,
            StoredBody::Complete(Blob(Bytes::from(body))),
        )
    }

    #[test]
    fn keeps_only_the_listed_headers_every_value_in_order() {
        let stored = sample();
        let map = stored.header_map();
        assert_eq!(map.len(), 3);
        let custom: Vec<_> = map
            .get_all("x-custom")
            .iter()
            .map(|v| v.as_bytes())
            .collect();
        assert_eq!(custom, [&b"one"[..], &b"\xfftwo"[..]]);
        assert!(map.get("x-dropped").is_none());
    }

    #[test]
    fn round_trips_exactly_with_both_codecs() {
        let stored = sample();
        for codec in [Codec::Tagged, Codec::Json] {
            let bytes = codec.encode_checked(&stored).unwrap();
            let back: StoredResponse = codec.decode(&bytes).unwrap();
            assert_eq!(back, stored, "{codec:?}");
        }
        let too_large = StoredResponse {
            body: StoredBody::TooLarge { len: Some(1 << 40) },
            ..sample()
        };
        let bytes = Codec::Tagged.encode_checked(&too_large).unwrap();
        assert_eq!(
            Codec::Tagged.decode::<StoredResponse>(&bytes).unwrap(),
            too_large
        );
    }

    #[test]
    fn tagged_bodies_are_stored_as_one_byte_string() {
        let body = vec![7u8; 10_000];
        let stored = StoredResponse {
            status: 200,
            headers: Vec::new(),
            body: StoredBody::Complete(Blob(Bytes::from(body))),
        };
        let bytes = Codec::Tagged.encode(&stored).unwrap();
        assert!(
            bytes.len() < 10_100,
            "{} bytes for a 10 000-byte body",
            bytes.len()
        );
    }
}
