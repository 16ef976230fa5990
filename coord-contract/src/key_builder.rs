//! Call keys: how parameter values become the key that every layer of a call shares.
//!
//! A call key is `<operation name>:<part>:<part>…`. Each part is rendered by [`KeyPart`]. The
//! rendering is locale-free and injective: for one operation, two different tuples of part
//! values never give the same key. Strings are escaped so that no value can forge a separator
//! (`:`), a Redis Cluster hash tag (`{`, `}`), or an escape (`%`), and control bytes never reach
//! the backend.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::rc::Rc;
use std::sync::Arc;

/// A value that can be part of a call key.
///
/// Implemented for integers, `bool`, `char`, `str`/`String`, references and smart pointers of
/// them, `Option<T>` and (feature `uuid`) `uuid::Uuid`. Implement it for your own identifier
/// types by delegating to one of those, e.g. `self.0.write_key_part(out)`.
///
/// # Contract
/// `write_key_part` appends one rendering to `out` and must be injective over the values of the
/// type: two different values must append different text. Write user-controlled text only
/// through [`KeyWriter::push_str`], which escapes it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be part of a coord key",
    label = "this key parameter's type does not implement `coord_core::KeyPart`",
    note = "key parts must render to stable text: use an integer, bool, char, string, Option or Uuid parameter, name a field of one (`key_from = \"order.customer_id\"`), or implement `coord_core::KeyPart` for `{Self}`"
)]
pub trait KeyPart {
    /// Appends this value's rendering to `out`.
    fn write_key_part(&self, out: &mut KeyWriter);
}

/// The buffer a key is rendered into. Text goes through [`KeyWriter::push_str`], which escapes it.
#[derive(Debug)]
pub struct KeyWriter {
    buf: String,
    /// Set when an absent value (`None`) was rendered: such a key cannot tell one caller's
    /// missing idempotency key from another's.
    absent: bool,
}

/// Whether [`KeyWriter::push_escaped`] escapes `:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Separators {
    /// Parts: a `:` in a value must never read as a separator.
    Escape,
    /// Segments (namespace, operation name): `:` is kept, module paths hold `::`.
    Keep,
}

/// Bytes that never appear unescaped in a rendered part.
const fn needs_escape(b: u8) -> bool {
    matches!(b, b':' | b'{' | b'}' | b'%') || b < 0x20 || b == 0x7f
}

/// [`needs_escape`] for every byte, and the same with `:` kept (segments): one lookup per byte
/// on the path every call's key takes.
const ESCAPED: [[bool; 256]; 2] = {
    let mut table = [[false; 256]; 2];
    let mut b = 0;
    while b < 256 {
        let escaped = needs_escape(b as u8);
        table[0][b] = escaped;
        table[1][b] = escaped && b != b':' as usize;
        b += 1;
    }
    table
};

impl KeyWriter {
    /// Appends `text`, escaping `:`, `{`, `}`, `%` and control bytes as `%XX`.
    pub fn push_str(&mut self, text: &str) {
        self.push_escaped(text, Separators::Escape);
    }

    /// The one escaper of key text: every byte [`needs_escape`] names becomes `%XX`, except
    /// `:` when `separators` keeps it (operation names and namespaces, which may hold module
    /// paths).
    fn push_escaped(&mut self, text: &str, separators: Separators) {
        let escaped = &ESCAPED[usize::from(separators == Separators::Keep)];
        let bytes = text.as_bytes();
        // Most text needs no escaping: find the first byte that does before copying anything.
        let Some(first) = bytes.iter().position(|&b| escaped[usize::from(b)]) else {
            self.buf.push_str(text);
            return;
        };
        let mut start = 0;
        for (i, &b) in bytes.iter().enumerate().skip(first) {
            if escaped[usize::from(b)] {
                self.buf.push_str(&text[start..i]);
                let _ = write!(self.buf, "%{b:02X}");
                start = i + 1;
            }
        }
        self.buf.push_str(&text[start..]);
    }

    /// Appends text known to need no escaping (digits, fixed words, and the `%-`, `%+`, `%_`
    /// markers, which escaping never produces). Debug builds check it.
    fn push_plain(&mut self, text: &str) {
        debug_assert!(!text.bytes().any(|b| b != b'%' && needs_escape(b)));
        self.buf.push_str(text);
    }

    /// Records that the value being written is absent (`None`). The `Option` implementation
    /// calls it; implement `KeyPart` for your own optional identifier by delegating to
    /// `Option`, or call this when your type renders "no value". On `#[idempotent]`, a key with
    /// an absent part is refused (`CoordError::MissingKey`) instead of shared.
    pub fn mark_absent(&mut self) {
        self.absent = true;
    }

    fn len(&self) -> usize {
        self.buf.len()
    }

