//! `coord locks ...` and `coord records ...`: the operations API of a coordinator, printed.

use coord_core::operator::Operator;
use coord_core::provider::{
    BackendErrorKind, Cursor, ForcedRelease, LockInfo, Page, RecordInfo, RecordStatus,
};
use coord_core::{BackendError, CallKey, Coordinator};
use futures_util::future::join_all;
use serde_json::{Value, json};

use crate::args::{Destructive, ListArgs, LockCommand, RecordCommand, RecordListArgs};
use crate::render;
use crate::{Exit, Failure, confirm, requested_by};

/// The key an operator typed, in the coordinator's namespace.
fn key(operator: &Operator<'_>, text: &str) -> Result<CallKey, Failure> {
    operator
        .key(text)
        .map_err(|e| Failure::usage(format!("`{text}`: {e}")))
}

/// Pages of keys from `list`: one page, or all of them with `--all`.
async fn pages<F, Fut>(args: &ListArgs, mut list: F) -> Result<Page<CallKey>, Failure>
where
    F: FnMut(Option<Cursor>) -> Fut,
    Fut: Future<Output = Result<Page<CallKey>, BackendError>>,
{
    let mut cursor = args.cursor.clone().map(Cursor::new);
    let mut items = Vec::new();
    loop {
        let page = list(cursor.take()).await?;
        items.extend(page.items);
        match page.next {
            Some(next) if args.all => cursor = Some(next),
            next => return Ok(Page { items, next }),
        }
    }
}

/// An error for one key of a listing, as JSON and as text.
fn key_error(key: &CallKey, err: &BackendError) -> (Value, String) {
    let failure = Failure::from(err.clone());
    (
        json!({ "key": key.to_string(), "error": { "kind": failure.kind, "message": failure.message } }),
        format!("{:<40} ERROR ({}): {}", key.to_string(), failure.kind, err),
    )
}

/// The exit code of a listing whose rows were printed, errors included: corrupt state under
/// some key is worth telling a script apart from a backend fault.
fn listing_exit(errors: &[BackendError]) -> Result<Exit, Failure> {
    if errors.iter().any(|e| e.kind() == BackendErrorKind::Corrupt) {
        Ok(Exit::Corrupt)
    } else if errors.is_empty() {
        Ok(Exit::Done)
    } else {
        Ok(Exit::Backend)
    }
}

/// The last line of a text listing: how many, and how to go on. `scope` is the digest a
/// record listing was narrowed to.
fn footer(
    locks: bool,
    shown: usize,
    operation: &str,
    scope: Option<&str>,
    next: &Option<Cursor>,
) -> String {
    let mut out = match (locks, shown) {
        (true, 1) => "1 lock held".to_owned(),
        (true, n) => format!("{n} locks held"),
        (false, 1) => "1 record".to_owned(),
        (false, n) => format!("{n} records"),
    };
    if let Some(digest) = scope {
        out.push_str(&format!(" of scope {digest}"));
    }
    if let Some(next) = next {
        out.push_str(&format!(
            "; more: coord {} list {}{} --cursor {next}",
            if locks { "locks" } else { "records" },
            operation,
            // The value itself is never printed: the operator types it again.
            if scope.is_some() {
                " --scope <VALUE>"
            } else {
                ""
            }
        ));
    }
    out
}

/// `coord locks list` / `coord records list` without an operation: the operations that have
/// such state, with how many keys each.
async fn operations(c: &Coordinator, locks: bool, json: bool) -> Result<Exit, Failure> {
    let operator = c.operator();
    let found = if locks {
        operator.lock_operations().await?
    } else {
        operator.record_operations().await?
    };
    let (noun, command) = if locks {
        ("locks", "locks")
    } else {
        ("records", "records")
    };
    if json {
        let rows: Vec<Value> = found
            .iter()
            .map(|op| json!({ "operation": op.operation, noun: op.keys }))
            .collect();
        let doc = json!({ "namespace": c.namespace(), "operations": rows });
        println!("{doc:#}");
        return Ok(Exit::Done);
    }
    println!("{}", render::operation_row_header(noun));
    for op in &found {
        println!("{}", render::operation_row(&op.operation, op.keys));
    }
    let what = if locks { "holds locks" } else { "has records" };
    match found.first() {
        None => println!(
            "no operation {what} in namespace `{}` (is that the application's? see --app)",
            c.namespace()
        ),
        Some(first) => println!(
            "{} {} {what} in namespace `{}`; list one: coord {command} list {}",
            found.len(),
            if found.len() == 1 {
                "operation"
            } else {
                "operations"
            },
            c.namespace(),
            first.operation
        ),
    }
    Ok(Exit::Done)
}

