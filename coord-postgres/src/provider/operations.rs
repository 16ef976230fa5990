//! The operations API: inspect a lock or a record, list the live keys of one operation,
//! force a lock free. One statement each.
//!
//! # Listing
//! Keys are stored whole (`namespace:operation[:parts]`) and compared byte by byte, so the
//! keys of one operation are one range of the primary key: a page is an index range scan
//! from just after the last key of the previous page (the cursor), in key order. With the
//! table unchanged, following the cursors visits every key once; a key created or removed
//! meanwhile may or may not appear.

use coord_core::provider::{
    BackendErrorKind, BoxFuture, Cursor, ForcedRelease, ListRequest, LockHolder, LockInfo,
    Operations, Page, RecordInfo, RecordStatus, Waiters,
};
use coord_core::{BackendError, CallKey, FencingToken};

use super::{Inner, PostgresProvider, from_ms, owner_of, wake_payload};
use crate::sql::Sql;

/// The cursor of a page that ended after `key` (its shown form, hex-encoded).
fn cursor_after(op_key: &str) -> Cursor {
    Cursor::new(format!(
        "p.{}",
        op_key
            .bytes()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    ))
}

/// The shown form a cursor made by [`cursor_after`] names.
fn read_cursor(cursor: &Cursor) -> Option<String> {
    let hex = cursor.as_str().strip_prefix("p.")?;
    if hex.is_empty() || !hex.len().is_multiple_of(2) {
        return None;
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

impl Inner {
    async fn inspect_lock(&self, key: &CallKey) -> Result<LockInfo, BackendError> {
        let what = "inspect lock";
        let rows = self
            .query(&self.sql.lock_inspect, &[&key.qualified()], what, key)
            .await?;
        let Some(row) = rows.first() else {
            return Ok(LockInfo::new(key.clone(), None, None));
        };
        let owner: uuid::Uuid = self.get(row, 0, what, key)?;
        let fence: Option<i64> = self.get(row, 1, what, key)?;
        let waited: bool = self.get(row, 2, what, key)?;
        let left: i64 = self.get(row, 3, what, key)?;
        let holder = (left > 0)
            .then(|| LockHolder::new(owner_of(owner), from_ms(left), Waiters::Flagged(waited)));
        Ok(LockInfo::new(
            key.clone(),
            holder,
            fence.map(|f| FencingToken::new(f.max(0) as u64)),
        ))
    }

    async fn inspect_record(&self, key: &CallKey) -> Result<Option<RecordInfo>, BackendError> {
        let what = "inspect record";
        let rows = self
            .query(&self.sql.record_inspect, &[&key.qualified()], what, key)
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let state: String = self.get(row, 0, what, key)?;
        let owner: uuid::Uuid = self.get(row, 1, what, key)?;
        let has_fingerprint: bool = self.get(row, 2, what, key)?;
        let payload: Option<i64> = self.get(row, 3, what, key)?;
        let lease_left: Option<i64> = self.get(row, 4, what, key)?;
        let expires_in: i64 = self.get(row, 5, what, key)?;
        let age: i64 = self.get(row, 6, what, key)?;
        let (status, lease_left) = match (state.as_str(), lease_left) {
            ("in_flight", Some(ms)) if ms > 0 => (RecordStatus::InFlight, Some(from_ms(ms))),
            ("in_flight", _) => (RecordStatus::Abandoned, None),
            ("completed", _) => (RecordStatus::Completed, None),
            _ => {
                return Err(BackendError::new(
                    BackendErrorKind::Corrupt,
                    format!(
                        "{what} at {}: the record has an unknown state",
                        self.address
                    ),
                )
                .with_key(key));
            }
        };
        Ok(Some(
            RecordInfo::new(key.clone(), status, from_ms(expires_in))
                .with_owner(Some(owner_of(owner)))
                .with_age(Some(from_ms(age)))
                .with_lease_left(lease_left)
                .with_payload_bytes(payload.map(|n| n.max(0) as usize))
                .with_fingerprint(has_fingerprint),
        ))
    }

    async fn list(
        &self,
        sql: &Sql,
        req: ListRequest<'_>,
        what: &str,
    ) -> Result<Page<CallKey>, BackendError> {
        let operation = req.operation;
        let op_text = operation.qualified();
        let namespace_len = op_text.len() - operation.op_key().len();
        let after = match req.cursor {
            None => None,
            Some(cursor) => Some(read_cursor(cursor).ok_or_else(|| {
                BackendError::new(
                    BackendErrorKind::Config,
                    format!("{what}: the cursor {cursor} was not made by coord-postgres"),
                )
                .with_key(operation)
            })?),
        };
        // Start after the cursor's key, or (first page) just before the operation's own key.
        let start = match &after {
            Some(op_key) => format!("{}{op_key}", &op_text[..namespace_len]),
            None => String::new(),
        };
        let size = req.page_size();
        let rows = self
            .query(sql, &[&op_text, &start, &(size as i64)], what, operation)
            .await?;
        let mut items = Vec::with_capacity(rows.len());
        let mut last = None;
        for row in &rows {
            let full: String = self.get(row, 0, what, operation)?;
            let Some(op_key) = full.get(namespace_len..) else {
                continue;
            };
            last = Some(op_key.to_owned());
            // The range holds exactly the operation's keys and those of its parts; a key
            // coord could not have printed is skipped rather than invented.
            let Ok(found) = operation.with_op_key(op_key) else {
                continue;
            };
            let of_operation = operation
                .operation()
                .is_none_or(|op| found.is_of_operation(op));
            if of_operation && found.qualified() == full {
                items.push(found);
            }
        }
        let next = if rows.len() < size {
            None
        } else {
            last.as_deref().map(cursor_after)
        };
        Ok(Page { items, next })
    }

    async fn force_release(&self, key: &CallKey) -> Result<ForcedRelease, BackendError> {
        let what = "force release";
        let wake = wake_payload("lock", key);
        let rows = self
            .query(
                &self.sql.lock_force_release,
                &[&key.qualified(), &self.channel, &wake],
                what,
                key,
            )
            .await?;
        let Some(row) = rows.first() else {
            return Ok(ForcedRelease::NotHeld);
        };
        let owner: uuid::Uuid = self.get(row, 0, what, key)?;
        let live: bool = self.get(row, 1, what, key)?;
        Ok(if live {
            ForcedRelease::Released {
                owner: owner_of(owner),
            }
        } else {
            ForcedRelease::NotHeld
        })
    }
}

impl Operations for PostgresProvider {
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

    fn list_locks<'a>(
        &'a self,
        req: ListRequest<'a>,
    ) -> BoxFuture<'a, Result<Page<CallKey>, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            inner.list(&inner.sql.lock_list, req, "list locks").await
        })
    }

    fn list_records<'a>(
        &'a self,
        req: ListRequest<'a>,
    ) -> BoxFuture<'a, Result<Page<CallKey>, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            inner
                .list(&inner.sql.record_list, req, "list records")
                .await
        })
    }

    fn force_release<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<ForcedRelease, BackendError>> {
        Box::pin(self.inner.force_release(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_read_back_and_foreign_ones_are_refused() {
        let c = cursor_after("op:part 1");
        assert_eq!(read_cursor(&c).as_deref(), Some("op:part 1"));
        assert!(!c.as_str().contains(' '));
        for bad in ["", "p.", "p.0", "r.00.0.", "p.zz", "p.ff"] {
            assert_eq!(read_cursor(&Cursor::new(bad)), None, "{bad}");
        }
    }
}
