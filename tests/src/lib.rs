//! Cross-crate tests of coord: the test doubles the integration tests share ([`support`], and
//! a database transaction for the transactional idempotency layer, [`buffered_transaction`])
//! and the reading of metric snapshots ([`metric_series`]).
//! The provider conformance suite lives in the `coord-conformance` crate; the tests here run
//! it against the in-process provider.

pub mod buffered_transaction;
pub mod metric_series;
pub mod support;