pub async fn locks(c: &Coordinator, cmd: LockCommand, json: bool) -> Result<Exit, Failure> {
    let operator = c.operator();
    match cmd {
        LockCommand::List(args) => {
            let Some(operation) = args.operation.as_deref() else {
                return operations(c, true, json).await;
            };
            let limit = usize::from(args.limit);
            let page = pages(&args, |cursor| async move {
                operator.locks(operation, cursor.as_ref(), limit).await
            })
            .await?;
            let infos = join_all(page.items.iter().map(|k| operator.lock(k))).await;
            let mut rows = Vec::new();
            let mut lines = vec![render::lock_row_header()];
            let mut errors = Vec::new();
            for (key, info) in page.items.iter().zip(infos) {
                match info {
                    // Released between the listing and the read: not a held lock any more.
                    Ok(info) if info.holder.is_none() => {}
                    Ok(info) => {
                        rows.push(render::lock_json(&info));
                        lines.push(render::lock_row(&info));
                    }
                    Err(err) => {
                        let (row, line) = key_error(key, &err);
                        rows.push(row);
                        lines.push(line);
                        errors.push(err);
                    }
                }
            }
            if json {
                let doc = json!({
                    "namespace": c.namespace(),
                    "operation": args.operation,
                    "locks": rows,
                    "next_cursor": page.next.as_ref().map(ToString::to_string),
                });
                println!("{doc:#}");
            } else {
                for line in &lines {
                    println!("{line}");
                }
                println!("{}", footer(true, rows.len(), operation, None, &page.next));
            }
            listing_exit(&errors)
        }
        LockCommand::Show { key: text } => {
            let key = key(&operator, &text)?;
            let info = operator.lock(&key).await?;
            if json {
                let mut doc = render::lock_json(&info);
                doc["namespace"] = json!(c.namespace());
                println!("{doc:#}");
            } else {
                print!("{}", render::lock_text(&info));
            }
            Ok(Exit::Done)
        }
        LockCommand::Permits { key: text } => {
            let key = key(&operator, &text)?;
            let info = operator.semaphore(&key).await?;
            if json {
                let mut doc = render::semaphore_json(&info);
                doc["namespace"] = json!(c.namespace());
                println!("{doc:#}");
            } else {
                print!("{}", render::semaphore_text(&info));
            }
            Ok(Exit::Done)
        }
        LockCommand::Rw { key: text } => {
            let key = key(&operator, &text)?;
            let info = operator.rw_lock(&key).await?;
            if json {
                let mut doc = render::rw_lock_json(&info);
                doc["namespace"] = json!(c.namespace());
                println!("{doc:#}");
            } else {
                print!("{}", render::rw_lock_text(&info));
            }
            Ok(Exit::Done)
        }
        LockCommand::Release(Destructive { key: text, yes, by }) => {
            let key = key(&operator, &text)?;
            let question = match operator.lock(&key).await {
                Ok(LockInfo { holder: None, .. }) => {
                    report_release(&key, ForcedRelease::NotHeld, json);
                    return Ok(Exit::Done);
                }
                Ok(LockInfo {
                    holder: Some(holder),
                    ..
                }) => format!(
                    "Force-release lock `{key}` held by {} ({} of lease left)? Its holder is \
                     not told and may still be running.",
                    holder.owner,
                    render::duration(holder.lease_left)
                ),
                Err(err) if err.kind() == BackendErrorKind::Corrupt => {
                    format!("The lock key of `{key}` holds corrupt state ({err}). Remove it?")
                }
                Err(err) => return Err(err.into()),
            };
            confirm(&question, yes)?;
            let outcome = operator
                .release_lock(&key, &requested_by(by.as_deref()))
                .await?;
            report_release(&key, outcome, json);
            Ok(Exit::Done)
        }
    }
}

fn report_release(key: &CallKey, outcome: ForcedRelease, json: bool) {
    let (word, owner, text) = match outcome {
        ForcedRelease::Released { owner } => (
            "released",
            Some(owner.to_string()),
            format!("released lock {key} (it was held by {owner})"),
        ),
        ForcedRelease::NotHeld => (
            "not_held",
            None,
            format!("lock {key} is not held; nothing to release"),
        ),
        ForcedRelease::RemovedCorrupt => (
            "removed_corrupt",
            None,
            format!("removed the corrupt value at lock {key}"),
        ),
        _ => ("other", None, format!("lock {key}: {outcome:?}")),
    };
    if json {
        let doc = json!({ "key": key.to_string(), "outcome": word, "former_owner": owner });
        println!("{doc:#}");
    } else {
        println!("{text}");
    }
}

