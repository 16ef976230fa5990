//! Reading a `metrics_util` debugging recorder's snapshot as text series, the form the
//! metrics tests assert on: `name{label=value,...}` with the labels sorted.

use std::collections::BTreeMap;

use metrics_util::debugging::{DebugValue, Snapshotter};

/// Every series as `name{label=value,...}` (labels sorted) to its value.
pub fn series(snapshotter: &Snapshotter) -> BTreeMap<String, DebugValue> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let mut labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            (
                format!("{}{{{}}}", key.key().name(), labels.join(",")),
                value,
            )
        })
        .collect()
}

/// Only the counters of [`series`].
pub fn counters(snapshotter: &Snapshotter) -> BTreeMap<String, u64> {
    series(snapshotter)
        .into_iter()
        .filter_map(|(name, value)| match value {
            DebugValue::Counter(n) => Some((name, n)),
            _ => None,
        })
        .collect()
}

/// The counter `name`; panics, listing the series there are, when it is missing or not a
/// counter.
pub fn counter(all: &BTreeMap<String, DebugValue>, name: &str) -> u64 {
    match all.get(name) {
        Some(DebugValue::Counter(n)) => *n,
        other => panic!(
            "{name}: {other:?}; have {:?}",
            all.keys().collect::<Vec<_>>()
        ),
    }
}

/// How many values the histogram `name` holds; panics like [`counter`].
pub fn histogram_len(all: &BTreeMap<String, DebugValue>, name: &str) -> usize {
    match all.get(name) {
        Some(DebugValue::Histogram(values)) => values.len(),
        other => panic!(
            "{name}: {other:?}; have {:?}",
            all.keys().collect::<Vec<_>>()
        ),
    }
}
