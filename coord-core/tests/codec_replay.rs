//! End to end through `#[idempotent]` with the default coordinator settings: the replay equals
//! what the first call returned, and fingerprints do not depend on `HashMap` order.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use coord_core::memory::MemoryProvider;
use coord_core::{Codec, CoordError, Coordinator, idempotent, observe};
use serde::{Deserialize, Serialize};

fn coordinator() -> Coordinator {
    Coordinator::builder()
        .namespace("codec-replay")
        .provider(MemoryProvider::new())
        .build()
        .expect("valid coordinator")
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Outcome {
    nested: Option<Option<u32>>,
    unit: Option<()>,
    ratio: f64,
    big: u128,
}

#[idempotent(key_from = "key", coordinator = c, name = "codec.exact")]
async fn exact(
    c: &Coordinator,
    key: &str,
    out: Outcome,
    runs: Arc<AtomicUsize>,
) -> Result<Outcome, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(out)
}

#[tokio::test]
async fn the_default_coordinator_replays_exactly() {
    let c = coordinator();
    assert_eq!(c.codec(), Codec::Tagged);
    let runs = Arc::new(AtomicUsize::new(0));
    let cases = [
        (None, None, f64::NAN),
        (Some(None), Some(()), f64::NEG_INFINITY),
        (Some(Some(0)), None, -0.0),
    ];
    for (i, (nested, unit, ratio)) in cases.into_iter().enumerate() {
        let key = format!("k{i}");
        let sent = Outcome {
            nested,
            unit,
            ratio,
            big: u128::MAX - i as u128,
        };
        let first = exact(&c, &key, sent.clone(), runs.clone()).await.unwrap();
        // A second call with other arguments gets the first call's outcome back.
        let other = Outcome {
            nested: Some(Some(99)),
            unit: None,
            ratio: 1.0,
            big: 0,
        };
        let (replayed, report) = observe(exact(&c, &key, other, runs.clone())).await;
        let replayed = replayed.unwrap();
        assert!(report.replayed(), "case {i}");
        for got in [&first, &replayed] {
            assert_eq!(got.nested, sent.nested, "case {i}");
            assert_eq!(got.unit, sent.unit, "case {i}");
            assert_eq!(got.ratio.to_bits(), sent.ratio.to_bits(), "case {i}");
            assert_eq!(got.big, sent.big, "case {i}");
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[idempotent(key_from = "key", fingerprint = ["items"], coordinator = c, name = "codec.fp")]
async fn order(
    c: &Coordinator,
    key: &str,
    items: HashMap<String, u32>,
    runs: Arc<AtomicUsize>,
) -> Result<u32, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(items.values().sum())
}

#[tokio::test]
async fn equal_hash_maps_are_the_same_parameters() {
    let c = coordinator();
    let runs = Arc::new(AtomicUsize::new(0));
    let entries: Vec<(String, u32)> = (0..32).map(|i| (format!("sku-{i}"), i)).collect();
    let forward: HashMap<_, _> = entries.iter().cloned().collect();
    let backward: HashMap<_, _> = entries.iter().rev().cloned().collect();
    let total = order(&c, "o1", forward, runs.clone()).await.unwrap();
    let (again, report) = observe(order(&c, "o1", backward.clone(), runs.clone())).await;
    assert_eq!(again.unwrap(), total);
    assert!(report.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Other content under the same key is refused, not replayed.
    let mut changed = backward;
    changed.insert("sku-0".into(), 1);
    let refused = order(&c, "o1", changed, runs.clone()).await;
    assert!(
        matches!(refused, Err(CoordError::KeyReused { .. })),
        "{refused:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