pub async fn records(c: &Coordinator, cmd: RecordCommand, json: bool) -> Result<Exit, Failure> {
    let operator = c.operator();
    match cmd {
        RecordCommand::List(RecordListArgs { list: args, scope }) => {
            let Some(operation) = args.operation.as_deref() else {
                return operations(c, false, json).await;
            };
            let limit = usize::from(args.limit);
            let mut page = pages(&args, |cursor| async move {
                operator.records(operation, cursor.as_ref(), limit).await
            })
            .await?;
            // The layer's record key is `operation:digest:key`: keep that principal's keys.
            let scope = scope.map(|raw| coord_http::scope_digest(c.namespace(), raw.as_bytes()));
            if let Some(digest) = &scope {
                let prefix = format!("{}:{digest}:", c.key(operation).finish().op_key());
                page.items.retain(|key| key.op_key().starts_with(&prefix));
            }
            let infos = join_all(page.items.iter().map(|k| operator.record(k))).await;
            let mut rows = Vec::new();
            let mut lines = vec![render::record_row_header()];
            let mut errors = Vec::new();
            for (key, info) in page.items.iter().zip(infos) {
                match info {
                    // Gone between the listing and the read.
                    Ok(None) => {}
                    Ok(Some(info)) => {
                        rows.push(render::record_json(&key.to_string(), Some(&info)));
                        lines.push(render::record_row(&info));
                    }
                    Err(err) => {
                        let (row, line) = key_error(key, &err);
                        rows.push(row);
                        lines.push(line);
                        errors.push(err);
                    }
                }
            }
            if json {
                let mut doc = json!({
                    "namespace": c.namespace(),
                    "operation": args.operation,
                    "records": rows,
                    "next_cursor": page.next.as_ref().map(ToString::to_string),
                });
                if let Some(digest) = &scope {
                    doc["scope_digest"] = json!(digest);
                }
                println!("{doc:#}");
            } else {
                for line in &lines {
                    println!("{line}");
                }
                let footer = footer(false, rows.len(), operation, scope.as_deref(), &page.next);
                println!("{footer}");
            }
            listing_exit(&errors)
        }
        RecordCommand::Show { key: text } => {
            let key = key(&operator, &text)?;
            let info = operator.record(&key).await?;
            let shown = key.to_string();
            if json {
                let mut doc = render::record_json(&shown, info.as_ref());
                doc["namespace"] = json!(c.namespace());
                println!("{doc:#}");
            } else {
                print!("{}", render::record_text(&shown, info.as_ref()));
            }
            Ok(Exit::Done)
        }
        RecordCommand::Purge(Destructive { key: text, yes, by }) => {
            let key = key(&operator, &text)?;
            let question = match operator.record(&key).await {
                Ok(None) => {
                    report_purge(&key, false, json);
                    return Ok(Exit::Done);
                }
                Ok(Some(info)) => purge_question(&key, &info),
                Err(err) if err.kind() == BackendErrorKind::Corrupt => {
                    format!("The record of `{key}` is corrupt ({err}). Remove it?")
                }
                Err(err) => return Err(err.into()),
            };
            confirm(&question, yes)?;
            let found = operator
                .purge_record(&key, &requested_by(by.as_deref()))
                .await?;
            report_purge(&key, found, json);
            Ok(Exit::Done)
        }
    }
}

fn purge_question(key: &CallKey, info: &RecordInfo) -> String {
    let what = match info.status {
        RecordStatus::InFlight => {
            "in flight: a call may be running now, and a duplicate would run beside it"
        }
        RecordStatus::Abandoned => {
            "abandoned: its call's outcome is unknown; the next call runs the body again"
        }
        _ => "completed: the next call runs the body again instead of replaying",
    };
    format!("Purge the record of `{key}` ({what})?")
}

fn report_purge(key: &CallKey, found: bool, json: bool) {
    if json {
        let doc = json!({ "key": key.to_string(), "purged": found });
        println!("{doc:#}");
    } else if found {
        println!("purged record {key}");
    } else {
        println!("no record at {key}; nothing to purge");
    }
}
