//! One command (or one pipeline) on a fred client, in fred's form, its reply in coord's form,
//! and the mapping of fred's errors to faults, with the rule for when a failed attempt may be
//! sent again.

use fred::bytes::BytesMut;
use fred::clients::{Client as FredClient, Pipeline, WithOptions};
use fred::error::{Error, ErrorKind};
use fred::prelude::{ClientLike, Server, Value};
use fred::types::config::Options as FredOptions;
use fred::types::{ClusterHash, CustomCommand};
use fred::util::redis_keyslot;

use crate::transport::{
    Command, ErrorCode, Fault, Reply, ServerError, asked_pipeline, asked_replies,
};

/// A client of the pool, as commands are sent on it: every command with [`command_options`](super::settings::command_options).
#[derive(Clone)]
pub(super) enum Sender {
    /// A client coord built: [`make_builder`](super::settings::make_builder) gives it [`command_options`](super::settings::command_options) as its own
    /// configuration (one write attempt, no redirection followed, the command timeout), so its
    /// commands need no per-command options.
    Own(FredClient),
    /// The application's client, whose configuration is its own: the options go with each
    /// command.
    Shared(WithOptions<FredClient>),
}

impl Sender {
    /// The fred client under the options.
    pub(super) fn client(&self) -> &FredClient {
        match self {
            Sender::Own(client) => client,
            Sender::Shared(client) => client,
        }
    }
}

/// Sends one command; fred's own command timeout bounds it, reconnection waits included.
pub(super) async fn run_one(
    sender: &Sender,
    cmd: &Command<'_>,
    clustered: bool,
) -> Result<Vec<Reply>, Fault> {
    let (name, args) = custom(cmd, clustered);
    let value: Value = match sender {
        Sender::Own(client) => client.custom(name, args).await,
        Sender::Shared(client) => client.custom(name, args).await,
    }
    .map_err(fault)?;
    Ok(vec![reply(value)?])
}

