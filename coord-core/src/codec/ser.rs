//! The encoder of the tagged format (layout in `tagged.rs`).

use serde::ser::{self, Serialize};

use super::format::{Error, tag};

/// What the encoder is producing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A stored record: map entries in iteration order, float bits as they are.
    Stored,
    /// Fingerprint input: sorted map entries, one NaN, `-0.0` as `0.0`, counts always written.
    Canonical,
    /// A check that the value has no NaN or infinite float (for the JSON codec, which cannot
    /// represent them); the bytes are thrown away.
    FiniteOnly,
}

pub(crate) struct Encoder {
    pub(crate) out: Vec<u8>,
    mode: Mode,
    /// Set when an element of a compound failed: a `Serialize` impl may ignore that error and
    /// carry on, and what it then writes is not the value, so the whole encoding must fail.
    poisoned: bool,
}

impl Encoder {
    pub(crate) fn new(mode: Mode) -> Self {
        Encoder {
            out: Vec::new(),
            mode,
            poisoned: false,
        }
    }

    /// Serializes `value`, then fails if an error was swallowed on the way.
    pub(crate) fn run<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        value.serialize(&mut *self)?;
        if self.poisoned {
            return Err(Error::new(
                "a `Serialize` implementation carried on after an error; the value is incomplete",
            ));
        }
        Ok(())
    }

    /// Serializes one element of a compound, remembering a failure.
    fn nested<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        let result = value.serialize(&mut *self);
        if result.is_err() {
            self.poisoned = true;
        }
        result
    }

    fn byte(&mut self, b: u8) {
        self.out.push(b);
    }

    fn varint(&mut self, mut n: u64) {
        while n >= 0x80 {
            self.out.push((n as u8) | 0x80);
            n >>= 7;
        }
        self.out.push(n as u8);
    }

    fn count(&mut self, n: usize) {
        // usize is at most 64 bits on every platform Rust supports.
        self.varint(n as u64);
    }

    fn name(&mut self, s: &str) {
        self.count(s.len());
        self.out.extend_from_slice(s.as_bytes());
    }

    fn variant(&mut self, t: u8, index: u32, variant: &str) {
        self.byte(t);
        self.varint(u64::from(index));
        self.name(variant);
    }

    fn float_check(&self, finite: bool) -> Result<(), Error> {
        if self.mode == Mode::FiniteOnly && !finite {
            return Err(Error::new(
                "NaN and infinite floats cannot be represented in JSON; use Codec::Tagged",
            ));
        }
        Ok(())
    }

    /// Starts a compound whose element count the caller announced (`len`), or not.
    fn open(&mut self, counted: u8, open: u8, len: Option<usize>) -> Compound<'_> {
        match (len, self.mode) {
            (Some(n), _) => {
                self.byte(counted);
                Compound::counted(self, n)
            }
            // The canonical form has one spelling per value: count the elements, then write
            // the count in front of them.
            (None, Mode::Canonical) => {
                let outer = std::mem::take(&mut self.out);
                Compound {
                    enc: self,
                    state: State::Buffered {
                        outer,
                        tag: counted,
                        written: 0,
                    },
                }
            }
            (None, _) => {
                self.byte(open);
                Compound {
                    enc: self,
                    state: State::Open,
                }
            }
        }
    }

    /// Encodes `value` into a buffer of its own, with this encoder's mode.
    fn encode_apart<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<Vec<u8>, Error> {
        let outer = std::mem::take(&mut self.out);
        let result = self.nested(value);
        let inner = std::mem::replace(&mut self.out, outer);
        result.map(|()| inner)
    }
}

/// Where a compound value stands while its elements are written.
enum State {
    /// The announced count is written in front, at byte `at`; if the elements written do not
    /// match it (a hand-written `Serialize` may announce a wrong length), it is corrected.
    Counted {
        at: usize,
        expected: usize,
        written: usize,
    },
    /// Unknown length, stored form: elements then `END`.
    Open,
    /// Unknown length, canonical form: elements go to a buffer until the count is known.
    Buffered {
        outer: Vec<u8>,
        tag: u8,
        written: usize,
    },
    /// A canonical map: entries are collected, then sorted by key bytes.
    Sorted {
        entries: Vec<(Vec<u8>, Vec<u8>)>,
        key: Option<Vec<u8>>,
    },
}

pub(crate) struct Compound<'a> {
    enc: &'a mut Encoder,
    state: State,
}

