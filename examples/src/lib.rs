//! Runnable examples of coord: see `quickstart.rs`. The library holds what the examples' own
//! tests start as well: the payments service of `payments_http`.

pub mod payments;
