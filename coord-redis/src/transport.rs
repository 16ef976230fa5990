//! The seam between the provider's logic and a Redis client library.
//!
//! The provider speaks in raw commands and replies; a transport sends them over whichever
//! topology it was built for, keeps its connections alive, and runs the one shared subscriber
//! connection. Everything above this module is the same for every client library.

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use coord_core::BackendError;
use coord_core::provider::{BackendErrorKind, BoxFuture, SentNotice};

#[cfg(feature = "fred")]
pub(crate) mod fred_client;
#[cfg(feature = "redis-client")]
pub(crate) mod redis_rs;
mod server_error;
mod server_watch;

pub(crate) use server_error::{ErrorCode, ServerError};
pub(crate) use server_watch::{ServerWatch, info_field, info_server};

/// Boxes the future `make` returns, made in its box rather than on the stack and then moved
/// into it: fred's command futures are several kilobytes, and a move would copy all of them
/// on every command.
pub(crate) fn boxed_in_place<'a, F>(make: impl FnOnce() -> F) -> BoxFuture<'a, F::Output>
where
    F: Future + Send + 'a,
{
    let boxed: Box<F> = Box::write(Box::new_uninit(), make());
    Box::into_pin(boxed)
}

/// Most arguments any coord command has (`EVALSHA sha numkeys` plus keys and script
/// arguments included): a lock waiter's look has the most, 11.
const MAX_ARGS: usize = 11;

/// One command: its name and arguments, and which argument is the key (for Cluster routing).
///
/// The arguments are borrowed from the caller, which keeps them alive until the reply is in:
/// building a command allocates nothing, and each client library copies the bytes once, into
/// its own wire buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Command<'a> {
    pub(crate) name: &'static str,
    args: [&'a [u8]; MAX_ARGS],
    len: usize,
    /// Index in `args` of the key that decides the slot (`None` for keyless commands).
    pub(crate) key_index: Option<usize>,
    /// For a keyless command that must go where another command went (a `WAIT` after a
    /// script, in one pipeline): that command's key.
    route: Option<&'a [u8]>,
}

