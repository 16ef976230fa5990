//! The tagged codec replays exactly what was encoded, and refuses bad bytes without panicking.

mod codec_support;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;

use codec_support::{Bits, Bits32, Blob, Marker, Val, val};
use coord_core::Codec;
use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};

/// Encodes with the default codec (checked, as the runtime does), decodes, and returns the
/// replay.
fn replay<T: Serialize + DeserializeOwned>(value: &T) -> T {
    let bytes = Codec::default()
        .encode_checked(value)
        .unwrap_or_else(|e| panic!("encode failed: {e}"));
    Codec::default()
        .decode(&bytes)
        .unwrap_or_else(|e| panic!("decode failed: {e}"))
}

fn assert_exact<T: Serialize + DeserializeOwned + PartialEq + Debug>(value: T) {
    assert_eq!(replay(&value), value);
}

#[test]
fn the_default_codec_is_tagged() {
    assert_eq!(Codec::default(), Codec::Tagged);
}

#[test]
fn option_of_option_keeps_some_none_apart_from_none() {
    assert_exact::<Option<Option<u32>>>(None);
    assert_exact::<Option<Option<u32>>>(Some(None));
    assert_exact::<Option<Option<u32>>>(Some(Some(7)));
    assert_exact::<Option<Option<Option<()>>>>(Some(Some(None)));
    assert_exact::<Option<Option<Option<()>>>>(Some(Some(Some(()))));
}

#[test]
fn unit_and_unit_structs_come_back() {
    assert_exact(());
    assert_exact(Some(()));
    assert_exact::<Option<()>>(None);
    assert_exact(Marker);
    assert_exact(Some(Marker));
    assert_exact(vec![(), ()]);
}

#[test]
fn floats_keep_their_exact_bits() {
    let payload_nan = f64::from_bits(0x7FF8_0000_0000_BEEF);
    let negative_nan = f64::from_bits(0xFFF8_0000_0000_0001);
    for f in [
        f64::NAN,
        payload_nan,
        negative_nan,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.0,
        0.0,
        f64::MIN_POSITIVE / 2.0,
        f64::MAX,
    ] {
        assert_eq!(replay(&f).to_bits(), f.to_bits(), "{f:?}");
        assert_eq!(replay(&Some(f)).map(f64::to_bits), Some(f.to_bits()));
    }
    for f in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0f32] {
        assert_eq!(replay(&f).to_bits(), f.to_bits(), "{f:?}");
    }
}

#[test]
fn integers_of_every_width_keep_their_value() {
    assert_exact(u128::MAX);
    assert_exact(i128::MIN);
    assert_exact(i128::MAX);
    assert_exact(u64::MAX);
    assert_exact(i64::MIN);
    assert_exact((i8::MIN, i16::MIN, i32::MIN, u8::MAX, u16::MAX, u32::MAX));
    assert_exact(vec![u128::MAX, 0, 1 << 64]);
    assert_exact('\u{10FFFF}');
}

