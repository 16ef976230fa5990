//! Where a call key lives in Redis.
//!
//! A call key of namespace `ns`, shown as `op:parts`, becomes
//!
//! | what                     | Redis name                        |
//! |--------------------------|-----------------------------------|
//! | lock                     | `ns:lock:{op:parts}`              |
//! | forced-release marker    | `ns:lock-forced:{op:parts}`       |
//! | processes waiting (list) | `ns:lock-queue:{op:parts}`        |
//! | fencing counter          | `ns:fence:{op:parts}`             |
//! | idempotency record       | `ns:idem:{op:parts}`              |
//! | cached answer            | `ns:cache:{op:parts}`             |
//! | single-flight claim      | `ns:flight:{op:parts}`            |
//! | single-flight hand-over  | `ns:flight:{op:parts}:<leader>`   |
//! | semaphore permits        | `ns:sem:{op:parts}`               |
//! | semaphore tokens, counter| `ns:sem-tok:{op:parts}`           |
//! | read-write lock state    | `ns:rw:{op:parts}`                |
//! | read-write lock readers  | `ns:rw-r:{op:parts}`              |
//!
//! A release is announced on the pub/sub channel named like the lock key (or, to wake one
//! waiting process only, on `<lock key>#<process id>`), a settled record
//! on the channel named like the record key, a finished or abandoned flight on the channel
//! named like its claim (channels are not keys: the names cannot clash). A hand-over is named
//! after its leader's token (32 hex digits), so each flight's outcome has a name of its own.
//!
//! A forced-release marker holds the owner token of the last hold an operator forced free,
//! for the rest of that lease plus a minute, so the former holder's release or renewal can
//! report a forced release rather than a lapse.
//!
//! The braces are a Redis Cluster hash tag: every name of one call key hashes to the same slot,
//! so a script may touch the lock and its fencing counter together. Call keys never contain
//! braces (the key builder escapes them), so a user value cannot move a key to another slot.

use coord_core::CallKey;

/// The kinds of name of a lock (see the table above), for [`Names::set`].
pub(crate) const LOCK: &str = "lock";
pub(crate) const LOCK_FORCED: &str = "lock-forced";
pub(crate) const LOCK_QUEUE: &str = "lock-queue";
pub(crate) const FENCE: &str = "fence";

/// The Redis names of one call key.
#[derive(Debug, Clone)]
pub(crate) struct Names<'a> {
    namespace: &'a str,
    tag: &'a str,
}

