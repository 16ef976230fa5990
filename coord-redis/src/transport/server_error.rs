//! An error reply from the server, read once from the client library's error.
//!
//! Each transport turns its library's error into a [`ServerError`] where the error arrives;
//! everything above matches on its [`ErrorCode`] and never reads the text again.

use std::fmt;

use coord_core::provider::BackendErrorKind;

/// The code an error reply starts with, as far as coord tells codes apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ErrorCode {
    /// `NOSCRIPT`: the script is not in the server's script cache.
    NoScript,
    /// `BUSY`: a script is running past its time limit.
    Busy,
    /// `LOADING`: the server is loading its data set.
    Loading,
    /// `MASTERDOWN`: a replica lost its master.
    MasterDown,
    /// `READONLY`: a write reached a replica (after a failover).
    ReadOnly,
    /// `CLUSTERDOWN`: the cluster does not serve this slot now.
    ClusterDown,
    /// `TRYAGAIN`: the slot is being resharded.
    TryAgain,
    /// `NOREPLICAS`: not enough replicas acknowledge writes.
    NoReplicas,
    /// `MOVED`: another node owns the slot.
    Moved,
    /// `ASK`: the slot is migrating.
    Ask,
    /// `UNBLOCKED`: a blocked client was released by force.
    Unblocked,
    /// `NOAUTH`: the connection has not authenticated.
    NoAuth,
    /// `WRONGPASS`: wrong user name or password.
    WrongPass,
    /// `NOPERM`: the ACL refuses the command.
    NoPerm,
    /// `OOM`: the server is at `maxmemory` and may not evict.
    Oom,
    /// `WRONGTYPE`: the key holds another Redis type.
    WrongType,
    /// `ERR coord: ...`: one of coord's scripts refused a value coord did not write.
    CoordScript,
    /// `ERR` otherwise: a Lua runtime error, a refused argument, an unknown command.
    Err,
    /// Any other code, as the server sent it.
    Other(String),
}

impl ErrorCode {
    /// The code as the server sent it.
    pub(crate) fn as_str(&self) -> &str {
        match self {
            ErrorCode::NoScript => "NOSCRIPT",
            ErrorCode::Busy => "BUSY",
            ErrorCode::Loading => "LOADING",
            ErrorCode::MasterDown => "MASTERDOWN",
            ErrorCode::ReadOnly => "READONLY",
            ErrorCode::ClusterDown => "CLUSTERDOWN",
            ErrorCode::TryAgain => "TRYAGAIN",
            ErrorCode::NoReplicas => "NOREPLICAS",
            ErrorCode::Moved => "MOVED",
            ErrorCode::Ask => "ASK",
            ErrorCode::Unblocked => "UNBLOCKED",
            ErrorCode::NoAuth => "NOAUTH",
            ErrorCode::WrongPass => "WRONGPASS",
            ErrorCode::NoPerm => "NOPERM",
            ErrorCode::Oom => "OOM",
            ErrorCode::WrongType => "WRONGTYPE",
            ErrorCode::CoordScript | ErrorCode::Err => "ERR",
            ErrorCode::Other(code) => code,
        }
    }
}

/// The prefix coord's scripts put after `ERR` when they refuse what they found (see the
/// `scripts` module): only they send it.
const COORD_SCRIPT_PREFIX: &str = "coord:";

/// An error reply: its code and the text after the code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerError {
    code: ErrorCode,
    message: String,
}

impl ServerError {
    /// The error reply with code `code` (`NOSCRIPT`, `ERR`) and the text after it.
    pub(crate) fn new(code: &str, message: &str) -> ServerError {
        let code = match code {
            "NOSCRIPT" => ErrorCode::NoScript,
            "BUSY" => ErrorCode::Busy,
            "LOADING" => ErrorCode::Loading,
            "MASTERDOWN" => ErrorCode::MasterDown,
            "READONLY" => ErrorCode::ReadOnly,
            "CLUSTERDOWN" => ErrorCode::ClusterDown,
            "TRYAGAIN" => ErrorCode::TryAgain,
            "NOREPLICAS" => ErrorCode::NoReplicas,
            "MOVED" => ErrorCode::Moved,
            "ASK" => ErrorCode::Ask,
            "UNBLOCKED" => ErrorCode::Unblocked,
            "NOAUTH" => ErrorCode::NoAuth,
            "WRONGPASS" => ErrorCode::WrongPass,
            "NOPERM" => ErrorCode::NoPerm,
            "OOM" => ErrorCode::Oom,
            "WRONGTYPE" => ErrorCode::WrongType,
            "ERR" if message.starts_with(COORD_SCRIPT_PREFIX) => ErrorCode::CoordScript,
            "ERR" => ErrorCode::Err,
            other => ErrorCode::Other(other.to_owned()),
        };
        ServerError {
            code,
            message: message.to_owned(),
        }
    }

    /// Reads the whole text of an error reply (`CODE message`), for client libraries that
    /// hand over only the text. `None` when the text does not start with an error code (an
    /// upper-case word): it is then the library's own message, not the server's.
    #[cfg_attr(not(feature = "fred"), allow(dead_code))] // fred's errors carry only text
    pub(crate) fn from_reply_text(text: &str) -> Option<ServerError> {
        let text = text.trim_start();
        let (code, message) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
        let is_code = !code.is_empty() && code.bytes().all(|b| b.is_ascii_uppercase() || b == b'_');
        is_code.then(|| ServerError::new(code, message.trim_start()))
    }

    /// The reply's code.
    pub(crate) fn code(&self) -> &ErrorCode {
        &self.code
    }