impl<'a> Command<'a> {
    pub(crate) fn new(name: &'static str) -> Command<'a> {
        Command {
            name,
            args: [&[]; MAX_ARGS],
            len: 0,
            key_index: None,
            route: None,
        }
    }

    /// Sends this keyless command to the node `other` goes to (Cluster), as the next command
    /// of the same pipeline.
    pub(crate) fn routed_as(mut self, other: &Command<'a>) -> Command<'a> {
        self.route = other.route_key();
        self
    }

    /// The key that decides where this command goes: its own, or the one it was routed as.
    pub(crate) fn route_key(&self) -> Option<&'a [u8]> {
        self.key_index
            .and_then(|i| self.args().get(i).copied())
            .or(self.route)
    }

    /// Appends the routing key.
    pub(crate) fn key(mut self, key: &'a str) -> Command<'a> {
        self.push_key(key);
        self
    }

    /// Appends an argument.
    pub(crate) fn arg(mut self, arg: &'a (impl AsRef<[u8]> + ?Sized)) -> Command<'a> {
        self.push(arg.as_ref());
        self
    }

    /// Appends the routing key, in place.
    pub(crate) fn push_key(&mut self, key: &'a str) {
        self.key_index = Some(self.len);
        self.push(key.as_bytes());
    }

    /// Appends an argument, in place (a command is built where it is used, not moved
    /// through a chain of calls).
    ///
    /// # Panics
    ///
    /// With more than `MAX_ARGS` arguments: every command coord sends has a fixed shape well
    /// under it, and the test suite sends each of them.
    pub(crate) fn push(&mut self, arg: &'a [u8]) {
        assert!(
            self.len < MAX_ARGS,
            "`{}` has too many arguments",
            self.name
        );
        self.args[self.len] = arg;
        self.len += 1;
    }

    /// The arguments after the name.
    pub(crate) fn args(&self) -> &[&'a [u8]] {
        &self.args[..self.len]
    }

    /// Bytes in all arguments together (for sizing a client's buffer).
    pub(crate) fn arg_bytes(&self) -> usize {
        self.args().iter().map(|a| a.len()).sum()
    }
}

/// A request to be told about once it has left the process (see [`Transport::run_noting_sent`]):
/// how to find it in the bytes a connection writes, and whom to tell.
#[derive(Debug)]
// Read by the redis-rs connections only: fred's transport tells of a send once the reply is
// in (`Transport::run_noting_sent`'s default), so a build with fred alone leaves them unread.
#[cfg_attr(not(feature = "redis-client"), allow(dead_code))]
pub(crate) struct SendWatch {
    /// The request's bytes that no other request contains.
    pub(crate) needle: Vec<u8>,
    /// How many bytes of the request follow the needle.
    pub(crate) tail: u64,
    pub(crate) notice: SentNotice,
}

impl SendWatch {
    /// Watches for `cmd`, whose arguments `unique` (indices into [`Command::args`]), taken
    /// together as written on the wire, occur in no other request.
    pub(crate) fn new(cmd: &Command<'_>, unique: Range<usize>, notice: SentNotice) -> SendWatch {
        let args = cmd.args();
        let mut needle = Vec::new();
        for arg in &args[unique.clone()] {
            push_bulk(&mut needle, arg);
        }
        let tail = args[unique.end..].iter().map(|a| bulk_len(a)).sum();
        SendWatch {
            needle,
            tail,
            notice,
        }
    }
}

/// One argument as a request carries it: `$<length>\r\n<bytes>\r\n` (RESP).
fn push_bulk(out: &mut Vec<u8>, arg: &[u8]) {
    out.push(b'$');
    out.extend_from_slice(arg.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(arg);
    out.extend_from_slice(b"\r\n");
}

fn bulk_len(arg: &[u8]) -> u64 {
    (1 + arg.len().to_string().len() + 2 + arg.len() + 2) as u64
}

/// A reply, as far as coord needs to tell replies apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Nil,
    Int(i64),
    /// A bulk or simple string.
    Data(Vec<u8>),
    Array(Vec<Reply>),
}

/// Why a transport call failed.
#[derive(Debug, Clone)]
pub(crate) enum Fault {
    /// No connection, or it broke.
    Unavailable(String),
    /// No connection could take the command, and the client says so before writing any of it:
    /// the command never left the process, so sending it again cannot run it twice. Reported
    /// as `Unavailable` when it is final. Only the fred transport can tell (redis-rs does not
    /// say whether a failed command was written), so a build without fred never makes one.
    #[cfg_attr(not(feature = "fred"), allow(dead_code))]
    NotSent(String),
    /// No answer in time.
    Timeout(String),
    /// The server answered with an error reply.
    Server(ServerError),
    /// A reply coord cannot read.
    Protocol(String),
    /// The connection settings are wrong.
    Config(String),
}

impl Fault {
    /// True for `NOSCRIPT`: the server does not have the script cached.
    pub(crate) fn is_noscript(&self) -> bool {
        matches!(self, Fault::Server(err) if *err.code() == ErrorCode::NoScript)
    }

    /// True for the Cluster error replies that prove the command was not executed (see
    /// [`ServerError::not_executed`]). Sending such a command again cannot run it twice.
    pub(crate) fn not_executed(&self) -> bool {
        matches!(self, Fault::Server(err) if err.not_executed())
    }

    /// The provider-level error, `context: text`. An error reply's kind is
    /// [`ServerError::backend_kind`]'s.
    pub(crate) fn into_backend(self, context: &str) -> BackendError {
        let (kind, text) = match self {
            Fault::Unavailable(t) | Fault::NotSent(t) => (BackendErrorKind::Unavailable, t),
            Fault::Timeout(t) => (BackendErrorKind::Timeout, t),
            Fault::Protocol(t) => (BackendErrorKind::Protocol, t),
            Fault::Config(t) => (BackendErrorKind::Config, t),
            Fault::Server(err) => (err.backend_kind(), err.to_string()),
        };
        BackendError::new(kind, format!("{context}: {text}"))
    }
}

/// One reply (or error reply) per node, with the node's `host:port`.
pub(crate) type NodeReplies = Vec<(String, Result<Reply, Fault>)>;

/// One node's entry of [`Transport::each_node`]'s answer: an error reply is that node's
/// answer; any other fault (no connection, no answer in time) fails the whole call.
pub(crate) fn node_answer(
    node: String,
    answer: Result<Reply, Fault>,
) -> Result<(String, Result<Reply, Fault>), Fault> {
    match answer {
        Ok(reply) => Ok((node, Ok(reply))),
        Err(Fault::Server(err)) => Ok((node, Err(Fault::Server(err)))),
        Err(other) => Err(other),
    }
}

/// Pauses that double, up to a ceiling, between attempts of one thing: both client libraries
/// wait the same way before a resend and before reopening the subscriber connection.
pub(crate) struct Backoff {
    pause: Duration,
    most: Duration,
}

impl Backoff {
    /// Between resends of one command (within its command timeout): 5 ms, doubling to 100 ms.
    pub(crate) fn resend() -> Backoff {
        Backoff::new(Duration::from_millis(5), Duration::from_millis(100))
    }

    /// Between attempts to open the subscriber connection: 10 ms, doubling to 500 ms.
    pub(crate) fn reconnect() -> Backoff {
        Backoff::new(Duration::from_millis(10), Duration::from_millis(500))
    }

    fn new(first: Duration, most: Duration) -> Backoff {
        Backoff { pause: first, most }
    }

    /// Whether the next pause, taken now, ends before `deadline`.
    pub(crate) fn ends_before(&self, deadline: tokio::time::Instant) -> bool {
        tokio::time::Instant::now() + self.pause < deadline
    }

    /// Sleeps the next pause; the one after is twice as long, up to the ceiling.
    pub(crate) async fn sleep(&mut self) {
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(self.most);
    }
}

/// How many `ASK` redirects one command follows in a row before the call fails: a slot
/// migrates from one node to one other, so a well-behaved cluster needs one; a few more cover
/// a slot that moves on again meanwhile. More in a row is a redirect loop (a node that keeps
/// pointing elsewhere, or an `ASKING` the target did not honour), reported as such.
pub(crate) const MAX_ASKS_IN_A_ROW: u32 = 4;

/// What follows an `ASK`: `cmds` for the node it names, each right after an `ASKING`, all in
/// one pipeline on that node's connection (so no other command of a shared connection comes
/// between an `ASKING` and its command). `ASKING` lets the node serve the one command after
/// it for a slot it is importing; each command of a pipeline needs its own (a `PTTL` after a
/// `SET` would otherwise be redirected back while the `SET` ran).
pub(crate) fn asked_pipeline<'a>(cmds: &[Command<'a>]) -> Vec<Command<'a>> {
    cmds.iter()
        .flat_map(|cmd| [Command::new("ASKING"), *cmd])
        .collect()
}

