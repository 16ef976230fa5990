//! Durations in configuration, in the grammar the attributes use: `"250ms"`, `"30s"`, `"5m"`,
//! `"24h"`, `"1m30s"`, `"0s"`.
//!
//! The grammar lives in the `coord_duration` crate, which the attribute macros call too, so a
//! duration means the same in an attribute and in a configuration. This module only adapts
//! it to the configuration's errors, which are text.

use std::time::Duration;

/// Parses `text` into a [`Duration`] (see `coord_duration` for the grammar), or says what is
/// wrong with it in the words the attributes use.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    coord_duration::parse(text).map_err(|err| err.to_string())
}

/// Writes `duration` in the grammar, in whole milliseconds and the largest units that fit
/// (`90s` is `"1m30s"`), so that parsing the text gives the same duration back (sub-millisecond
/// parts are dropped: the grammar has none).
pub(crate) fn format_duration(duration: Duration) -> String {
    coord_duration::format(duration)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde::{Deserialize, Serialize};

    use super::*;

    /// A configuration field as `CoordConfig` declares its durations.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Field {
        #[serde(default, with = "crate::config::optional_duration")]
        lease: Option<Duration>,
    }

    /// A refusal reaches the configuration's user as the shared parser's whole message, the
    /// same sentence an attribute shows for the same text.
    #[test]
    fn refusals_carry_the_shared_parsers_message() {
        for text in ["5 minutes", "1.5s", "5min", "", "9223372036854775808ms"] {
            let expected = coord_duration::parse(text).expect_err(text).to_string();
            assert_eq!(parse_duration(text), Err(expected.clone()), "{text}");
            let json = format!("{{\"lease\": {text:?}}}");
            let err = serde_json::from_str::<Field>(&json).expect_err(&json);
            assert!(err.to_string().contains(&expected), "{text}: {err}");
        }
    }

    /// A configuration written out reads back the same, through serde both ways.
    #[test]
    fn durations_round_trip_through_serde() {
        for millis in [0u64, 1, 250, 90_000, 3_605_250, coord_duration::MAX_MILLIS] {
            let field = Field {
                lease: Some(Duration::from_millis(millis)),
            };
            let json = serde_json::to_string(&field).expect("serialize");
            assert_eq!(
                json,
                format!(
                    "{{\"lease\":\"{}\"}}",
                    coord_duration::format_millis(millis)
                )
            );
            assert_eq!(serde_json::from_str::<Field>(&json).expect(&json), field);
        }
        assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(
            serde_json::from_str::<Field>("{}").expect("absent"),
            Field { lease: None }
        );
    }
}
