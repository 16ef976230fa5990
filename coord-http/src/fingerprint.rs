//! What makes two requests "the same request" for one idempotency key.

use coord_core::provider::Fingerprint;
use http::HeaderName;
use http::request::Parts;
use sha2::{Digest, Sha256};

/// Changes whenever the fingerprint's input changes shape, so that an upgrade never makes two
/// different requests look alike (at worst a key used across the upgrade is refused).
const VERSION: u8 = 1;

/// Fingerprints a request: its method, its path and query, the listed headers (name and every
/// value, in order; an absent header differs from an empty one) and its body bytes.
///
/// Each field goes into SHA-256 with its length in front, so no two different requests share
/// an input; the first 128 bits are kept.
pub(crate) fn request_fingerprint(
    parts: &Parts,
    headers: &[HeaderName],
    body: &[u8],
) -> Fingerprint {
    let mut hasher = Sha256::new();
    hasher.update([VERSION]);
    field(&mut hasher, parts.method.as_str().as_bytes());
    let target = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or_else(|| parts.uri.path());
    field(&mut hasher, target.as_bytes());
    hasher.update((headers.len() as u64).to_le_bytes());
    for name in headers {
        field(&mut hasher, name.as_str().as_bytes());
        let values = parts.headers.get_all(name);
        hasher.update((values.iter().count() as u64).to_le_bytes());
        for value in values {
            field(&mut hasher, value.as_bytes());
        }
    }
    field(&mut hasher, body);
    let digest = hasher.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&digest[..16]);
    Fingerprint(out)
}

fn field(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn parts(method: &str, uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut builder = Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap().into_parts().0
    }

    fn fp(method: &str, uri: &str, headers: &[(&str, &str)], body: &[u8]) -> Fingerprint {
        let listed = [HeaderName::from_static("content-type")];
        request_fingerprint(&parts(method, uri, headers), &listed, body)
    }

    #[test]
    fn same_request_same_fingerprint() {
        let a = fp("POST", "/pay?x=1", &[("content-type", "a/b")], b"{}");
        let b = fp("POST", "/pay?x=1", &[("content-type", "a/b")], b"{}");
        assert_eq!(a, b);
    }

    #[test]
    fn each_part_counts() {
        let base = fp("POST", "/pay", &[("content-type", "a/b")], b"{}");
        assert_ne!(base, fp("PATCH", "/pay", &[("content-type", "a/b")], b"{}"));
        assert_ne!(base, fp("POST", "/pay2", &[("content-type", "a/b")], b"{}"));
        assert_ne!(
            base,
            fp("POST", "/pay?x", &[("content-type", "a/b")], b"{}")
        );
        assert_ne!(base, fp("POST", "/pay", &[("content-type", "a/c")], b"{}"));
        assert_ne!(base, fp("POST", "/pay", &[], b"{}"));
        assert_ne!(base, fp("POST", "/pay", &[("content-type", "a/b")], b"{ }"));
    }

    #[test]
    fn unlisted_headers_do_not_count() {
        let a = fp("POST", "/pay", &[("x-trace", "1")], b"");
        let b = fp("POST", "/pay", &[("x-trace", "2")], b"");
        assert_eq!(a, b);
    }

    #[test]
    fn boundaries_between_fields_count() {
        // Moving bytes from the path into the body must not give the same input.
        assert_ne!(fp("POST", "/ab", &[], b"c"), fp("POST", "/a", &[], b"bc"));
        // An empty header value is not an absent header.
        assert_ne!(
            fp("POST", "/", &[("content-type", "")], b""),
            fp("POST", "/", &[], b"")
        );
    }
}