impl<'a> Compound<'a> {
    /// Writes the announced count `expected` (after the caller wrote the tag).
    fn counted(enc: &'a mut Encoder, expected: usize) -> Self {
        let at = enc.out.len();
        enc.count(expected);
        Compound {
            enc,
            state: State::Counted {
                at,
                expected,
                written: 0,
            },
        }
    }

    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        match &mut self.state {
            State::Counted { written, .. } | State::Buffered { written, .. } => *written += 1,
            State::Open | State::Sorted { .. } => {}
        }
        self.enc.nested(value)
    }

    fn field<T: Serialize + ?Sized>(&mut self, name: &str, value: &T) -> Result<(), Error> {
        self.enc.name(name);
        self.element(value)
    }

    fn key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        if let State::Sorted { .. } = self.state {
            let bytes = self.enc.encode_apart(key)?;
            if let State::Sorted { key: pending, .. } = &mut self.state {
                if pending.replace(bytes).is_some() {
                    return Err(Error::new("map key serialized without a value"));
                }
            }
            Ok(())
        } else {
            self.element(key)
        }
    }

    fn value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        if let State::Sorted { .. } = self.state {
            let bytes = self.enc.encode_apart(value)?;
            if let State::Sorted { entries, key } = &mut self.state {
                let key = key
                    .take()
                    .ok_or_else(|| Error::new("map value serialized before its key"))?;
                entries.push((key, bytes));
            }
            Ok(())
        } else {
            // Keys were counted; values ride along with them.
            self.enc.nested(value)
        }
    }

    fn end(self) -> Result<(), Error> {
        let Compound { enc, state } = self;
        match state {
            State::Counted {
                at,
                expected,
                written,
            } => {
                if expected != written {
                    // Rare: splice the true count over the announced one.
                    let mut fixed = Encoder::new(enc.mode);
                    fixed.count(written);
                    let mut announced = Encoder::new(enc.mode);
                    announced.count(expected);
                    let range = at..at + announced.out.len();
                    // The count is where we wrote it unless a `Serialize` impl ignored an error
                    // of ours and carried on; refuse rather than splice out of bounds.
                    if range.end > enc.out.len() {
                        return Err(Error::new(
                            "serialization continued after an error it was given",
                        ));
                    }
                    enc.out.splice(range, fixed.out);
                }
                Ok(())
            }
            State::Open => {
                enc.byte(tag::END);
                Ok(())
            }
            State::Buffered {
                outer,
                tag,
                written,
            } => {
                let inner = std::mem::replace(&mut enc.out, outer);
                enc.byte(tag);
                enc.count(written);
                enc.out.extend_from_slice(&inner);
                Ok(())
            }
            State::Sorted { mut entries, key } => {
                if key.is_some() {
                    return Err(Error::new("map key serialized without a value"));
                }
                // Sorting the whole entry (key bytes first) makes even duplicate keys, which a
                // hand-written `Serialize` can produce, come out in one order.
                entries.sort_unstable();
                enc.byte(tag::MAP);
                enc.count(entries.len());
                for (k, v) in entries {
                    enc.out.extend_from_slice(&k);
                    enc.out.extend_from_slice(&v);
                }
                Ok(())
            }
        }
    }
}

impl<'a> ser::Serializer for &'a mut Encoder {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Compound<'a>;
    type SerializeTuple = Compound<'a>;
    type SerializeTupleStruct = Compound<'a>;
    type SerializeTupleVariant = Compound<'a>;
    type SerializeMap = Compound<'a>;
    type SerializeStruct = Compound<'a>;
    type SerializeStructVariant = Compound<'a>;

