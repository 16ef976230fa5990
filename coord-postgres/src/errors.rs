//! PostgreSQL's errors as coord's [`BackendError`] kinds.
//!
//! | what happened | kind |
//! |---|---|
//! | no answer within the command timeout (client side), `statement_timeout` (57014), no free pooled connection in time | `Timeout` |
//! | connection refused, reset or closed, `pg_terminate_backend` / shutdown (57P01..57P03), the server's connection limit (53300), a read-only server or replica (25006), serialization failure or deadlock (40001, 40P01), a full notification queue (54000), a lock not available (55P03) | `Unavailable` |
//! | out of memory, disk full (53200, 53100) | `OutOfMemory` |
//! | refused credentials or permissions (28xxx, 42501), a missing schema, table or function (3F000, 42P01, 42883, 42703: run the migrations), a bad URL | `Config` |
//! | a row that breaks the tables' checks (23xxx), anything else | `Protocol` |

use coord_core::BackendError;
use coord_core::provider::BackendErrorKind;
use tokio_postgres::error::SqlState;

/// The kind of a driver error.
pub(crate) fn kind_of(err: &tokio_postgres::Error) -> BackendErrorKind {
    if let Some(db) = err.as_db_error() {
        return kind_of_state(db.code());
    }
    if err.is_closed() {
        return BackendErrorKind::Unavailable;
    }
    // Everything without a server's error code is the connection's: I/O, TLS, a closed or
    // broken stream, an unexpected message.
    let text = err.to_string();
    if text.contains("timeout") || text.contains("timed out") {
        BackendErrorKind::Timeout
    } else if text.contains("invalid configuration") || text.contains("error parsing") {
        BackendErrorKind::Config
    } else {
        BackendErrorKind::Unavailable
    }
}

/// The kind of a server error code.
pub(crate) fn kind_of_state(code: &SqlState) -> BackendErrorKind {
    let text = code.code();
    match text {
        "57014" => BackendErrorKind::Timeout,
        "57P01" | "57P02" | "57P03" | "53300" | "25006" | "40001" | "40P01" | "54000" | "55P03"
        | "55006" => BackendErrorKind::Unavailable,
        "53200" | "53100" => BackendErrorKind::OutOfMemory,
        "42501" | "3F000" | "42P01" | "42883" | "42703" | "3D000" => BackendErrorKind::Config,
        _ if text.starts_with("08") => BackendErrorKind::Unavailable,
        _ if text.starts_with("28") => BackendErrorKind::Config,
        _ => BackendErrorKind::Protocol,
    }
}

/// Whether, after `err`, the connection must not be used again: anything but an error the
/// server reported while the session stayed usable.
pub(crate) fn breaks_connection(err: &tokio_postgres::Error) -> bool {
    match err.as_db_error() {
        // A terminated or shut-down session, or a fatal error, ends the connection.
        Some(db) => {
            matches!(db.code().code(), "57P01" | "57P02" | "57P03")
                || db.code().code().starts_with("08")
                || matches!(db.severity(), "FATAL" | "PANIC")
        }
        None => true,
    }
}

/// `err` as a backend error, described as `what` at `address` (which holds no password).
pub(crate) fn backend_error(
    err: &tokio_postgres::Error,
    what: &str,
    address: &str,
) -> BackendError {
    let kind = kind_of(err);
    let detail = match err.as_db_error() {
        Some(db) => format!("{} ({}): {}", db.severity(), db.code().code(), db.message()),
        None => err.to_string(),
    };
    let hint = match kind {
        BackendErrorKind::Config
            if err.as_db_error().is_some_and(|db| {
                matches!(db.code().code(), "3F000" | "42P01" | "42883" | "42703")
            }) =>
        {
            "; coord's tables are missing or older than this version: run `coord migrate` or \
             `PostgresProvider::migrate`"
        }
        _ => "",
    };
    BackendError::new(kind, format!("{what} at {address}: {detail}{hint}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_codes_map_to_kinds() {
        let kind = |code: &str| kind_of_state(&SqlState::from_code(code));
        assert_eq!(kind("57014"), BackendErrorKind::Timeout);
        assert_eq!(kind("57P01"), BackendErrorKind::Unavailable);
        assert_eq!(kind("53300"), BackendErrorKind::Unavailable);
        assert_eq!(kind("25006"), BackendErrorKind::Unavailable);
        assert_eq!(kind("08006"), BackendErrorKind::Unavailable);
        assert_eq!(kind("40001"), BackendErrorKind::Unavailable);
        assert_eq!(kind("53200"), BackendErrorKind::OutOfMemory);
        assert_eq!(kind("28P01"), BackendErrorKind::Config);
        assert_eq!(kind("42P01"), BackendErrorKind::Config);
        assert_eq!(kind("23514"), BackendErrorKind::Protocol);
        assert_eq!(kind("XX000"), BackendErrorKind::Protocol);
    }
}
