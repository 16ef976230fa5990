//! How locks and records are printed: text for people, JSON for scripts.

use std::time::Duration;

use coord_core::provider::{HoldInfo, LockInfo, RecordInfo, RwLockInfo, SemaphoreInfo, Waiters};
use serde_json::{Value, json};

/// A duration for people: `850ms`, `12.5s`, `3m 02s`, `5h 10m`, `2d 03h`.
pub fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    let secs = d.as_secs();
    if ms < 1000 {
        format!("{ms}ms")
    } else if secs < 60 {
        format!("{:.1}s", d.as_secs_f64())
    } else if secs < 3600 {
        format!("{}m {:02}s", secs / 60, secs % 60)
    } else if secs < 86_400 {
        format!("{}h {:02}m", secs / 3600, secs % 3600 / 60)
    } else {
        format!("{}d {:02}h", secs / 86_400, secs % 86_400 / 3600)
    }
}

fn millis(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

fn waiters_json(w: Waiters) -> Value {
    match w {
        Waiters::Counted(n) => json!({ "count": n }),
        Waiters::Flagged(flag) => json!({ "flagged": flag }),
        _ => json!({}),
    }
}

fn waiters_text(w: Waiters) -> String {
    match w {
        Waiters::Counted(0) => "none".to_owned(),
        Waiters::Counted(n) => format!("{n} waiting"),
        Waiters::Flagged(true) => "someone waits".to_owned(),
        Waiters::Flagged(false) => "none announced".to_owned(),
        _ => "unknown".to_owned(),
    }
}

/// A lock as JSON: `key`, `held`, `owner`, `lease_left_ms`, `waiters`, `fencing_token`.
pub fn lock_json(info: &LockInfo) -> Value {
    let holder = info.holder.as_ref();
    json!({
        "key": info.key.to_string(),
        "held": holder.is_some(),
        "owner": holder.map(|h| h.owner.to_string()),
        "lease_left_ms": holder.map(|h| millis(h.lease_left)),
        "waiters": holder.map(|h| waiters_json(h.waiters)),
        "fencing_token": info.fencing_token.map(|t| t.get()),
    })
}

/// A lock as text, one field a line.
pub fn lock_text(info: &LockInfo) -> String {
    let mut out = format!("lock {}\n", info.key);
    match &info.holder {
        Some(holder) => {
            out.push_str("  state:          held\n");
            out.push_str(&format!("  owner:          {}\n", holder.owner));
            out.push_str(&format!(
                "  lease left:     {}\n",
                duration(holder.lease_left)
            ));
            out.push_str(&format!(
                "  waiters:        {}\n",
                waiters_text(holder.waiters)
            ));
        }
        None => out.push_str("  state:          free\n"),
    }
    out.push_str(&format!(
        "  fencing token:  {}\n",
        info.fencing_token
            .map_or_else(|| "-".to_owned(), |t| t.to_string())
    ));
    out
}

/// The header and one row per lock of a listing.
pub fn lock_row_header() -> String {
    format!(
        "{:<40} {:<32} {:>10} {:<15} {}",
        "KEY", "OWNER", "LEASE LEFT", "WAITERS", "FENCING TOKEN"
    )
}

pub fn lock_row(info: &LockInfo) -> String {
    match &info.holder {
        Some(h) => format!(
            "{:<40} {:<32} {:>10} {:<15} {}",
            info.key.to_string(),
            h.owner.to_string(),
            duration(h.lease_left),
            waiters_text(h.waiters),
            info.fencing_token
                .map_or_else(|| "-".to_owned(), |t| t.to_string())
        ),
        None => format!(
            "{:<40} (released since it was listed)",
            info.key.to_string()
        ),
    }
}

/// One hold of a semaphore or read-write lock as JSON: `owner`, `lease_left_ms`,
/// `fencing_token`.
fn hold_json(hold: &HoldInfo) -> Value {
    json!({
        "owner": hold.owner.to_string(),
        "lease_left_ms": millis(hold.lease_left),
        "fencing_token": hold.fencing_token.map(|t| t.get()),
    })
}

/// Holds as text rows under a header naming what they are (`PERMIT`, `READER`, `WRITER`).
fn hold_rows(what: &str, holds: &[HoldInfo], out: &mut String) {
    out.push_str(&format!(
        "  {:<32} {:>10} {}\n",
        format!("{what} OWNER"),
        "LEASE LEFT",
        "FENCING TOKEN"
    ));
    for hold in holds {
        out.push_str(&format!(
            "  {:<32} {:>10} {}\n",
            hold.owner.to_string(),
            duration(hold.lease_left),
            hold.fencing_token
                .map_or_else(|| "-".to_owned(), |t| t.to_string())
        ));
    }
}

/// A semaphore as JSON: `key`, `held` (how many permits), `permits` (each `owner`,
/// `lease_left_ms`, `fencing_token`, soonest-ending first), `waiters`.
pub fn semaphore_json(info: &SemaphoreInfo) -> Value {
    json!({
        "key": info.key.to_string(),
        "held": info.permits.len(),
        "permits": info.permits.iter().map(hold_json).collect::<Vec<_>>(),
        "waiters": waiters_json(info.waiters),
    })
}

/// A semaphore as text: how many permits are held and who waits, then one row per permit.
pub fn semaphore_text(info: &SemaphoreInfo) -> String {
    let mut out = format!("semaphore {}\n", info.key);
    out.push_str(&format!("  permits held:   {}\n", info.permits.len()));
    out.push_str(&format!(
        "  waiters:        {}\n",
        waiters_text(info.waiters)
    ));
    if !info.permits.is_empty() {
        hold_rows("PERMIT", &info.permits, &mut out);
    }
    out
}

/// What holds a read-write lock: `free`, `read` or `write`.
fn rw_state(info: &RwLockInfo) -> &'static str {
    if info.writer.is_some() {
        "write"
    } else if info.readers.is_empty() {
        "free"
    } else {
        "read"
    }
}

