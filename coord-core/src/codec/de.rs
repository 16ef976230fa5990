//! The decoder of the tagged format (layout in `tagged.rs`).
//!
//! Nothing in here trusts the input: every length is checked against the bytes that are left
//! before anything is sliced or reserved, nesting is bounded by [`MAX_DEPTH`], and every
//! malformed input is an `Err`, never a panic.

use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};
use serde::forward_to_deserialize_any;

use super::format::{Error, MAX_DEPTH, tag};

/// Decodes one value from `body` (a record without its header) and refuses trailing bytes.
pub(crate) fn decode<T: de::DeserializeOwned>(body: &[u8]) -> Result<T, Error> {
    let mut de = Decoder {
        input: body,
        pos: 0,
        depth: 0,
    };
    let value = T::deserialize(&mut de)?;
    if de.pos != body.len() {
        return Err(de.error(format_args!(
            "{} bytes left over after the value",
            body.len() - de.pos
        )));
    }
    Ok(value)
}

pub(crate) struct Decoder<'de> {
    input: &'de [u8],
    pos: usize,
    depth: usize,
}

impl<'de> Decoder<'de> {
    fn error(&self, what: std::fmt::Arguments<'_>) -> Error {
        // Offsets count from the start of the record, header included.
        Error::new(format!("{what} (at byte {})", self.pos + 2))
    }

    fn remaining(&self) -> usize {
        self.input.len() - self.pos
    }

    fn peek(&self) -> Result<u8, Error> {
        self.input
            .get(self.pos)
            .copied()
            .ok_or_else(|| self.error(format_args!("record ends where a value should start")))
    }

    fn byte(&mut self) -> Result<u8, Error> {
        let b = self.peek()?;
        self.pos += 1;
        Ok(b)
    }

    fn take(&mut self, n: usize) -> Result<&'de [u8], Error> {
        if n > self.remaining() {
            return Err(self.error(format_args!(
                "record ends early: {n} bytes announced, {} left",
                self.remaining()
            )));
        }
        let slice = &self.input[self.pos..self.pos + n];
        self.pos += n;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Error> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn varint(&mut self) -> Result<u64, Error> {
        let mut value: u64 = 0;
        for i in 0..10 {
            let b = self.byte()?;
            let bits = u64::from(b & 0x7F);
            // The tenth byte may only carry the 64th bit.
            if i == 9 && bits > 1 {
                return Err(self.error(format_args!("length does not fit in 64 bits")));
            }
            value |= bits << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(self.error(format_args!("length does not fit in 64 bits")))
    }

    /// A length or count: never more than the bytes left, since every element takes at least
    /// one byte. This is what keeps a forged huge length from becoming a huge allocation.
    fn len(&mut self) -> Result<usize, Error> {
        let n = self.varint()?;
        match usize::try_from(n) {
            Ok(n) if n <= self.remaining() => Ok(n),
            _ => Err(self.error(format_args!(
                "length {n} is larger than the {} bytes left",
                self.remaining()
            ))),
        }
    }

    fn name(&mut self) -> Result<&'de str, Error> {
        let n = self.len()?;
        let bytes = self.take(n)?;
        std::str::from_utf8(bytes).map_err(|_| self.error(format_args!("string is not UTF-8")))
    }

    fn enter(&mut self) -> Result<(), Error> {
        if self.depth >= MAX_DEPTH {
            return Err(self.error(format_args!("value nested deeper than {MAX_DEPTH} levels")));
        }
        self.depth += 1;
        Ok(())
    }

    fn leave(&mut self) {
        self.depth -= 1;
    }