impl<'a> Names<'a> {
    /// The names of `key`: its namespace, and its shown form (`operation:parts`) as the hash
    /// tag. Nothing is split: a [`CallKey`] never holds `{` or `}` (the key builder escapes
    /// them, and keys from an operator's text are refused when they hold one).
    pub(crate) fn of(key: &'a CallKey) -> Names<'a> {
        debug_assert!(!key.qualified().contains(['{', '}']));
        Names {
            namespace: key.namespace(),
            tag: key.op_key(),
        }
    }

    /// The names of `kinds` (`"lock"`, `"fence"`, ...), rendered into one buffer: one
    /// allocation for all the names one call sends, rather than one per name.
    pub(crate) fn set<const N: usize>(&self, kinds: [&str; N]) -> NameSet<N> {
        let each = self.namespace.len() + self.tag.len() + 4;
        let len = kinds.iter().map(|k| k.len() + each).sum();
        let mut text = String::with_capacity(len);
        let mut ends = [0; N];
        for (kind, end) in kinds.iter().zip(&mut ends) {
            text.push_str(self.namespace);
            text.push(':');
            text.push_str(kind);
            text.push_str(":{");
            text.push_str(self.tag);
            text.push('}');
            *end = text.len();
        }
        NameSet { text, ends }
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
        self.name(LOCK)
    }

    /// The marker naming the owner whose hold an operator forced free.
    pub(crate) fn forced(&self) -> String {
        self.name(LOCK_FORCED)
    }

    /// The ids of the processes waiting for the lock, in the order they will be woken.
    pub(crate) fn lock_queue(&self) -> String {
        self.name(LOCK_QUEUE)
    }

    pub(crate) fn fence(&self) -> String {
        self.name(FENCE)
    }

    pub(crate) fn record(&self) -> String {
        self.name("idem")
    }

    pub(crate) fn cache(&self) -> String {
        self.name("cache")
    }

    pub(crate) fn flight(&self) -> String {
        self.name("flight")
    }

    /// A semaphore's permits: a sorted set of owner → end of lease (server ms).
    pub(crate) fn semaphore(&self) -> String {
        self.name("sem")
    }

    /// A semaphore's permit tokens (a hash of owner → fencing token) and its fencing counter
    /// (field `f`), apart from the lock's counter of the same key.
    pub(crate) fn semaphore_tokens(&self) -> String {
        self.name("sem-tok")
    }

    /// A read-write lock's state: a hash of its writer, a waiting writer's claim, its readers'
    /// tokens and its fencing counter (shared by both modes), apart from the lock's.
    pub(crate) fn rw_lock(&self) -> String {
        self.name("rw")
    }

    /// A read-write lock's readers: a sorted set of owner → end of lease (server ms).
    pub(crate) fn rw_readers(&self) -> String {
        self.name("rw-r")
    }

    /// The hand-over of the flight led by `leader` (its token as 32 hex digits).
    pub(crate) fn flight_outcome(&self, leader: &str) -> String {
        let mut out = self.name("flight");
        out.push(':');
        out.push_str(leader);
        out
    }
}

/// Several Redis names of one call key in one buffer (see [`Names::set`]).
#[derive(Debug, Clone)]
pub(crate) struct NameSet<const N: usize> {
    text: String,
    ends: [usize; N],
}

impl<const N: usize> NameSet<N> {
    /// The `i`th name, in the order the kinds were given.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.text[start..self.ends[i]]
    }

    /// All the names, in order.
    #[inline]
    pub(crate) fn all(&self) -> [&str; N] {
        std::array::from_fn(|i| self.get(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let key = CallKey::builder("svc", "charge")
            .part(&42)
            .part("eu")
            .finish();
        let n = Names::of(&key);
        assert_eq!(n.lock(), "svc:lock:{charge:42:eu}");
        assert_eq!(n.forced(), "svc:lock-forced:{charge:42:eu}");
        assert_eq!(n.lock_queue(), "svc:lock-queue:{charge:42:eu}");
        assert_eq!(n.fence(), "svc:fence:{charge:42:eu}");
        assert_eq!(n.record(), "svc:idem:{charge:42:eu}");
        assert_eq!(n.cache(), "svc:cache:{charge:42:eu}");
        assert_eq!(n.flight(), "svc:flight:{charge:42:eu}");
        assert_eq!(n.flight_outcome("00ff"), "svc:flight:{charge:42:eu}:00ff");
        assert_eq!(n.semaphore(), "svc:sem:{charge:42:eu}");
        assert_eq!(n.semaphore_tokens(), "svc:sem-tok:{charge:42:eu}");
        assert_eq!(n.rw_lock(), "svc:rw:{charge:42:eu}");
        assert_eq!(n.rw_readers(), "svc:rw-r:{charge:42:eu}");
        // A brace in any input is escaped, so it never reaches a name.
        let key = CallKey::builder("s{v}", "a{b}").part("c}").finish();
        let n = Names::of(&key);
        assert_eq!(n.lock().matches('{').count(), 1);
        assert_eq!(n.lock().matches('}').count(), 1);
    }

    #[test]
    fn a_set_renders_each_name_as_alone() {
        let key = CallKey::builder("svc", "charge").part(&7).finish();
        let n = Names::of(&key);
        let set = n.set([LOCK, FENCE, LOCK_QUEUE, LOCK_FORCED]);
        assert_eq!(set.all(), [n.lock(), n.fence(), n.lock_queue(), n.forced()]);
        assert_eq!(set.get(2), "svc:lock-queue:{charge:7}");
        let one = n.set([LOCK]);
        assert_eq!(one.get(0), n.lock());
    }
}
