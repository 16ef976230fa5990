//! # coord-postgres
//!
//! The PostgreSQL provider for coord (crate docs are completed below).

#![warn(missing_docs)]

mod errors;
mod provider;
mod schema;
mod sql;
mod sweeper;
#[cfg(feature = "tls")]
mod tls;
mod waiters;

pub use provider::{
    ConnectError, MAX_KEY_BYTES, PostgresProvider, PostgresProviderBuilder, URL_ENV,
};
pub use schema::{DEFAULT_SCHEMA, MigrationReport, SCHEMA_VERSION, SchemaError};
