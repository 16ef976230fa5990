//! Hostile key parts: the rendered call key stays injective, inside its namespace, and inside
//! one Redis Cluster hash slot.
//!
//! Two ways in. A table of named cases (empty parts, 1 MiB parts, NUL, newline, braces, `*`,
//! `%`-escape lookalikes, Unicode lookalikes, text that came from non-UTF-8 bytes, hostile
//! operation names), each stating what it expects and printing what it saw; and property tests
//! over generated tuples of hostile parts.
//!
//! The Redis layout checked here is the one documented for the Redis provider: call key
//! `ns:op:parts` lives at `ns:<kind>:{op:parts}`, and Redis hashes only the text between the
//! first `{` and the next `}`. The Redis-side test (`coord-redis/tests/redis/bad_inputs.rs`) checks
//! the names a real server ends up with.
//!
//! Non-UTF-8 bytes: every string key part is `&str`/`String`/`char` (there is no bytes key
//! part), so bytes that are not UTF-8 cannot reach a key part; a caller converts them first,
//! typically lossily (`String::from_utf8_lossy`, `OsStr::to_string_lossy`). Lossy conversion
//! maps different byte strings to the same text, so the cases below pin that coord keeps the
//! converted text injective and confined, and that the collapse happens before coord.
//!
//! Injectivity is per operation and per parameter type: an operation's key parameters have
//! fixed types, so the integer `1` and the string `"1"` rendering alike is not a collision two
//! calls of one operation can meet (a case pins it, so a change is noticed).

use coord_core::{CallKey, KeyPart};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------------
// The Redis side, as documented: names, hash tags and slots.

/// CRC16/XMODEM, the checksum Redis Cluster maps keys to slots with.
fn crc16(data: &[u8]) -> u16 {
    let mut crc = 0u16;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The part of `name` Redis hashes: between the first `{` and the next `}` when that is not
/// empty, else the whole name.
fn hashed_part(name: &[u8]) -> &[u8] {
    if let Some(open) = name.iter().position(|&b| b == b'{') {
        if let Some(len) = name[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &name[open + 1..open + 1 + len];
            }
        }
    }
    name
}

fn slot(name: &str) -> u16 {
    crc16(hashed_part(name.as_bytes())) % 16384
}

/// The Redis names of call key `key`, laid out as the Redis provider documents.
fn redis_names(key: &str) -> [String; 3] {
    let (ns, rest) = key.split_once(':').unwrap_or(("", key));
    ["lock", "fence", "idem"].map(|kind| format!("{ns}:{kind}:{{{rest}}}"))
}

// ---------------------------------------------------------------------------------------------
// Rendering and reading back.

/// The call key the runtime builds: namespace, operation name, then the parts.
fn call_key(ns: &str, op: &str, parts: &[String]) -> String {
    parts
        .iter()
        .fold(CallKey::builder(ns, op), |b, p| b.part(p.as_str()))
        .finish()
        .qualified()
        .to_owned()
}

/// The namespace as the runtime writes it into keys (escaped like an operation segment).
fn rendered_namespace(ns: &str) -> String {
    CallKey::builder(ns, "op").finish().namespace().to_owned()
}

/// Reads the parts back out of a key rendered by [`call_key`] with a known namespace and
/// operation: the inverse of the rendering, so `decode(encode(t)) == t` proves that distinct
/// tuples give distinct keys.
fn decode_parts(key: &str, ns: &str, op: &str) -> Result<Vec<String>, String> {
    let head = format!("{ns}:{op}");
    let rest = key
        .strip_prefix(&head)
        .ok_or_else(|| format!("key does not start with {head:?}"))?;
    if rest.is_empty() {
        return Ok(Vec::new());
    }
    let rest = rest
        .strip_prefix(':')
        .ok_or("no separator after the operation")?;
    rest.split(':').map(unescape).collect()
}

fn unescape(part: &str) -> Result<String, String> {
    if part == "%_" {
        return Ok(String::new());
    }
    let bytes = part.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = part
                .get(i + 1..i + 3)
                .ok_or_else(|| format!("truncated escape at {i}"))?;
            let byte = u8::from_str_radix(hex, 16).map_err(|_| format!("bad escape {hex:?}"))?;
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|e| e.to_string())
}

