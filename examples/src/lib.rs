//! Runnable examples of coord: see `quickstart.rs`.