    fn starts_at(&self, at: usize, prefix: &str) -> bool {
        self.buf[at..].starts_with(prefix)
    }

    fn insert_plain(&mut self, at: usize, text: &str) {
        self.buf.insert_str(at, text);
    }
}

/// Renders a call key into a buffer: the one renderer behind [`CallKeyBuilder`](crate::CallKeyBuilder).
#[derive(Debug)]
pub(crate) struct KeyBuilder {
    writer: KeyWriter,
    /// The `key_from` path of the first part that rendered an absent value, when named.
    missing: Option<&'static str>,
}

impl KeyBuilder {
    /// Appends one part, after a `:` separator. A part that renders to nothing (an empty
    /// string) is written `%_`, so parts are never empty and `::` never appears after the
    /// operation name: names built from module paths cannot run into another op's parts.
    #[inline]
    pub(crate) fn part<P: KeyPart + ?Sized>(mut self, part: &P) -> KeyBuilder {
        self.writer.buf.push(':');
        let before = self.writer.len();
        part.write_key_part(&mut self.writer);
        if self.writer.len() == before {
            self.writer.push_plain("%_");
        }
        self
    }

    /// Appends one part like [`KeyBuilder::part`], remembering `name` (the `key_from` path the
    /// macros saw) if the part renders an absent value, for the `MissingKey` error.
    #[inline]
    pub(crate) fn named_part<P: KeyPart + ?Sized>(
        self,
        name: &'static str,
        part: &P,
    ) -> KeyBuilder {
        let was_absent = self.writer.absent;
        let mut this = self.part(part);
        if !was_absent && this.writer.absent && this.missing.is_none() {
            this.missing = Some(name);
        }
        this
    }

    /// True when some part rendered an absent value (`None`).
    #[inline]
    pub(crate) fn has_absent_part(&self) -> bool {
        self.writer.absent
    }

    /// The `key_from` path of the first absent part, when the macros named it.
    #[inline]
    pub(crate) fn missing_part(&self) -> Option<&'static str> {
        self.missing
    }

    /// Appends `segment` after a `:` separator. For operation names: the macros check them at
    /// compile time (ASCII letters, digits, `.`, `_`, `-`, `/`, or a module path with `::`),
    /// and such names are appended as they are.
    ///
    /// `:` is kept (module paths hold `::`), so a segment is only as injective as the names the
    /// macros accept: a segment holding a single `:` can read like a segment plus a part. What
    /// the macros never accept is escaped like a part's text (`{`, `}`, `%` and control bytes
    /// as `%XX`), so no segment, whatever it holds, can move a key to another Redis Cluster
    /// hash slot or put a control byte into it. An empty segment is written `%_`, as an empty
    /// part is, so a key never ends in a bare separator.
    pub(crate) fn raw_segment(mut self, segment: &str) -> KeyBuilder {
        self.writer.buf.push(':');
        self.write_segment(segment);
        self
    }

    /// Writes `segment` with the escaping [`KeyBuilder::raw_segment`] describes.
    fn write_segment(&mut self, segment: &str) {
        if segment.is_empty() {
            self.writer.push_plain("%_");
            return;
        }
        self.writer.push_escaped(segment, Separators::Keep);
    }

    /// How long the rendered text is so far.
    pub(crate) fn rendered_len(&self) -> usize {
        self.writer.len()
    }

    /// Starts a key in `namespace` (escaped like a segment; the operation name and the parts
    /// follow) in this thread's scratch buffer, for [`KeyBuilder::into_shared`].
    pub(crate) fn scratch(namespace: &str) -> KeyBuilder {
        let mut buf = SCRATCH.with(|cell| cell.take());
        buf.clear();
        let mut builder = KeyBuilder {
            writer: KeyWriter { buf, absent: false },
            missing: None,
        };
        builder.write_segment(namespace);
        builder
    }

    /// Starts a key with `rendered`, text this module rendered before (a namespace, `:` and an
    /// operation name, see [`KeyPrefix`](crate::KeyPrefix)), copied as it is, in this thread's
    /// scratch buffer.
    #[inline]
    pub(crate) fn scratch_rendered(rendered: &str) -> KeyBuilder {
        let mut buf = SCRATCH.with(|cell| cell.take());
        buf.clear();
        buf.push_str(rendered);
        KeyBuilder {
            writer: KeyWriter { buf, absent: false },
            missing: None,
        }
    }

    /// The text rendered so far.
    pub(crate) fn rendered(&self) -> &str {
        &self.writer.buf
    }

    /// Gives the buffer back to the thread's scratch slot, unused.
    pub(crate) fn recycle(self) {
        let buf = self.writer.buf;
        if buf.capacity() <= 1024 {
            SCRATCH.with(|cell| cell.set(buf));
        }
    }

    /// The rendered text in one shared allocation; the buffer goes back to the thread's
    /// scratch slot, so building a call key costs one allocation.
    pub(crate) fn into_shared(self) -> Arc<str> {
        let key: Arc<str> = Arc::from(self.writer.buf.as_str());
        let buf = self.writer.buf;
        if buf.capacity() <= 1024 {
            SCRATCH.with(|cell| cell.set(buf));
        }
        key
    }
}

