//! The key of one call as a value: built once, passed to every layer and provider as is.

use std::fmt;
use std::sync::Arc;

use crate::key_builder::{KeyBuilder, KeyPart};

/// The key of one call: a namespace, an operation name and the rendered key parts.
///
/// Built once per call (by the attributes, by `Coordinator::key`,
/// or by [`CallKey::builder`]) and handed to every layer and provider as this value; nothing
/// ever splits a key string back into its pieces.
///
/// # One form, shown and accepted
/// A key is shown as `operation:parts` (for example `payments.charge:order-7`): that is what
/// [`Display`](fmt::Display) prints and what `CoordError::key`,
/// `CallReport::key` and coord's log lines carry. The namespace is
/// the coordinator's and is not part of the shown form; [`CallKey::from_op_key`] turns a
/// shown key (pasted by an operator) back into a key of a given namespace, so
/// `Coordinator::purge_record` and operator tools accept
/// exactly what errors print.
///
/// # Promised
/// * The parts are rendered injectively (see [`KeyPart`]): two different tuples of part values
///   of one operation never give the same key.
/// * No key holds `{`, `}` or a control byte, so every backend name derived from one key lands
///   in one Redis Cluster slot and no value can reach the backend raw.
///
/// Cloning is cheap (one shared allocation). Equality and hashing compare the whole key,
/// namespace included.
#[derive(Clone)]
pub struct CallKey {
    /// `namespace:operation[:parts]`, as one allocation.
    full: Arc<str>,
    /// Where the shown form (`operation[:parts]`) starts in `full`. Offsets are `u32` to keep
    /// the key (and every error carrying one) small; see [`offset`].
    shown_from: u32,
    /// Where the operation name ends in `full`, when the key was built (not read from text).
    /// `NO_OP_END` when unknown.
    op_end: u32,
}

const NO_OP_END: u32 = u32::MAX;

/// An offset into a key as stored. A namespace or operation name of 4 GiB or more (which no
/// coordinator accepts, but the public builders must not panic on) degrades gracefully: the
/// namespace reads as empty and the operation as unknown, while the key's text, and so its
/// identity and backend names, stay exact.
fn offset(at: usize) -> Option<u32> {
    u32::try_from(at).ok().filter(|&at| at != NO_OP_END)
}

impl PartialEq for CallKey {
    fn eq(&self, other: &CallKey) -> bool {
        self.full == other.full
    }
}

impl Eq for CallKey {}

impl std::hash::Hash for CallKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.full.hash(state);
    }
}

impl PartialOrd for CallKey {
    fn partial_cmp(&self, other: &CallKey) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for CallKey {
    fn cmp(&self, other: &CallKey) -> std::cmp::Ordering {
        self.full.cmp(&other.full)
    }
}

impl CallKey {
    /// Starts the key of `operation` in `namespace`, for call sites without a coordinator at
    /// hand (provider tests, tools). The namespace and the operation name are written with the
    /// same escaping as the attributes use, so a key built here for a coordinator's namespace
    /// and an attribute's operation name equals the key the attribute builds.
    pub fn builder(namespace: &str, operation: &str) -> CallKeyBuilder {
        CallKeyBuilder::new(KeyBuilder::scratch(namespace), operation)
    }

    /// A key from its shown form `operation[:parts]` (what [`fmt::Display`] prints and errors
    /// carry), in `namespace`: the way an operator's input becomes a key.
    ///
    /// The text is taken as it is, not split, trimmed or re-rendered: it must be what coord
    /// printed. Refused: an empty key, a key starting or ending with `:`, and any text holding
    /// `{`, `}` or a control byte (tab, newline and the like included). Coord never prints such
    /// a key (key parts escape those bytes as `%XX`), and accepting one could address names
    /// outside coord's layout. A space is accepted: a key part holding one is printed with it.
    pub fn from_op_key(namespace: &str, op_key: &str) -> Result<CallKey, InvalidCallKey> {
        check_op_key(op_key)?;
        let mut full = KeyBuilder::scratch(namespace).into_shared().to_string();
        full.push(':');
        let shown_from = offset(full.len()).unwrap_or(0);
        full.push_str(op_key);
        Ok(CallKey {
            full: Arc::from(full),
            shown_from,
            op_end: NO_OP_END,
        })
    }

