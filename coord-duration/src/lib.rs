//! The duration grammar of coord: `"250ms"`, `"30s"`, `"5m"`, `"24h"`, `"1d"`, `"1m30s"`.
//!
//! coord reads durations in two places, its attribute macros at compile time
//! (`#[distributed_lock(lease = "5m")]`) and its configuration at run time (`COORD_LEASE=30s`,
//! `lease = "30s"` in a file). Both call this crate, so they accept the same text, give it the
//! same value and explain a refusal in the same words.
//!
//! ```
//! use std::time::Duration;
//!
//! assert_eq!(coord_duration::parse("1m30s"), Ok(Duration::from_secs(90)));
//! assert_eq!(coord_duration::parse_millis("250ms"), Ok(250));
//! assert_eq!(coord_duration::format(Duration::from_secs(90)), "1m30s");
//!
//! let err = coord_duration::parse("5 minutes").unwrap_err();
//! assert_eq!(err.reason(), &coord_duration::Reason::Whitespace);
//! assert!(err.to_string().starts_with("invalid duration \"5 minutes\": it contains spaces; "));
//! ```
//!
//! # The grammar
//!
//! A duration is one or more *terms*, each a whole number immediately followed by a unit,
//! written from the largest unit down, each unit at most once, with nothing between the terms:
//!
//! | Unit | Means          | Milliseconds | Example   |
//! |------|----------------|-------------:|-----------|
//! | `d`  | day (24 hours) | 86 400 000   | `"1d"`    |
//! | `h`  | hour           | 3 600 000    | `"24h"`   |
//! | `m`  | minute         | 60 000       | `"5m"`    |
//! | `s`  | second         | 1 000        | `"30s"`   |
//! | `ms` | millisecond    | 1            | `"250ms"` |
//!
//! A duration's value is the sum of its terms: `"1h0m5s250ms"` is 3 605 250 ms.
//!
//! | Accepted                                   | Example                    |
//! |--------------------------------------------|----------------------------|
//! | zero, in any unit                          | `"0s"`, `"0ms"`            |
//! | leading zeros                              | `"007s"` (7 s)             |
//! | a term of zero between others              | `"1h0m5s"`                 |
//! | a number larger than the next unit up      | `"90s"`, `"36h"`           |
//! | up to [`MAX_MILLIS`] (`i64::MAX` ms, about 292 million years) | `"9223372036854775807ms"` |
//!
//! | Refused ([`Reason`])                              | Example                     |
//! |---------------------------------------------------|-----------------------------|
//! | empty text ([`Reason::Empty`])                    | `""`                        |
//! | a sign ([`Reason::Negative`], [`Reason::ExpectedNumber`]) | `"-5s"`, `"+5s"`     |
//! | whitespace anywhere, even at the ends ([`Reason::Whitespace`]) | `"5 s"`, `" 5s"` |
//! | fractions ([`Reason::Fraction`]): use a smaller unit | `"1.5s"`, `"1,5s"`       |
//! | a number without a unit ([`Reason::MissingUnit`]) | `"5"`, `"1m30"`             |
//! | text where a number belongs ([`Reason::ExpectedNumber`]) | `"s"`, `"ms5"`       |
//! | an unknown unit, upper case included ([`Reason::UnknownUnit`]) | `"5min"`, `"5S"`, `"5µs"` |
//! | units not in descending order, or repeated ([`Reason::UnitOrder`]) | `"30s1m"`, `"1m1m"` |
//! | more than [`MAX_MILLIS`] ([`Reason::TooLong`])    | `"9223372036854775808ms"`   |
//!
//! Whitespace is refused rather than trimmed so that a quoted value means what it shows; a
//! caller reading text that may carry stray whitespace (an environment variable) trims it
//! first. Zero is accepted: whether a zero duration means anything is the caller's call.
//!
//! # What is promised
//!
//! * The grammar above, with semantic-versioning stability: a text accepted by one version
//!   is accepted, with the same value, by every later compatible version.
//! * [`format()`] writes text that [`parse`] reads back to the same whole milliseconds, for
//!   every duration up to [`MAX_MILLIS`].
//!
//! Not promised: the wording of [`ParseError`]'s message (match on [`ParseError::reason`]
//! instead), or that [`Reason`] keeps its variants (it is `#[non_exhaustive]`).

