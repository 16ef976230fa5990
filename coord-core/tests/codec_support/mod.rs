//! Generated nested values shared by the codec and fingerprint tests.

#![allow(dead_code)] // each test file uses its own part of this

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use proptest::prelude::*;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// An `f64` compared by its bits, so that `NaN == NaN` when the bits agree and `-0.0 != 0.0`:
/// exactly what a replay must preserve.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Bits(pub f64);

impl PartialEq for Bits {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

/// An `f32` compared by its bits.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Bits32(pub f32);

impl PartialEq for Bits32 {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

/// Bytes written with `serialize_bytes` (a `Vec<u8>` is a sequence of `u8` in serde).
#[derive(Debug, Clone, PartialEq)]
pub struct Blob(pub Vec<u8>);

impl Serialize for Blob {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Blob {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Blob;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Blob, E> {
                Ok(Blob(v.to_vec()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Blob, A::Error> {
                let mut out = Vec::new();
                while let Some(b) = seq.next_element()? {
                    out.push(b);
                }
                Ok(Blob(out))
            }
        }
        d.deserialize_bytes(V)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Marker;

/// A nested value touching every part of the serde data model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Val {
    Unit,
    UnitStruct(Marker),
    Bool(bool),
    I8(i8),
    I64(i64),
    I128(i128),
    U16(u16),
    U128(u128),
    F32(Bits32),
    F64(Bits),
    Char(char),
    Str(String),
    Bytes(Blob),
    Opt(Option<Option<Box<Val>>>),
    List(Vec<Val>),
    Hash(HashMap<String, Val>),
    Tree(BTreeMap<i32, Val>),
    Pair(Box<Val>, Box<Val>),
    Record { first: Box<Val>, second: Option<u8> },
}

/// Floats of every class, including NaNs with payloads and `-0.0`.
pub fn any_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>(),
        any::<u64>().prop_map(f64::from_bits),
        Just(f64::NAN),
        Just(-f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(-0.0),
    ]
}

/// Generated values, nested up to 4 levels.
pub fn val() -> impl Strategy<Value = Val> {
    let leaf = prop_oneof![
        Just(Val::Unit),
        Just(Val::UnitStruct(Marker)),
        any::<bool>().prop_map(Val::Bool),
        any::<i8>().prop_map(Val::I8),
        any::<i64>().prop_map(Val::I64),
        any::<i128>().prop_map(Val::I128),
        any::<u16>().prop_map(Val::U16),
        any::<u128>().prop_map(Val::U128),
        any::<u32>().prop_map(|b| Val::F32(Bits32(f32::from_bits(b)))),
        any_f64().prop_map(|f| Val::F64(Bits(f))),
        any::<char>().prop_map(Val::Char),
        ".{0,6}".prop_map(Val::Str),
        prop::collection::vec(any::<u8>(), 0..8).prop_map(|b| Val::Bytes(Blob(b))),
        Just(Val::Opt(None)),
        Just(Val::Opt(Some(None))),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            inner
                .clone()
                .prop_map(|v| Val::Opt(Some(Some(Box::new(v))))),
            prop::collection::vec(inner.clone(), 0..5).prop_map(Val::List),
            prop::collection::hash_map(".{0,4}", inner.clone(), 0..5).prop_map(Val::Hash),
            prop::collection::btree_map(any::<i32>(), inner.clone(), 0..5).prop_map(Val::Tree),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| Val::Pair(Box::new(a), Box::new(b))),
            (inner, any::<Option<u8>>()).prop_map(|(a, second)| Val::Record {
                first: Box::new(a),
                second
            }),
        ]
    })
}

/// The same value with every float replaced by the one fingerprints treat it as: any NaN by
/// the standard NaN, `-0.0` by `0.0`.
pub fn normalized(v: &Val) -> Val {
    map_val(v, &|leaf| match leaf {
        Val::F64(Bits(f)) if f.is_nan() => Val::F64(Bits(f64::NAN)),
        Val::F64(Bits(f)) if *f == 0.0 => Val::F64(Bits(0.0)),
        Val::F32(Bits32(f)) if f.is_nan() => Val::F32(Bits32(f32::NAN)),
        Val::F32(Bits32(f)) if *f == 0.0 => Val::F32(Bits32(0.0)),
        other => other.clone(),
    })
}

/// Rebuilds `v` bottom-up, applying `leaf` to every value that holds no other.
fn map_val(v: &Val, leaf: &dyn Fn(&Val) -> Val) -> Val {
    match v {
        Val::Hash(map) => Val::Hash(
            map.iter()
                .map(|(k, v)| (k.clone(), map_val(v, leaf)))
                .collect(),
        ),
        Val::Tree(map) => Val::Tree(map.iter().map(|(k, v)| (*k, map_val(v, leaf))).collect()),
        Val::Opt(Some(Some(inner))) => Val::Opt(Some(Some(Box::new(map_val(inner, leaf))))),
        Val::List(items) => Val::List(items.iter().map(|i| map_val(i, leaf)).collect()),
        Val::Pair(a, b) => Val::Pair(Box::new(map_val(a, leaf)), Box::new(map_val(b, leaf))),
        Val::Record { first, second } => Val::Record {
            first: Box::new(map_val(first, leaf)),
            second: *second,
        },
        other => leaf(other),
    }
}

/// The same value with every `HashMap` built anew: a fresh random hasher, entries inserted
/// in reverse iteration order. Its maps iterate in another order than the original's.
pub fn rebuilt(v: &Val) -> Val {
    match v {
        Val::Hash(map) => {
            let entries: Vec<_> = map.iter().collect();
            let mut fresh = HashMap::new();
            for (k, v) in entries.into_iter().rev() {
                fresh.insert(k.clone(), rebuilt(v));
            }
            Val::Hash(fresh)
        }
        Val::Tree(map) => Val::Tree(map.iter().map(|(k, v)| (*k, rebuilt(v))).collect()),
        Val::Opt(Some(Some(inner))) => Val::Opt(Some(Some(Box::new(rebuilt(inner))))),
        Val::List(items) => Val::List(items.iter().map(rebuilt).collect()),
        Val::Pair(a, b) => Val::Pair(Box::new(rebuilt(a)), Box::new(rebuilt(b))),
        Val::Record { first, second } => Val::Record {
            first: Box::new(rebuilt(first)),
            second: *second,
        },
        other => other.clone(),
    }
}