/// The replies to `cmds` (`count` of them) among the replies to their
/// [`asked_pipeline`]: every second one (each `ASKING` answers `OK`).
pub(crate) fn asked_replies(replies: Vec<Reply>, count: usize) -> Result<Vec<Reply>, Fault> {
    if replies.len() != 2 * count {
        return Err(Fault::Protocol(format!(
            "{} replies to {count} commands, each after ASKING",
            replies.len()
        )));
    }
    Ok(replies.into_iter().skip(1).step_by(2).collect())
}

/// Following `ASK` redirects for one command.
///
/// A Cluster node answers `ASK <slot> <node>` while the command's slot migrates away from it
/// and the command's keys are not all there (Redis 7.2 and later answer `TRYAGAIN` instead
/// when only some are). The node decides this before it executes anything (the
/// Cluster specification's "ASK redirection"; the server's `getNodeByQuery`, which runs
/// before the command is called, a script included: its keys are the ones it declares, and
/// coord's scripts touch no other key). So an `ASK` proves the command was not executed, and
/// sending it to the named node, with `ASKING` right before it, is not a second send of
/// something that may have run: the one-send promise holds.
///
/// Bounded: at most [`MAX_ASKS_IN_A_ROW`] followed without a pause, all within the command's
/// timeout. A `TRYAGAIN` or `CLUSTERDOWN` (the slot is in flux: the call pauses, then sends
/// the command again) starts the count again, a `MOVED` does not (a target that answers
/// `MOVED` back to the source, which answers `ASK` again, is a loop).
#[derive(Debug, Default)]
pub(crate) struct AskFollow {
    in_a_row: u32,
}

impl AskFollow {
    /// Counts one more `ASK` to follow; the fault that ends the call when it would be one
    /// too many (`redirect` is the last one).
    pub(crate) fn follow(&mut self, redirect: &ServerError) -> Result<(), Fault> {
        self.in_a_row += 1;
        if self.in_a_row > MAX_ASKS_IN_A_ROW {
            return Err(Fault::Unavailable(format!(
                "a redirect loop: {MAX_ASKS_IN_A_ROW} ASK redirects followed in a row, then \
                 `{redirect}` (the command was not executed)"
            )));
        }
        Ok(())
    }

