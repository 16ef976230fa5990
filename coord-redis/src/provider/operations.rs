//! The operations API over Redis: inspect a lock, a record, a semaphore or a read-write lock
//! (one read-only script each, timed by the server's clock),
//! list the keys of one operation (`SCAN` with `MATCH` on every data node, never `KEYS`), force
//! a lock free (one script), and the server report behind `coord check`.
//!
//! # Listing
//! A page scans the lock (`ns:lock:{..}`) or record (`ns:idem:{..}`) names of one operation
//! with `SCAN cursor MATCH ns:kind:{op[:}]* COUNT 1000` (of a whole namespace:
//! `MATCH ns:kind:{*`), node after node (Cluster: every
//! master, in address order), until the page is full, the nodes are done, or 32 `SCAN`s were
//! sent (a sparse keyspace then yields short or empty pages with a cursor to go on). Names
//! that are not exactly a key of the operation (another operation whose name starts the same,
//! a name coord could not have written) are skipped.
//!
//! The cursor says which node, which `SCAN` cursor on it, and the last key listed from that
//! `SCAN` batch when the page filled up in the middle of one: the next page sends the same
//! `SCAN` again and skips the keys up to that one (a batch's keys are sorted). So a page never
//! exceeds its limit, and with the keyspace unchanged nothing is skipped or repeated. Redis's
//! own `SCAN` promise holds otherwise, with one more gap: a key that sorts before the
//! remembered one can be missed if the node's hash table shrank between the two pages (a mass
//! deletion), since the repeated batch may then cover more of the table.
//!
//! On a Cluster, each `SCAN` goes to every master and only the answer of the node being
//! listed is used (the transport has no single-node call): wasted work on the others, bounded
//! by `COUNT`, for an operator's tool.

use std::time::Duration;

use coord_core::provider::{
    BackendErrorKind, BoxFuture, Cursor, FORCED_RELEASE_MEMORY, ForcedRelease, HoldInfo,
    ListRequest, LockHolder, LockInfo, NamespaceListRequest, Operations, Page, RecordInfo,
    RecordStatus, RwLockInfo, SemaphoreInfo, Waiters, WriterClaim,
};
use coord_core::{BackendError, CallKey, FencingToken};

use super::commands::{millis, parse_token};
use super::{Inner, RedisProvider};
use crate::config::scrub;
use crate::encode::Decimal;
use crate::keys::Names;
use crate::scripts;
use crate::server_checks::{self, ServerReport};
use crate::transport::{Command, Reply};

/// `SCAN`'s `COUNT`: the same for every call, so a batch sent again covers the same slots.
const SCAN_COUNT: &str = "1000";

/// The most `SCAN` round trips one page sends.
const SCANS_PER_PAGE: usize = 32;

impl RedisProvider {
    /// Reads what `coord check` judges, from every data node this provider sends commands to:
    /// the Redis version, `maxmemory-policy`, persistence settings (`appendonly`, `save`) and
    /// the node's clock against this host's. A node that refuses `CONFIG GET` (managed
    /// services) is reported with the error instead of its settings; a node that cannot be
    /// reached fails the report with a `Timeout` or `Unavailable` error.
    ///
    /// Reads only. Coord measures leases and retentions by the server's clock and never
    /// compares it with a client's, so a clock offset does not break coord's promises; it
    /// matters to whoever reads timestamps across machines.
    pub async fn server_report(&self) -> Result<ServerReport, BackendError> {
        let inner = &*self.inner;
        let reading = server_checks::report(&*inner.transport);
        match tokio::time::timeout(inner.timeout.saturating_mul(3), reading).await {
            Ok(Ok(report)) => Ok(report),
            Ok(Err(fault)) => {
                let err = fault.into_backend(&format!("reading the servers at {}", inner.address));
                Err(BackendError::new(
                    err.kind(),
                    scrub(err.message(), &inner.secrets),
                ))
            }
            Err(_) => Err(BackendError::new(
                BackendErrorKind::Timeout,
                format!(
                    "reading the servers at {}: no answer within {:?}",
                    inner.address,
                    inner.timeout.saturating_mul(3)
                ),
            )),
        }
    }
}

/// Which Redis names a listing scans.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Lock,
    Record,
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Kind::Lock => "lock",
            Kind::Record => "idem",
        }
    }
}

/// Where a listing stands: the node being scanned, the `SCAN` cursor on it, and the last key
/// listed from the batch that cursor returns, when the page filled up inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ScanState {
    node: Option<String>,
    cursor: u64,
    after: Option<String>,
}

