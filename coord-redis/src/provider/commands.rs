//! Sending commands and scripts, and turning replies and faults into backend errors.

use std::borrow::Cow;
use std::time::Duration;

use coord_core::provider::{
    BackendErrorKind, OwnerToken, ReplicaAcks, ReplicaShortfall, SentNotice, replicas,
};
use coord_core::{BackendError, CallKey};

use super::{AckWait, Inner, MAX_MILLIS};
use crate::config::scrub;
use crate::encode::TokenText;
use crate::scripts::Script;
use crate::transport::{Command, Fault, Reply, SendWatch};

impl Inner {
    pub(super) fn error(&self, fault: Fault, what: &str, key: &CallKey) -> BackendError {
        if let Fault::Timeout(why) = fault {
            // The client's own text says which wait ran out (the dial, the reply, a pooled
            // connection's turn): kept, with any secret in it scrubbed.
            return BackendError::new(
                BackendErrorKind::Timeout,
                format!(
                    "{what} at {}: no answer within {:?} ({})",
                    self.address,
                    self.timeout,
                    scrub(&why, &self.secrets)
                ),
            )
            .with_key(key);
        }
        let err = fault.into_backend(&format!("{what} at {}", self.address));
        BackendError::new(err.kind(), scrub(err.message(), &self.secrets)).with_key(key)
    }

    /// Sends `cmds` in one round trip (the transport bounds it by the command timeout).
    pub(super) async fn run(
        &self,
        cmds: &[Command<'_>],
        key: &CallKey,
    ) -> Result<Vec<Reply>, BackendError> {
        let what = cmds[0].name;
        match self.transport.run(cmds).await {
            Ok(replies) if replies.len() == cmds.len() => Ok(replies),
            Ok(_) => Err(self.protocol(what, key, "wrong number of replies")),
            Err(fault) => Err(self.error(fault, what, key)),
        }
    }

    /// Runs `script` by SHA, sending its source once if the server does not have it.
    pub(super) async fn eval(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
        key: &CallKey,
    ) -> Result<Reply, BackendError> {
        let sha: &str = &script.sha;
        let build = |name: &'static str, body| script_command(name, body, keys, args);
        // (A statement of its own, so the command is gone before the fallback builds another.)
        let first = self.transport.run(&[build("EVALSHA", sha)]).await;
        let outcome = match first {
            // Rare (a fresh or flushed server): boxed, so the common path's future stays small.
            Err(fault) if fault.is_noscript() => {
                let source = [build("EVAL", script.source)];
                Box::pin(self.transport.run(&source)).await
            }
            other => other,
        };
        let what = || format!("script `{}`", script.name);
        match outcome {
            Ok(mut replies) if replies.len() == 1 => Ok(replies.pop().expect("one reply")),
            Ok(_) => Err(self.protocol(&what(), key, "wrong number of replies")),
            Err(fault) => Err(self.error(fault, &what(), key)),
        }
    }

    /// [`Inner::eval`], telling `sent` once the request has left the process (where the
    /// transport can see that; otherwise once it is answered). `unique` indexes `keys` followed by
    /// `args`: those, together, must occur in no other request.
    ///
    /// Sent as `EVAL` with the script's source, never `EVALSHA`: on a server that does not have
    /// the script cached (a fresh or flushed one) an `EVALSHA` is refused with `NOSCRIPT`, and
    /// by then its bytes had left the process and `sent` was told, so a caller answered on that
    /// notice could exit before the `EVAL` that does the work went out. One request, whichever
    /// the server's cache holds: the notice means the write itself left. (A few hundred bytes
    /// more per request; this is only the cluster flight's hand-over, once per flight.)
    pub(super) async fn eval_noting_sent(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
        unique: std::ops::Range<usize>,
        key: &CallKey,
        sent: SentNotice,
    ) -> Result<Reply, BackendError> {
        let cmd = [script_command("EVAL", script.source, keys, args)];
        // `EVAL source numkeys` come before the keys.
        let offset = 2;
        let watch = SendWatch::new(&cmd[0], unique.start + offset..unique.end + offset, sent);
        let outcome = self.transport.run_noting_sent(&cmd, watch).await;
        let what = || format!("script `{}`", script.name);
        match outcome {
            Ok(mut replies) if replies.len() == 1 => Ok(replies.pop().expect("one reply")),
            Ok(_) => Err(self.protocol(&what(), key, "wrong number of replies")),
            Err(fault) => Err(self.error(fault, &what(), key)),
        }
    }

    /// Runs a script that may grant something (a claim, a lock, a renewal, a completion),
    /// followed, when the provider waits for replicas, by `WAIT` in the same round trip on the
    /// same connection. Returns the script's reply and what `WAIT` found; the caller decides
    /// from the reply whether it granted anything, and then asks [`Inner::replicated`].
    pub(super) async fn eval_granting(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
        key: &CallKey,
    ) -> Result<(Reply, Acks), BackendError> {
        let Some(acks) = self.ack_wait(key)? else {
            return Ok((self.eval(script, keys, args, key).await?, Acks(None)));
        };
        Box::pin(self.eval_waited(script, keys, args, key, &acks)).await
    }

    /// The `WAIT` this write is followed by: the operation's override when its call put one
    /// in scope ([`replicas::in_scope`]), else the provider's own setting. An override's
    /// timeout is checked as the builder checks the provider's (above zero, below the command
    /// timeout, whose bound the `WAIT` shares), and a bad one is a `Config` error.
    pub(super) fn ack_wait(&self, key: &CallKey) -> Result<Option<Cow<'_, AckWait>>, BackendError> {
        match replicas::in_scope() {
            None => Ok(self.replica_acks.as_ref().map(Cow::Borrowed)),
            Some(ReplicaAcks::Off) => Ok(None),
            Some(ReplicaAcks::Wait { replicas, timeout }) => {
                if timeout.is_zero() || timeout >= self.timeout {
                    return Err(BackendError::new(
                        BackendErrorKind::Config,
                        format!(
                            "the operation's `replica_acks` timeout must be above zero and below \
                             the command timeout ({:?}, got {timeout:?}): the `WAIT` shares the \
                             write's round trip, which the command timeout bounds",
                            self.timeout
                        ),
                    )
                    .with_key(key));
                }
                Ok(Some(Cow::Owned(AckWait::new(replicas, timeout))))
            }
        }
    }