/// Everything the confinement promise says about one rendered key, as a list of violations
/// (empty when the key is confined).
fn confinement_violations(key: &str, ns: &str) -> Vec<String> {
    let mut bad = Vec::new();
    let Some(rest) = key.strip_prefix(ns).and_then(|r| r.strip_prefix(':')) else {
        bad.push(format!("does not start with namespace {ns:?} and `:`"));
        return bad;
    };
    if key.split_once(':').map(|(n, _)| n) != Some(ns) {
        bad.push("the first `:` is not right after the namespace".into());
    }
    if rest.contains(['{', '}']) {
        bad.push("a raw brace after the namespace".into());
    }
    if rest.bytes().any(|b| b < 0x20 || b == 0x7f) {
        bad.push("a raw control byte".into());
    }
    let names = redis_names(key);
    for name in &names {
        if hashed_part(name.as_bytes()) != rest.as_bytes() {
            bad.push(format!(
                "hash tag of {} is not the call key",
                &name[..name.len().min(40)]
            ));
        }
        if !name.starts_with(&format!("{ns}:")) {
            bad.push("Redis name outside the namespace".into());
        }
    }
    let slots: Vec<u16> = names.iter().map(|n| slot(n)).collect();
    if slots.iter().any(|&s| s != slots[0]) {
        bad.push(format!("names spread over slots {slots:?}"));
    }
    bad
}

/// A short description of a possibly huge key.
fn show(key: &str) -> String {
    if key.len() <= 60 {
        format!("{key:?}")
    } else {
        let cut = (0..=40)
            .rev()
            .find(|&i| key.is_char_boundary(i))
            .unwrap_or(0);
        format!("{:?}… ({} bytes)", &key[..cut], key.len())
    }
}

// ---------------------------------------------------------------------------------------------
// The table.

/// One call key: namespace, operation name (as the macros pass it) and string parts.
#[derive(Clone)]
struct KeyInput {
    ns: &'static str,
    op: &'static str,
    parts: Vec<String>,
}

fn input(parts: &[&str]) -> KeyInput {
    KeyInput {
        ns: "svc",
        op: "pay.charge",
        parts: parts.iter().map(|p| (*p).to_owned()).collect(),
    }
}

enum Expect {
    /// The key reads back to exactly its parts, starts with its namespace, holds no raw brace
    /// or control byte after it, and all its Redis names hash to one slot by the call key.
    Confined,
    /// Confined, and different from the key of this other input.
    DistinctFrom(KeyInput),
    /// Renders exactly like this other key (a documented non-collision, see the module docs).
    SameAs(String),
    /// The operation segment is not one the macros accept, but the key is still confined to
    /// its namespace and one slot.
    ConfinedSegment,
}

struct Case {
    name: &'static str,
    input: KeyInput,
    expect: Expect,
}

fn mib(unit: &str) -> String {
    unit.repeat((1 << 20) / unit.len())
}