    /// The key shown as `op_key` in this key's namespace, checked like
    /// [`CallKey::from_op_key`]: how a provider that lists keys (it reads their shown forms
    /// back from the backend) turns what it found into keys, without escaping the namespace a
    /// second time.
    ///
    /// When this key was built for an operation (see [`CallKey::operation`]) and `op_key` is a
    /// key of that operation (the operation name alone, or followed by `:` and a part), the
    /// result knows its operation too.
    pub fn with_op_key(&self, op_key: &str) -> Result<CallKey, InvalidCallKey> {
        check_op_key(op_key)?;
        let shown_from = self.shown_from as usize;
        let mut full = String::with_capacity(shown_from + op_key.len());
        full.push_str(&self.full[..shown_from]);
        full.push_str(op_key);
        let op_end = self
            .operation()
            .filter(|op| is_key_of_operation(op_key, op))
            .map_or(NO_OP_END, |op| {
                offset(shown_from + op.len()).unwrap_or(NO_OP_END)
            });
        Ok(CallKey {
            full: Arc::from(full),
            shown_from: self.shown_from,
            op_end,
        })
    }

    /// True when this key belongs to the operation `operation` (written as coord writes an
    /// operation name into a key): its shown form is the name alone, or the name, `:` and a
    /// part. A part never starts with `:`, so the keys of `jobs` are told from those of
    /// `jobs::nightly`.
    pub fn is_of_operation(&self, operation: &str) -> bool {
        is_key_of_operation(self.op_key(), operation)
    }

    pub(crate) fn from_rendered(full: Arc<str>, shown_from: usize, op_end: usize) -> CallKey {
        debug_assert!(shown_from <= op_end && op_end <= full.len());
        debug_assert!(full.is_char_boundary(shown_from) && full.is_char_boundary(op_end));
        match (offset(shown_from), offset(op_end)) {
            (Some(shown_from), Some(op_end)) => CallKey {
                full,
                shown_from,
                op_end,
            },
            (Some(shown_from), None) => CallKey {
                full,
                shown_from,
                op_end: NO_OP_END,
            },
            (None, _) => CallKey {
                full,
                shown_from: 0,
                op_end: NO_OP_END,
            },
        }
    }

    /// The operation name as written into the key, when the key was built (by the attributes,
    /// [`CallKey::builder`] or `Coordinator::key`); `None` for a key
    /// read from text by [`CallKey::from_op_key`], whose operation name cannot be told from
    /// its parts.
    pub fn operation(&self) -> Option<&str> {
        (self.op_end != NO_OP_END)
            .then(|| &self.full[self.shown_from as usize..self.op_end as usize])
    }

    /// The operation name: [`CallKey::operation`] when the key knows it, else read from the
    /// shown form as everything before the first single `:` (a `::` belongs to the name,
    /// as in the module paths of default names: `app::jobs::nightly:t-7` is operation
    /// `app::jobs::nightly` with the part `t-7`).
    ///
    /// Reading is exact for every name the attributes accept (ASCII letters, digits, `.`,
    /// `_`, `-`, `/`, and `::` between module path segments), since a part never starts with
    /// `:`; a name given to the handle API that holds a single `:` is cut there.
    pub fn shown_operation(&self) -> &str {
        if let Some(op) = self.operation() {
            return op;
        }
        let shown = self.op_key();
        let bytes = shown.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b':' {
                if bytes.get(i + 1) == Some(&b':') {
                    i += 2;
                    continue;
                }
                return &shown[..i];
            }
            i += 1;
        }
        shown
    }

    /// The whole key ([`CallKey::qualified`]) as a shared string, for in-process tables that
    /// keep it without copying.
    pub fn shared(&self) -> &Arc<str> {
        &self.full
    }

    /// The namespace (the coordinator's), as written into backend names.
    pub fn namespace(&self) -> &str {
        // `shown_from` is one past the `:` that ends the namespace.
        &self.full[..(self.shown_from as usize).saturating_sub(1)]
    }

    /// The shown form, `operation[:parts]`: what [`fmt::Display`] prints.
    pub fn op_key(&self) -> &str {
        &self.full[self.shown_from as usize..]
    }

    /// The whole key, `namespace:operation[:parts]`: a unique name for the call across
    /// namespaces (what an in-process provider keys its tables by).
    pub fn qualified(&self) -> &str {
        &self.full
    }
}

/// Whether `op_key` (a shown form) is a key of the operation written as `operation`.
fn is_key_of_operation(op_key: &str, operation: &str) -> bool {
    match op_key.strip_prefix(operation) {
        Some("") => true,
        Some(rest) => rest.starts_with(':') && !rest[1..].starts_with(':') && rest.len() > 1,
        None => false,
    }
}

/// What [`CallKey::from_op_key`] refuses.
fn check_op_key(op_key: &str) -> Result<(), InvalidCallKey> {
    if op_key.is_empty() {
        return Err(InvalidCallKey("the key is empty"));
    }
    if op_key.starts_with(':') || op_key.ends_with(':') {
        return Err(InvalidCallKey(
            "a key neither starts nor ends with `:` (it is `operation[:parts]`)",
        ));
    }
    if op_key
        .bytes()
        .any(|b| matches!(b, b'{' | b'}') || b < 0x20 || b == 0x7f)
    {
        return Err(InvalidCallKey(
            "a key printed by coord holds no `{`, `}` or control character",
        ));
    }
    Ok(())
}

