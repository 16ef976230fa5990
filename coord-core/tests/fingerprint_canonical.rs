//! Fingerprints are canonical: equal parameters agree whatever the map iteration order or the
//! process, and the data model's distinctions (NaN, infinities, `None`, `Some(None)`, `""`,
//! unit) are kept.

mod codec_support;

use std::collections::{BTreeMap, HashMap};

use codec_support::{Marker, Val, normalized, rebuilt, val};
use coord_core::__private::FingerprintHasher;
use coord_core::provider::Fingerprint;
use proptest::prelude::*;
use serde::Serialize;
use sha2::{Digest, Sha256};

fn fp<T: Serialize + ?Sized>(value: &T) -> Fingerprint {
    FingerprintHasher::new().param(value).finish().unwrap()
}

#[test]
fn special_values_are_pairwise_distinct() {
    let prints = [
        ("NaN", fp(&f64::NAN)),
        ("+inf", fp(&f64::INFINITY)),
        ("-inf", fp(&f64::NEG_INFINITY)),
        ("0.0", fp(&0.0f64)),
        ("None", fp(&None::<Option<u8>>)),
        ("Some(None)", fp(&Some(None::<u8>))),
        ("Some(())", fp(&Some(()))),
        ("\"\"", fp("")),
        ("()", fp(&())),
        ("unit struct", fp(&Marker)),
        ("0i64", fp(&0i64)),
        ("0u64", fp(&0u64)),
        ("empty vec", fp(&Vec::<u8>::new())),
        ("empty map", fp(&BTreeMap::<u8, u8>::new())),
        ("f32 NaN", fp(&f32::NAN)),
    ];
    for (i, (a, fa)) in prints.iter().enumerate() {
        for (b, fb) in &prints[i + 1..] {
            assert_ne!(fa, fb, "{a} and {b} fingerprint equally");
        }
    }
}

#[test]
fn every_nan_is_one_nan_and_negative_zero_is_zero() {
    let nans = [
        f64::NAN,
        -f64::NAN,
        f64::from_bits(0x7FF0_0000_0000_0001),
        f64::from_bits(0xFFF8_0000_DEAD_BEEF),
    ];
    for nan in nans {
        assert!(nan.is_nan());
        assert_eq!(fp(&nan), fp(&f64::NAN), "{:#x}", nan.to_bits());
        assert_eq!(fp(&Some(vec![nan])), fp(&Some(vec![f64::NAN])));
    }
    assert_eq!(fp(&f32::from_bits(0xFFC0_0001)), fp(&f32::NAN));
    assert_eq!(fp(&-0.0f64), fp(&0.0f64));
    assert_eq!(fp(&-0.0f32), fp(&0.0f32));
}

#[test]
fn hash_maps_fingerprint_like_ordered_maps_with_the_same_entries() {
    let entries: Vec<(String, Option<u32>)> = (0..64)
        .map(|i| (format!("key-{i}"), (i % 2 == 0).then_some(i)))
        .collect();
    let forward: HashMap<_, _> = entries.iter().cloned().collect();
    let backward: HashMap<_, _> = entries.iter().rev().cloned().collect();
    let ordered: BTreeMap<_, _> = entries.iter().cloned().collect();
    // With 64 entries, two hash maps with their own random seeds iterate in the same order
    // with negligible probability; the fingerprints must agree regardless.
    assert_eq!(fp(&forward), fp(&backward));
    assert_eq!(fp(&forward), fp(&ordered));
    let mut changed = forward.clone();
    changed.insert("key-0".into(), Some(1));
    assert_ne!(fp(&forward), fp(&changed));
}

#[test]
fn boundaries_and_order_of_parameters_count() {
    let a = FingerprintHasher::new().param("ab").param("c").finish();
    let b = FingerprintHasher::new().param("a").param("bc").finish();
    assert_ne!(a.unwrap(), b.unwrap());
    let a = FingerprintHasher::new().param(&1u8).param(&2u8).finish();
    let b = FingerprintHasher::new().param(&2u8).param(&1u8).finish();
    assert_ne!(a.unwrap(), b.unwrap());
    let one = FingerprintHasher::new().param(&(1u8, 2u8)).finish();
    let two = FingerprintHasher::new().param(&1u8).param(&2u8).finish();
    assert_ne!(one.unwrap(), two.unwrap());
}