    /// Runs `f` one nesting level deeper.
    fn nested<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T, Error>) -> Result<T, Error> {
        self.enter()?;
        let result = f(self);
        self.leave();
        result
    }

    /// Hands a counted or open sequence to `visitor` and checks it took every element.
    fn seq<V: Visitor<'de>>(
        &mut self,
        count: Option<usize>,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.nested(|de| {
            let mut access = Seq {
                de,
                left: count,
                done: false,
            };
            let value = visitor.visit_seq(&mut access)?;
            access.finish()?;
            Ok(value)
        })
    }

    fn map<V: Visitor<'de>>(
        &mut self,
        count: Option<usize>,
        keys: Keys,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.nested(|de| {
            let mut access = Map {
                de,
                left: count,
                keys,
                done: false,
            };
            let value = visitor.visit_map(&mut access)?;
            access.finish()?;
            Ok(value)
        })
    }

    /// Reads the index and name that follow a variant tag.
    fn variant_id(&mut self) -> Result<VariantId<'de>, Error> {
        let index = self.varint()?;
        let name = self.name()?;
        Ok(VariantId { index, name })
    }

    /// The value after tag `t` (already read), handed to `visitor` by what it is.
    fn any<V: Visitor<'de>>(&mut self, t: u8, visitor: V) -> Result<V::Value, Error> {
        match t {
            tag::UNIT | tag::UNIT_STRUCT => visitor.visit_unit(),
            tag::NONE => visitor.visit_none(),
            tag::SOME => self.nested(|de| visitor.visit_some(&mut *de)),
            tag::FALSE => visitor.visit_bool(false),
            tag::TRUE => visitor.visit_bool(true),
            tag::I8 => visitor.visit_i8(i8::from_le_bytes(self.array()?)),
            tag::I16 => visitor.visit_i16(i16::from_le_bytes(self.array()?)),
            tag::I32 => visitor.visit_i32(i32::from_le_bytes(self.array()?)),
            tag::I64 => visitor.visit_i64(i64::from_le_bytes(self.array()?)),
            // Values that fit 64 bits go out as such: serde's buffering of untagged and
            // internally tagged enums has no 128-bit slot, and every integer visitor takes 64.
            tag::I128 => {
                let v = i128::from_le_bytes(self.array()?);
                match i64::try_from(v) {
                    Ok(small) => visitor.visit_i64(small),
                    Err(_) => visitor.visit_i128(v),
                }
            }
            tag::U8 => visitor.visit_u8(self.byte()?),
            tag::U16 => visitor.visit_u16(u16::from_le_bytes(self.array()?)),
            tag::U32 => visitor.visit_u32(u32::from_le_bytes(self.array()?)),
            tag::U64 => visitor.visit_u64(u64::from_le_bytes(self.array()?)),
            tag::U128 => {
                let v = u128::from_le_bytes(self.array()?);
                match u64::try_from(v) {
                    Ok(small) => visitor.visit_u64(small),
                    Err(_) => visitor.visit_u128(v),
                }
            }
            tag::F32 => visitor.visit_f32(f32::from_bits(u32::from_le_bytes(self.array()?))),
            tag::F64 => visitor.visit_f64(f64::from_bits(u64::from_le_bytes(self.array()?))),
            tag::CHAR => {
                let code = u32::from_le_bytes(self.array()?);
                match char::from_u32(code) {
                    Some(c) => visitor.visit_char(c),
                    None => Err(self.error(format_args!("{code:#x} is not a char"))),
                }
            }
            tag::STR => visitor.visit_borrowed_str(self.name()?),
            tag::BYTES => {
                let n = self.len()?;
                visitor.visit_borrowed_bytes(self.take(n)?)
            }
            tag::SEQ | tag::TUPLE | tag::TUPLE_STRUCT => {
                let n = self.len()?;
                self.seq(Some(n), visitor)
            }
            tag::SEQ_OPEN => self.seq(None, visitor),
            tag::MAP => {
                let n = self.len()?;
                self.map(Some(n), Keys::Values, visitor)
            }
            tag::MAP_OPEN => self.map(None, Keys::Values, visitor),
            tag::STRUCT => {
                let n = self.len()?;
                self.map(Some(n), Keys::Names, visitor)
            }
            tag::NEWTYPE_STRUCT => self.nested(|de| visitor.visit_newtype_struct(&mut *de)),
            // Without a hint, variants take the shape serde's own buffering (and JSON) gives
            // them: a unit variant is its name, any other a one-entry map from its name.
            tag::UNIT_VARIANT => visitor.visit_borrowed_str(self.variant_id()?.name),
            tag::NEWTYPE_VARIANT | tag::TUPLE_VARIANT | tag::STRUCT_VARIANT => {
                let id = self.variant_id()?;
                self.nested(|de| {
                    let mut access = VariantAsMap {
                        de,
                        tag: t,
                        name: Some(id.name),
                        body_read: false,
                    };
                    let value = visitor.visit_map(&mut access)?;
                    if !access.body_read {
                        return Err(access
                            .de
                            .error(format_args!("variant `{}` left unread", id.name)));
                    }
                    Ok(value)
                })
            }
            tag::END => Err(self.error(format_args!("end marker where a value should be"))),
            other => Err(self.error(format_args!("unknown tag {other:#04x}"))),
        }
    }

    /// The body of a tuple or struct variant (its tag `t` and id already read).
    fn variant_body<V: Visitor<'de>>(&mut self, t: u8, visitor: V) -> Result<V::Value, Error> {
        let n = self.len()?;
        if t == tag::TUPLE_VARIANT {
            self.seq(Some(n), visitor)
        } else {
            self.map(Some(n), Keys::Names, visitor)
        }
    }
}