#![forbid(unsafe_code)]

use std::error::Error;
use std::fmt::{self, Write as _};
use std::time::Duration;

/// The units, largest first, with their length in milliseconds.
const UNITS: [(&str, u64); 5] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// The longest duration accepted, in milliseconds: `i64::MAX`, what a signed 64-bit
/// millisecond count holds, the widest range storage backends take for an expiry (about
/// 292 million years).
///
/// ```
/// assert_eq!(coord_duration::parse_millis("9223372036854775807ms"), Ok(coord_duration::MAX_MILLIS));
/// assert!(coord_duration::parse_millis("9223372036854775808ms").is_err());
/// ```
pub const MAX_MILLIS: u64 = i64::MAX as u64;

/// The hint every refusal's message ends with.
const ACCEPTED: &str = "write a whole number followed by a unit (`ms`, `s`, `m`, `h` or `d`), \
     such as \"250ms\", \"30s\", \"5m\" or \"24h\", or several of them from the largest unit \
     down, such as \"1m30s\"";

/// Parses `text` into whole milliseconds, or says what is wrong with it.
///
/// See the [crate documentation](crate) for the grammar.
///
/// ```
/// assert_eq!(coord_duration::parse_millis("1m30s"), Ok(90_000));
/// assert_eq!(coord_duration::parse_millis("0s"), Ok(0));
///
/// let err = coord_duration::parse_millis("30s1m").unwrap_err();
/// assert_eq!(err.text(), "30s1m");
/// assert_eq!(err.reason(), &coord_duration::Reason::UnitOrder { unit: "m".into() });
/// ```
pub fn parse_millis(text: &str) -> Result<u64, ParseError> {
    let refuse = |reason: Reason| {
        Err(ParseError {
            text: text.to_owned(),
            reason,
        })
    };
    if text.is_empty() {
        return refuse(Reason::Empty);
    }
    if text.starts_with('-') {
        return refuse(Reason::Negative);
    }
    if text.chars().any(char::is_whitespace) {
        return refuse(Reason::Whitespace);
    }
    if text.contains('.') || text.contains(',') {
        return refuse(Reason::Fraction);
    }

    let mut total: u64 = 0;
    // Index into UNITS of the previous term's unit: each term must use a smaller one.
    let mut previous: Option<usize> = None;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return refuse(Reason::ExpectedNumber { at: rest.into() });
        }
        let (number, after) = rest.split_at(digits);
        // The unit is everything up to the next digit, so that a unit outside ASCII (`µs`) or
        // with punctuation in it is named whole in the refusal.
        let unit_len = after
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        if unit.is_empty() {
            return refuse(Reason::MissingUnit {
                number: number.into(),
            });
        }
        let Some(index) = UNITS.iter().position(|(name, _)| *name == unit) else {
            return refuse(Reason::UnknownUnit { unit: unit.into() });
        };
        if previous.is_some_and(|p| index <= p) {
            return refuse(Reason::UnitOrder { unit: unit.into() });
        }
        previous = Some(index);

        // A number too large for u64 overflows like a term too large for the limit.
        let term = number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(UNITS[index].1));
        total = match term.and_then(|t| total.checked_add(t)) {
            Some(sum) if sum <= MAX_MILLIS => sum,
            _ => return refuse(Reason::TooLong),
        };
        rest = after;
    }
    Ok(total)
}

/// Parses `text` into a [`Duration`] of whole milliseconds, or says what is wrong with it.
///
/// See the [crate documentation](crate) for the grammar.
///
/// ```
/// use std::time::Duration;
///
/// assert_eq!(coord_duration::parse("24h"), Ok(Duration::from_secs(86_400)));
/// assert_eq!(coord_duration::parse("2d12h"), Ok(Duration::from_secs(216_000)));
/// assert!(coord_duration::parse("1.5s").is_err());
/// ```
pub fn parse(text: &str) -> Result<Duration, ParseError> {
    parse_millis(text).map(Duration::from_millis)
}