fn cases() -> Vec<Case> {
    use Expect::*;
    let lossy_ff = String::from_utf8_lossy(b"id-\xff").into_owned();
    let lossy_fe = String::from_utf8_lossy(b"id-\xfe\xfd").into_owned();
    #[cfg(unix)]
    let os_lossy = {
        use std::os::unix::ffi::OsStrExt;
        std::ffi::OsStr::from_bytes(b"file\x80.txt")
            .to_string_lossy()
            .into_owned()
    };
    #[cfg(not(unix))]
    let os_lossy = String::from("file\u{FFFD}.txt");
    let big_a = mib("a");
    let mut big_ab = big_a.clone();
    big_ab.pop();
    big_ab.push('b');
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    vec![
        Case {
            name: "empty part",
            input: input(&[""]),
            expect: DistinctFrom(input(&[])),
        },
        Case {
            name: "two empty parts",
            input: input(&["", ""]),
            expect: DistinctFrom(input(&[""])),
        },
        Case {
            name: "empty part vs literal %_",
            input: input(&[""]),
            expect: DistinctFrom(input(&["%_"])),
        },
        Case {
            name: "1 MiB part",
            input: input(&[leak(big_a.clone())]),
            expect: DistinctFrom(input(&[leak(big_ab)])),
        },
        Case {
            name: "1 MiB of braces",
            input: input(&[leak(mib("{"))]),
            expect: DistinctFrom(input(&[leak(mib("}"))])),
        },
        Case {
            name: "1 MiB of NUL",
            input: input(&[leak(mib("\0"))]),
            expect: Confined,
        },
        Case {
            name: "1 MiB then a colon",
            input: input(&[leak(format!("{big_a}:"))]),
            expect: DistinctFrom(input(&[leak(big_a.clone()), ""])),
        },
        Case {
            name: "NUL",
            input: input(&["a\0b"]),
            expect: DistinctFrom(input(&["a%00b"])),
        },
        Case {
            name: "newline and CR",
            input: input(&["a\nb\r"]),
            expect: DistinctFrom(input(&["a b "])),
        },
        Case {
            name: "tab and DEL",
            input: input(&["\t\x7f"]),
            expect: Confined,
        },
        Case {
            name: "every ASCII control byte",
            input: input(&[leak((0u8..0x20).map(char::from).collect())]),
            expect: Confined,
        },
        Case {
            name: "hash tag in a part",
            input: input(&["{user1}"]),
            expect: DistinctFrom(input(&["user1"])),
        },
        Case {
            name: "lone braces",
            input: input(&["}", "{"]),
            expect: DistinctFrom(input(&["{", "}"])),
        },
        Case {
            name: "empty hash tag",
            input: input(&["{}"]),
            expect: Confined,
        },
        Case {
            name: "glob characters",
            input: input(&["*", "?", "[a-z]"]),
            expect: DistinctFrom(input(&["*?[a-z]"])),
        },
        Case {
            name: "separator in a part",
            input: input(&["a:b"]),
            expect: DistinctFrom(input(&["a", "b"])),
        },
        Case {
            name: "double separator",
            input: input(&["::"]),
            expect: DistinctFrom(input(&["", "", ""])),
        },
        Case {
            name: "percent",
            input: input(&["%"]),
            expect: DistinctFrom(input(&["%25"])),
        },
        Case {
            name: "escape lookalike %3A",
            input: input(&["%3A"]),
            expect: DistinctFrom(input(&[":"])),
        },
        Case {
            name: "escape lookalike %2F",
            input: input(&["a%2Fb"]),
            expect: DistinctFrom(input(&["a/b"])),
        },
        Case {
            name: "option markers as text",
            input: input(&["%-", "%+"]),
            expect: DistinctFrom(input(&["%_", "%_"])),
        },
        Case {
            name: "fullwidth colon",
            input: input(&["a\u{FF1A}b"]),
            expect: DistinctFrom(input(&["a:b"])),
        },
        Case {
            name: "fullwidth braces",
            input: input(&["\u{FF5B}x\u{FF5D}"]),
            expect: DistinctFrom(input(&["{x}"])),
        },
        Case {
            name: "hyphen lookalike",
            input: input(&["a\u{2010}b"]),
            expect: DistinctFrom(input(&["a-b"])),
        },
        Case {
            name: "combining accent vs precomposed",
            input: input(&["e\u{301}"]),
            expect: DistinctFrom(input(&["\u{e9}"])),
        },
        Case {
            name: "bidi override and zero-width joiner",
            input: input(&["\u{202E}a\u{200D}"]),
            expect: DistinctFrom(input(&["a"])),
        },
        Case {
            name: "C1 control and line separator",
            input: input(&["\u{85}\u{2028}"]),
            expect: Confined,
        },
        Case {
            name: "non-UTF-8 via from_utf8_lossy",
            input: input(&[leak(lossy_ff.clone())]),
            expect: DistinctFrom(input(&["id-"])),
        },
        Case {
            name: "two non-UTF-8 inputs collapse before coord",
            input: input(&[leak(lossy_fe)]),
            expect: SameAs(call_key(
                "svc",
                "pay.charge",
                &["id-\u{FFFD}\u{FFFD}".to_owned()],
            )),
        },
        Case {
            name: "non-UTF-8 path via OsStr lossy",
            input: input(&[leak(os_lossy)]),
            expect: DistinctFrom(input(&["file.txt"])),
        },
        Case {
            name: "integer and string render alike",
            input: input(&["1"]),
            expect: SameAs(
                CallKey::builder("svc", "pay.charge")
                    .part(&1u64)
                    .finish()
                    .qualified()
                    .to_owned(),
            ),
        },
        Case {
            name: "unicode namespace",
            input: KeyInput {
                ns: "\u{540D}\u{524D}",
                op: "op",
                parts: vec!["x".into()],
            },
            expect: Confined,
        },
        Case {
            name: "namespace with glob and percent",
            input: KeyInput {
                ns: "*%",
                op: "op",
                parts: vec!["x".into()],
            },
            expect: DistinctFrom(KeyInput {
                ns: "*",
                op: "op",
                parts: vec!["%".into(), "x".into()],
            }),
        },
        Case {
            name: "64 KiB namespace",
            input: KeyInput {
                ns: leak("n".repeat(1 << 16)),
                op: "op",
                parts: vec!["x".into()],
            },
            expect: Confined,
        },
        Case {
            name: "module-path operation name",
            input: KeyInput {
                ns: "svc",
                op: "my_crate::billing::charge",
                parts: vec!["".into()],
            },
            expect: DistinctFrom(KeyInput {
                ns: "svc",
                op: "my_crate",
                parts: vec![
                    "".into(),
                    "billing".into(),
                    "".into(),
                    "charge".into(),
                    "".into(),
                ],
            }),
        },
        Case {
            name: "operation with every allowed character",
            input: KeyInput {
                ns: "svc",
                op: "a.b_c-d/e9",
                parts: vec!["x".into()],
            },
            expect: DistinctFrom(KeyInput {
                ns: "svc",
                op: "a.b_c-d",
                parts: vec!["e9".into(), "x".into()],
            }),
        },
        Case {
            name: "operation segment with braces",
            input: KeyInput {
                ns: "svc",
                op: "op{tag}",
                parts: vec!["x".into()],
            },
            expect: ConfinedSegment,
        },
        Case {
            name: "operation segment with control bytes",
            input: KeyInput {
                ns: "svc",
                op: "op\n\0",
                parts: vec![],
            },
            expect: ConfinedSegment,
        },
        Case {
            name: "operation segment with a percent",
            input: KeyInput {
                ns: "svc",
                op: "op%7B",
                parts: vec![],
            },
            expect: ConfinedSegment,
        },
    ]
}

