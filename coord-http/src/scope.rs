//! Whose key a request's key is: the scope decision the builder requires, and the digest a
//! scope enters the record key as.

use std::fmt;
use std::sync::Arc;

use http::HeaderName;
use http::request::Parts;
use sha2::{Digest, Sha256};

pub(crate) use sealed::Sealed;

/// The length of a [`scope_digest`], in characters (lowercase hexadecimal digits).
pub const SCOPE_DIGEST_LEN: usize = 32;

/// Separates this digest's inputs from every other SHA-256 input coord computes; changes if the
/// input ever changes shape.
const DOMAIN: &[u8] = b"coord-http scope v1";

/// What is hashed after the namespace: a principal's value, or "the header was absent".
const VALUE: u8 = 1;
const ABSENT: u8 = 0;

/// The form a principal's value takes in a record key: 32 lowercase hexadecimal digits, the
/// first 128 bits of SHA-256 over a fixed domain label, `namespace` and `scope` (each
/// length-prefixed).
///
/// The layer calls this for every request whose layer was given a
/// [`scope`](crate::IdempotencyLayerBuilder::scope) or a
/// [`scope_header`](crate::IdempotencyLayerBuilder::scope_header), with the coordinator's
/// namespace and the principal's bytes (the function's `String`, or the header's value), so
/// operator tools given the raw value can find that principal's records (`coord records list
/// http.idempotency --scope VALUE`).
///
/// # Promised
/// * Fixed length, and only `0-9a-f`: the raw value never reaches a backend key name, a log
///   line, a [`CallReport`](coord_core::CallReport) or a metric.
/// * Deterministic across processes, platforms and versions of this crate that keep the
///   record-key layout (a change is a breaking change, announced in the changelog).
/// * The namespace is part of the input: the same principal has unrelated digests in two
///   namespaces.
///
/// # Not promised
/// The digest hides a value from someone reading keys or logs, not from someone who can guess
/// it: anyone who knows the namespace can check a guessed e-mail address or tenant name
/// against it. It is not a secret, and no substitute for keeping the backend private.
pub fn scope_digest(namespace: &str, scope: &[u8]) -> String {
    digest(namespace, Some(scope))
}

/// The digest of a value, or of "no value" (a [`scope_header`](
/// crate::IdempotencyLayerBuilder::scope_header) that a request does not carry), which no
/// value shares.
fn digest(namespace: &str, scope: Option<&[u8]>) -> String {
    let mut hasher = Sha256::new();
    field(&mut hasher, DOMAIN);
    field(&mut hasher, namespace.as_bytes());
    match scope {
        Some(scope) => {
            hasher.update([VALUE]);
            field(&mut hasher, scope);
        }
        None => hasher.update([ABSENT]),
    }
    let digest = hasher.finalize();
    let mut out = String::with_capacity(SCOPE_DIGEST_LEN);
    for byte in &digest[..SCOPE_DIGEST_LEN / 2] {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn field(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
}

/// How a layer tells principals apart, once chosen.
#[derive(Clone)]
pub(crate) enum Scope {
    /// Every caller is one principal: the scope part is empty, as before scopes were required,
    /// so records written by earlier versions keep their keys.
    Single,
    /// The application's function names the principal.
    Function(Arc<dyn Fn(&Parts) -> String + Send + Sync>),
    /// The value of a request header names the principal; its absence is one more principal.
    Header(HeaderName),
}

impl Scope {
    /// The key part this request's principal is stored under, in `namespace`.
    pub(crate) fn key_part(&self, namespace: &str, request: &Parts) -> String {
        match self {
            Scope::Single => String::new(),
            Scope::Function(scope) => scope_digest(namespace, scope(request).as_bytes()),
            Scope::Header(name) => {
                let mut values = request.headers.get_all(name).iter();
                match (values.next(), values.next()) {
                    (None, _) => digest(namespace, None),
                    (Some(one), None) => scope_digest(namespace, one.as_bytes()),
                    // A repeated header means what its values joined by ", " mean (RFC 9110,
                    // section 5.3), so both spellings are one principal.
                    (Some(first), Some(second)) => {
                        let mut joined = first.as_bytes().to_vec();
                        for value in std::iter::once(second).chain(values) {
                            joined.extend_from_slice(b", ");
                            joined.extend_from_slice(value.as_bytes());
                        }
                        scope_digest(namespace, &joined)
                    }
                }
            }
        }
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Single => f.write_str("SinglePrincipal"),
            Scope::Function(_) => f.write_str("Function(..)"),
            Scope::Header(name) => f.debug_tuple("Header").field(name).finish(),
        }
    }
}

/// The state of an [`IdempotencyLayerBuilder`](crate::IdempotencyLayerBuilder) that has not
/// yet been told how principals are told apart: it has no usable `build()`.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct ScopeUnset;

/// The state of an [`IdempotencyLayerBuilder`](crate::IdempotencyLayerBuilder) after
/// [`scope`](crate::IdempotencyLayerBuilder::scope),
/// [`scope_header`](crate::IdempotencyLayerBuilder::scope_header) or
/// [`single_principal`](crate::IdempotencyLayerBuilder::single_principal).
#[derive(Debug, Clone)]
pub struct ScopeSet(pub(crate) Scope);

mod sealed {
    /// Carries the choice out of the builder; in a private module, so no other crate can
    /// implement [`ScopeDecision`](super::ScopeDecision).
    pub trait Sealed {
        fn into_set(self) -> super::ScopeSet;
    }

    impl Sealed for super::ScopeSet {
        fn into_set(self) -> super::ScopeSet {
            self
        }
    }
}

/// Implemented only by [`ScopeSet`]: the bound on
/// [`build`](crate::IdempotencyLayerBuilder::build) that makes building a layer without a
/// scope decision a compile error. Sealed: it cannot be implemented outside this crate.
#[diagnostic::on_unimplemented(
    message = "the idempotency layer does not know whose keys are whose: choose a scope before `.build()`",
    label = "`.build()` needs a scope decision first",
    note = "call one of: `.scope(|request| principal)` (your function names the caller), `.scope_header(AUTHORIZATION)` (a header's value names the caller), or `.single_principal()` (every caller is one principal: keys are shared by all)"
)]
pub trait ScopeDecision: Sealed {}

