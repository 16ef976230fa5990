//! For provider authors: the contract a coordination backend implements.
//!
//! Everything here is the `coord-contract` crate, re-exported so that a provider crate needs
//! only `coord-core`: the traits ([`LockProvider`], [`IdempotencyStore`], [`CacheStore`],
//! [`FlightStore`], [`Operations`]), the request and outcome types they speak, [`CallKey`],
//! the owner and fencing tokens, [`BackendError`], the saturating [`time`] helpers and the
//! [`background`] clean-up runner. See the `coord-contract` crate docs for the promises each
//! trait makes, and run `coord-conformance` against a new provider before trusting it.

pub use coord_contract::*;