/// Runs one case: `Ok(saw)` when it behaved as expected, `Err(saw)` otherwise.
fn run(case: &Case) -> Result<String, String> {
    let KeyInput { ns, op, parts } = &case.input;
    let key = call_key(ns, op, parts);
    // The namespace as keys carry it: escaped like an operation segment (`%` as `%25`).
    let ns = &rendered_namespace(ns);
    let mut problems = confinement_violations(&key, ns);
    if !matches!(case.expect, Expect::ConfinedSegment) {
        match decode_parts(&key, ns, op) {
            Ok(back) if &back == parts => {}
            Ok(back) => problems.push(format!("reads back as {} parts, not the input", back.len())),
            Err(e) => problems.push(format!("does not read back: {e}")),
        }
    }
    match &case.expect {
        Expect::DistinctFrom(other) => {
            let other_key = call_key(other.ns, other.op, &other.parts);
            if other_key == key {
                problems.push(format!("same key as the other input: {}", show(&key)));
            }
            problems.extend(confinement_violations(
                &other_key,
                &rendered_namespace(other.ns),
            ));
        }
        Expect::SameAs(other) if *other != key => {
            problems.push(format!("{} differs from {}", show(&key), show(other)));
        }
        _ => {}
    }
    let saw = format!("{} in slot {}", show(&key), slot(&redis_names(&key)[0]));
    if problems.is_empty() {
        Ok(saw)
    } else {
        Err(format!("{saw}: {}", problems.join("; ")))
    }
}

fn describe(expect: &Expect) -> String {
    match expect {
        Expect::Confined => "confined, reads back".into(),
        Expect::DistinctFrom(other) => format!(
            "confined, reads back, differs from {}",
            show(&call_key(other.ns, other.op, &other.parts))
        ),
        Expect::SameAs(other) => format!("renders as {}", show(other)),
        Expect::ConfinedSegment => "confined to namespace and one slot".into(),
    }
}

/// The smallest count of key cases the corpus promises.
const MIN_KEY_CASES: usize = 35;

#[test]
fn hostile_key_corpus() {
    // The checksum matches Redis Cluster's reference value.
    assert_eq!(crc16(b"123456789"), 0x31C3);
    let cases = cases();
    let mut failed = Vec::new();
    for case in &cases {
        let (verdict, saw) = match run(case) {
            Ok(saw) => ("PASS", saw),
            Err(saw) => ("FAIL", saw),
        };
        println!(
            "case {}: expected {}; saw {saw}: {verdict}",
            case.name,
            describe(&case.expect)
        );
        if verdict == "FAIL" {
            failed.push(case.name);
        }
    }
    println!("key corpus: {} cases, {} failed", cases.len(), failed.len());
    assert!(failed.is_empty(), "failed cases: {failed:?}");
    assert!(
        cases.len() >= MIN_KEY_CASES,
        "only {} key cases",
        cases.len()
    );
}

