//! The runtime the generated code calls. Not a public API: reached through
//! `coord_core::__private`, and free to change between patch releases.

pub(crate) mod cache;
pub(crate) mod cache_tiers;
pub(crate) mod call;
pub(crate) mod cluster_flight;
pub(crate) mod detach;
pub(crate) mod flight;
pub(crate) mod held;
pub(crate) mod idempotency;
pub(crate) mod lease_guard;
pub(crate) mod lifecycle;
pub(crate) mod lock;
pub(crate) mod multi_lock;
pub(crate) mod outcome;
pub(crate) mod renewal;
pub(crate) mod rw_lock;
pub(crate) mod settings;
pub(crate) mod spec;
pub(crate) mod state;
pub(crate) mod transactional;