/// Pins the encoding by spelling it out from the documented layout: if this changes,
/// fingerprints stored by earlier builds no longer match and every reused key would be
/// refused as reused with other parameters. Change it only with the fingerprint version byte.
#[test]
fn fingerprints_follow_the_documented_layout() {
    let mut map = HashMap::new();
    map.insert("b", 1u8);
    map.insert("a", 2u8);
    let print = FingerprintHasher::new()
        .param("ab")
        .param(&Some(None::<u8>))
        .param(&map)
        .param(&-0.0f64)
        .finish()
        .unwrap();

    let mut expected = Sha256::new();
    expected.update([2u8]); // fingerprint version
    let params: [&[u8]; 4] = [
        // string: tag, length, UTF-8
        &[0x12, 2, b'a', b'b'],
        // Some, None
        &[0x02, 0x01],
        // map of 2, entries sorted by encoded key: "a" => 2u8, "b" => 1u8
        &[0x18, 2, 0x12, 1, b'a', 0x0A, 2, 0x12, 1, b'b', 0x0A, 1],
        // f64 0.0 (canonical form of -0.0)
        &[0x10, 0, 0, 0, 0, 0, 0, 0, 0],
    ];
    for bytes in params {
        expected.update((bytes.len() as u64).to_le_bytes());
        expected.update(bytes);
    }
    let digest = expected.finalize();
    assert_eq!(print.0[..], digest[..16]);
}

#[test]
fn a_serialization_error_is_reported() {
    let err = FingerprintHasher::new()
        .param(&1u8)
        .param(&Failing)
        .param(&2u8)
        .finish()
        .unwrap_err();
    assert!(err.contains("refused by the type"), "{err}");
}

fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// Rebuilding every `HashMap` (fresh random seed, reversed insertion order) and replacing
    /// each NaN payload by the standard NaN change nothing.
    #[test]
    fn equal_values_fingerprint_equally(v in val()) {
        let again = rebuilt(&v);
        prop_assert_eq!(&again, &v);
        prop_assert_eq!(fp(&v), fp(&again));
        prop_assert_eq!(fp(&v), fp(&normalized(&v)));
        let as_params = FingerprintHasher::new().param(&v).param(&again).finish().unwrap();
        let swapped = FingerprintHasher::new().param(&again).param(&v).finish().unwrap();
        prop_assert_eq!(as_params, swapped);
    }

    /// Different values (after the documented float normalisation) fingerprint differently.
    #[test]
    fn different_values_fingerprint_differently(a in val(), b in val()) {
        prop_assume!(normalized(&a) != normalized(&b));
        prop_assert_ne!(fp(&a), fp(&b));
    }

    /// Small edits deep inside a value change its fingerprint.
    #[test]
    fn wrapping_a_value_changes_its_fingerprint(v in val()) {
        let some = Val::Opt(Some(Some(Box::new(v.clone()))));
        let list = Val::List(vec![v.clone()]);
        prop_assert_ne!(fp(&v), fp(&some));
        prop_assert_ne!(fp(&v), fp(&list));
        prop_assert_ne!(fp(&some), fp(&list));
        prop_assert_ne!(fp(&Some(&v)), fp(&Some(Some(&v))));
    }
}

/// A sequence of unknown length whose second element fails.
struct FailingSeq;

impl Serialize for FailingSeq {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(None)?;
        seq.serialize_element(&1u8)?;
        seq.serialize_element(&Failing)?;
        seq.end()
    }
}

struct Failing;

impl Serialize for Failing {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("refused by the type"))
    }
}

/// Ignores the errors it is given and announces a wrong field count.
struct Careless;

impl Serialize for Careless {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Careless", 3)?;
        let _ = st.serialize_field("a", &FailingSeq);
        st.serialize_field("b", &2u8)?;
        st.end()
    }
}

#[test]
fn a_serialize_impl_that_ignores_errors_gets_an_error_not_a_panic() {
    let err = FingerprintHasher::new()
        .param(&Careless)
        .finish()
        .unwrap_err();
    assert!(err.contains("carried on after an error"), "{err}");
    let err = coord_core::Codec::Tagged.encode(&Careless).unwrap_err();
    assert!(err.contains("carried on after an error"), "{err}");
}