// ---------------------------------------------------------------------------------------------
// Generated tuples.

/// Pieces hostile strings are glued from.
const PIECES: &[&str] = &[
    "", ":", "::", "{", "}", "{}", "%", "%2F", "%3A", "%_", "%-", "%+", "*", "?", "\0", "\n", "\r",
    "\t", "\x7f", "\u{FF1A}", "\u{2010}", "-", "\u{FF5B}", "\u{FF5D}", "\u{FFFD}", "\u{e9}",
    "e\u{301}", "a", "1", " ", "\u{202E}", "\u{85}",
];

fn hostile() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::collection::vec(prop::sample::select(PIECES), 0..6).prop_map(|p| p.concat()),
        1 => any::<String>(),
    ]
}

fn tuple() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(hostile(), 0..4)
}

/// Operation names as the macros produce them: explicit names and module paths, chosen so
/// that some are prefixes of others.
const OPS: &[&str] = &["a", "a.b", "a/b", "a-b", "a::b", "a::b::c", "b"];

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 512,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// Distinct (operation, tuple) pairs never share a key.
    #[test]
    fn distinct_calls_get_distinct_keys(
        a in (prop::sample::select(OPS), tuple()),
        b in (prop::sample::select(OPS), tuple()),
    ) {
        prop_assume!(a != b);
        prop_assert_ne!(call_key("svc", a.0, &a.1), call_key("svc", b.0, &b.1));
    }

    /// Near-identical tuples (one piece changed) never share a key.
    #[test]
    fn one_changed_part_changes_the_key(t in prop::collection::vec(hostile(), 1..4), i in any::<prop::sample::Index>(), other in hostile()) {
        let mut u = t.clone();
        let at = i.index(u.len());
        prop_assume!(u[at] != other);
        u[at] = other;
        prop_assert_ne!(call_key("svc", "a", &t), call_key("svc", "a", &u));
    }

    /// Every key reads back to its tuple: the rendering is invertible, hence injective.
    #[test]
    fn keys_read_back_to_their_parts(op in prop::sample::select(OPS), t in tuple()) {
        let key = call_key("svc", op, &t);
        prop_assert_eq!(decode_parts(&key, "svc", op), Ok(t));
    }

    /// No tuple moves a key out of its namespace or spreads one call over several slots.
    #[test]
    fn keys_stay_in_their_namespace_and_slot(op in prop::sample::select(OPS), t in tuple()) {
        let key = call_key("svc", op, &t);
        let bad = confinement_violations(&key, "svc");
        prop_assert!(bad.is_empty(), "{}: {:?}", show(&key), bad);
    }

    /// Optional parts: `None`, `Some("")` and `Some` of any hostile text stay apart.
    #[test]
    fn optional_hostile_parts_stay_apart(a in prop::option::of(hostile()), b in prop::option::of(hostile())) {
        prop_assume!(a != b);
        let key = |v: &Option<String>| CallKey::builder("svc", "a").part(v).finish().qualified().to_owned();
        prop_assert_ne!(key(&a), key(&b));
    }

    /// `char` parts, lookalikes included, render like the one-character string.
    #[test]
    fn char_parts_are_confined(c in any::<char>()) {
        let key = CallKey::builder("svc", "a").part(&c).finish().qualified().to_owned();
        prop_assert_eq!(&key, &call_key("svc", "a", &[c.to_string()]));
        prop_assert!(confinement_violations(&key, "svc").is_empty());
    }

    /// Whatever an operation segment holds, the key stays in its namespace and one slot.
    #[test]
    fn any_operation_segment_is_confined(op in hostile(), t in tuple()) {
        let key = call_key("svc", &op, &t);
        let bad = confinement_violations(&key, "svc");
        prop_assert!(bad.is_empty(), "{}: {:?}", show(&key), bad);
    }
}

/// A part type of the caller's own, delegating as `KeyPart`'s docs advise, keeps the promise.
#[test]
fn delegating_key_parts_inherit_the_escaping() {
    struct OrderId(String);
    impl KeyPart for OrderId {
        fn write_key_part(&self, out: &mut coord_core::provider::KeyWriter) {
            self.0.write_key_part(out);
        }
    }
    let forged = OrderId("1}:{2".into());
    let key = CallKey::builder("svc", "a")
        .part(&forged)
        .finish()
        .qualified()
        .to_owned();
    assert_eq!(key, "svc:a:1%7D%3A%7B2");
    assert!(confinement_violations(&key, "svc").is_empty());
}
