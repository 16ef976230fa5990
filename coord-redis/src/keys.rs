//! Where a call key lives in Redis.
//!
//! A call key `ns:op:parts` becomes
//!
//! | what                     | Redis name                        |
//! |--------------------------|-----------------------------------|
//! | lock                     | `ns:lock:{op:parts}`              |
//! | fencing counter          | `ns:fence:{op:parts}`             |
//! | idempotency record       | `ns:idem:{op:parts}`              |
//!
//! A release is announced on the pub/sub channel named like the lock key, a settled record
//! on the channel named like the record key (channels are not keys: the names cannot clash).
//!
//! The braces are a Redis Cluster hash tag: every name of one call key hashes to the same slot,
//! so a script may touch the lock and its fencing counter together. Call keys never contain
//! braces (the key builder escapes them), so a user value cannot move a key to another slot.

use coord_core::{BackendError, BackendErrorKind};

/// The Redis names of one call key.
#[derive(Debug, Clone)]
pub(crate) struct Names<'a> {
    namespace: &'a str,
    tag: &'a str,
}

impl<'a> Names<'a> {
    /// Splits `key` at its first `:` into namespace and the rest (which becomes the hash tag).
    pub(crate) fn of(key: &'a str) -> Result<Names<'a>, BackendError> {
        let (namespace, tag) = key.split_once(':').unwrap_or(("", key));
        // A brace anywhere (the namespace included) would move a name's hash tag, and the
        // lock, fence and record of one call could then land in different cluster slots.
        if tag.is_empty() || key.contains(['{', '}']) {
            return Err(BackendError::new(
                BackendErrorKind::Config,
                "a call key must be `namespace:op[:parts]` without `{` or `}`",
            )
            .with_key(key));
        }
        Ok(Names { namespace, tag })
    }

    fn name(&self, kind: &str) -> String {
        let mut out = String::with_capacity(self.namespace.len() + kind.len() + self.tag.len() + 4);
        out.push_str(self.namespace);
        out.push(':');
        out.push_str(kind);
        out.push_str(":{");
        out.push_str(self.tag);
        out.push('}');
        out
    }

    pub(crate) fn lock(&self) -> String {
        self.name("lock")
    }

    pub(crate) fn fence(&self) -> String {
        self.name("fence")
    }

    pub(crate) fn record(&self) -> String {
        self.name("idem")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let n = Names::of("svc:charge:42:eu").unwrap();
        assert_eq!(n.lock(), "svc:lock:{charge:42:eu}");
        assert_eq!(n.fence(), "svc:fence:{charge:42:eu}");
        assert_eq!(n.record(), "svc:idem:{charge:42:eu}");
        assert!(Names::of("svc:").is_err());
        assert!(Names::of("svc:a{b}").is_err());
    }
}