#[test]
fn maps_round_trip_whatever_their_keys() {
    let hash: HashMap<String, Option<u32>> = (0..50)
        .map(|i| (format!("k{i}"), (i % 3 != 0).then_some(i)))
        .collect();
    assert_exact(hash);
    let mut tree: BTreeMap<(i32, Option<String>), Vec<Option<()>>> = BTreeMap::new();
    tree.insert((-1, None), vec![None, Some(())]);
    tree.insert((2, Some(String::new())), vec![]);
    assert_exact(tree);
    let mut float_keys: HashMap<u128, HashMap<char, Bits>> = HashMap::new();
    float_keys.insert(u128::MAX, [('x', Bits(f64::NAN))].into_iter().collect());
    assert_exact(float_keys);
    assert_exact(Blob(vec![0, 255, 1]));
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum External {
    Unit,
    Newtype(Option<Option<i64>>),
    Tuple(u8, String, Option<()>),
    Struct { a: Bits, b: Vec<External> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
enum Internal {
    Unit,
    Newtype(Inner),
    Struct { a: i32, b: Option<String> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", content = "c")]
enum Adjacent {
    Unit,
    Newtype(Option<Option<u8>>),
    Tuple(i64, char),
    Struct { a: Bits },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
enum Untagged {
    Num(i64),
    Wide(u64),
    Text(String),
    Pair(bool, Option<u8>),
    Rec { x: i32, y: External },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Inner {
    x: u64,
    y: Option<Option<u8>>,
}

#[test]
fn every_enum_shape_round_trips() {
    assert_exact(External::Unit);
    assert_exact(External::Newtype(Some(None)));
    assert_exact(External::Tuple(1, "x".into(), Some(())));
    assert_exact(External::Struct {
        a: Bits(f64::NEG_INFINITY),
        b: vec![External::Unit, External::Newtype(None)],
    });
}

#[test]
fn internally_tagged_enums_round_trip() {
    assert_exact(Internal::Unit);
    assert_exact(Internal::Newtype(Inner {
        x: u64::MAX,
        y: Some(Some(3)),
    }));
    assert_exact(Internal::Struct {
        a: -5,
        b: Some(String::new()),
    });
}

#[test]
fn adjacently_tagged_enums_round_trip() {
    assert_exact(Adjacent::Unit);
    assert_exact(Adjacent::Newtype(Some(None)));
    assert_exact(Adjacent::Newtype(Some(Some(9))));
    assert_exact(Adjacent::Tuple(i64::MIN, 'é'));
    assert_exact(Adjacent::Struct { a: Bits(f64::NAN) });
}

#[test]
fn untagged_enums_round_trip() {
    assert_exact(Untagged::Num(-3));
    assert_exact(Untagged::Wide(u64::MAX));
    assert_exact(Untagged::Text("t".into()));
    assert_exact(Untagged::Pair(true, None));
    assert_exact(Untagged::Rec {
        x: 1,
        y: External::Struct {
            a: Bits(1.5),
            b: vec![External::Tuple(0, String::new(), None)],
        },
    });
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Flattened {
    id: u32,
    #[serde(flatten)]
    inner: Inner,
    #[serde(flatten)]
    extra: BTreeMap<String, i64>,
}

#[test]
fn flatten_round_trips() {
    assert_exact(Flattened {
        id: 4,
        inner: Inner {
            x: 1 << 40,
            y: Some(Some(2)),
        },
        extra: [("z".to_owned(), -1)].into_iter().collect(),
    });
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Sparse {
    always: u8,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    maybe: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    list: Vec<u8>,
    #[serde(skip)]
    never: u8,
}

#[test]
fn skipped_fields_round_trip() {
    assert_exact(Sparse {
        always: 1,
        maybe: None,
        list: vec![],
        never: 0,
    });
    assert_exact(Sparse {
        always: 1,
        maybe: Some("m".into()),
        list: vec![],
        never: 0,
    });
    assert_exact(Sparse {
        always: 1,
        maybe: None,
        list: vec![2],
        never: 0,
    });
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct OrderV1 {
    id: u64,
    total: i64,
    gone: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct OrderV2 {
    total: i64,
    id: u64,
    #[serde(default)]
    note: Option<Option<String>>,
}

#[test]
fn old_records_decode_into_a_type_with_added_default_fields() {
    let old = OrderV1 {
        id: 7,
        total: -10,
        gone: "removed in v2".into(),
    };
    let bytes = Codec::Tagged.encode(&old).unwrap();
    // Fields are matched by name: reordered fields keep their values, the removed one is
    // skipped, the added one takes its default.
    let new: OrderV2 = Codec::Tagged.decode(&bytes).unwrap();
    assert_eq!(
        new,
        OrderV2 {
            total: -10,
            id: 7,
            note: None,
        }
    );
}

#[test]
fn a_record_of_another_type_is_an_error() {
    let bytes = Codec::Tagged.encode(&"text").unwrap();
    assert!(Codec::Tagged.decode::<u32>(&bytes).is_err());
    let bytes = Codec::Tagged.encode(&External::Unit).unwrap();
    let err = Codec::Tagged.decode::<Adjacent>(&bytes).unwrap_err();
    assert!(!err.is_empty());
    let bytes = Codec::Tagged.encode(&External::Newtype(None)).unwrap();
    // Same variant name, other shape.
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    enum Reshaped {
        Newtype { x: u8 },
    }
    let err = Codec::Tagged.decode::<Reshaped>(&bytes).unwrap_err();
    assert!(err.contains("Newtype"), "{err}");
    // A narrower integer that cannot hold the value.
    let bytes = Codec::Tagged.encode(&300u32).unwrap();
    assert!(Codec::Tagged.decode::<u8>(&bytes).is_err());
    // A shorter tuple than was written.
    let bytes = Codec::Tagged.encode(&(1u8, 2u8, 3u8)).unwrap();
    assert!(Codec::Tagged.decode::<(u8, u8)>(&bytes).is_err());
}

#[test]
fn records_decode_into_self_describing_targets() {
    let value = Inner {
        x: 3,
        y: Some(None),
    };
    let bytes = Codec::Tagged.encode(&value).unwrap();
    let json: serde_json::Value = Codec::Tagged.decode(&bytes).unwrap();
    assert_eq!(json, serde_json::json!({ "x": 3, "y": null }));
    let bytes = Codec::Tagged
        .encode(&External::Tuple(1, "a".into(), None))
        .unwrap();
    let json: serde_json::Value = Codec::Tagged.decode(&bytes).unwrap();
    assert_eq!(json, serde_json::json!({ "Tuple": [1, "a", null] }));
}

/// Announces more fields than it writes, as a careless hand-written `Serialize` may.
struct Miscounted;

impl Serialize for Miscounted {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Miscounted", 5)?;
        st.serialize_field("a", &1u8)?;
        st.serialize_field("b", &2u8)?;
        st.end()
    }
}

#[derive(Debug, PartialEq, Deserialize)]
struct Counted {
    a: u8,
    b: u8,
}

#[test]
fn a_wrongly_announced_length_is_corrected() {
    let bytes = Codec::Tagged.encode(&Miscounted).unwrap();
    assert_eq!(
        Codec::Tagged.decode::<Counted>(&bytes).unwrap(),
        Counted { a: 1, b: 2 }
    );
}

/// Writes a string, reads an integer: its records never decode.
#[derive(Debug)]
struct Lopsided;

impl Serialize for Lopsided {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("not a number")
    }
}

impl<'de> Deserialize<'de> for Lopsided {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        u32::deserialize(d).map(|_| Lopsided)
    }
}

#[test]
fn encode_checked_refuses_what_would_not_decode() {
    assert!(Codec::Tagged.encode(&Lopsided).is_ok());
    let err = Codec::Tagged.encode_checked(&Lopsided).unwrap_err();
    assert!(err.contains("Lopsided"), "{err}");
}

#[derive(Debug, Serialize, Deserialize)]
struct Deep(Option<Box<Deep>>);

fn deep(levels: usize) -> Deep {
    (0..levels).fold(Deep(None), |inner, _| Deep(Some(Box::new(inner))))
}

#[test]
fn nesting_is_bounded() {
    assert!(Codec::Tagged.encode_checked(&deep(20)).is_ok());
    // Each level is a newtype and a `Some`: 200 levels are 400 deep, past the bound.
    assert!(Codec::Tagged.encode(&deep(200)).is_ok());
    let err = Codec::Tagged.encode_checked(&deep(200)).unwrap_err();
    assert!(err.contains("nested deeper"), "{err}");
    // Forged input: a million `Some` tags must be an error, not a stack overflow.
    let mut bytes = vec![0xC1, 1];
    bytes.extend(std::iter::repeat_n(0x02, 1_000_000));
    bytes.push(0x00);
    assert!(Codec::Tagged.decode::<serde_json::Value>(&bytes).is_err());
    // A recursive type read from a value it does not match must not recurse without end.
    for body in [0x00u8, 0x03, 0x12] {
        let err = Codec::Tagged
            .decode::<Deep>(&[0xC1, 1, body, 0])
            .unwrap_err();
        assert!(!err.is_empty());
    }
}

#[test]
fn huge_length_prefixes_are_errors_not_allocations() {
    let max_varint = [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01];
    for t in [0x12u8, 0x13, 0x14, 0x16, 0x18, 0x1A] {
        let mut bytes = vec![0xC1, 1, t];
        bytes.extend_from_slice(&max_varint);
        assert!(Codec::Tagged.decode::<serde_json::Value>(&bytes).is_err());
        assert!(Codec::Tagged.decode::<Vec<u8>>(&bytes).is_err());
        assert!(Codec::Tagged.decode::<String>(&bytes).is_err());
    }
    // An overlong varint (more than 64 bits).
    let mut bytes = vec![0xC1, 1, 0x12];
    bytes.extend_from_slice(&[0xFF; 11]);
    assert!(Codec::Tagged.decode::<String>(&bytes).is_err());
}

#[test]
fn malformed_scalars_are_errors() {
    // A string that is not UTF-8.
    let err = Codec::Tagged
        .decode::<String>(&[0xC1, 1, 0x12, 2, 0xFF, 0xFE])
        .unwrap_err();
    assert!(err.contains("UTF-8"), "{err}");
    // A char that is a surrogate.
    let err = Codec::Tagged
        .decode::<char>(&[0xC1, 1, 0x11, 0x00, 0xD8, 0, 0])
        .unwrap_err();
    assert!(err.contains("not a char"), "{err}");
    // A tag no version of the format has.
    let err = Codec::Tagged.decode::<u8>(&[0xC1, 1, 0xEE]).unwrap_err();
    assert!(err.contains("unknown tag"), "{err}");
    // An end marker with nothing to close.
    assert!(Codec::Tagged.decode::<Val>(&[0xC1, 1, 0x21]).is_err());
}

#[test]
fn foreign_and_future_records_are_named() {
    let json = Codec::Json.encode(&Inner { x: 1, y: None }).unwrap();
    let err = Codec::Tagged.decode::<Inner>(&json).unwrap_err();
    assert!(err.contains("JSON"), "{err}");
    let tagged = Codec::Tagged.encode(&Inner { x: 1, y: None }).unwrap();
    let err = Codec::Json.decode::<Inner>(&tagged).unwrap_err();
    assert!(err.contains("tagged"), "{err}");
    let mut future = tagged.clone();
    future[1] = 2;
    let err = Codec::Tagged.decode::<Inner>(&future).unwrap_err();
    assert!(err.contains("version 2"), "{err}");
    assert!(Codec::Tagged.decode::<()>(&[]).is_err());
    assert!(Codec::Tagged.decode::<()>(&[0xC1]).is_err());
    let mut trailing = Codec::Tagged.encode(&5u8).unwrap();
    trailing.push(0);
    assert!(Codec::Tagged.decode::<u8>(&trailing).is_err());
}

#[test]
fn json_refuses_non_finite_floats_and_round_trips_the_rest() {
    for f in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        assert!(Codec::Json.encode(&f).is_err());
        assert!(Codec::Json.encode_checked(&Some(f)).is_err());
        assert!(
            Codec::Json
                .encode_checked(&External::Struct {
                    a: Bits(f),
                    b: vec![]
                })
                .is_err()
        );
    }
    assert!(Codec::Json.encode(&f32::NAN).is_err());
    let value = External::Struct {
        a: Bits(-2.5),
        b: vec![External::Tuple(3, "j".into(), None), External::Unit],
    };
    let bytes = Codec::Json.encode_checked(&value).unwrap();
    assert!(bytes.starts_with(b"{"), "JSON stays readable");
    assert_eq!(Codec::Json.decode::<External>(&bytes).unwrap(), value);
}

/// Values JSON represents exactly: no floats outside the finite range, no `Option<Option>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct JsonSafe {
    n: i64,
    u: u64,
    f: f64,
    s: String,
    o: Option<u8>,
    m: BTreeMap<String, Vec<i32>>,
}

fn json_safe() -> impl Strategy<Value = JsonSafe> {
    (
        any::<i64>(),
        any::<u64>(),
        // serde_json's default float parser may miss by an ulp on long decimals; eighths are
        // exact in both directions.
        any::<i32>().prop_map(|i| f64::from(i) / 8.0),
        ".{0,8}",
        any::<Option<u8>>(),
        prop::collection::btree_map(".{0,4}", prop::collection::vec(any::<i32>(), 0..4), 0..4),
    )
        .prop_map(|(n, u, f, s, o, m)| JsonSafe { n, u, f, s, o, m })
}

/// Every proptest here runs its default 256 cases; the values are small, so this is quick.
fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn generated_values_replay_exactly(v in val()) {
        let bytes = Codec::Tagged.encode_checked(&v).unwrap();
        prop_assert_eq!(Codec::Tagged.decode::<Val>(&bytes).unwrap(), v);
    }

    #[test]
    fn generated_values_nested_in_options_replay(v in val()) {
        let wrapped = (Some(Some(v.clone())), Some(None::<Val>), vec![Bits32(-0.0)]);
        prop_assert_eq!(replay(&wrapped), wrapped);
    }

    #[test]
    fn every_strict_prefix_of_a_record_is_an_error(v in val(), cut in any::<prop::sample::Index>()) {
        let bytes = Codec::Tagged.encode(&v).unwrap();
        let cut = cut.index(bytes.len());
        prop_assert!(Codec::Tagged.decode::<Val>(&bytes[..cut]).is_err());
        prop_assert!(Codec::Tagged.decode::<serde_json::Value>(&bytes[..cut]).is_err());
    }

    #[test]
    fn corrupted_records_never_panic(
        v in val(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut bytes = Codec::Tagged.encode(&v).unwrap();
        for (at, byte) in flips {
            let at = at.index(bytes.len());
            bytes[at] = byte;
        }
        // Either outcome is fine; what is checked is that decoding returns.
        let _ = Codec::Tagged.decode::<Val>(&bytes);
        let _ = Codec::Tagged.decode::<serde_json::Value>(&bytes);
        let _ = Codec::Tagged.decode::<Untagged>(&bytes);
    }

    #[test]
    fn garbage_never_panics(body in prop::collection::vec(any::<u8>(), 0..64)) {
        let mut bytes = vec![0xC1, 1];
        bytes.extend_from_slice(&body);
        let _ = Codec::Tagged.decode::<Val>(&bytes);
        let _ = Codec::Tagged.decode::<serde_json::Value>(&bytes);
        let _ = Codec::Tagged.decode::<(Option<Option<u8>>, Internal, Adjacent)>(&bytes);
        let _ = Codec::Tagged.decode::<Flattened>(&bytes);
        let _ = Codec::Tagged.decode::<Deep>(&bytes);
        let _ = Codec::Tagged.decode::<Vec<Option<Box<Deep>>>>(&bytes);
        let _ = Codec::Tagged.decode::<Val>(&body);
    }

    #[test]
    fn json_round_trips_what_it_accepts(v in json_safe()) {
        let bytes = Codec::Json.encode_checked(&v).unwrap();
        prop_assert_eq!(Codec::Json.decode::<JsonSafe>(&bytes).unwrap(), v);
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
enum Wide {
    Big(u128),
    Neg(i128),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind")]
enum Buffered {
    Holder {
        o: Option<Option<u8>>,
        u: (),
        f: Bits,
    },
}

/// Untagged and internally tagged enums go through serde's own buffer of the value, which
/// keeps `Some(None)`, unit and float bits, but cannot hand a 128-bit integer to its target
/// (a limit of serde, whatever the format).
#[test]
fn buffered_enums_keep_what_serde_buffers_and_refuse_the_rest_at_encode() {
    assert_exact(Buffered::Holder {
        o: Some(None),
        u: (),
        f: Bits(f64::NAN),
    });
    // The failure shows when the outcome is encoded, and nothing undecodable is produced.
    let err = Codec::Tagged.encode_checked(&Wide::Big(1)).unwrap_err();
    assert!(err.contains("Wide"), "{err}");
    assert!(Codec::Tagged.encode_checked(&Wide::Neg(i128::MIN)).is_err());
    assert!(Codec::Tagged.encode(&Wide::Big(u128::MAX)).is_ok());
}
