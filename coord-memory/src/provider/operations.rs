//! [`Operations`]: inspecting, listing and force-releasing, with the listing cursors.
use std::sync::Arc;

use coord_contract::{
    BackendError, BackendErrorKind, BoxFuture, CallKey, Cursor, ForcedRelease, ListRequest,
    LockHolder, LockInfo, NamespaceListRequest, Operations, Page, RecordInfo, RwLockInfo,
    SemaphoreInfo, Waiters,
};

use super::MemoryProvider;

/// The operations API: reads of the lock table and the record store, by this process's clock.
///
/// A lock reports its exact number of waiters ([`Waiters::Counted`]) and the newest fencing
/// token minted since it was last free; a semaphore its live permits and its waiters, a
/// read-write lock its live holds, its waiting writer's claim and its waiters in either mode
/// (all counted exactly). Listings are sorted by key; a cursor holds the last key
/// listed (hex-encoded), and the next page starts after it.
impl Operations for MemoryProvider {
    fn inspect_lock<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<LockInfo, BackendError>> {
        let info = match self.locks.inspect(key.qualified()) {
            Some(view) => LockInfo::new(
                key.clone(),
                Some(LockHolder::new(
                    view.owner,
                    view.lease_left,
                    Waiters::Counted(view.waiters),
                )),
                view.fencing_token,
            ),
            None => LockInfo::new(key.clone(), None, None),
        };
        Box::pin(std::future::ready(Ok(info)))
    }

    fn inspect_semaphore<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<SemaphoreInfo, BackendError>> {
        let (permits, waiting) = self.semaphores.inspect(key.qualified());
        let info = SemaphoreInfo::new(key.clone(), permits, Waiters::Counted(waiting));
        Box::pin(std::future::ready(Ok(info)))
    }

    fn inspect_rw_lock<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<RwLockInfo, BackendError>> {
        let view = self.rw_locks.inspect(key.qualified());
        let info = RwLockInfo::new(
            key.clone(),
            view.readers,
            view.writer,
            view.claim,
            Waiters::Counted(view.waiting),
        );
        Box::pin(std::future::ready(Ok(info)))
    }

    fn inspect_record<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<Option<RecordInfo>, BackendError>> {
        let info = self.records.inspect(key.qualified()).map(|view| {
            RecordInfo::new(key.clone(), view.status, view.expires_in)
                .with_owner(Some(view.owner))
                .with_age(Some(view.age))
                .with_lease_left(view.lease_left)
                .with_payload_bytes(view.payload_len)
                .with_fingerprint(view.has_fingerprint)
        });
        Box::pin(std::future::ready(Ok(info)))
    }

    fn list_locks<'a>(
        &'a self,
        req: ListRequest<'a>,
    ) -> BoxFuture<'a, Result<Page<CallKey>, BackendError>> {
        let page = page_of(
            self.locks.held_keys(),
            req.operation,
            true,
            req.cursor,
            req.page_size(),
        );
        Box::pin(std::future::ready(page))
    }

    fn list_records<'a>(
        &'a self,
        req: ListRequest<'a>,
    ) -> BoxFuture<'a, Result<Page<CallKey>, BackendError>> {
        let page = page_of(
            self.records.keys(),
            req.operation,
            true,
            req.cursor,
            req.page_size(),
        );
        Box::pin(std::future::ready(page))
    }

    fn list_namespace_locks<'a>(
        &'a self,
        req: NamespaceListRequest<'a>,
    ) -> BoxFuture<'a, Result<Page<CallKey>, BackendError>> {
        let page = page_of(
            self.locks.held_keys(),
            req.namespace,
            false,
            req.cursor,
            req.page_size(),
        );
        Box::pin(std::future::ready(page))
    }

    fn list_namespace_records<'a>(
        &'a self,
        req: NamespaceListRequest<'a>,
    ) -> BoxFuture<'a, Result<Page<CallKey>, BackendError>> {
        let page = page_of(
            self.records.keys(),
            req.namespace,
            false,
            req.cursor,
            req.page_size(),
        );
        Box::pin(std::future::ready(page))
    }

    fn force_release<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<ForcedRelease, BackendError>> {
        let outcome = self.locks.force_release(key.qualified());
        Box::pin(std::future::ready(Ok(outcome)))
    }
}

/// A page of at most `size` keys after `cursor`, out of `keys` (whole keys as the tables hold
/// them): the keys of `op`'s namespace, and with `only_op` only those of its operation.
pub(super) fn page_of(
    keys: Vec<Arc<str>>,
    op: &CallKey,
    only_op: bool,
    cursor: Option<&Cursor>,
    size: usize,
) -> Result<Page<CallKey>, BackendError> {
    let after = match cursor {
        None => None,
        Some(cursor) => Some(read_cursor(cursor).ok_or_else(|| {
            BackendError::new(
                BackendErrorKind::Config,
                format!("listing: `{cursor}` is not a cursor of the in-process provider"),
            )
            .with_key(op)
        })?),
    };
    // Everything before the shown form: the namespace and its `:`.
    let prefix = &op.qualified()[..op.qualified().len() - op.op_key().len()];
    let mut found: Vec<CallKey> = keys
        .iter()
        .filter_map(|full| full.strip_prefix(prefix))
        .filter(|shown| after.as_deref().is_none_or(|after| *shown > after))
        .filter_map(|shown| op.with_op_key(shown).ok())
        .filter(|key| !only_op || key.is_of_operation(op.op_key()))
        .collect();
    found.sort_unstable_by(|a, b| a.op_key().cmp(b.op_key()));
    let next = (found.len() > size).then(|| write_cursor(found[size - 1].op_key()));
    found.truncate(size);
    Ok(Page { items: found, next })
}

pub(super) fn write_cursor(after: &str) -> Cursor {
    let mut text = String::with_capacity(2 + after.len() * 2);
    text.push_str("m.");
    for b in after.bytes() {
        text.push_str(&format!("{b:02x}"));
    }
    Cursor::new(text)
}

pub(super) fn read_cursor(cursor: &Cursor) -> Option<String> {
    let hex = cursor.as_str().strip_prefix("m.")?;
    if hex.len() % 2 != 0 {
        return None;
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}