/// Sends `cmds`, as one pipeline when there are several.
pub(super) async fn run_on(
    sender: &Sender,
    cmds: &[Command<'_>],
    clustered: bool,
) -> Result<Vec<Reply>, Fault> {
    match (cmds, sender) {
        ([one], _) => run_one(sender, one, clustered).await,
        (_, Sender::Own(client)) => {
            pipelined(Pipeline::from(client.clone()), cmds, clustered).await
        }
        // The pipeline's commands take the options too.
        (_, Sender::Shared(client)) => {
            pipelined(Pipeline::from(client.clone()), cmds, clustered).await
        }
    }
}

/// Sends `cmds` as one pipeline.
async fn pipelined<C: ClientLike>(
    pipeline: Pipeline<C>,
    cmds: &[Command<'_>],
    clustered: bool,
) -> Result<Vec<Reply>, Fault> {
    for c in cmds {
        let (cmd, args) = custom(c, clustered);
        let _: () = pipeline.custom(cmd, args).await.map_err(fault)?;
    }
    // A pipeline's commands are routed one by one: one of them finding no connection does not
    // prove the others were not written.
    let values: Vec<Value> = pipeline.all().await.map_err(|e| match fault(e) {
        Fault::NotSent(why) => Fault::Unavailable(why),
        other => other,
    })?;
    values.into_iter().map(reply).collect()
}

/// Whether `fault` is fred's report of a redirect it did not follow: `MOVED` or `ASK`, which
/// fred does not say (see [`fault`]).
pub(super) fn is_redirect(fault: &Fault) -> bool {
    matches!(fault, Fault::Server(err) if *err.code() == ErrorCode::Moved)
}

/// The node the slot of `cmds` is migrating to, when it is: the question fred's report of a
/// redirect leaves open (`MOVED` or `ASK`, and to where). Asked of the node fred routes the
/// slot to (`CLUSTER NODES`, whose own line lists the slots it is migrating and to which
/// node): `None` when that node migrates nothing of the slot (the redirect was a `MOVED`,
/// after which fred has refreshed its slot map), or cannot tell.
pub(super) async fn migrating_to(
    sender: &Sender,
    cmds: &[Command<'_>],
    options: &FredOptions,
) -> Option<Server> {
    let slot = redis_keyslot(cmds.first()?.route_key()?);
    // Routed by the slot, as the command was.
    let nodes: Value = sender
        .client()
        .with_options(options)
        .custom(
            CustomCommand::new_static("CLUSTER", ClusterHash::Custom(slot), false),
            vec![Value::from_static_str("NODES")],
        )
        .await
        .ok()?;
    let (host, port) = migration_target(&nodes.as_str()?, slot)?;
    Some(Server::new(host, port))
}

/// In a `CLUSTER NODES` listing, the address of the node the answering node (`myself`) is
/// migrating `slot` to (its entry `[<slot>->-<node id>]`).
pub(super) fn migration_target(nodes: &str, slot: u16) -> Option<(String, u16)> {
    let marker = format!("[{slot}->-");
    let mut fields = nodes.lines().map(|line| line.split(' '));
    let target = fields
        .clone()
        .find(|f| {
            f.clone()
                .nth(2)
                .is_some_and(|flags| flags.contains("myself"))
        })?
        .find_map(|entry| entry.strip_prefix(marker.as_str())?.strip_suffix(']'))?;
    // `<id> <ip>:<port>@<bus port>[,<hostname>] ...`
    let address = fields.find(|f| f.clone().next() == Some(target))?.nth(1)?;
    let (host, port) = address.split('@').next()?.rsplit_once(':')?;
    Some((host.to_owned(), port.parse().ok()?))
}

/// Sends `cmds` to `node`, each right after `ASKING`, in one pipeline
/// ([`asked_pipeline`]) with `options` (which name no node; `node` is added): fred writes a
/// pipeline's commands one after the other, with no other command of the client between
/// them, so each `ASKING` flag is the next command's.
pub(super) async fn run_asking(
    sender: &Sender,
    cmds: &[Command<'_>],
    node: Server,
    options: &FredOptions,
) -> Result<Vec<Reply>, Fault> {
    let options = FredOptions {
        cluster_node: Some(node),
        ..options.clone()
    };
    let pipeline = Pipeline::from(sender.client().with_options(&options));
    let asked = asked_pipeline(cmds);
    for c in &asked {
        let (cmd, args) = custom(c, true);
        let _: () = pipeline.custom(cmd, args).await.map_err(fault)?;
    }
    // As in `pipelined`: one command finding no connection does not prove none was written.
    let values: Vec<Value> = pipeline.all().await.map_err(|e| match fault(e) {
        Fault::NotSent(why) => Fault::Unavailable(why),
        other => other,
    })?;
    let replies = values.into_iter().map(reply).collect::<Result<_, _>>()?;
    asked_replies(replies, cmds.len())
}

/// fred's form of `cmd`: the command, and its arguments as shared slices of one buffer.
pub(super) fn custom(cmd: &Command<'_>, clustered: bool) -> (CustomCommand, Vec<Value>) {
    // The slot is computed here, and only for a Cluster (fred looks at it nowhere else): fred
    // 10 honours only `ClusterHash::Custom` on a custom command and otherwise hashes the first
    // string argument, which for `EVALSHA` is the script's SHA (a wrong node, a `MOVED` and a
    // second round trip on every script call).
    let hash = match cmd.route_key() {
        Some(key) if clustered => ClusterHash::Custom(redis_keyslot(key)),
        _ => ClusterHash::Random,
    };
    // One buffer for all arguments, handed out as shared slices: one allocation per command
    // instead of one per argument.
    let mut buffer = BytesMut::with_capacity(cmd.arg_bytes());
    for arg in cmd.args() {
        buffer.extend_from_slice(arg);
    }
    let mut buffer = buffer.freeze();
    let mut args = Vec::with_capacity(cmd.args().len());
    for arg in cmd.args() {
        args.push(Value::Bytes(buffer.split_to(arg.len())));
    }
    (CustomCommand::new_static(cmd.name, hash, false), args)
}

/// Whether a failed attempt may be sent again (within the command timeout): refused and not
/// executed (a Cluster redirect or reconfiguration: fred refreshes its slot map), or never
/// written (fred had no connection for it: the server closed it, and fred is making a new
/// one).
pub(super) fn resendable(fault: &Fault) -> bool {
    fault.not_executed() || matches!(fault, Fault::NotSent(_))
}

pub(super) fn reply(value: Value) -> Result<Reply, Fault> {
    Ok(match value {
        Value::Null => Reply::Nil,
        Value::Integer(i) => Reply::Int(i),
        // Under RESP3 (a shared client may speak it) a script's `false` arrives as a boolean
        // (RESP2 sends nil) and `true` as a boolean (RESP2 sends 1).
        Value::Boolean(false) => Reply::Nil,
        Value::Boolean(true) => Reply::Int(1),
        Value::String(s) => Reply::Data(s.as_bytes().to_vec()),
        Value::Bytes(b) => Reply::Data(b.to_vec()),
        Value::Array(items) => {
            Reply::Array(items.into_iter().map(reply).collect::<Result<_, _>>()?)
        }
        // `CONFIG GET` under RESP3: flattened as RESP2 sends it.
        Value::Map(map) => Reply::Array(
            map.inner()
                .into_iter()
                .flat_map(|(k, v)| [reply(Value::from(k)), reply(v)])
                .collect::<Result<_, _>>()?,
        ),
        other => return Err(Fault::Protocol(format!("unexpected reply {other:?}"))),
    })
}

/// What fred answers a command it found no connection to write to: its connection was closed
/// and not replaced yet. fred fails the command before writing any of it (each command is
/// given one write attempt, and routing comes before the write).
const NO_ROUTE: &str = "Failed to route command.";

pub(super) fn fault(err: Error) -> Fault {
    let text = err.details();
    let unavailable = || Fault::Unavailable(format!("{:?}: {text}", err.kind()));
    match err.kind() {
        ErrorKind::Unknown if text == NO_ROUTE => {
            Fault::NotSent(format!("{:?}: {text} (not sent)", err.kind()))
        }
        ErrorKind::Timeout => Fault::Timeout(text.to_owned()),
        ErrorKind::Config | ErrorKind::Url | ErrorKind::Auth => Fault::Config(text.to_owned()),
        ErrorKind::Protocol | ErrorKind::Parse => Fault::Protocol(text.to_owned()),
        // fred hands an error reply over as its text, code first: it is read here, once.
        ErrorKind::InvalidArgument
        | ErrorKind::InvalidCommand
        | ErrorKind::Unknown
        | ErrorKind::NotFound
        | ErrorKind::Cluster => match ServerError::from_reply_text(text) {
            Some(reply) => Fault::Server(reply),
            None => unavailable(),
        },
        // A `MOVED`/`ASK` reply fred did not follow (`max_redirections = 0`). fred does not
        // say which, nor where to: `migrating_to` finds out.
        ErrorKind::Routing if text.starts_with("Too many redirections") => Fault::Server(
            ServerError::new("MOVED", &format!("or ASK, not followed: {text}")),
        ),
        _ => unavailable(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_migration_target_is_read_from_the_answering_nodes_line() {
        let nodes = "\
a1 127.0.0.1:7001@17001 master - 0 1 2 connected 5461-10922 [30-<-c3]
c3 127.0.0.1:7000@17000,host-c myself,master - 0 0 1 connected 0-5460 [14->-a1] [30->-b2]
b2 10.0.0.2:7002@17002 master - 0 1 3 connected 10923-16383
";
        assert_eq!(
            migration_target(nodes, 14),
            Some(("127.0.0.1".to_owned(), 7001))
        );
        assert_eq!(
            migration_target(nodes, 30),
            Some(("10.0.0.2".to_owned(), 7002))
        );
        // Another node's importing entry is not this node's migration.
        assert_eq!(migration_target(nodes, 31), None);
        assert_eq!(migration_target(nodes, 1), None);
    }
}