thread_local! {
    /// A reusable key buffer. Taken out while a key is built (so a nested build just starts a
    /// fresh one) and put back afterwards.
    static SCRATCH: std::cell::Cell<String> = const { std::cell::Cell::new(String::new()) };
}

/// The shown form of operation `name`'s key with `parts`, in namespace `ns` (tests).
#[cfg(test)]
fn render_key(name: &str, parts: &[&dyn KeyPart]) -> String {
    let key = parts
        .iter()
        .fold(KeyBuilder::scratch("ns").raw_segment(name), |b, p| {
            b.part(*p)
        })
        .into_shared();
    key["ns:".len()..].to_owned()
}

macro_rules! int_key_part {
    ($($t:ty),*) => {$(
        impl KeyPart for $t {
            fn write_key_part(&self, out: &mut KeyWriter) {
                // Decimal, no grouping, no locale: `-` and digits only.
                let mut digits = [0u8; 40];
                let text = format_int(*self as i128, &mut digits);
                out.push_plain(text);
            }
        }
    )*};
}

fn format_int(value: i128, buf: &mut [u8; 40]) -> &str {
    let negative = value < 0;
    let magnitude = value.unsigned_abs();
    let mut at = buf.len();
    // 64-bit division where the value fits (every integer type but the 128-bit ones, always):
    // dividing a `u128` is a library call per digit.
    match u64::try_from(magnitude) {
        Ok(mut small) => loop {
            at -= 1;
            buf[at] = b'0' + (small % 10) as u8;
            small /= 10;
            if small == 0 {
                break;
            }
        },
        Err(_) => {
            let mut large = magnitude;
            loop {
                at -= 1;
                buf[at] = b'0' + (large % 10) as u8;
                large /= 10;
                if large == 0 {
                    break;
                }
            }
        }
    }
    if negative {
        at -= 1;
        buf[at] = b'-';
    }
    // Only ASCII digits and '-' were written.
    std::str::from_utf8(&buf[at..]).expect("ASCII digits")
}

int_key_part!(i8, i16, i32, i64, isize, u8, u16, u32, u64, usize);

impl KeyPart for i128 {
    fn write_key_part(&self, out: &mut KeyWriter) {
        let mut digits = [0u8; 40];
        out.push_plain(format_int(*self, &mut digits));
    }
}

impl KeyPart for u128 {
    fn write_key_part(&self, out: &mut KeyWriter) {
        if let Ok(small) = i128::try_from(*self) {
            small.write_key_part(out);
        } else {
            out.push_plain(&self.to_string());
        }
    }
}

impl KeyPart for bool {
    fn write_key_part(&self, out: &mut KeyWriter) {
        out.push_plain(if *self { "true" } else { "false" });
    }
}

impl KeyPart for char {
    fn write_key_part(&self, out: &mut KeyWriter) {
        let mut utf8 = [0u8; 4];
        out.push_str(self.encode_utf8(&mut utf8));
    }
}

impl KeyPart for str {
    fn write_key_part(&self, out: &mut KeyWriter) {
        out.push_str(self);
    }
}

impl KeyPart for String {
    fn write_key_part(&self, out: &mut KeyWriter) {
        out.push_str(self);
    }
}

impl<T: KeyPart + ?Sized> KeyPart for &T {
    fn write_key_part(&self, out: &mut KeyWriter) {
        (**self).write_key_part(out);
    }
}

impl<T: KeyPart + ?Sized> KeyPart for &mut T {
    fn write_key_part(&self, out: &mut KeyWriter) {
        (**self).write_key_part(out);
    }
}

impl<T: KeyPart + ?Sized> KeyPart for Box<T> {
    fn write_key_part(&self, out: &mut KeyWriter) {
        (**self).write_key_part(out);
    }
}

impl<T: KeyPart + ?Sized> KeyPart for Arc<T> {
    fn write_key_part(&self, out: &mut KeyWriter) {
        (**self).write_key_part(out);
    }
}

impl<T: KeyPart + ?Sized> KeyPart for Rc<T> {
    fn write_key_part(&self, out: &mut KeyWriter) {
        (**self).write_key_part(out);
    }
}

impl<T: KeyPart + ToOwned + ?Sized> KeyPart for Cow<'_, T> {
    fn write_key_part(&self, out: &mut KeyWriter) {
        self.as_ref().write_key_part(out);
    }
}