impl fmt::Display for CallKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.op_key())
    }
}

impl fmt::Debug for CallKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CallKey({:?})", self.qualified())
    }
}

impl PartialEq<str> for CallKey {
    /// Compares the shown form (`operation[:parts]`).
    fn eq(&self, other: &str) -> bool {
        self.op_key() == other
    }
}

impl PartialEq<&str> for CallKey {
    /// Compares the shown form (`operation[:parts]`).
    fn eq(&self, other: &&str) -> bool {
        self.op_key() == *other
    }
}

/// Builds a [`CallKey`] part by part. From [`CallKey::builder`] or
/// `Coordinator::key`.
#[derive(Debug)]
pub struct CallKeyBuilder {
    inner: KeyBuilder,
    shown_from: usize,
    op_end: usize,
}

impl CallKeyBuilder {
    pub(crate) fn new(namespace: KeyBuilder, operation: &str) -> CallKeyBuilder {
        let shown_from = namespace.rendered_len() + 1;
        let inner = namespace.raw_segment(operation);
        CallKeyBuilder {
            op_end: inner.rendered_len(),
            inner,
            shown_from,
        }
    }

    /// Appends one key part (rendered like the attributes render a `key_from` parameter).
    pub fn part<P: KeyPart + ?Sized>(mut self, part: &P) -> CallKeyBuilder {
        self.inner = self.inner.part(part);
        self
    }

    /// Appends one key part like [`CallKeyBuilder::part`], remembering `name` (the
    /// `key_from` path the attribute names) if the part renders an absent value, for the
    /// `MissingKey` error. What the attributes' generated code calls.
    #[doc(hidden)]
    #[inline]
    pub fn named_part<P: KeyPart + ?Sized>(
        mut self,
        name: &'static str,
        part: &P,
    ) -> CallKeyBuilder {
        self.inner = self.inner.named_part(name, part);
        self
    }

    /// True when some part rendered an absent value (`None`).
    #[inline]
    pub fn has_absent_part(&self) -> bool {
        self.inner.has_absent_part()
    }

    /// The `key_from` path of the first part that rendered an absent value, when it was
    /// appended with a name.
    #[inline]
    pub fn missing_part(&self) -> Option<&'static str> {
        self.inner.missing_part()
    }

    /// The finished key: one allocation, shared by every clone.
    #[inline]
    pub fn finish(self) -> CallKey {
        CallKey::from_rendered(self.inner.into_shared(), self.shown_from, self.op_end)
    }
}

/// The rendered start `namespace:operation` of every key of one operation in one namespace:
/// rendered (escaped) once, then copied as it is into each key built from it. The attributes
/// keep one per call site, so a call renders only its own parts.
///
/// A key built from a prefix equals the key [`CallKey::builder`] builds for the same namespace
/// and operation with the same parts.
#[derive(Debug, Clone)]
pub struct KeyPrefix {
    /// The namespace as given (unescaped), to tell whether a coordinator's namespace is this
    /// prefix's.
    namespace: Box<str>,
    /// `namespace:operation`, escaped as [`CallKey::builder`] escapes them.
    rendered: Box<str>,
    /// Where the operation name starts in `rendered`.
    shown_from: usize,
}

impl KeyPrefix {
    /// Renders the start of the keys of `operation` in `namespace`.
    pub fn new(namespace: &str, operation: &str) -> KeyPrefix {
        let builder = CallKey::builder(namespace, operation);
        let shown_from = builder.shown_from;
        let rendered = builder.inner.rendered().into();
        builder.inner.recycle();
        KeyPrefix {
            namespace: namespace.into(),
            rendered,
            shown_from,
        }
    }

    /// The namespace this prefix was rendered for, as given.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Starts a key with this prefix: what [`CallKey::builder`] returns for the prefix's
    /// namespace and operation, without escaping either again.
    #[inline]
    pub fn builder(&self) -> CallKeyBuilder {
        CallKeyBuilder {
            inner: KeyBuilder::scratch_rendered(&self.rendered),
            shown_from: self.shown_from,
            op_end: self.rendered.len(),
        }
    }
}

/// Text that is not a key coord printed: see [`CallKey::from_op_key`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidCallKey(&'static str);

impl fmt::Display for InvalidCallKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a coord key: {}", self.0)
    }
}

