//! One command (or one pipeline) on a redis-rs connection, its reply in coord's form, and
//! the mapping of redis-rs's errors to faults, with the rule for when a fault leaves the
//! connection unusable.

use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError, Value};

use crate::transport::{Command, ErrorCode, Fault, Reply, ServerError};

pub(super) fn to_cmd(cmd: &Command<'_>) -> redis::Cmd {
    let mut out = redis::Cmd::with_capacity(cmd.args().len() + 1, cmd.name.len() + cmd.arg_bytes());
    out.arg(cmd.name);
    for arg in cmd.args() {
        out.arg(*arg);
    }
    out
}

pub(super) async fn exec<C: ConnectionLike>(
    conn: &mut C,
    cmds: &[Command<'_>],
) -> Result<Vec<Reply>, Fault> {
    if let [one] = cmds {
        let value = to_cmd(one).query_async(conn).await.map_err(fault)?;
        return Ok(vec![reply(value)?]);
    }
    let mut pipe = redis::pipe();
    for cmd in cmds {
        pipe.add_command(to_cmd(cmd));
    }
    let values: Vec<Value> = pipe.query_async(conn).await.map_err(fault)?;
    values.into_iter().map(reply).collect()
}

pub(super) fn reply(value: Value) -> Result<Reply, Fault> {
    Ok(match value {
        Value::Nil => Reply::Nil,
        Value::Int(i) => Reply::Int(i),
        Value::BulkString(data) => Reply::Data(data),
        Value::SimpleString(s) => Reply::Data(s.into_bytes()),
        // RESP3 sends `INFO` as a verbatim string.
        Value::VerbatimString { text, .. } => Reply::Data(text.into_bytes()),
        // RESP3 sends `CONFIG GET` as a map: flattened as RESP2 sends it.
        Value::Map(pairs) => Reply::Array(
            pairs
                .into_iter()
                .flat_map(|(k, v)| [reply(k), reply(v)])
                .collect::<Result<_, _>>()?,
        ),
        Value::Okay => Reply::Data(b"OK".to_vec()),
        // Under RESP3 a script's `false` arrives as a boolean (RESP2 sent nil) and `true`
        // as a boolean (RESP2 sent 1).
        Value::Boolean(false) => Reply::Nil,
        Value::Boolean(true) => Reply::Int(1),
        Value::Array(items) | Value::Set(items) => {
            Reply::Array(items.into_iter().map(reply).collect::<Result<_, _>>()?)
        }
        Value::ServerError(err) => return Err(server_error(&err)),
        other => return Err(Fault::Protocol(format!("unexpected reply {other:?}"))),
    })
}

/// An error reply, as redis-rs hands it over (code and details apart).
fn server_error(err: &redis::ServerError) -> Fault {
    Fault::Server(ServerError::new(err.code(), err.details().unwrap_or("")))
}

pub(super) fn fault(err: RedisError) -> Fault {
    // An error reply, whether redis-rs knows its code or not. A pipeline reports its first
    // failing command.
    if err.code().is_some() || err.kind() == ErrorKind::Extension {
        if let Some(errors) = err.clone().into_server_errors()
            && let Some((_, first)) = errors.first()
        {
            return server_error(first);
        }
        if let Some(code) = err.code() {
            return Fault::Server(ServerError::new(code, err.detail().unwrap_or("")));
        }
    }
    if err.is_timeout() {
        return Fault::Timeout(err.to_string());
    }
    match err.kind() {
        ErrorKind::InvalidClientConfig | ErrorKind::AuthenticationFailed => {
            Fault::Config(err.to_string())
        }
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => Fault::Protocol(err.to_string()),
        // An error kind for replies, without a reply in it.
        ErrorKind::Extension | ErrorKind::Server(_) => Fault::Protocol(err.to_string()),
        _ => Fault::Unavailable(err.to_string()),
    }
}

/// Whether a connection that produced `fault` should be replaced: it broke, hangs, is no
/// longer on the master (Sentinel), or gave a reply the client could not read. After an
/// unreadable reply the connection's replies may no longer line up with its requests, and a
/// later reply of the right type could answer the wrong command: a new connection costs a
/// dial, a misaligned one could hand one key's answer to another.
pub(super) fn stale(fault: &Fault) -> bool {
    match fault {
        Fault::Unavailable(_) | Fault::NotSent(_) | Fault::Timeout(_) | Fault::Protocol(_) => true,
        Fault::Server(err) => matches!(
            err.code(),
            ErrorCode::ReadOnly | ErrorCode::MasterDown | ErrorCode::Loading
        ),
        _ => false,
    }
}
