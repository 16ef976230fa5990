//! Cross-crate tests of coord: the test doubles the integration tests share ([`support`]) and
//! the reading of metric snapshots ([`metric_series`]).
//! The provider conformance suite lives in the `coord-conformance` crate; the tests here run
//! it against the in-process provider.

pub mod metric_series;
pub mod support;