    /// True for the Cluster error replies that prove the command was not executed (`MOVED`:
    /// another node owns the slot; `TRYAGAIN`, `CLUSTERDOWN`: refused for now). Sending such
    /// a command again cannot run it twice. (`ASK` proves it too, but is not resent to the
    /// same node: it is followed to the node it names, see [`AskFollow`](super::AskFollow).)
    pub(crate) fn not_executed(&self) -> bool {
        matches!(
            self.code,
            ErrorCode::Moved | ErrorCode::TryAgain | ErrorCode::ClusterDown
        )
    }

    /// For an `ASK` reply (`ASK <slot> <host>:<port>`): the node the slot is migrating to.
    /// `None` for any other reply, or an `ASK` whose address cannot be read.
    #[cfg_attr(not(feature = "redis-client"), allow(dead_code))] // fred hides the reply
    pub(crate) fn ask_target(&self) -> Option<(&str, u16)> {
        if self.code != ErrorCode::Ask {
            return None;
        }
        let (_slot, address) = self.message.trim().split_once(' ')?;
        let (host, port) = address.trim().rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        Some((host, port.parse().ok()?))
    }

    /// What the reply means to a caller. Replies that say "not now" (loading, failover,
    /// cluster reconfiguration, a busy script) are availability problems; `OOM` (a server at
    /// its `maxmemory` under `noeviction`) is [`BackendErrorKind::OutOfMemory`], which goes
    /// away once memory is freed; `WRONGTYPE` (a coord key holding another Redis type) and
    /// the `ERR coord: ...` replies of coord's scripts (a value coord did not write) are
    /// [`BackendErrorKind::Corrupt`]; refused credentials or permissions are
    /// [`BackendErrorKind::Config`]; any other error reply (a Lua runtime error, a rejected
    /// argument) is a protocol problem.
    pub(crate) fn backend_kind(&self) -> BackendErrorKind {
        match self.code {
            ErrorCode::Loading
            | ErrorCode::Busy
            | ErrorCode::MasterDown
            | ErrorCode::ReadOnly
            | ErrorCode::ClusterDown
            | ErrorCode::TryAgain
            | ErrorCode::NoReplicas
            | ErrorCode::Moved
            | ErrorCode::Ask
            | ErrorCode::Unblocked => BackendErrorKind::Unavailable,
            ErrorCode::NoAuth | ErrorCode::WrongPass | ErrorCode::NoPerm => {
                BackendErrorKind::Config
            }
            ErrorCode::Oom => BackendErrorKind::OutOfMemory,
            ErrorCode::WrongType | ErrorCode::CoordScript => BackendErrorKind::Corrupt,
            ErrorCode::NoScript | ErrorCode::Err | ErrorCode::Other(_) => {
                BackendErrorKind::Protocol
            }
        }
    }
}

/// `CODE message`, as the server sent it.
impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.code.as_str(), self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(reply: &str) -> BackendErrorKind {
        ServerError::from_reply_text(reply)
            .expect("an error reply")
            .backend_kind()
    }

    #[test]
    fn error_replies_map_to_kinds() {
        assert_eq!(
            kind("OOM command not allowed when used memory > 'maxmemory'."),
            BackendErrorKind::OutOfMemory
        );
        assert_eq!(
            kind("WRONGTYPE Operation against a key holding the wrong kind of value"),
            BackendErrorKind::Corrupt
        );
        assert_eq!(
            kind("ERR coord: the record has no state"),
            BackendErrorKind::Corrupt
        );
        // Other `ERR` replies (a Lua runtime error, a refused argument) are not about the data.
        assert_eq!(
            kind("ERR user_script:3: attempt to compare nil with number"),
            BackendErrorKind::Protocol
        );
        assert_eq!(
            kind("ERR invalid expire time in 'set' command"),
            BackendErrorKind::Protocol
        );
        assert_eq!(
            kind("LOADING Redis is loading"),
            BackendErrorKind::Unavailable
        );
        assert_eq!(
            kind("BUSY Redis is busy running a script"),
            BackendErrorKind::Unavailable
        );
        assert_eq!(kind("NOPERM no permissions"), BackendErrorKind::Config);
        assert_eq!(kind("SOMETHINGNEW happened"), BackendErrorKind::Protocol);
    }

    #[test]
    fn codes_are_read_once_and_shown_as_sent() {
        let err = ServerError::from_reply_text("NOSCRIPT No matching script.").unwrap();
        assert_eq!(err.code(), &ErrorCode::NoScript);
        assert_eq!(err.to_string(), "NOSCRIPT No matching script.");
        let err = ServerError::new("ERR", "coord: the lock has no expiry");
        assert_eq!(err.code(), &ErrorCode::CoordScript);
        assert_eq!(err.to_string(), "ERR coord: the lock has no expiry");
        assert!(ServerError::new("MOVED", "12 10.0.0.1:7000").not_executed());
        assert!(!ServerError::new("ASK", "12 10.0.0.1:7000").not_executed());
        assert_eq!(
            ServerError::new("ASK", "12 10.0.0.1:7000").ask_target(),
            Some(("10.0.0.1", 7000))
        );
        assert_eq!(
            ServerError::new("ASK", "12 [::1]:7000").ask_target(),
            Some(("::1", 7000))
        );
        assert_eq!(
            ServerError::new("MOVED", "12 10.0.0.1:7000").ask_target(),
            None
        );
        assert_eq!(ServerError::new("ASK", "12").ask_target(), None);
        let err = ServerError::from_reply_text("CUSTOM_CODE").unwrap();
        assert_eq!(err.code(), &ErrorCode::Other("CUSTOM_CODE".to_owned()));
        // A library's own message is not an error reply.
        assert_eq!(ServerError::from_reply_text("Connection closed"), None);
        assert_eq!(ServerError::from_reply_text(""), None);
    }
}