    async fn eval_waited(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
        key: &CallKey,
        acks: &AckWait,
    ) -> Result<(Reply, Acks), BackendError> {
        let build = |name: &'static str, body| script_command(name, body, keys, args);
        let script_cmd = build("EVALSHA", &*script.sha);
        let wait = acks.command(&script_cmd);
        let first = self.transport.run(&[script_cmd, wait]).await;
        let outcome = match first {
            Err(fault) if fault.is_noscript() => {
                let source = build("EVAL", script.source);
                let wait = acks.command(&source);
                self.transport.run(&[source, wait]).await
            }
            other => other,
        };
        let what = || format!("script `{}`", script.name);
        match outcome {
            Ok(replies) => self.split_acks(replies, &what(), key, acks),
            Err(fault) => Err(self.error(fault, &what(), key)),
        }
    }

    /// Sends one command that may grant something, followed by `WAIT` when the provider
    /// waits for replicas (see [`Inner::eval_granting`]); more commands may follow it in the
    /// same round trip (`then`), their replies after the first.
    pub(super) async fn run_granting(
        &self,
        cmd: Command<'_>,
        then: Option<Command<'_>>,
        key: &CallKey,
    ) -> Result<(Vec<Reply>, Acks), BackendError> {
        let Some(acks) = self.ack_wait(key)? else {
            let replies = match then {
                Some(then) => self.run(&[cmd, then], key).await?,
                None => self.run(&[cmd], key).await?,
            };
            return Ok((replies, Acks(None)));
        };
        let wait = acks.command(&cmd);
        let mut replies = match then {
            Some(then) => self.run(&[cmd, then, wait], key).await?,
            None => self.run(&[cmd, wait], key).await?,
        };
        let seen = match replies.pop() {
            Some(Reply::Int(n)) => n,
            _ => return Err(self.protocol("WAIT", key, "unexpected reply")),
        };
        Ok((replies, Acks::seen(seen, &acks)))
    }

    fn split_acks(
        &self,
        mut replies: Vec<Reply>,
        what: &str,
        key: &CallKey,
        acks: &AckWait,
    ) -> Result<(Reply, Acks), BackendError> {
        match (replies.pop(), replies.pop(), replies.is_empty()) {
            (Some(Reply::Int(seen)), Some(reply), true) => Ok((reply, Acks::seen(seen, acks))),
            _ => Err(self.protocol(what, key, "unexpected replies to a script and its WAIT")),
        }
    }

