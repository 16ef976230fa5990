//! Cross-crate tests of coord: the test doubles the integration tests share ([`support`]).
//! The provider conformance suite lives in the `coord-conformance` crate; the tests here run
//! it against the in-process provider.

pub mod support;