/// A read-write lock as JSON: `key`, `state` (`free`, `read`, `write`), `readers` (each
/// `owner`, `lease_left_ms`, `fencing_token`, soonest-ending first), `writer` (the same, or
/// null), `waiting_writer` (`owner`, `claim_left_ms`, or null), `waiters`.
pub fn rw_lock_json(info: &RwLockInfo) -> Value {
    json!({
        "key": info.key.to_string(),
        "state": rw_state(info),
        "readers": info.readers.iter().map(hold_json).collect::<Vec<_>>(),
        "writer": info.writer.as_ref().map(hold_json),
        "waiting_writer": info.waiting_writer.map(|claim| json!({
            "owner": claim.owner.to_string(),
            "claim_left_ms": millis(claim.claim_left),
        })),
        "waiters": waiters_json(info.waiters),
    })
}

/// A read-write lock as text: its state, the waiting writer and who waits, then one row per
/// reader or for the writer.
pub fn rw_lock_text(info: &RwLockInfo) -> String {
    let mut out = format!("read-write lock {}\n", info.key);
    let state = match (rw_state(info), info.readers.len()) {
        ("read", 1) => "read (1 reader)".to_owned(),
        ("read", n) => format!("read ({n} readers)"),
        (state, _) => state.to_owned(),
    };
    out.push_str(&format!("  state:          {state}\n"));
    out.push_str(&format!(
        "  waiting writer: {}\n",
        info.waiting_writer.map_or_else(
            || "-".to_owned(),
            |claim| format!(
                "{} (keeps new readers out for {} more)",
                claim.owner,
                duration(claim.claim_left)
            )
        )
    ));
    out.push_str(&format!(
        "  waiters:        {}\n",
        waiters_text(info.waiters)
    ));
    if let Some(writer) = &info.writer {
        hold_rows("WRITER", std::slice::from_ref(writer), &mut out);
    }
    if !info.readers.is_empty() {
        hold_rows("READER", &info.readers, &mut out);
    }
    out
}

