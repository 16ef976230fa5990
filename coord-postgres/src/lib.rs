//! # coord-postgres
//!
//! The PostgreSQL provider for coord (crate docs are completed below).

#![warn(missing_docs)]

mod connection;
mod errors;
mod from_config;
mod provider;
mod schema;
mod sql;
mod sweeper;
#[cfg(feature = "tls")]
mod tls;
mod waiters;

pub use from_config::{coordinator_from_config, coordinator_from_env};
pub use provider::{
    ConnectError, MAX_KEY_BYTES, PostgresProvider, PostgresProviderBuilder, URL_ENV,
};
pub use schema::{DEFAULT_SCHEMA, MigrationReport, SCHEMA_VERSION, SchemaError};
