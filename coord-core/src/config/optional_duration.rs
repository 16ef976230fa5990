//! `serde(with = ..)` for an optional duration written as text (`"30s"`), in the grammar of
//! [`duration`](super::duration).

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

pub(crate) fn serialize<S: Serializer>(
    value: &Option<Duration>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(duration) => serializer.serialize_str(&super::duration::format_duration(*duration)),
        None => serializer.serialize_none(),
    }
}

pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    let text: Option<String> = Option::deserialize(deserializer)?;
    text.map(|t| super::duration::parse_duration(&t).map_err(serde::de::Error::custom))
        .transpose()
}