/// The header of a listing of operations: `noun` is what is counted (`locks`, `records`).
pub fn operation_row_header(noun: &str) -> String {
    format!("{:<48} {:>8}", "OPERATION", noun.to_ascii_uppercase())
}

/// One operation of such a listing, with how many keys.
pub fn operation_row(operation: &str, keys: usize) -> String {
    format!("{operation:<48} {keys:>8}")
}

/// A record as JSON: `key`, `exists`, `status`, `owner`, `age_ms`, `lease_left_ms`,
/// `expires_in_ms`, `payload_bytes`, `has_fingerprint` (all but `key` and `exists` null when
/// there is no record).
pub fn record_json(key: &str, info: Option<&RecordInfo>) -> Value {
    match info {
        Some(r) => json!({
            "key": key,
            "exists": true,
            "status": r.status.as_str(),
            "owner": r.owner.map(|o| o.to_string()),
            "age_ms": r.age.map(millis),
            "lease_left_ms": r.lease_left.map(millis),
            "expires_in_ms": millis(r.expires_in),
            "payload_bytes": r.payload_bytes,
            "has_fingerprint": r.has_fingerprint,
        }),
        None => json!({
            "key": key,
            "exists": false,
            "status": null,
            "owner": null,
            "age_ms": null,
            "lease_left_ms": null,
            "expires_in_ms": null,
            "payload_bytes": null,
            "has_fingerprint": null,
        }),
    }
}

/// A record as text, one field a line.
pub fn record_text(key: &str, info: Option<&RecordInfo>) -> String {
    let Some(r) = info else {
        return format!("record {key}\n  state:          none (no record)\n");
    };
    let opt = |d: Option<Duration>| d.map_or_else(|| "-".to_owned(), duration);
    let mut out = format!("record {key}\n");
    out.push_str(&format!("  state:          {}\n", r.status));
    out.push_str(&format!(
        "  owner:          {}\n",
        r.owner
            .map_or_else(|| "(not recorded)".to_owned(), |o| o.to_string())
    ));
    out.push_str(&format!(
        "  age:            {}\n",
        r.age.map_or_else(|| "(not recorded)".to_owned(), duration)
    ));
    out.push_str(&format!("  lease left:     {}\n", opt(r.lease_left)));
    out.push_str(&format!("  expires in:     {}\n", duration(r.expires_in)));
    out.push_str(&format!(
        "  payload:        {}\n",
        r.payload_bytes
            .map_or_else(|| "-".to_owned(), |n| format!("{n} bytes"))
    ));
    out.push_str(&format!(
        "  fingerprint:    {}\n",
        if r.has_fingerprint { "yes" } else { "no" }
    ));
    out
}

pub fn record_row_header() -> String {
    format!(
        "{:<40} {:<10} {:>10} {:>10} {:>10} {:>8}",
        "KEY", "STATE", "AGE", "LEASE LEFT", "EXPIRES IN", "PAYLOAD"
    )
}

pub fn record_row(r: &RecordInfo) -> String {
    let opt = |d: Option<Duration>| d.map_or_else(|| "-".to_owned(), duration);
    format!(
        "{:<40} {:<10} {:>10} {:>10} {:>10} {:>8}",
        r.key.to_string(),
        r.status.as_str(),
        opt(r.age),
        opt(r.lease_left),
        duration(r.expires_in),
        r.payload_bytes
            .map_or_else(|| "-".to_owned(), |n| format!("{n}B"))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration(Duration::from_millis(850)), "850ms");
        assert_eq!(duration(Duration::from_millis(12_500)), "12.5s");
        assert_eq!(duration(Duration::from_secs(182)), "3m 02s");
        assert_eq!(duration(Duration::from_secs(5 * 3600 + 600)), "5h 10m");
        assert_eq!(
            duration(Duration::from_secs(2 * 86_400 + 3 * 3600)),
            "2d 03h"
        );
    }
}