impl<'de> de::Deserializer<'de> for &mut Decoder<'de> {
    type Error = Error;

    fn is_human_readable(&self) -> bool {
        false
    }

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let t = self.byte()?;
        self.any(t, visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.peek()? {
            tag::NONE => {
                self.pos += 1;
                visitor.visit_none()
            }
            tag::SOME => {
                self.pos += 1;
                self.nested(|de| visitor.visit_some(&mut *de))
            }
            // A value written without `Some` (the field was `T` and is now `Option<T>`). This
            // consumes nothing, so it counts as a level: a recursive type must not loop here.
            _ => self.nested(|de| visitor.visit_some(&mut *de)),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        if self.peek()? == tag::NEWTYPE_STRUCT {
            self.pos += 1;
            self.nested(|de| visitor.visit_newtype_struct(&mut *de))
        } else {
            // The inner value written bare (e.g. the type used to be `T`, now `Wrapper(T)`);
            // counted as a level for the same reason as in `deserialize_option`.
            self.nested(|de| visitor.visit_newtype_struct(&mut *de))
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        let t = self.byte()?;
        match t {
            tag::UNIT_VARIANT | tag::NEWTYPE_VARIANT | tag::TUPLE_VARIANT | tag::STRUCT_VARIANT => {
                let id = self.variant_id()?;
                self.nested(|de| visitor.visit_enum(Enum { de, tag: t, id }))
            }
            // A unit variant by name alone.
            tag::STR => visitor.visit_enum(self.name()?.into_deserializer()),
            other => Err(self.error(format_args!(
                "expected an enum variant, found tag {other:#04x}"
            ))),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_any(visitor)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map struct identifier
    }
}

struct Seq<'a, 'de> {
    de: &'a mut Decoder<'de>,
    /// Elements left, or `None` for a sequence closed by `END`.
    left: Option<usize>,
    done: bool,
}

impl<'de> Seq<'_, 'de> {
    fn has_next(&mut self) -> Result<bool, Error> {
        match &mut self.left {
            Some(0) => Ok(false),
            Some(n) => {
                *n -= 1;
                Ok(true)
            }
            None if self.done => Ok(false),
            None if self.de.peek()? == tag::END => {
                self.de.pos += 1;
                self.done = true;
                Ok(false)
            }
            None => Ok(true),
        }
    }

    /// After the visitor: a target that took fewer elements than were written is an error,
    /// not a silent truncation (and the decoder must not stop in the middle of the value).
    fn finish(&mut self) -> Result<(), Error> {
        if self.has_next()? {
            return Err(self.de.error(format_args!(
                "sequence has more elements than the target type takes"
            )));
        }
        Ok(())
    }
}

impl<'de> de::SeqAccess<'de> for Seq<'_, 'de> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        if !self.has_next()? {
            return Ok(None);
        }
        seed.deserialize(&mut *self.de).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        self.left
    }
}

/// How the keys of a map are written.
#[derive(Clone, Copy)]
enum Keys {
    /// As tagged values (maps).
    Values,
    /// As bare names (struct fields).
    Names,
}

struct Map<'a, 'de> {
    de: &'a mut Decoder<'de>,
    left: Option<usize>,
    keys: Keys,
    done: bool,
}