impl ScanState {
    fn start() -> ScanState {
        ScanState {
            node: None,
            cursor: 0,
            after: None,
        }
    }

    /// `r.<node hex>.<cursor>.<after hex>`: printable, without whitespace.
    fn to_cursor(&self) -> Cursor {
        Cursor::new(format!(
            "r.{}.{}.{}",
            hex(self.node.as_deref().unwrap_or_default()),
            self.cursor,
            hex(self.after.as_deref().unwrap_or_default())
        ))
    }

    fn from_cursor(cursor: &Cursor) -> Option<ScanState> {
        let mut parts = cursor.as_str().split('.');
        if parts.next()? != "r" {
            return None;
        }
        let node = unhex(parts.next()?)?;
        let scan = parts.next()?.parse().ok()?;
        let after = unhex(parts.next()?)?;
        if parts.next().is_some() || node.is_empty() {
            return None;
        }
        Some(ScanState {
            node: Some(node),
            cursor: scan,
            after: (!after.is_empty()).then_some(after),
        })
    }
}

fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<String> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let bytes = (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

/// `text` with the glob characters of `MATCH` (`*`, `?`, `[`, `]`, `\`) escaped.
fn glob_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl Inner {
    async fn inspect_lock(&self, key: &CallKey) -> Result<LockInfo, BackendError> {
        let names = Names::of(key);
        let reply = self
            .eval(
                &scripts::INSPECT_LOCK,
                &[&names.lock(), &names.fence()],
                &[],
                key,
            )
            .await?;
        let corrupt = |detail: &str| self.corrupt("inspect lock", key, detail);
        let Reply::Array(items) = reply else {
            return Err(self.protocol("inspect lock", key, "unexpected script reply"));
        };
        let [holder, Reply::Int(pttl), fence] = items.as_slice() else {
            return Err(self.protocol("inspect lock", key, "unexpected script reply"));
        };
        let fencing_token = match fence {
            Reply::Nil => None,
            Reply::Data(text) => Some(FencingToken::new(
                std::str::from_utf8(text)
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .ok_or_else(|| corrupt("the fencing counter is not a number"))?,
            )),
            _ => return Err(self.protocol("inspect lock", key, "unexpected script reply")),
        };
        let holder = match holder {
            Reply::Nil => None,
            Reply::Data(value) => {
                let marked = value.ends_with(b"*");
                let token = value.strip_suffix(b"*").unwrap_or(value);
                let owner = parse_token(token)
                    .ok_or_else(|| corrupt("the lock key holds a value coord did not write"))?;
                Some(LockHolder::new(
                    owner,
                    Duration::from_millis((*pttl).max(0) as u64),
                    Waiters::Flagged(marked),
                ))
            }
            _ => return Err(self.protocol("inspect lock", key, "unexpected script reply")),
        };
        Ok(LockInfo::new(key.clone(), holder, fencing_token))
    }

    /// Holds from a flat script reply: `owner, ms left, token` per hold. `what` names the
    /// call in errors.
    fn holds(
        &self,
        items: &[Reply],
        what: &str,
        key: &CallKey,
    ) -> Result<Vec<HoldInfo>, BackendError> {
        if !items.len().is_multiple_of(3) {
            return Err(self.protocol(what, key, "unexpected script reply"));
        }
        items
            .chunks_exact(3)
            .map(|hold| match hold {
                [Reply::Data(owner), Reply::Int(left), Reply::Int(token)] if *token > 0 => {
                    let owner = parse_token(owner)
                        .ok_or_else(|| self.corrupt(what, key, "a holder coord did not write"))?;
                    Ok(HoldInfo::new(
                        owner,
                        Duration::from_millis((*left).max(0) as u64),
                        Some(FencingToken::new(*token as u64)),
                    ))
                }
                _ => Err(self.protocol(what, key, "unexpected script reply")),
            })
            .collect()
    }

    async fn inspect_semaphore(&self, key: &CallKey) -> Result<SemaphoreInfo, BackendError> {
        const WHAT: &str = "inspect semaphore";
        let names = Names::of(key);
        let reply = self
            .eval(
                &scripts::INSPECT_SEMAPHORE,
                &[&names.semaphore(), &names.semaphore_tokens()],
                &[],
                key,
            )
            .await?;
        let Reply::Array(items) = reply else {
            return Err(self.protocol(WHAT, key, "unexpected script reply"));
        };
        let [Reply::Int(flag), permits @ ..] = items.as_slice() else {
            return Err(self.protocol(WHAT, key, "unexpected script reply"));
        };
        let permits = self.holds(permits, WHAT, key)?;
        Ok(SemaphoreInfo::new(
            key.clone(),
            permits,
            Waiters::Flagged(*flag == 1),
        ))
    }

    async fn inspect_rw_lock(&self, key: &CallKey) -> Result<RwLockInfo, BackendError> {
        const WHAT: &str = "inspect read-write lock";
        let names = Names::of(key);
        let reply = self
            .eval(
                &scripts::INSPECT_RW,
                &[&names.rw_lock(), &names.rw_readers()],
                &[],
                key,
            )
            .await?;
        let unexpected = || self.protocol(WHAT, key, "unexpected script reply");
        let Reply::Array(items) = reply else {
            return Err(unexpected());
        };
        let [
            writer,
            writer_left,
            writer_token,
            claimant,
            claim_left,
            Reply::Int(flag),
            readers @ ..,
        ] = items.as_slice()
        else {
            return Err(unexpected());
        };
        let writer = match (writer, writer_left, writer_token) {
            (Reply::Nil, _, _) => None,
            (Reply::Data(owner), Reply::Int(left), Reply::Int(token)) if *token > 0 => {
                Some(HoldInfo::new(
                    parse_token(owner)
                        .ok_or_else(|| self.corrupt(WHAT, key, "a writer coord did not write"))?,
                    Duration::from_millis((*left).max(0) as u64),
                    Some(FencingToken::new(*token as u64)),
                ))
            }
            _ => return Err(unexpected()),
        };
        let waiting_writer = match (claimant, claim_left) {
            (Reply::Nil, _) => None,
            (Reply::Data(owner), Reply::Int(left)) => Some(WriterClaim::new(
                parse_token(owner)
                    .ok_or_else(|| self.corrupt(WHAT, key, "a claimant coord did not write"))?,
                Duration::from_millis((*left).max(0) as u64),
            )),
            _ => return Err(unexpected()),
        };
        let readers = self.holds(readers, WHAT, key)?;
        Ok(RwLockInfo::new(
            key.clone(),
            readers,
            writer,
            waiting_writer,
            Waiters::Flagged(*flag == 1),
        ))
    }

    async fn inspect_record(&self, key: &CallKey) -> Result<Option<RecordInfo>, BackendError> {
        let names = Names::of(key);
        let reply = self
            .eval(&scripts::INSPECT_RECORD, &[&names.record()], &[], key)
            .await?;
        let unexpected = || self.protocol("inspect record", key, "unexpected script reply");
        let Reply::Array(items) = reply else {
            return Err(unexpected());
        };
        let (state, owner, age, lease_left, pttl, payload, fp) = match items.as_slice() {
            [Reply::Int(0)] => return Ok(None),
            [
                Reply::Int(1),
                Reply::Data(state),
                owner,
                Reply::Int(age),
                Reply::Int(lease_left),
                Reply::Int(pttl),
                Reply::Int(payload),
                Reply::Int(fp),
            ] => (state, owner, *age, *lease_left, *pttl, *payload, *fp),
            _ => return Err(unexpected()),
        };
        let status = match state.as_slice() {
            b"i" => RecordStatus::InFlight,
            b"a" => RecordStatus::Abandoned,
            b"c" => RecordStatus::Completed,
            _ => return Err(unexpected()),
        };
        let owner = match owner {
            Reply::Nil => None,
            Reply::Data(token) => Some(parse_token(token).ok_or_else(|| {
                self.corrupt("inspect record", key, "the record's owner is not a token")
            })?),
            _ => return Err(unexpected()),
        };
        let ms = |n: i64| (n >= 0).then(|| Duration::from_millis(n as u64));
        Ok(Some(
            RecordInfo::new(key.clone(), status, ms(pttl).unwrap_or_default())
                .with_owner(owner)
                .with_age(ms(age))
                .with_lease_left(ms(lease_left))
                .with_payload_bytes(usize::try_from(payload).ok())
                .with_fingerprint(fp > 0),
        ))
    }

    async fn force_release(&self, key: &CallKey) -> Result<ForcedRelease, BackendError> {
        let names = Names::of(key);
        let memory = Decimal::new(millis(FORCED_RELEASE_MEMORY));
        let reply = self
            .eval(
                &scripts::FORCE_RELEASE,
                &[&names.lock(), &names.forced()],
                &[memory.as_ref()],
                key,
            )
            .await?;
        let unexpected = || self.protocol("force release", key, "unexpected script reply");
        let Reply::Array(items) = reply else {
            return Err(unexpected());
        };
        match items.as_slice() {
            [Reply::Int(0)] => Ok(ForcedRelease::NotHeld),
            [Reply::Int(2)] => Ok(ForcedRelease::RemovedCorrupt),
            [Reply::Int(1), Reply::Data(token)] => Ok(ForcedRelease::Released {
                owner: parse_token(token).ok_or_else(unexpected)?,
            }),
            _ => Err(unexpected()),
        }
    }

    /// A page of at most `size` keys after `cursor`: those of `op`'s namespace, and with
    /// `only_op` only those of its operation.
    async fn list(
        &self,
        op: &CallKey,
        only_op: bool,
        cursor: Option<&Cursor>,
        size: usize,
        kind: Kind,
    ) -> Result<Page<CallKey>, BackendError> {
        let what = match kind {
            Kind::Lock => "listing locks",
            Kind::Record => "listing records",
        };
        let mut state = match cursor {
            None => ScanState::start(),
            Some(cursor) => ScanState::from_cursor(cursor).ok_or_else(|| {
                BackendError::new(
                    BackendErrorKind::Config,
                    format!("{what}: `{cursor}` is not a cursor of the Redis provider"),
                )
                .with_key(op)
            })?,
        };
        let prefix = format!("{}:{}:{{", op.namespace(), kind.word());
        let pattern = if only_op {
            format!(
                "{}{}[:}}]*",
                glob_literal(&prefix),
                glob_literal(op.op_key())
            )
        } else {
            format!("{}*", glob_literal(&prefix))
        };
        let mut items: Vec<CallKey> = Vec::new();
        for _ in 0..SCANS_PER_PAGE {
            let cursor_text = state.cursor.to_string();
            let scan = Command::new("SCAN")
                .arg(&cursor_text)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            let mut replies = self
                .transport
                .each_node(scan)
                .await
                .map_err(|fault| self.error(fault, what, op))?;
            replies.sort_by(|a, b| a.0.cmp(&b.0));
            let node = match &state.node {
                Some(node) => node.clone(),
                None => match replies.first() {
                    Some((node, _)) => node.clone(),
                    None => break,
                },
            };
            let Some(index) = replies.iter().position(|(n, _)| *n == node) else {
                return Err(BackendError::new(
                    BackendErrorKind::Unavailable,
                    format!(
                        "{what}: the node {node} the listing was at is no longer one of the \
                         deployment's data nodes (a failover or resharding?): start again"
                    ),
                )
                .with_key(op));
            };
            let (next_cursor, names) = match &replies[index].1 {
                Ok(reply) => parse_scan(reply)
                    .ok_or_else(|| self.protocol(what, op, "unreadable SCAN reply"))?,
                Err(fault) => return Err(self.error(fault.clone(), what, op)),
            };
            let mut found: Vec<CallKey> = names
                .iter()
                .filter_map(|name| std::str::from_utf8(name).ok())
                .filter_map(|name| name.strip_prefix(&prefix)?.strip_suffix('}'))
                .filter(|shown| state.after.as_deref().is_none_or(|after| *shown > after))
                .filter_map(|shown| op.with_op_key(shown).ok())
                .filter(|key| !only_op || key.is_of_operation(op.op_key()))
                .collect();
            found.sort_unstable_by(|a, b| a.op_key().cmp(b.op_key()));
            found.dedup();
            let room = size - items.len();
            if found.len() > room {
                found.truncate(room);
                state.after = found.last().map(|k| k.op_key().to_owned());
                state.node = Some(node);
                items.extend(found);
                return Ok(Page {
                    items,
                    next: Some(state.to_cursor()),
                });
            }
            items.extend(found);
            state.after = None;
            if next_cursor != 0 {
                state.node = Some(node);
                state.cursor = next_cursor;
            } else {
                match replies.get(index + 1) {
                    Some((next_node, _)) => {
                        state.node = Some(next_node.clone());
                        state.cursor = 0;
                    }
                    None => return Ok(Page { items, next: None }),
                }
            }
            if items.len() == size {
                break;
            }
        }
        Ok(Page {
            items,
            next: Some(state.to_cursor()),
        })
    }
}

/// A `SCAN` reply: the next cursor and the names of the batch.
fn parse_scan(reply: &Reply) -> Option<(u64, Vec<Vec<u8>>)> {
    let Reply::Array(parts) = reply else {
        return None;
    };
    let [cursor, Reply::Array(names)] = parts.as_slice() else {
        return None;
    };
    let cursor = match cursor {
        Reply::Data(text) => std::str::from_utf8(text).ok()?.parse().ok()?,
        Reply::Int(n) => u64::try_from(*n).ok()?,
        _ => return None,
    };
    let names = names
        .iter()
        .map(|name| match name {
            Reply::Data(name) => Some(name.clone()),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()?;
    Some((cursor, names))
}

/// Inspection, listing and forced release over Redis.
///
/// * A lock's waiters are a flag ([`Waiters::Flagged`]): a waiter marks the holder's value
///   once it is subscribed, and the mark goes with the holder.
/// * A free lock may still show a fencing token: the counter outlives each mint by
///   `max(10 × lease, 1 h)`.
/// * A record's age is unknown (`None`) for records written before coord stored write times;
///   so is the owner of records completed before coord stored completing owners.
/// * Listings follow the module's notes: `SCAN` on every data node, pages never over the limit.
/// * Forcing a lock free also deletes a lock key holding something coord did not write
///   ([`ForcedRelease::RemovedCorrupt`]).
impl Operations for RedisProvider {
    fn inspect_lock<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<LockInfo, BackendError>> {
        Box::pin(self.inner.inspect_lock(key))
    }

    fn inspect_record<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<Option<RecordInfo>, BackendError>> {
        Box::pin(self.inner.inspect_record(key))
    }

    fn inspect_semaphore<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<SemaphoreInfo, BackendError>> {
        Box::pin(self.inner.inspect_semaphore(key))
    }

    fn inspect_rw_lock<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<RwLockInfo, BackendError>> {
        Box::pin(self.inner.inspect_rw_lock(key))
    }

    fn list_locks<'a>(
        &'a self,
        req: ListRequest<'a>,
    ) -> BoxFuture<'a, Result<Page<CallKey>, BackendError>> {
        Box::pin(
            self.inner
                .list(req.operation, true, req.cursor, req.page_size(), Kind::Lock),
        )
    }

    fn list_records<'a>(
        &'a self,
        req: ListRequest<'a>,
    ) -> BoxFuture<'a, Result<Page<CallKey>, BackendError>> {
        Box::pin(self.inner.list(
            req.operation,
            true,
            req.cursor,
            req.page_size(),
            Kind::Record,
        ))
    }

    fn force_release<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<ForcedRelease, BackendError>> {
        Box::pin(self.inner.force_release(key))
    }

    fn list_namespace_locks<'a>(
        &'a self,
        req: NamespaceListRequest<'a>,
    ) -> BoxFuture<'a, Result<Page<CallKey>, BackendError>> {
        Box::pin(self.inner.list(
            req.namespace,
            false,
            req.cursor,
            req.page_size(),
            Kind::Lock,
        ))
    }

    fn list_namespace_records<'a>(
        &'a self,
        req: NamespaceListRequest<'a>,
    ) -> BoxFuture<'a, Result<Page<CallKey>, BackendError>> {
        Box::pin(self.inner.list(
            req.namespace,
            false,
            req.cursor,
            req.page_size(),
            Kind::Record,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_foreign_ones_are_refused() {
        let state = ScanState {
            node: Some("127.0.0.1:6379".to_owned()),
            cursor: 1234,
            after: Some("jobs:a b".to_owned()),
        };
        let cursor = state.to_cursor();
        assert!(!cursor.as_str().contains(char::is_whitespace), "{cursor}");
        assert_eq!(ScanState::from_cursor(&cursor), Some(state));
        let no_after = ScanState {
            node: Some("n:1".to_owned()),
            cursor: 0,
            after: None,
        };
        assert_eq!(
            ScanState::from_cursor(&no_after.to_cursor()),
            Some(no_after)
        );
        for foreign in [
            "",
            "r",
            "r...",
            "r.6e.x.",
            "m.6e",
            "r.6e.1.zz",
            "r..1.",
            "r.6e.1..x",
        ] {
            assert_eq!(
                ScanState::from_cursor(&Cursor::new(foreign)),
                None,
                "{foreign:?}"
            );
        }
    }

    #[test]
    fn glob_characters_are_matched_literally() {
        assert_eq!(
            glob_literal("ns:lock:{a*b?[c]\\"),
            "ns:lock:{a\\*b\\?\\[c\\]\\\\"
        );
        assert_eq!(glob_literal("plain"), "plain");
    }

    #[test]
    fn scan_replies_parse() {
        let reply = Reply::Array(vec![
            Reply::Data(b"17".to_vec()),
            Reply::Array(vec![Reply::Data(b"a".to_vec()), Reply::Data(b"b".to_vec())]),
        ]);
        assert_eq!(
            parse_scan(&reply),
            Some((17, vec![b"a".to_vec(), b"b".to_vec()]))
        );
        assert_eq!(parse_scan(&Reply::Data(b"0".to_vec())), None);
    }
}