impl std::error::Error for InvalidCallKey {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operation_is_read_back_from_the_shown_form() {
        for (op, parts, shown) in [
            ("app::jobs::nightly", &["t-7"][..], "app::jobs::nightly:t-7"),
            (
                "payments.charge",
                &["order 7", "eu"][..],
                "payments.charge:order 7:eu",
            ),
            ("app::nightly", &[][..], "app::nightly"),
            ("jobs/rebuild", &["a:b"][..], "jobs/rebuild:a%3Ab"),
        ] {
            let built = parts
                .iter()
                .fold(CallKey::builder("ns", op), |b, p| b.part(*p))
                .finish();
            assert_eq!(built.to_string(), shown);
            assert_eq!(built.shown_operation(), op, "a built key knows it");
            let read = CallKey::from_op_key("ns", shown).unwrap();
            assert_eq!(read.operation(), None);
            assert_eq!(
                read.shown_operation(),
                op,
                "and a key read from text finds it"
            );
        }
    }

    #[test]
    fn builder_and_shown_form_round_trip() {
        let key = CallKey::builder("svc", "payments.charge")
            .part("order:7")
            .part(&42u32)
            .finish();
        assert_eq!(key.namespace(), "svc");
        assert_eq!(key.op_key(), "payments.charge:order%3A7:42");
        assert_eq!(key.qualified(), "svc:payments.charge:order%3A7:42");
        assert_eq!(key.to_string(), key.op_key());
        assert_eq!(key.operation(), Some("payments.charge"));
        let back = CallKey::from_op_key("svc", &key.to_string()).unwrap();
        assert_eq!(back, key);
        assert_eq!(back.operation(), None);
        assert_ne!(CallKey::from_op_key("other", key.op_key()).unwrap(), key);
    }

    #[test]
    fn shown_forms_coord_never_prints_are_refused() {
        for bad in ["", ":a", "a:", "a{b}", "a\nb", "a\tb", "a\u{7f}", "op:x\n"] {
            assert!(CallKey::from_op_key("svc", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_key_coord_prints_is_accepted_back() {
        let parts = [
            "a b",
            " leading",
            "trailing ",
            "tab\there",
            "colon:brace{}",
            "",
            "100%",
            "naïve",
        ];
        for part in parts {
            let key = CallKey::builder("svc", "op").part(part).finish();
            let back = CallKey::from_op_key("svc", &key.to_string())
                .unwrap_or_else(|e| panic!("{key} ({part:?}) refused: {e}"));
            assert_eq!(back, key, "{part:?}");
        }
    }

    #[test]
    fn keys_read_back_in_a_namespace_keep_it_exactly() {
        // `%` is escaped in a namespace: reading a shown form back through the namespace text
        // would escape it twice, so listing providers use `with_op_key`.
        let op = CallKey::builder("a%b", "jobs").finish();
        let built = CallKey::builder("a%b", "jobs").part(&7).finish();
        let read = op.with_op_key(built.op_key()).unwrap();
        assert_eq!(read, built);
        assert_eq!(read.operation(), Some("jobs"));
        let other = op.with_op_key("jobs::nightly:7").unwrap();
        assert_eq!(other.operation(), None, "a key of another operation");
        assert!(op.with_op_key("jobs:{7}").is_err());
        assert!(built.is_of_operation("jobs"));
        assert!(op.is_of_operation("jobs"));
        assert!(!other.is_of_operation("jobs"));
        assert!(!built.is_of_operation("job"));
        assert!(other.is_of_operation("jobs::nightly"));
    }

    #[test]
    fn a_key_built_from_a_prefix_equals_one_built_whole() {
        for (ns, op) in [
            ("svc", "payments.charge"),
            ("a{b}%c", "app::jobs::nightly"),
            ("", ""),
        ] {
            let prefix = KeyPrefix::new(ns, op);
            assert_eq!(prefix.namespace(), ns);
            for part in ["order:7", "", "x"] {
                let whole = CallKey::builder(ns, op).part(part).part(&7u64).finish();
                let from_prefix = prefix.builder().part(part).part(&7u64).finish();
                assert_eq!(from_prefix, whole);
                assert_eq!(from_prefix.qualified(), whole.qualified());
                assert_eq!(from_prefix.op_key(), whole.op_key());
                assert_eq!(from_prefix.namespace(), whole.namespace());
                assert_eq!(from_prefix.operation(), whole.operation());
            }
            assert_eq!(prefix.builder().finish(), CallKey::builder(ns, op).finish());
        }
    }

    #[test]
    fn a_key_is_as_small_as_a_string() {
        assert_eq!(size_of::<CallKey>(), size_of::<String>());
    }

    #[test]
    fn namespaces_are_escaped_like_segments() {
        let key = CallKey::builder("a{b}", "op").finish();
        assert!(!key.qualified().contains(['{', '}']));
        assert_eq!(key.op_key(), "op");
    }
}