/// Writes `millis` in the grammar, with the largest units that fit (`90_000` is `"1m30s"`;
/// zero is `"0s"`).
///
/// [`parse_millis`] reads the text back to `millis` whenever `millis` is at most
/// [`MAX_MILLIS`]; a larger count is written the same way, but parsing refuses it.
///
/// ```
/// assert_eq!(coord_duration::format_millis(3_605_250), "1h5s250ms");
/// assert_eq!(coord_duration::format_millis(0), "0s");
/// ```
pub fn format_millis(millis: u64) -> String {
    if millis == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    let mut left = millis;
    for (name, length) in UNITS {
        if left >= length {
            // Writing into a String cannot fail.
            let _ = write!(out, "{}{name}", left / length);
            left %= length;
        }
    }
    out
}

/// Writes `duration` in the grammar, in whole milliseconds with the largest units that fit
/// (90 s is `"1m30s"`): the text [`parse`] reads back to `duration` less its sub-millisecond
/// part, which the grammar cannot express and which is dropped.
///
/// A duration longer than [`MAX_MILLIS`] has no text that parses; it is written as its whole
/// milliseconds (at most `u64::MAX`, saturating), which [`parse`] refuses as too long.
///
/// ```
/// use std::time::Duration;
///
/// assert_eq!(coord_duration::format(Duration::from_millis(86_400_250)), "1d250ms");
/// assert_eq!(coord_duration::format(Duration::from_micros(1_500)), "1ms");
/// ```
pub fn format(duration: Duration) -> String {
    format_millis(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

/// Why a text is not a duration: the text and the [`Reason`].
///
/// Its [`Display`](fmt::Display) is one sentence for a person: the text, what is wrong with
/// it, and how to write a duration, such as
/// `invalid duration "1.5s": fractions are not accepted (use a smaller unit: "1500ms", not
/// "1.5s"); write a whole number followed by a unit (...)`. Code should match on
/// [`reason`](ParseError::reason) rather than on that wording.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    text: String,
    reason: Reason,
}

impl ParseError {
    /// The text that was refused, as given.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// What is wrong with the text.
    pub fn reason(&self) -> &Reason {
        &self.reason
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid duration \"{}\": {}; {ACCEPTED}",
            self.text, self.reason
        )
    }
}

impl Error for ParseError {}

/// What is wrong with a text that is not a duration. Checked in this order: the first that
/// applies is the one reported.
///
/// Its [`Display`](fmt::Display) is the middle of [`ParseError`]'s message, such as
/// `it contains spaces`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// The text is empty.
    Empty,
    /// The text starts with `-`.
    Negative,
    /// The text contains whitespace (anywhere, the ends included).
    Whitespace,
    /// The text contains `.` or `,`: a fraction, which the grammar does not have.
    Fraction,
    /// A term does not start with a digit (a sign other than `-`, a unit with no number).
    ExpectedNumber {
        /// The rest of the text, from where the number should be.
        at: String,
    },
    /// A number is not followed by a unit.
    MissingUnit {
        /// The number, as written.
        number: String,
    },
    /// A number is followed by something that is not one of the units (`d`, `h`, `m`, `s`,
    /// `ms`; lower case only).
    UnknownUnit {
        /// Everything between the number and the next digit (or the end).
        unit: String,
    },
    /// A unit is not smaller than the one before it: out of order, or repeated.
    UnitOrder {
        /// The unit out of place.
        unit: String,
    },
    /// The total is more than [`MAX_MILLIS`].
    TooLong,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Empty => f.write_str("it is empty"),
            Reason::Negative => f.write_str("a duration cannot be negative"),
            Reason::Whitespace => f.write_str("it contains spaces"),
            Reason::Fraction => f.write_str(
                "fractions are not accepted (use a smaller unit: \"1500ms\", not \"1.5s\")",
            ),
            Reason::ExpectedNumber { at } => write!(f, "expected a number at `{at}`"),
            Reason::MissingUnit { number } => write!(f, "the number `{number}` has no unit"),
            Reason::UnknownUnit { unit } => {
                write!(f, "`{unit}` is not a unit")?;
                let lower = unit.to_ascii_lowercase();
                if UNITS.iter().any(|(name, _)| *name == lower) {
                    write!(f, " (units are lower case: `{lower}`)")?;
                }
                Ok(())
            }
            Reason::UnitOrder { unit } => write!(
                f,
                "`{unit}` follows a unit that is not larger; units go from the largest down, each at most once"
            ),
            Reason::TooLong => {
                f.write_str("it is too long to represent (the limit is about 292 million years)")
            }
        }
    }
}