impl ScopeDecision for ScopeSet {}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;
    use http::header::AUTHORIZATION;

    fn parts(headers: &[(&str, &str)]) -> Parts {
        let mut builder = Request::builder().method("POST").uri("/");
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap().into_parts().0
    }

    #[test]
    fn digest_is_fixed_length_hex_and_hides_the_value() {
        for scope in [
            "",
            "alice@example.com",
            "Bearer sk_live_123",
            &"x".repeat(10_000),
        ] {
            let d = scope_digest("payments", scope.as_bytes());
            assert_eq!(d.len(), SCOPE_DIGEST_LEN, "{d}");
            assert!(
                d.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            );
            if !scope.is_empty() {
                assert!(!d.contains(scope), "{d}");
            }
        }
    }

    #[test]
    fn digest_is_stable() {
        // Records written by one version must be found by the next: the layout is pinned (the
        // value was computed independently, from the layout the docs describe).
        assert_eq!(
            scope_digest("payments", b"alice"),
            "37729085138030fd4e4f7f6a50f9369f"
        );
    }

    #[test]
    fn namespace_and_value_both_count() {
        let base = scope_digest("payments", b"alice");
        assert_eq!(base, scope_digest("payments", b"alice"));
        assert_ne!(base, scope_digest("billing", b"alice"));
        assert_ne!(base, scope_digest("payments", b"bob"));
        // Moving bytes between the namespace and the value changes the input.
        assert_ne!(scope_digest("ab", b"c"), scope_digest("a", b"bc"));
    }

    #[test]
    fn header_scope() {
        let scope = Scope::Header(AUTHORIZATION);
        let part = |headers: &[(&str, &str)]| scope.key_part("ns", &parts(headers));
        let alice = part(&[("authorization", "Bearer alice")]);
        assert_eq!(alice, scope_digest("ns", b"Bearer alice"));
        assert_ne!(alice, part(&[("authorization", "Bearer bob")]));
        // Absent is a principal of its own, unlike any value, the empty one included.
        let absent = part(&[]);
        assert_eq!(absent, part(&[("x-other", "1")]));
        assert_ne!(absent, part(&[("authorization", "")]));
        assert_eq!(absent.len(), SCOPE_DIGEST_LEN);
        // Repeated: the values joined, as HTTP reads a repeated field.
        assert_eq!(
            part(&[("authorization", "a"), ("authorization", "b")]),
            part(&[("authorization", "a, b")])
        );
    }

    #[test]
    fn function_and_single_scopes() {
        let function = Scope::Function(Arc::new(|_: &Parts| "acme".to_owned()));
        assert_eq!(
            function.key_part("ns", &parts(&[])),
            scope_digest("ns", b"acme")
        );
        assert_eq!(Scope::Single.key_part("ns", &parts(&[])), "");
    }
}
