//! Cross-crate tests of coord: the provider conformance suite ([`conformance`]) and the test
//! doubles the integration tests share ([`support`]).

pub mod conformance;
pub mod support;
