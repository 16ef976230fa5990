//! Reading the `Idempotency-Key` header: the structured-field string form and the bare form.

use std::fmt;

use http::HeaderMap;
use http::header::{GetAll, HeaderName, HeaderValue};

/// The longest key accepted, in characters (the key is ASCII, so also in bytes).
pub const MAX_KEY_LEN: usize = 255;

/// An idempotency key as the client sent it, without the structured-field quoting.
///
/// Always 1 to [`MAX_KEY_LEN`] visible ASCII characters (`!` to `~`). `"abc"` and `abc` in the
/// header give the same key.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The key's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a request's idempotency key was refused (each is answered `400 Bad Request`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The header is absent and the layer requires it.
    Missing,
    /// The header appears more than once: which one counts would be a guess.
    Repeated,
    /// The header, or the string inside its quotes, is empty.
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`] characters.
    TooLong,
    /// The key has a character outside visible ASCII (`!` to `~`): a space, a control byte or
    /// anything non-ASCII.
    NotVisibleAscii,
    /// The value starts with `"` but is not a well-formed structured-field string (no closing
    /// quote, an escape other than `\"` or `\\`, or text after the closing quote).
    MalformedString,
}

impl KeyError {
    /// A sentence for the client, naming the header.
    pub(crate) fn describe(self, header: &HeaderName) -> String {
        match self {
            KeyError::Missing => format!("this request needs an `{header}` header"),
            KeyError::Repeated => format!("the `{header}` header appears more than once"),
            KeyError::Empty => format!("the `{header}` header is empty"),
            KeyError::TooLong => {
                format!("the `{header}` key is longer than {MAX_KEY_LEN} characters")
            }
            KeyError::NotVisibleAscii => {
                format!("the `{header}` key may only contain visible ASCII characters (`!` to `~`)")
            }
            KeyError::MalformedString => format!(
                "the `{header}` header starts with a quote but is not a valid structured-field string"
            ),
        }
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            KeyError::Missing => "idempotency key missing",
            KeyError::Repeated => "idempotency key header repeated",
            KeyError::Empty => "idempotency key empty",
            KeyError::TooLong => "idempotency key too long",
            KeyError::NotVisibleAscii => "idempotency key has characters outside visible ASCII",
            KeyError::MalformedString => "idempotency key is a malformed structured-field string",
        };
        f.write_str(text)
    }
}

impl std::error::Error for KeyError {}

/// Reads the key from the request's headers: `Ok(None)` when the header is absent.
pub(crate) fn key_from_headers(
    headers: &HeaderMap,
    name: &HeaderName,
) -> Result<Option<IdempotencyKey>, KeyError> {
    let values: GetAll<'_, HeaderValue> = headers.get_all(name);
    let mut iter = values.iter();
    let Some(first) = iter.next() else {
        return Ok(None);
    };
    if iter.next().is_some() {
        return Err(KeyError::Repeated);
    }
    parse_key(first.as_bytes()).map(Some)
}

/// Parses one header value: a structured-field string (`"abc"`, RFC 9651 §3.3.3, with `\"`
/// and `\\` escapes) or the bare key (`abc`). Surrounding spaces are ignored, as structured
/// fields allow.
///
/// The key itself must be 1 to [`MAX_KEY_LEN`] visible ASCII characters, in either form: a
/// space inside the quotes is refused like one outside them.
pub fn parse_key(value: &[u8]) -> Result<IdempotencyKey, KeyError> {
    let value = trim_spaces(value);
    let key = if value.first() == Some(&b'"') {
        unquote(value)?
    } else {
        value.to_vec()
    };
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if !key.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(KeyError::NotVisibleAscii);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong);
    }
    // Only visible ASCII is left, which is UTF-8.
    Ok(IdempotencyKey(
        String::from_utf8(key).map_err(|_| KeyError::NotVisibleAscii)?,
    ))
}

fn trim_spaces(mut value: &[u8]) -> &[u8] {
    while let [b' ', rest @ ..] = value {
        value = rest;
    }
    while let [rest @ .., b' '] = value {
        value = rest;
    }
    value
}