    fn is_human_readable(&self) -> bool {
        false
    }

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.byte(if v { tag::TRUE } else { tag::FALSE });
        Ok(())
    }

    fn serialize_i8(self, v: i8) -> Result<(), Error> {
        self.byte(tag::I8);
        self.out.extend_from_slice(&v.to_le_bytes());
        Ok(())
    }

    fn serialize_i16(self, v: i16) -> Result<(), Error> {
        self.byte(tag::I16);
        self.out.extend_from_slice(&v.to_le_bytes());
        Ok(())
    }

    fn serialize_i32(self, v: i32) -> Result<(), Error> {
        self.byte(tag::I32);
        self.out.extend_from_slice(&v.to_le_bytes());
        Ok(())
    }

    fn serialize_i64(self, v: i64) -> Result<(), Error> {
        self.byte(tag::I64);
        self.out.extend_from_slice(&v.to_le_bytes());
        Ok(())
    }

    fn serialize_i128(self, v: i128) -> Result<(), Error> {
        self.byte(tag::I128);
        self.out.extend_from_slice(&v.to_le_bytes());
        Ok(())
    }

    fn serialize_u8(self, v: u8) -> Result<(), Error> {
        self.byte(tag::U8);
        self.byte(v);
        Ok(())
    }

    fn serialize_u16(self, v: u16) -> Result<(), Error> {
        self.byte(tag::U16);
        self.out.extend_from_slice(&v.to_le_bytes());
        Ok(())
    }

    fn serialize_u32(self, v: u32) -> Result<(), Error> {
        self.byte(tag::U32);
        self.out.extend_from_slice(&v.to_le_bytes());
        Ok(())
    }

    fn serialize_u64(self, v: u64) -> Result<(), Error> {
        self.byte(tag::U64);
        self.out.extend_from_slice(&v.to_le_bytes());
        Ok(())
    }

    fn serialize_u128(self, v: u128) -> Result<(), Error> {
        self.byte(tag::U128);
        self.out.extend_from_slice(&v.to_le_bytes());
        Ok(())
    }

    fn serialize_f32(self, v: f32) -> Result<(), Error> {
        self.float_check(v.is_finite())?;
        let v = match self.mode {
            Mode::Canonical if v.is_nan() => f32::NAN,
            // `-0.0 == 0.0`: one spelling for what compares equal.
            Mode::Canonical if v == 0.0 => 0.0,
            _ => v,
        };
        self.byte(tag::F32);
        self.out.extend_from_slice(&v.to_bits().to_le_bytes());
        Ok(())
    }

    fn serialize_f64(self, v: f64) -> Result<(), Error> {
        self.float_check(v.is_finite())?;
        let v = match self.mode {
            Mode::Canonical if v.is_nan() => f64::NAN,
            Mode::Canonical if v == 0.0 => 0.0,
            _ => v,
        };
        self.byte(tag::F64);
        self.out.extend_from_slice(&v.to_bits().to_le_bytes());
        Ok(())
    }

    fn serialize_char(self, v: char) -> Result<(), Error> {
        self.byte(tag::CHAR);
        self.out.extend_from_slice(&u32::from(v).to_le_bytes());
        Ok(())
    }

    fn serialize_str(self, v: &str) -> Result<(), Error> {
        self.byte(tag::STR);
        self.name(v);
        Ok(())
    }

    fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
        self.byte(tag::BYTES);
        self.count(v.len());
        self.out.extend_from_slice(v);
        Ok(())
    }

    fn serialize_none(self) -> Result<(), Error> {
        self.byte(tag::NONE);
        Ok(())
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        self.byte(tag::SOME);
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), Error> {
        self.byte(tag::UNIT);
        Ok(())
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        self.byte(tag::UNIT_STRUCT);
        Ok(())
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        index: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        self.variant(tag::UNIT_VARIANT, index, variant);
        Ok(())
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.byte(tag::NEWTYPE_STRUCT);
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.variant(tag::NEWTYPE_VARIANT, index, variant);
        value.serialize(self)
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Compound<'a>, Error> {
        Ok(self.open(tag::SEQ, tag::SEQ_OPEN, len))
    }

    fn serialize_tuple(self, len: usize) -> Result<Compound<'a>, Error> {
        self.byte(tag::TUPLE);
        Ok(Compound::counted(self, len))
    }

    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> Result<Compound<'a>, Error> {
        self.byte(tag::TUPLE_STRUCT);
        Ok(Compound::counted(self, len))
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Compound<'a>, Error> {
        self.variant(tag::TUPLE_VARIANT, index, variant);
        Ok(Compound::counted(self, len))
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Compound<'a>, Error> {
        if self.mode == Mode::Canonical {
            return Ok(Compound {
                enc: self,
                state: State::Sorted {
                    entries: Vec::with_capacity(len.unwrap_or(0).min(1024)),
                    key: None,
                },
            });
        }
        Ok(self.open(tag::MAP, tag::MAP_OPEN, len))
    }

    fn serialize_struct(self, _name: &'static str, len: usize) -> Result<Compound<'a>, Error> {
        self.byte(tag::STRUCT);
        Ok(Compound::counted(self, len))
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Compound<'a>, Error> {
        self.variant(tag::STRUCT_VARIANT, index, variant);
        Ok(Compound::counted(self, len))
    }

    fn collect_str<T: std::fmt::Display + ?Sized>(self, value: &T) -> Result<(), Error> {
        self.serialize_str(&value.to_string())
    }
}

/// serde's compound traits, all served by `Compound`: the four sequence-like ones write one
/// element per call, the two struct-like ones one named field.
macro_rules! elements {
    ($($trait:ident :: $method:ident),+) => {$(
        impl ser::$trait for Compound<'_> {
            type Ok = ();
            type Error = Error;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
                self.element(value)
            }
            fn end(self) -> Result<(), Error> {
                Compound::end(self)
            }
        }
    )+};
}

macro_rules! fields {
    ($($trait:ident),+) => {$(
        impl ser::$trait for Compound<'_> {
            type Ok = ();
            type Error = Error;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), Error> {
                self.field(key, value)
            }
            fn end(self) -> Result<(), Error> {
                Compound::end(self)
            }
        }
    )+};
}

elements!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);
fields!(SerializeStruct, SerializeStructVariant);

impl ser::SerializeMap for Compound<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        self.key(key)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.value(value)
    }
    fn end(self) -> Result<(), Error> {
        Compound::end(self)
    }
}