/// `None` renders as `%-`. `Some(v)` renders as `v` does, unless that text begins with `%-` or
/// `%+` (only possible for nested options), in which case it gets a `%+` prefix. Escaped text
/// only ever holds `%` before two hex digits, so `None`, plain `Some` and prefixed `Some` can
/// never meet.
impl<T: KeyPart> KeyPart for Option<T> {
    fn write_key_part(&self, out: &mut KeyWriter) {
        match self {
            None => {
                out.mark_absent();
                out.push_plain("%-");
            }
            Some(value) => {
                let at = out.len();
                value.write_key_part(out);
                if out.starts_at(at, "%-") || out.starts_at(at, "%+") {
                    out.insert_plain(at, "%+");
                }
            }
        }
    }
}

#[cfg(feature = "uuid")]
impl KeyPart for uuid::Uuid {
    fn write_key_part(&self, out: &mut KeyWriter) {
        let mut buf = uuid::Uuid::encode_buffer();
        out.push_plain(self.hyphenated().encode_lower(&mut buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key2(a: &str, b: &str) -> String {
        render_key("op", &[&a, &b])
    }

    #[test]
    fn separators_and_hash_tags_are_escaped() {
        assert_eq!(key2("a:b", "c"), "op:a%3Ab:c");
        assert_eq!(key2("a", "b:c"), "op:a:b%3Ac");
        assert_eq!(key2("{tag}", "%"), "op:%7Btag%7D:%25");
        assert_eq!(key2("\n\0", "é"), "op:%0A%00:é");
        assert_eq!(key2("", "x"), "op:%_:x");
    }

    #[test]
    fn integers_render_plain_decimal() {
        let key = render_key("op", &[&-12i64, &u128::MAX, &i128::MIN]);
        assert_eq!(
            key,
            format!("op:-12:{}:{}", u128::MAX, i128::MIN),
            "integers must render as plain decimal"
        );
    }

    #[test]
    fn options_distinguish_none_from_every_some() {
        let none: Option<Option<&str>> = None;
        let some_none: Option<Option<&str>> = Some(None);
        let some_some: Option<Option<&str>> = Some(Some("%-"));
        let keys = [
            render_key("op", &[&none]),
            render_key("op", &[&some_none]),
            render_key("op", &[&some_some]),
        ];
        assert_ne!(keys[0], keys[1]);
        assert_ne!(keys[1], keys[2]);
        assert_ne!(keys[0], keys[2]);
    }

    proptest! {
        #[test]
        fn string_pairs_render_injectively(a in any::<String>(), b in any::<String>(), c in any::<String>(), d in any::<String>()) {
            prop_assume!((a.as_str(), b.as_str()) != (c.as_str(), d.as_str()));
            prop_assert_ne!(key2(&a, &b), key2(&c, &d));
        }

        #[test]
        fn hostile_strings_render_injectively(a in "[:{}%\\x00-\\x1f a]{0,6}", b in "[:{}%\\x00-\\x1f a]{0,6}", c in "[:{}%\\x00-\\x1f a]{0,6}", d in "[:{}%\\x00-\\x1f a]{0,6}") {
            prop_assume!((a.as_str(), b.as_str()) != (c.as_str(), d.as_str()));
            prop_assert_ne!(key2(&a, &b), key2(&c, &d));
        }

        #[test]
        fn rendered_parts_never_hold_raw_separators_or_tags(a in any::<String>()) {
            let key = render_key("op", &[&a]);
            let part = &key["op:".len()..];
            let forged = part.contains(':') || part.contains('{') || part.contains('}');
            prop_assert!(!forged, "part {:?} holds a raw separator or hash tag", part);
            prop_assert!(!part.bytes().any(|b| b < 0x20));
        }

        #[test]
        fn mixed_tuples_render_injectively(
            a in any::<(i64, Option<String>, bool, char)>(),
            b in any::<(i64, Option<String>, bool, char)>(),
        ) {
            prop_assume!(a != b);
            let ka = render_key("op", &[&a.0, &a.1, &a.2, &a.3]);
            let kb = render_key("op", &[&b.0, &b.1, &b.2, &b.3]);
            prop_assert_ne!(ka, kb);
        }

        #[test]
        fn nested_options_render_injectively(
            a in any::<Option<Option<String>>>(),
            b in any::<Option<Option<String>>>(),
        ) {
            prop_assume!(a != b);
            prop_assert_ne!(render_key("op", &[&a]), render_key("op", &[&b]));
        }

        #[test]
        fn integers_render_like_display(v in any::<i128>(), u in any::<u64>()) {
            prop_assert_eq!(render_key("op", &[&v]), format!("op:{v}"));
            prop_assert_eq!(render_key("op", &[&u]), format!("op:{u}"));
        }
    }
}
