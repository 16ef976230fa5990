//! A minimal blocking Redis client for the tests' own inspection: one command per fresh
//! connection, RESP2 replies.
//!
//! It is deliberately not the client under test: it shares no code with coord-redis, so a
//! test can check what that client wrote (`PTTL`, `TYPE`, `INFO commandstats`) or tamper
//! with it (plant a wrong-typed value) without trusting it.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::ports::HOST;

/// A reply of the blocking test client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    /// Nil bulk or nil array.
    Nil,
    /// An integer.
    Int(i64),
    /// A simple string (`+OK`).
    Simple(String),
    /// A bulk string.
    Bulk(Vec<u8>),
    /// An array.
    Array(Vec<Resp>),
    /// An error reply.
    Error(String),
}

impl Resp {
    /// The reply as text: simple and bulk strings (lossily), integers, errors; `None` for
    /// nil and arrays.
    pub fn text(&self) -> Option<String> {
        match self {
            Resp::Simple(s) | Resp::Error(s) => Some(s.clone()),
            Resp::Bulk(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Resp::Int(i) => Some(i.to_string()),
            Resp::Nil | Resp::Array(_) => None,
        }
    }

    /// The integer, if this is one.
    pub fn int(&self) -> Option<i64> {
        match self {
            Resp::Int(i) => Some(*i),
            _ => None,
        }
    }
}

/// Sends one command to `127.0.0.1:port` over a fresh connection and reads the reply.
pub fn command_at(port: u16, args: &[&str]) -> std::io::Result<Resp> {
    command_at_auth(port, None, args)
}

/// Like [`command_at`], authenticating first (`AUTH password`, the default user) when
/// `password` is given. An `AUTH` refused is returned as its error reply.
pub fn command_at_auth(port: u16, password: Option<&str>, args: &[&str]) -> std::io::Result<Resp> {
    let addr: SocketAddr = format!("{HOST}:{port}").parse().expect("loopback address");
    command_to_auth(addr, password, args)
}

/// Like [`command_at`], to a server at any address (one in a [`TestLan`](crate::TestLan)
/// host, reached from the hub).
pub fn command_to(addr: SocketAddr, args: &[&str]) -> std::io::Result<Resp> {
    command_to_auth(addr, None, args)
}

fn command_to_auth(
    addr: SocketAddr,
    password: Option<&str>,
    args: &[&str],
) -> std::io::Result<Resp> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    stream.set_nodelay(true)?;
    let mut out = Vec::new();
    if let Some(password) = password {
        out.extend(encode(&["AUTH", password]));
    }
    out.extend(encode(args));
    stream.write_all(&out)?;
    let mut reader = BufReader::new(stream);
    if password.is_some() {
        let auth = read_resp(&mut reader)?;
        if matches!(auth, Resp::Error(_)) {
            return Ok(auth);
        }
    }
    read_resp(&mut reader)
}

/// The value of `field` in the `INFO section` of the server on `port`, or `None` when the
/// server cannot be asked or does not report it.
pub(crate) fn info_field_auth(
    port: u16,
    password: Option<&str>,
    section: &str,
    field: &str,
) -> Option<String> {
    let text = command_at_auth(port, password, &["INFO", section])
        .ok()?
        .text()?;
    text.lines().find_map(|l| {
        l.strip_prefix(&format!("{field}:"))
            .map(|v| v.trim().to_owned())
    })
}

/// `args` as a RESP array of bulk strings.
fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Reads one RESP2 reply.
fn read_resp(reader: &mut impl BufRead) -> std::io::Result<Resp> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let (kind, rest) = line.split_at(1.min(line.len()));
    Ok(match kind {
        "+" => Resp::Simple(rest.to_owned()),
        "-" => Resp::Error(rest.to_owned()),
        ":" => Resp::Int(rest.parse().map_err(|_| bad("bad integer"))?),
        "$" => {
            let len: i64 = rest.parse().map_err(|_| bad("bad length"))?;
            if len < 0 {
                Resp::Nil
            } else {
                let mut buf = vec![0u8; len as usize + 2];
                reader.read_exact(&mut buf)?;
                buf.truncate(len as usize);
                Resp::Bulk(buf)
            }
        }
        "*" => {
            let len: i64 = rest.parse().map_err(|_| bad("bad length"))?;
            if len < 0 {
                Resp::Nil
            } else {
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(read_resp(reader)?);
                }
                Resp::Array(items)
            }
        }
        _ => return Err(bad("unknown reply type")),
    })
}

#[cfg(test)]
mod tests {
    use std::io::ErrorKind;

    use super::{Resp, encode, read_resp};

    fn parse(bytes: &[u8]) -> std::io::Result<Resp> {
        read_resp(&mut &bytes[..])
    }

    #[test]
    fn encodes_commands_as_arrays_of_bulk_strings() {
        assert_eq!(
            encode(&["SET", "k", ""]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n".to_vec()
        );
    }

    #[test]
    fn reads_every_reply_kind() {
        assert_eq!(parse(b"+OK\r\n").unwrap(), Resp::Simple("OK".into()));
        assert_eq!(parse(b"-ERR no\r\n").unwrap(), Resp::Error("ERR no".into()));
        assert_eq!(parse(b":-42\r\n").unwrap(), Resp::Int(-42));
        assert_eq!(parse(b"$-1\r\n").unwrap(), Resp::Nil);
        assert_eq!(parse(b"*-1\r\n").unwrap(), Resp::Nil);
        // A bulk string may hold CR LF itself: its length, not a line end, bounds it.
        assert_eq!(
            parse(b"$4\r\na\r\nb\r\n").unwrap(),
            Resp::Bulk(b"a\r\nb".to_vec())
        );
        assert_eq!(
            parse(b"*3\r\n:1\r\n$1\r\nx\r\n*0\r\n").unwrap(),
            Resp::Array(vec![
                Resp::Int(1),
                Resp::Bulk(b"x".to_vec()),
                Resp::Array(vec![])
            ])
        );
    }

    #[test]
    fn refuses_malformed_or_truncated_replies() {
        assert_eq!(parse(b"").unwrap_err().kind(), ErrorKind::UnexpectedEof);
        assert_eq!(parse(b"?x\r\n").unwrap_err().kind(), ErrorKind::InvalidData);
        assert_eq!(parse(b":x\r\n").unwrap_err().kind(), ErrorKind::InvalidData);
        assert_eq!(
            parse(b"$5\r\nab\r\n").unwrap_err().kind(),
            ErrorKind::UnexpectedEof
        );
        assert_eq!(
            parse(b"*2\r\n:1\r\n").unwrap_err().kind(),
            ErrorKind::UnexpectedEof
        );
    }

    #[test]
    fn reply_accessors() {
        assert_eq!(Resp::Bulk(b"v".to_vec()).text().as_deref(), Some("v"));
        assert_eq!(Resp::Int(7).text().as_deref(), Some("7"));
        assert_eq!(Resp::Nil.text(), None);
        assert_eq!(Resp::Array(vec![]).text(), None);
        assert_eq!(Resp::Int(7).int(), Some(7));
        assert_eq!(Resp::Simple("7".into()).int(), None);
    }
}
