//! coord's tagged binary format, as bytes: the layout, its tags and limits, and the error both
//! directions report. (The encoder is `ser.rs`, the decoder `de.rs`, the entry points
//! `tagged.rs`.)
//!
//! The format is self-describing, with exact serde round trips.
//!
//! Every item of the serde data model is written with a tag byte of its own, so what was
//! serialized can be told from the bytes alone: `None` from `Some(None)`, `()` from a unit
//! struct, `1u8` from `1i64`, a NaN from a missing value. Structs are written as maps keyed by
//! their field names (never by position), so records survive `#[serde(skip_serializing_if)]`,
//! fields added with `#[serde(default)]`, and removed fields; the decoder also supports
//! `deserialize_any`, which untagged, internally tagged and adjacently tagged enums and
//! `#[serde(flatten)]` rely on.
//!
//! # Layout
//!
//! A record is `MAGIC VERSION value`, with no trailing bytes. A *varint* is an unsigned LEB128
//! `u64` (at most 10 bytes); a *name* is `varint len, len UTF-8 bytes`, without a tag. Fixed
//! width numbers are little endian. A `value` is one tag byte and its body:
//!
//! | tag | item | body |
//! | --- | --- | --- |
//! | `0x00` | unit `()` | |
//! | `0x01` | `None` | |
//! | `0x02` | `Some` | value |
//! | `0x03` / `0x04` | `false` / `true` | |
//! | `0x05`..=`0x09` | `i8` `i16` `i32` `i64` `i128` | 1, 2, 4, 8, 16 bytes |
//! | `0x0A`..=`0x0E` | `u8` `u16` `u32` `u64` `u128` | 1, 2, 4, 8, 16 bytes |
//! | `0x0F` / `0x10` | `f32` / `f64` | the IEEE 754 bits, 4 / 8 bytes (NaN payloads kept) |
//! | `0x11` | `char` | its scalar value as 4 bytes |
//! | `0x12` | string | varint len, UTF-8 bytes |
//! | `0x13` | bytes | varint len, bytes |
//! | `0x14` | sequence | varint count, values |
//! | `0x15` | sequence of unknown length | values, `END` |
//! | `0x16` | tuple | varint count, values |
//! | `0x17` | tuple struct | varint count, values |
//! | `0x18` | map | varint count, (key value, value) pairs |
//! | `0x19` | map of unknown length | (key value, value) pairs, `END` |
//! | `0x1A` | struct | varint count, (field name, value) pairs |
//! | `0x1B` | unit struct | |
//! | `0x1C` | newtype struct | value |
//! | `0x1D` | unit variant | varint index, variant name |
//! | `0x1E` | newtype variant | varint index, variant name, value |
//! | `0x1F` | tuple variant | varint index, variant name, varint count, values |
//! | `0x20` | struct variant | varint index, variant name, varint count, (field name, value) pairs |
//! | `0x21` | `END` | closes an unknown-length sequence or map |
//!
//! Type names are not written: renaming a struct or an enum keeps its records readable.
//! Variants are decoded by name (the index is kept for formats of targets that ask for it).
//!
//! The *canonical* form, used for fingerprints, is the same layout with three rules on top:
//! map entries are sorted by the bytes of their encoded keys, every NaN is written as one NaN
//! (and `-0.0` as `0.0`), and sequences and maps always carry their count (tags `0x14` and
//! `0x18`, never `0x15` or `0x19`).

use std::fmt;

/// First byte of every record: not a byte any UTF-8 text (so no JSON record) starts with.
pub(crate) const MAGIC: u8 = 0xC1;
/// Second byte of every record: the version of the layout above.
pub(crate) const VERSION: u8 = 1;

/// Nesting deeper than this is refused when decoding, so hostile or corrupt bytes cannot
/// exhaust the stack. Values nested this deep are refused at encode time by
/// `Codec::encode_checked`, which decodes what it wrote.
pub(crate) const MAX_DEPTH: usize = 128;

pub(crate) mod tag {
    pub const UNIT: u8 = 0x00;
    pub const NONE: u8 = 0x01;
    pub const SOME: u8 = 0x02;
    pub const FALSE: u8 = 0x03;
    pub const TRUE: u8 = 0x04;
    pub const I8: u8 = 0x05;
    pub const I16: u8 = 0x06;
    pub const I32: u8 = 0x07;
    pub const I64: u8 = 0x08;
    pub const I128: u8 = 0x09;
    pub const U8: u8 = 0x0A;
    pub const U16: u8 = 0x0B;
    pub const U32: u8 = 0x0C;
    pub const U64: u8 = 0x0D;
    pub const U128: u8 = 0x0E;
    pub const F32: u8 = 0x0F;
    pub const F64: u8 = 0x10;
    pub const CHAR: u8 = 0x11;
    pub const STR: u8 = 0x12;
    pub const BYTES: u8 = 0x13;
    pub const SEQ: u8 = 0x14;
    pub const SEQ_OPEN: u8 = 0x15;
    pub const TUPLE: u8 = 0x16;
    pub const TUPLE_STRUCT: u8 = 0x17;
    pub const MAP: u8 = 0x18;
    pub const MAP_OPEN: u8 = 0x19;
    pub const STRUCT: u8 = 0x1A;
    pub const UNIT_STRUCT: u8 = 0x1B;
    pub const NEWTYPE_STRUCT: u8 = 0x1C;
    pub const UNIT_VARIANT: u8 = 0x1D;
    pub const NEWTYPE_VARIANT: u8 = 0x1E;
    pub const TUPLE_VARIANT: u8 = 0x1F;
    pub const STRUCT_VARIANT: u8 = 0x20;
    pub const END: u8 = 0x21;
}

/// What went wrong encoding or decoding; the message is what `Codec` reports.
///
/// Boxed so that `Result`s stay one pointer wide on the hot path of decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::box_collection)] // the extra allocation happens on errors only
pub(crate) struct Error(Box<String>);

impl Error {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Error(Box::new(message.into()))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl serde::ser::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Error::new(msg.to_string())
    }
}

impl serde::de::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Error::new(msg.to_string())
    }
}