/// The README's examples, compiled and run as doc-tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(text: &str) -> Reason {
        parse_millis(text).expect_err(text).reason
    }

    #[test]
    fn single_terms() {
        assert_eq!(parse_millis("250ms"), Ok(250));
        assert_eq!(parse_millis("30s"), Ok(30_000));
        assert_eq!(parse_millis("5m"), Ok(300_000));
        assert_eq!(parse_millis("24h"), Ok(86_400_000));
        assert_eq!(parse_millis("1d"), Ok(86_400_000));
        assert_eq!(parse_millis("90s"), Ok(90_000));
    }

    #[test]
    fn compound_terms() {
        assert_eq!(parse_millis("1m30s"), Ok(90_000));
        assert_eq!(parse_millis("1h0m5s250ms"), Ok(3_605_250));
        assert_eq!(parse_millis("2d12h"), Ok(216_000_000));
        assert_eq!(parse_millis("1d1h1m1s1ms"), Ok(90_061_001));
    }

    #[test]
    fn zero_in_every_unit() {
        for text in ["0d", "0h", "0m", "0s", "0ms", "0d0ms", "000s"] {
            assert_eq!(parse_millis(text), Ok(0), "{text}");
        }
    }

    #[test]
    fn leading_zeros_are_read_as_decimal() {
        assert_eq!(parse_millis("007s"), Ok(7_000));
        assert_eq!(parse_millis("010ms"), Ok(10));
    }

    #[test]
    fn the_empty_text_is_refused() {
        assert_eq!(reason(""), Reason::Empty);
    }

    #[test]
    fn whitespace_is_refused_wherever_it_is() {
        for text in [
            " 1s", "1s ", "1 s", "1m 30s", "\t1s", "1s\n", "1\u{a0}s", " ",
        ] {
            assert_eq!(reason(text), Reason::Whitespace, "{text:?}");
        }
    }

    #[test]
    fn signs_and_fractions_are_refused() {
        assert_eq!(reason("-5s"), Reason::Negative);
        assert_eq!(reason("-0s"), Reason::Negative);
        assert_eq!(
            reason("+5s"),
            Reason::ExpectedNumber {
                at: "+5s".to_owned()
            }
        );
        assert_eq!(reason("1.5s"), Reason::Fraction);
        assert_eq!(reason("1,5s"), Reason::Fraction);
        assert_eq!(reason(".5s"), Reason::Fraction);
    }

    #[test]
    fn numbers_and_units_must_alternate() {
        assert_eq!(
            reason("5"),
            Reason::MissingUnit {
                number: "5".to_owned()
            }
        );
        assert_eq!(
            reason("1m30"),
            Reason::MissingUnit {
                number: "30".to_owned()
            }
        );
        assert_eq!(reason("s"), Reason::ExpectedNumber { at: "s".to_owned() });
        assert_eq!(
            reason("ms5"),
            Reason::ExpectedNumber {
                at: "ms5".to_owned()
            }
        );
        assert_eq!(
            reason("forever"),
            Reason::ExpectedNumber {
                at: "forever".to_owned()
            }
        );
    }

    #[test]
    fn unknown_units_are_named_whole() {
        for (text, unit) in [
            ("5x", "x"),
            ("5min", "min"),
            ("5S", "S"),
            ("5MS", "MS"),
            ("5µs", "µs"),
            ("5s!", "s!"),
            ("1m_30s", "m_"),
        ] {
            assert_eq!(
                reason(text),
                Reason::UnknownUnit {
                    unit: unit.to_owned()
                },
                "{text}"
            );
        }
    }

    #[test]
    fn an_upper_case_unit_is_pointed_at_its_lower_case_form() {
        let message = parse_millis("5S").expect_err("upper case").to_string();
        assert!(
            message.contains("`S` is not a unit (units are lower case: `s`)"),
            "{message}"
        );
        let message = parse_millis("5min").expect_err("min").to_string();
        assert!(message.contains("`min` is not a unit;"), "{message}");
    }

    #[test]
    fn units_go_from_the_largest_down_each_once() {
        for (text, unit) in [("30s1m", "m"), ("1m1m", "m"), ("1h1d", "d"), ("1ms1s", "s")] {
            assert_eq!(
                reason(text),
                Reason::UnitOrder {
                    unit: unit.to_owned()
                },
                "{text}"
            );
        }
    }

    #[test]
    fn the_largest_accepted_value() {
        assert_eq!(parse_millis("9223372036854775807ms"), Ok(MAX_MILLIS));
        assert_eq!(
            parse("9223372036854775807ms"),
            Ok(Duration::from_millis(MAX_MILLIS))
        );
        // The limit reached by a sum of terms, exactly.
        let days = MAX_MILLIS / 86_400_000;
        let rest = MAX_MILLIS % 86_400_000;
        assert_eq!(
            parse_millis(&format!("{days}d{rest}ms")),
            Ok(MAX_MILLIS),
            "{days}d{rest}ms"
        );
        assert_eq!(reason("9223372036854775808ms"), Reason::TooLong);
        assert_eq!(
            reason(&format!("{days}d{}ms", rest + 1)),
            Reason::TooLong,
            "one past the limit as a sum"
        );
    }

    #[test]
    fn overflow_is_too_long_never_a_wrap() {
        for text in [
            // Does not fit in u64 at all.
            "99999999999999999999s",
            "18446744073709551616ms",
            // Fits in u64, but not once multiplied by the unit.
            "18446744073709551615d",
            "9223372036854776s",
            // Each term fits in u64; their sum does not.
            "106751991167d18446744073709551615ms",
            // Fits in u64, above the limit.
            "18446744073709551615ms",
        ] {
            assert_eq!(reason(text), Reason::TooLong, "{text}");
        }
    }

    #[test]
    fn the_message_names_the_text_the_reason_and_the_accepted_forms() {
        let err = parse_millis("5 minutes").expect_err("spaces");
        assert_eq!(
            err.to_string(),
            "invalid duration \"5 minutes\": it contains spaces; write a whole number followed \
             by a unit (`ms`, `s`, `m`, `h` or `d`), such as \"250ms\", \"30s\", \"5m\" or \
             \"24h\", or several of them from the largest unit down, such as \"1m30s\""
        );
        assert_eq!(err.text(), "5 minutes");
        for bad in [
            "",
            "5",
            "-5s",
            "1.5s",
            "5x",
            "s",
            "30s1m",
            "99999999999999999999s",
        ] {
            let message = parse_millis(bad).expect_err(bad).to_string();
            assert!(
                message.starts_with(&format!("invalid duration \"{bad}\": ")),
                "{message}"
            );
            assert!(message.ends_with(ACCEPTED), "{message}");
        }
    }

    #[test]
    fn formatting_uses_the_largest_units_that_fit() {
        assert_eq!(format_millis(0), "0s");
        assert_eq!(format_millis(1), "1ms");
        assert_eq!(format_millis(1_000), "1s");
        assert_eq!(format_millis(90_000), "1m30s");
        assert_eq!(format_millis(3_605_250), "1h5s250ms");
        assert_eq!(format_millis(216_000_000), "2d12h");
        assert_eq!(format(Duration::from_secs(90)), "1m30s");
        assert_eq!(format(Duration::from_nanos(999_999)), "0s");
    }

    #[test]
    fn formatting_round_trips_through_parsing() {
        let mut samples = vec![
            0u64,
            1,
            250,
            999,
            1_000,
            59_999,
            60_000,
            90_000,
            3_605_250,
            86_400_000,
            216_000_000,
            MAX_MILLIS - 1,
            MAX_MILLIS,
        ];
        // A spread over the whole range: every bit position, with neighbours.
        for shift in 0..63 {
            let base = 1u64 << shift;
            samples.extend([base - 1, base, base + 1]);
        }
        for millis in samples {
            let text = format_millis(millis);
            assert_eq!(parse_millis(&text), Ok(millis), "{millis} as {text}");
            let duration = Duration::from_millis(millis);
            assert_eq!(parse(&format(duration)), Ok(duration), "{millis}");
        }
    }

    #[test]
    fn what_cannot_be_parsed_back_is_refused_as_too_long() {
        assert_eq!(reason(&format_millis(MAX_MILLIS + 1)), Reason::TooLong);
        assert_eq!(reason(&format(Duration::MAX)), Reason::TooLong);
    }
}