impl<'de> Map<'_, 'de> {
    fn has_next(&mut self) -> Result<bool, Error> {
        match &mut self.left {
            Some(0) => Ok(false),
            Some(n) => {
                *n -= 1;
                Ok(true)
            }
            None if self.done => Ok(false),
            None if self.de.peek()? == tag::END => {
                self.de.pos += 1;
                self.done = true;
                Ok(false)
            }
            None => Ok(true),
        }
    }

    fn finish(&mut self) -> Result<(), Error> {
        if self.has_next()? {
            return Err(self.de.error(format_args!(
                "map has more entries than the target type takes"
            )));
        }
        Ok(())
    }
}

impl<'de> de::MapAccess<'de> for Map<'_, 'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        if !self.has_next()? {
            return Ok(None);
        }
        match self.keys {
            Keys::Values => seed.deserialize(&mut *self.de).map(Some),
            Keys::Names => {
                let name = self.de.name()?;
                seed.deserialize(de::value::BorrowedStrDeserializer::new(name))
                    .map(Some)
            }
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        seed.deserialize(&mut *self.de)
    }

    fn size_hint(&self) -> Option<usize> {
        self.left
    }
}

/// A variant's index and name.
#[derive(Clone, Copy)]
struct VariantId<'de> {
    index: u64,
    name: &'de str,
}

/// The variant identifier: by name, or by index for the targets that ask for an integer.
impl<'de> de::Deserializer<'de> for VariantId<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_borrowed_str(self.name)
    }

    fn deserialize_u8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_u64(self.index)
    }

    fn deserialize_u16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_u64(self.index)
    }

    fn deserialize_u32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_u64(self.index)
    }

    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_u64(self.index)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier ignored_any
    }
}

struct Enum<'a, 'de> {
    de: &'a mut Decoder<'de>,
    tag: u8,
    id: VariantId<'de>,
}

impl<'a, 'de> de::EnumAccess<'de> for Enum<'a, 'de> {
    type Error = Error;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), Error> {
        let value = seed.deserialize(self.id)?;
        Ok((value, self))
    }
}

impl<'de> Enum<'_, 'de> {
    fn shape_error(&self, expected: &str) -> Error {
        let found = match self.tag {
            tag::UNIT_VARIANT => "unit",
            tag::NEWTYPE_VARIANT => "newtype",
            tag::TUPLE_VARIANT => "tuple",
            _ => "struct",
        };
        self.de.error(format_args!(
            "variant `{}` was written as a {found} variant, the target type has a {expected} \
             variant",
            self.id.name
        ))
    }
}

impl<'de> de::VariantAccess<'de> for Enum<'_, 'de> {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        if self.tag != tag::UNIT_VARIANT {
            return Err(self.shape_error("unit"));
        }
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        if self.tag != tag::NEWTYPE_VARIANT {
            return Err(self.shape_error("newtype"));
        }
        seed.deserialize(&mut *self.de)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Error> {
        if self.tag != tag::TUPLE_VARIANT {
            return Err(self.shape_error("tuple"));
        }
        self.de.variant_body(self.tag, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        if self.tag != tag::STRUCT_VARIANT {
            return Err(self.shape_error("struct"));
        }
        self.de.variant_body(self.tag, visitor)
    }
}

/// A non-unit variant seen through `deserialize_any`: `{ name: body }`.
struct VariantAsMap<'a, 'de> {
    de: &'a mut Decoder<'de>,
    tag: u8,
    /// The name until the key is taken.
    name: Option<&'de str>,
    /// Whether the body was decoded: the decoder must not stop inside the value.
    body_read: bool,
}

impl<'de> de::MapAccess<'de> for VariantAsMap<'_, 'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        match self.name.take() {
            Some(name) => seed
                .deserialize(de::value::BorrowedStrDeserializer::new(name))
                .map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        if self.name.is_some() || self.body_read {
            return Err(self
                .de
                .error(format_args!("variant body asked for out of turn")));
        }
        self.body_read = true;
        if self.tag == tag::NEWTYPE_VARIANT {
            seed.deserialize(&mut *self.de)
        } else {
            seed.deserialize(VariantBody {
                de: &mut *self.de,
                tag: self.tag,
            })
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(usize::from(self.name.is_some()))
    }
}

/// The body of a tuple variant (a sequence) or struct variant (a map), for `deserialize_any`.
struct VariantBody<'a, 'de> {
    de: &'a mut Decoder<'de>,
    tag: u8,
}

impl<'de> de::Deserializer<'de> for VariantBody<'_, 'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.de.variant_body(self.tag, visitor)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
        ignored_any
    }
}
