//! Durations written as string literals in attribute options, resolved at compile time.
//!
//! A duration is one or more `<whole number><unit>` terms, units in descending order, no
//! spaces: `"250ms"`, `"30s"`, `"5m"`, `"24h"`, `"1d"`, `"1m30s"`, `"0s"`.

/// The units, largest first, with their length in milliseconds.
const UNITS: [(&str, u64); 5] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// The longest duration accepted, in milliseconds: what a signed 64-bit millisecond count
/// holds, the widest range backends take for an expiry.
const MAX_MILLIS: u64 = i64::MAX as u64;

/// The hint every rejection ends with.
const ACCEPTED: &str = "write a whole number followed by a unit (`ms`, `s`, `m`, `h` or `d`), \
     such as \"250ms\", \"30s\", \"5m\" or \"24h\", or several of them from the largest unit \
     down, such as \"1m30s\"";

/// Parses `text` into whole milliseconds, or explains what is wrong with it.
pub(crate) fn parse_millis(text: &str) -> Result<u64, String> {
    let reject = |why: &str| Err(format!("invalid duration \"{text}\": {why}; {ACCEPTED}"));
    if text.is_empty() {
        return reject("it is empty");
    }
    if text.starts_with('-') {
        return reject("a duration cannot be negative");
    }
    if text.chars().any(char::is_whitespace) {
        return reject("it contains spaces");
    }
    if text.contains('.') || text.contains(',') {
        return reject("fractions are not accepted (use a smaller unit: \"1500ms\", not \"1.5s\")");
    }

    let mut total: u64 = 0;
    // Index into UNITS of the last unit seen: later terms must use a smaller unit.
    let mut last_unit: Option<usize> = None;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return reject(&format!("expected a number at `{rest}`"));
        }
        let (number, after) = rest.split_at(digits);
        let letters = after
            .bytes()
            .take_while(|b| b.is_ascii_alphabetic())
            .count();
        let (unit, after) = after.split_at(letters);
        if unit.is_empty() {
            return reject(&format!("the number `{number}` has no unit"));
        }
        let Some(index) = UNITS.iter().position(|(name, _)| *name == unit) else {
            return reject(&format!("`{unit}` is not a unit"));
        };
        if last_unit.is_some_and(|last| index <= last) {
            return reject(&format!(
                "`{unit}` follows a unit that is not larger; units go from the largest down, each at most once"
            ));
        }
        last_unit = Some(index);

        let term = number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(UNITS[index].1));
        total = match term.and_then(|t| total.checked_add(t)) {
            Some(sum) if sum <= MAX_MILLIS => sum,
            _ => {
                return reject(
                    "it is too long to represent (the limit is about 292 million years)",
                );
            }
        };
        rest = after;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::parse_millis;

    #[test]
    fn single_terms() {
        assert_eq!(parse_millis("250ms"), Ok(250));
        assert_eq!(parse_millis("30s"), Ok(30_000));
        assert_eq!(parse_millis("5m"), Ok(300_000));
        assert_eq!(parse_millis("24h"), Ok(86_400_000));
        assert_eq!(parse_millis("1d"), Ok(86_400_000));
        assert_eq!(parse_millis("0s"), Ok(0));
    }

    #[test]
    fn compound_terms() {
        assert_eq!(parse_millis("1m30s"), Ok(90_000));
        assert_eq!(parse_millis("1h0m5s250ms"), Ok(3_605_250));
        assert_eq!(parse_millis("2d12h"), Ok(216_000_000));
    }

    #[test]
    fn rejections() {
        for bad in [
            "",
            "5 minutes",
            "5",
            "-5s",
            "1.5s",
            "5x",
            "s",
            "30s1m",
            "1m1m",
            "5min",
            "ms5",
            "1s ",
            "99999999999999999999s",
            "9223372036854776s",
        ] {
            let err = parse_millis(bad).expect_err(bad);
            assert!(err.contains("\"250ms\""), "{bad}: {err}");
        }
    }

    #[test]
    fn the_largest_accepted_value() {
        assert_eq!(parse_millis("9223372036854775807ms"), Ok(i64::MAX as u64));
        assert!(parse_millis("9223372036854775808ms").is_err());
    }

    use crate::config_grammar;

    /// Attribute literals and configuration values are one grammar: both parsers accept the
    /// same strings with the same value and refuse the same strings.
    #[test]
    fn the_configuration_parses_durations_exactly_as_the_attributes_do() {
        let table = [
            "250ms",
            "30s",
            "5m",
            "24h",
            "1d",
            "0s",
            "1m30s",
            "1h0m5s250ms",
            "2d12h",
            "9223372036854775807ms",
            "9223372036854775808ms",
            "",
            "5 minutes",
            "5",
            "-5s",
            "1.5s",
            "1,5s",
            "5x",
            "s",
            "30s1m",
            "1m1m",
            "5min",
            "ms5",
            "1s ",
            " 1s",
            "1S",
            "99999999999999999999s",
            "9223372036854776s",
            "0ms",
            "007s",
            "1h1d",
            "1d1h1m1s1ms",
        ];
        for text in table {
            assert_eq!(
                parse_millis(text),
                config_grammar::parse_millis(text),
                "the two grammars disagree on {text:?}"
            );
        }
        // Both sides really parse something (the table is not all refusals).
        assert_eq!(config_grammar::parse_millis("1m30s"), Ok(90_000));
    }
}
