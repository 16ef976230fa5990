//! What a provider is configured with, one concept per module:
//!
//! * `client`: which client library talks to Redis, and what coord reads from an
//!   application's own client;
//! * `address`: Redis URLs parsed into [`Address`]es (the one form both client libraries are
//!   configured from), their display in messages, and [`scrub`] for texts from client
//!   libraries;
//! * `tls`: certificates, as given and as loaded;
//! * `options`: the builder's settings with their defaults ([`Options`]) and the checked
//!   [`Target`] a transport connects to.
//!
//! Everything that ends up in an error message or a log line goes through
//! [`Address::display`] or [`Options::describe`], which never include credentials; client
//! libraries' own error texts pass through [`scrub`]. Transports depend on this module, never
//! the other way round.

use coord_core::BackendError;
use coord_core::provider::BackendErrorKind;

mod address;
mod client;
mod options;
mod tls;

pub(crate) use address::{Address, Place, scrub};
#[cfg(feature = "fred")]
pub(crate) use address::{display_parts, display_socket};
pub use client::Client;
pub(crate) use options::{Options, Target, Topology};
#[cfg(feature = "tls")]
pub(crate) use tls::Pem;
pub(crate) use tls::TlsMaterial;
#[cfg(all(feature = "tls", feature = "redis-client"))]
pub(crate) use tls::ensure_crypto_provider;

/// A configuration error with `message`, which must not quote anything that may hold a
/// secret.
fn config_error(message: String) -> BackendError {
    BackendError::new(BackendErrorKind::Config, message)
}