    /// After a write that granted something: `Ok` when no `WAIT` followed it (neither the
    /// provider nor the operation waits for replicas) or enough replicas acknowledged, else a
    /// `NotReplicated` error naming the count seen and asked for.
    pub(super) fn replicated(
        &self,
        acks: Acks,
        what: &str,
        key: &CallKey,
    ) -> Result<(), BackendError> {
        let Some(Seen {
            seen,
            asked,
            timeout,
        }) = acks.0
        else {
            return Ok(());
        };
        if seen >= asked {
            return Ok(());
        }
        Err(BackendError::not_replicated(
            ReplicaShortfall {
                acknowledged: seen,
                asked,
            },
            format!(
                "{what} at {}: only {seen} of {asked} replica(s) acknowledged the write within \
                 {timeout:?} (`replica_acks`); a failover could lose it, so it counts as failed",
                self.address
            ),
        )
        .with_key(key))
    }

    /// State under one of coord's keys that coord did not write.
    pub(super) fn corrupt(&self, what: &str, key: &CallKey, detail: &str) -> BackendError {
        BackendError::new(
            BackendErrorKind::Corrupt,
            format!("{what} at {}: {detail}", self.address),
        )
        .with_key(key)
    }

    pub(super) fn protocol(&self, what: &str, key: &CallKey, detail: &str) -> BackendError {
        BackendError::new(
            BackendErrorKind::Protocol,
            format!("{what} at {}: {detail}", self.address),
        )
        .with_key(key)
    }
}

impl AckWait {
    pub(super) fn new(replicas: u32, timeout: Duration) -> AckWait {
        AckWait {
            replicas,
            replicas_arg: replicas.to_string(),
            timeout_ms: millis(timeout).to_string(),
            timeout,
        }
    }

    /// `WAIT replicas timeout`, sent where `after` goes, right after it.
    fn command<'a>(&'a self, after: &Command<'a>) -> Command<'a> {
        Command::new("WAIT")
            .arg(&self.replicas_arg)
            .arg(&self.timeout_ms)
            .routed_as(after)
    }
}

/// `EVALSHA sha` or `EVAL source` with `keys` (the first routes the command) and `args`.
fn script_command<'a>(
    name: &'static str,
    body: &'a str,
    keys: &[&'a str],
    args: &[&'a [u8]],
) -> Command<'a> {
    const NUMKEYS: [&str; 5] = ["0", "1", "2", "3", "4"];
    let mut cmd = Command::new(name);
    cmd.push(body.as_bytes());
    cmd.push(NUMKEYS[keys.len()].as_bytes());
    if let [first, rest @ ..] = keys {
        cmd.push_key(first);
        for k in rest {
            cmd.push(k.as_bytes());
        }
    }
    for a in args {
        cmd.push(a);
    }
    cmd
}

/// What the `WAIT` after a granting write found, or `None` when no `WAIT` followed it.
#[must_use = "ask `Inner::replicated` whether the write counts"]
pub(super) struct Acks(Option<Seen>);

/// How many replicas acknowledged a write, out of how many the `WAIT` asked for, within what.
struct Seen {
    seen: u32,
    asked: u32,
    timeout: Duration,
}

impl Acks {
    fn seen(seen: i64, asked: &AckWait) -> Acks {
        Acks(Some(Seen {
            seen: seen.clamp(0, i64::from(u32::MAX)) as u32,
            asked: asked.replicas,
            timeout: asked.timeout,
        }))
    }
}

/// Milliseconds for `PX`/`PEXPIRE`: rounded up (a sub-millisecond or zero lease is one
/// millisecond, since Redis refuses zero), capped at [`MAX_MILLIS`].
pub(super) fn millis(d: Duration) -> u64 {
    let ms = d.as_micros().div_ceil(1000);
    ms.clamp(1, MAX_MILLIS as u128) as u64
}

/// A lock value coord wrote: an owner token, with `*` appended once someone waits for it.
pub(super) fn is_token(value: &[u8]) -> bool {
    let token = value.strip_suffix(b"*").unwrap_or(value);
    token.len() == 32 && token.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The owner token written as `holder` (32 lowercase hex digits), if it is one.
pub(super) fn parse_token(holder: &[u8]) -> Option<OwnerToken> {
    if holder.len() != 32 || !is_token(holder) {
        return None;
    }
    let text = std::str::from_utf8(holder).ok()?;
    u128::from_str_radix(text, 16)
        .ok()
        .map(OwnerToken::from_u128)
}

/// Whether the lock value `holder` is `token`'s (marked as waited for or not).
pub(super) fn is_own(holder: &[u8], token: &TokenText) -> bool {
    holder.strip_suffix(b"*").unwrap_or(holder) == token.as_ref()
}