/// The content of a structured-field string that starts at `value[0] == '"'` and must end the
/// value. Characters a structured-field string may not carry (controls, non-ASCII) are kept,
/// for the visible-ASCII check to name.
fn unquote(value: &[u8]) -> Result<Vec<u8>, KeyError> {
    let mut out = Vec::with_capacity(value.len());
    let mut bytes = value[1..].iter();
    loop {
        match bytes.next() {
            None => return Err(KeyError::MalformedString),
            Some(b'\\') => match bytes.next() {
                Some(&escaped @ (b'"' | b'\\')) => out.push(escaped),
                _ => return Err(KeyError::MalformedString),
            },
            Some(b'"') => {
                return if bytes.as_slice().is_empty() {
                    Ok(out)
                } else {
                    Err(KeyError::MalformedString)
                };
            }
            Some(&b) => out.push(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(value: &str) -> String {
        parse_key(value.as_bytes()).unwrap().as_str().to_owned()
    }

    fn err(value: &[u8]) -> KeyError {
        parse_key(value).unwrap_err()
    }

    #[test]
    fn bare_and_quoted_forms_give_the_same_key() {
        assert_eq!(ok("abc-123"), "abc-123");
        assert_eq!(ok("\"abc-123\""), "abc-123");
        assert_eq!(ok("  \"abc\"  "), "abc");
        assert_eq!(ok(" abc "), "abc");
    }

    #[test]
    fn escapes_inside_quotes() {
        assert_eq!(ok(r#""a\"b\\c""#), r#"a"b\c"#);
        assert_eq!(err(br#""a\nb""#), KeyError::MalformedString);
        assert_eq!(err(br#""abc\""#), KeyError::MalformedString);
    }

    #[test]
    fn a_quote_must_be_closed_and_end_the_value() {
        assert_eq!(err(b"\"abc"), KeyError::MalformedString);
        assert_eq!(err(b"\"abc\"def"), KeyError::MalformedString);
        assert_eq!(err(b"\"abc\";p=1"), KeyError::MalformedString);
        // A quote inside a bare key is just a character.
        assert_eq!(ok("ab\"c"), "ab\"c");
    }

    #[test]
    fn empty_keys() {
        assert_eq!(err(b""), KeyError::Empty);
        assert_eq!(err(b"   "), KeyError::Empty);
        assert_eq!(err(b"\"\""), KeyError::Empty);
    }

    #[test]
    fn length_limit_is_255_characters() {
        let longest = "k".repeat(MAX_KEY_LEN);
        assert_eq!(ok(&longest), longest);
        assert_eq!(ok(&format!("\"{longest}\"")), longest);
        let too_long = "k".repeat(MAX_KEY_LEN + 1);
        assert_eq!(err(too_long.as_bytes()), KeyError::TooLong);
        assert_eq!(err(format!("\"{too_long}\"").as_bytes()), KeyError::TooLong);
    }

    #[test]
    fn only_visible_ascii() {
        assert_eq!(err(b"a b"), KeyError::NotVisibleAscii);
        assert_eq!(err(b"\"a b\""), KeyError::NotVisibleAscii);
        assert_eq!(err(b"a\tb"), KeyError::NotVisibleAscii);
        assert_eq!(err(b"a\x7fb"), KeyError::NotVisibleAscii);
        assert_eq!(err("cl\u{e9}".as_bytes()), KeyError::NotVisibleAscii);
        assert_eq!(err("\"cl\u{e9}\"".as_bytes()), KeyError::NotVisibleAscii);
        assert_eq!(ok("!~"), "!~");
    }

    #[test]
    fn repeated_header_is_refused() {
        let name = HeaderName::from_static("idempotency-key");
        let mut headers = HeaderMap::new();
        assert_eq!(key_from_headers(&headers, &name), Ok(None));
        headers.append(&name, HeaderValue::from_static("a"));
        assert_eq!(
            key_from_headers(&headers, &name).unwrap().unwrap().as_str(),
            "a"
        );
        headers.append(&name, HeaderValue::from_static("a"));
        assert_eq!(key_from_headers(&headers, &name), Err(KeyError::Repeated));
    }
}