    /// After `fault`, the call pauses before sending the command again: a `TRYAGAIN` or
    /// `CLUSTERDOWN` starts the count again.
    pub(crate) fn pausing_after(&mut self, fault: &Fault) {
        if let Fault::Server(err) = fault
            && matches!(err.code(), ErrorCode::TryAgain | ErrorCode::ClusterDown)
        {
            self.in_a_row = 0;
        }
    }
}

/// A client library behind the provider.
pub(crate) trait Transport: Send + Sync + 'static {
    /// Sends `cmds` in one round trip (a pipeline when more than one) and returns one reply
    /// per command. Any error reply fails the whole call.
    ///
    /// Resolves within the command timeout, including any time spent making a connection:
    /// the provider adds no timer of its own on the path every lock takes.
    ///
    /// Each command goes out once: no client library behind this trait resends a command on
    /// its own after it may have reached the server (a timeout, a connection that closed with
    /// the command in flight). Only replies that prove the command was not executed
    /// (`MOVED`, `TRYAGAIN`, `CLUSTERDOWN` from a Cluster), and failures that prove it never
    /// left the process (its connection was closed, or known gone, before any byte of it was
    /// written), are followed by a resend, within the same timeout (redis-rs: once, on a
    /// fresh connection, which may take a second command timeout). An `ASK` (which proves the
    /// same) is followed to the node it names, with `ASKING` right before the command on the
    /// same connection, a few times in a row at most ([`AskFollow`]), within the same timeout.
    ///
    /// After a call times out or its connection breaks, that connection is not used again:
    /// the next call goes out on a freshly made one, so it never queues behind a reply that
    /// may never come.
    fn run<'a>(&'a self, cmds: &'a [Command<'a>]) -> BoxFuture<'a, Result<Vec<Reply>, Fault>>;

    /// [`Transport::run`], telling `watch.notice` once the kernel has accepted every byte of
    /// the request it describes (the request has left the process). A transport that cannot
    /// see its socket's writes drops the notice once the reply is in: never early, only later
    /// than it could be. A command resent on a fresh connection is told about when answered.
    fn run_noting_sent<'a>(
        &'a self,
        cmds: &'a [Command<'a>],
        watch: SendWatch,
    ) -> BoxFuture<'a, Result<Vec<Reply>, Fault>> {
        Box::pin(async move {
            let replies = self.run(cmds).await;
            drop(watch);
            replies
        })
    }

    /// Sends the keyless `cmd` to every data node this transport sends commands to (the one
    /// server, Sentinel's current master, every Cluster master) and returns each node's
    /// address (`host:port`) with its reply or error reply. Fails as a whole when a node
    /// cannot be reached or does not answer; each node's answer is bounded by the command
    /// timeout. (Used at connect, which bounds the whole.)
    fn each_node<'a>(&'a self, cmd: Command<'a>) -> BoxFuture<'a, Result<NodeReplies, Fault>>;

    /// Starts the shared subscriber connection. It connects in the background, reconnects on
    /// its own, and reports messages and reconnections to `events`.
    fn subscriber(&self, events: Arc<dyn SubscriberEvents>) -> Box<dyn Subscriber>;
}

/// The shared subscriber connection.
pub(crate) trait Subscriber: Send + Sync + 'static {
    /// Subscribes to `channels`; resolves once the server confirmed.
    fn subscribe<'a>(&'a self, channels: &'a [String]) -> BoxFuture<'a, Result<(), Fault>>;

    /// Unsubscribes from `channels`.
    fn unsubscribe<'a>(&'a self, channels: &'a [String]) -> BoxFuture<'a, Result<(), Fault>>;
}

/// Where a subscriber reports what it receives.
pub(crate) trait SubscriberEvents: Send + Sync + 'static {
    /// A message arrived on `channel`, carrying `payload` (empty for a bare wake-up).
    fn message(&self, channel: &[u8], payload: &[u8]);

    /// The connection was re-established (or messages were dropped): subscriptions must be
    /// renewed, and anything published meanwhile may have been missed.
    fn resync(&self);
}
