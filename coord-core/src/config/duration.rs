//! Durations in configuration, in the grammar the attributes use.
//!
//! A duration is one or more `<whole number><unit>` terms, units (`d`, `h`, `m`, `s`, `ms`)
//! from the largest down, each at most once, no spaces: `"250ms"`, `"30s"`, `"5m"`, `"24h"`,
//! `"1m30s"`, `"0s"`. The macros parse attribute literals with their own copy of this grammar
//! (a proc-macro crate cannot depend on this one); a test of the macro crate runs both parsers
//! over one table of strings and fails if they ever disagree.

use std::time::Duration;

/// The units, largest first, with their length in milliseconds.
const UNITS: [(&str, u64); 5] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// The longest duration accepted, in milliseconds (what a signed 64-bit millisecond count
/// holds, the widest range backends take for an expiry).
const MAX_MILLIS: u64 = i64::MAX as u64;

/// The hint every refusal ends with.
const ACCEPTED: &str = "write a whole number followed by a unit (`ms`, `s`, `m`, `h` or `d`), \
     such as \"250ms\", \"30s\", \"5m\" or \"24h\", or several of them from the largest unit \
     down, such as \"1m30s\"";

/// Parses `text` into whole milliseconds, or says what is wrong with it.
pub(crate) fn parse_millis(text: &str) -> Result<u64, String> {
    let refuse = |why: &str| Err(format!("invalid duration \"{text}\": {why}; {ACCEPTED}"));
    if text.is_empty() {
        return refuse("it is empty");
    }
    if text.starts_with('-') {
        return refuse("a duration cannot be negative");
    }
    if text.chars().any(char::is_whitespace) {
        return refuse("it contains spaces");
    }
    if text.contains('.') || text.contains(',') {
        return refuse("fractions are not accepted (use a smaller unit: \"1500ms\", not \"1.5s\")");
    }
    let mut total: u64 = 0;
    // Index into UNITS of the previous term's unit: each term must use a smaller one.
    let mut previous: Option<usize> = None;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return refuse(&format!("expected a number at `{rest}`"));
        }
        let (number, after) = rest.split_at(digits);
        let letters = after
            .bytes()
            .take_while(|b| b.is_ascii_alphabetic())
            .count();
        let (unit, after) = after.split_at(letters);
        if unit.is_empty() {
            return refuse(&format!("the number `{number}` has no unit"));
        }
        let Some(index) = UNITS.iter().position(|(name, _)| *name == unit) else {
            return refuse(&format!("`{unit}` is not a unit"));
        };
        if previous.is_some_and(|p| index <= p) {
            return refuse(&format!(
                "`{unit}` follows a unit that is not larger; units go from the largest down, each at most once"
            ));
        }
        previous = Some(index);
        let term = number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(UNITS[index].1));
        total = match term.and_then(|t| total.checked_add(t)) {
            Some(sum) if sum <= MAX_MILLIS => sum,
            _ => {
                return refuse(
                    "it is too long to represent (the limit is about 292 million years)",
                );
            }
        };
        rest = after;
    }
    Ok(total)
}

/// Parses `text` into a [`Duration`] (see the module docs for the grammar).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    parse_millis(text).map(Duration::from_millis)
}

/// Writes `duration` in the grammar, in whole milliseconds and the largest units that fit
/// (`90s` is `"1m30s"`), so that parsing the text gives the same duration back (sub-millisecond
/// parts are dropped: the grammar has none).
pub(crate) fn format_duration(duration: Duration) -> String {
    let mut millis = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    if millis == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    for (name, length) in UNITS {
        if millis >= length {
            out.push_str(&format!("{}{name}", millis / length));
            millis %= length;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting_round_trips_through_parsing() {
        for millis in [
            0u64,
            1,
            250,
            1_000,
            90_000,
            3_605_250,
            86_400_000,
            216_000_000,
        ] {
            let text = format_duration(Duration::from_millis(millis));
            assert_eq!(parse_millis(&text), Ok(millis), "{text}");
        }
        assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
    }
}
