//! `#[cached]` with the in-process provider: hits, misses, expiry and invalidation in every
//! scope; the cache's place in the stack (a hit reaches neither single-flight nor the lock);
//! what a poisoned entry and a failing backend do (a miss, never an error); metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::handle::CacheScope;
use coord_core::provider::CacheStore;
use coord_core::report::{CacheOutcome, FlightOutcome, IdempotencyOutcome, LockOutcome};
use coord_core::{
    CallKey, CoordError, Coordinator, cached, distributed_lock, idempotent, observe, single_flight,
    telemetry,
};
use coord_tests::metric_series::counters;
use coord_tests::support::InstrumentedProvider;
use metrics_util::debugging::DebuggingRecorder;

/// Counts the body's runs per test (each test passes its own counter).
type Runs = Arc<AtomicUsize>;

fn runs() -> Runs {
    Arc::new(AtomicUsize::new(0))
}

fn key(c: &Coordinator, op: &str, id: u64) -> CallKey {
    c.key(op).part(&id).finish()
}

#[cached(name = "t.cache.local", key_from = "id", coordinator = c, ttl = "2s")]
async fn local(c: &Coordinator, id: u64, runs: Runs) -> Result<u64, String> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(id * 10)
}

#[cached(name = "t.cache.shared", key_from = "id", coordinator = c, ttl = "2s", scope = "shared")]
async fn shared(c: &Coordinator, id: u64, runs: Runs) -> Result<u64, String> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(id * 10)
}

#[cached(
    name = "t.cache.two_tier",
    key_from = "id",
    coordinator = c,
    ttl = "4s",
    scope = "two_tier",
    local_ttl = "1s"
)]
async fn two_tier(c: &Coordinator, id: u64, runs: Runs) -> Result<u64, String> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(id * 10)
}

#[cached(name = "t.cache.errors", key_from = "id", coordinator = c, ttl = "1m")]
async fn failing(c: &Coordinator, id: u64, runs: Runs) -> Result<u64, String> {
    runs.fetch_add(1, Ordering::SeqCst);
    Err(format!("no {id}"))
}

#[cached(
    name = "t.cache.errors_kept",
    key_from = "id",
    coordinator = c,
    ttl = "1m",
    scope = "shared",
    cache_err = true
)]
async fn failing_kept(c: &Coordinator, id: u64, runs: Runs) -> Result<u64, String> {
    runs.fetch_add(1, Ordering::SeqCst);
    Err(format!("no {id}"))
}

/// Runs one call and reports what the cache did.
async fn outcome<F: Future>(call: F) -> (F::Output, Option<CacheOutcome>) {
    let (out, report) = observe(call).await;
    (out, report.cache())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_scope_hits_misses_expires_and_invalidates() {
    let (provider, c) = InstrumentedProvider::coordinator("cache-local");
    let n = runs();
    assert_eq!(
        outcome(local(&c, 1, n.clone())).await,
        (Ok(10), Some(CacheOutcome::Miss))
    );
    assert_eq!(
        outcome(local(&c, 1, n.clone())).await,
        (Ok(10), Some(CacheOutcome::Hit))
    );
    // Another key is another entry.
    assert_eq!(
        outcome(local(&c, 2, n.clone())).await,
        (Ok(20), Some(CacheOutcome::Miss))
    );
    assert_eq!(n.load(Ordering::SeqCst), 2);
    // The local scope never asks the provider.
    assert_eq!(provider.cache_gets.load(Ordering::SeqCst), 0);
    assert_eq!(provider.cache_sets.load(Ordering::SeqCst), 0);

    // Invalidation with the key the attribute uses.
    assert!(c.invalidate(&key(&c, "t.cache.local", 1)).await.unwrap());
    assert!(!c.invalidate(&key(&c, "t.cache.local", 1)).await.unwrap());
    assert_eq!(
        outcome(local(&c, 1, n.clone())).await,
        (Ok(10), Some(CacheOutcome::Miss))
    );
    assert_eq!(n.load(Ordering::SeqCst), 3);

    // Expiry: after the TTL the entry is never served.
    tokio::time::sleep(Duration::from_millis(2_600)).await;
    assert_eq!(
        outcome(local(&c, 1, n.clone())).await,
        (Ok(10), Some(CacheOutcome::Miss))
    );
    assert_eq!(n.load(Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_entries_are_per_namespace() {
    let (_, a) = InstrumentedProvider::coordinator("cache-ns-a");
    let (_, b) = InstrumentedProvider::coordinator("cache-ns-b");
    let n = runs();
    local(&a, 7, n.clone()).await.unwrap();
    local(&b, 7, n.clone()).await.unwrap();
    local(&a, 7, n.clone()).await.unwrap();
    assert_eq!(n.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_scope_goes_through_the_provider() {
    let (provider, c) = InstrumentedProvider::coordinator("cache-shared");
    let n = runs();
    assert_eq!(
        outcome(shared(&c, 1, n.clone())).await,
        (Ok(10), Some(CacheOutcome::Miss))
    );
    assert_eq!(provider.inner.cache_entries(), 1);
    assert_eq!(
        outcome(shared(&c, 1, n.clone())).await,
        (Ok(10), Some(CacheOutcome::Hit))
    );
    assert_eq!(n.load(Ordering::SeqCst), 1);
    // No local tier: both calls read the provider, one wrote it.
    assert_eq!(provider.cache_gets.load(Ordering::SeqCst), 2);
    assert_eq!(provider.cache_sets.load(Ordering::SeqCst), 1);

    // Another coordinator over the same provider (another instance) sees the entry.
    let other = Coordinator::builder()
        .namespace("cache-shared")
        .provider(provider.clone())
        .build()
        .unwrap();
    assert_eq!(
        outcome(shared(&other, 1, n.clone())).await,
        (Ok(10), Some(CacheOutcome::Hit))
    );

    assert!(c.invalidate(&key(&c, "t.cache.shared", 1)).await.unwrap());
    assert_eq!(provider.inner.cache_entries(), 0);
    assert_eq!(
        outcome(shared(&other, 1, n.clone())).await,
        (Ok(10), Some(CacheOutcome::Miss))
    );
    assert_eq!(n.load(Ordering::SeqCst), 2);

    tokio::time::sleep(Duration::from_millis(2_600)).await;
    assert_eq!(
        outcome(shared(&c, 1, n.clone())).await,
        (Ok(10), Some(CacheOutcome::Miss))
    );
    assert_eq!(n.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tier_answers_locally_then_from_the_shared_entry() {
    let (provider, c) = InstrumentedProvider::coordinator("cache-two");
    let n = runs();
    assert_eq!(
        outcome(two_tier(&c, 1, n.clone())).await,
        (Ok(10), Some(CacheOutcome::Miss))
    );
    let gets = provider.cache_gets.load(Ordering::SeqCst);
    assert_eq!(
        outcome(two_tier(&c, 1, n.clone())).await,
        (Ok(10), Some(CacheOutcome::Hit))
    );
    // The local tier answered: the provider was not asked.
    assert_eq!(provider.cache_gets.load(Ordering::SeqCst), gets);

    // Past `local_ttl` but inside `ttl`: the shared entry answers and the body does not run.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        outcome(two_tier(&c, 1, n.clone())).await,
        (Ok(10), Some(CacheOutcome::Hit))
    );
    assert_eq!(provider.cache_gets.load(Ordering::SeqCst), gets + 1);
    assert_eq!(n.load(Ordering::SeqCst), 1);

    // Another instance removes the shared entry: this process's copy lives out `local_ttl`
    // at most, then the call runs again.
    provider
        .inner
        .cache_delete(&key(&c, "t.cache.two_tier", 1))
        .await
        .unwrap();
    assert_eq!(
        outcome(two_tier(&c, 1, n.clone())).await,
        (Ok(10), Some(CacheOutcome::Hit))
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        outcome(two_tier(&c, 1, n.clone())).await,
        (Ok(10), Some(CacheOutcome::Miss))
    );
    assert_eq!(n.load(Ordering::SeqCst), 2);

    // `invalidate` clears both tiers.
    assert!(c.invalidate(&key(&c, "t.cache.two_tier", 1)).await.unwrap());
    assert_eq!(provider.inner.cache_entries(), 0);
    assert_eq!(
        outcome(two_tier(&c, 1, n.clone())).await,
        (Ok(10), Some(CacheOutcome::Miss))
    );
    assert_eq!(n.load(Ordering::SeqCst), 3);

    // Past `ttl`: neither tier serves it.
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    assert_eq!(
        outcome(two_tier(&c, 1, n.clone())).await,
        (Ok(10), Some(CacheOutcome::Miss))
    );
    assert_eq!(n.load(Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_cached_only_when_asked() {
    let (provider, c) = InstrumentedProvider::coordinator("cache-err");
    let n = runs();
    assert_eq!(failing(&c, 1, n.clone()).await, Err("no 1".to_owned()));
    assert_eq!(failing(&c, 1, n.clone()).await, Err("no 1".to_owned()));
    assert_eq!(n.load(Ordering::SeqCst), 2);

    assert_eq!(provider.inner.cache_entries(), 0);

    // With `cache_err`, the error is stored whole in the shared tier and decoded back.
    let n = runs();
    assert_eq!(failing_kept(&c, 1, n.clone()).await, Err("no 1".to_owned()));
    assert_eq!(provider.inner.cache_entries(), 1);
    let (out, cache) = outcome(failing_kept(&c, 1, n.clone())).await;
    assert_eq!(
        (out, cache),
        (Err("no 1".to_owned()), Some(CacheOutcome::Hit))
    );
    assert_eq!(n.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_shared_entry_is_a_miss_and_is_replaced() {
    let (provider, c) = InstrumentedProvider::coordinator("cache-poison");
    let n = runs();
    let k = key(&c, "t.cache.shared", 3);
    provider
        .inner
        .cache_set(&k, b"\x00 not an encoded outcome", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        outcome(shared(&c, 3, n.clone())).await,
        (Ok(30), Some(CacheOutcome::Stale))
    );
    assert_eq!(
        outcome(shared(&c, 3, n.clone())).await,
        (Ok(30), Some(CacheOutcome::Hit))
    );
    assert_eq!(n.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_backend_is_a_miss_not_an_error() {
    let (provider, c) = InstrumentedProvider::coordinator("cache-down");
    provider.fail_cache.store(true, Ordering::SeqCst);
    let n = runs();
    for _ in 0..2 {
        assert_eq!(
            outcome(shared(&c, 1, n.clone())).await,
            (Ok(10), Some(CacheOutcome::Error))
        );
    }
    assert_eq!(n.load(Ordering::SeqCst), 2);
    assert_eq!(provider.cache_sets.load(Ordering::SeqCst), 2);
    // `invalidate` does report a failed delete.
    assert!(c.invalidate(&key(&c, "t.cache.shared", 1)).await.is_err());
    provider.fail_cache.store(false, Ordering::SeqCst);
    shared(&c, 1, n.clone()).await.unwrap();
    assert_eq!(
        outcome(shared(&c, 1, n.clone())).await,
        (Ok(10), Some(CacheOutcome::Hit))
    );
    assert_eq!(n.load(Ordering::SeqCst), 3);
}

// The whole stack, written with the cache last and the lock first.
#[distributed_lock(key_from = "id", coordinator = c, name = "t.cache.stack_a")]
#[single_flight]
#[cached(ttl = "1m")]
async fn stack_backwards(c: &Coordinator, id: u64, runs: Runs) -> Result<u64, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(id)
}

// The cache first, single-flight last.
#[cached(key_from = "id", coordinator = c, name = "t.cache.stack_b", ttl = "1m")]
#[distributed_lock]
#[single_flight]
async fn stack_mixed(c: &Coordinator, id: u64, runs: Runs) -> Result<u64, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_reaches_neither_single_flight_nor_the_lock_in_any_written_order() {
    for backwards in [true, false] {
        let (provider, c) =
            InstrumentedProvider::coordinator(if backwards { "stack-a" } else { "stack-b" });
        let n = runs();
        let call = |c: Coordinator, n: Runs| async move {
            if backwards {
                stack_backwards(&c, 5, n).await
            } else {
                stack_mixed(&c, 5, n).await
            }
        };
        let (out, first) = observe(call(c.clone(), n.clone())).await;
        assert_eq!(out.unwrap(), 5);
        assert_eq!(first.cache(), Some(CacheOutcome::Miss));
        assert_eq!(first.flight(), Some(FlightOutcome::Led));
        assert_eq!(first.lock(), Some(LockOutcome::Acquired));
        assert_eq!(provider.acquires.load(Ordering::SeqCst), 1);

        let (out, second) = observe(call(c.clone(), n.clone())).await;
        assert_eq!(out.unwrap(), 5);
        assert_eq!(second.cache(), Some(CacheOutcome::Hit));
        assert_eq!(second.flight(), None, "a hit skips single-flight");
        assert_eq!(second.lock(), None, "a hit skips the lock");
        assert_eq!(provider.acquires.load(Ordering::SeqCst), 1);
        assert_eq!(n.load(Ordering::SeqCst), 1);
    }
}

#[idempotent(key_from = "id", coordinator = c, name = "t.cache.idem")]
#[cached(ttl = "1m")]
async fn idem_cached(c: &Coordinator, id: u64, runs: Runs) -> Result<u64, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_sits_outside_the_cache() {
    let (_, c) = InstrumentedProvider::coordinator("cache-idem");
    let n = runs();
    let (_, first) = observe(idem_cached(&c, 1, n.clone())).await;
    assert_eq!(first.idempotency(), Some(IdempotencyOutcome::Executed));
    assert_eq!(first.cache(), Some(CacheOutcome::Miss));
    // A replay answers before the cache is reached.
    let (out, second) = observe(idem_cached(&c, 1, n.clone())).await;
    assert_eq!(out.unwrap(), 1);
    assert_eq!(second.idempotency(), Some(IdempotencyOutcome::Replayed));
    assert_eq!(second.cache(), None);
    // With the record gone, the cache answers and the body still does not run.
    assert!(c.purge_record(&key(&c, "t.cache.idem", 1)).await.unwrap());
    let (_, third) = observe(idem_cached(&c, 1, n.clone())).await;
    assert_eq!(third.idempotency(), Some(IdempotencyOutcome::Executed));
    assert_eq!(third.cache(), Some(CacheOutcome::Hit));
    assert_eq!(n.load(Ordering::SeqCst), 1);
}

async fn handle_run(c: &Coordinator, scope: CacheScope, n: Runs) -> Result<u64, String> {
    c.cached(key(c, "t.cache.handle", 9))
        .ttl(Duration::from_secs(60))
        .scope(scope)
        .run(move || async move {
            n.fetch_add(1, Ordering::SeqCst);
            Ok::<u64, String>(90)
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handle_api_shares_entries_and_keys_with_the_attribute() {
    for scope in [CacheScope::Local, CacheScope::Shared, CacheScope::TwoTier] {
        let ns = format!("cache-handle-{scope:?}");
        let (provider, c) = InstrumentedProvider::coordinator(&ns);
        let n = runs();
        assert_eq!(handle_run(&c, scope, n.clone()).await, Ok(90));
        assert_eq!(handle_run(&c, scope, n.clone()).await, Ok(90));
        assert_eq!(n.load(Ordering::SeqCst), 1, "{scope:?}");
        let shared_entries = usize::from(scope != CacheScope::Local);
        assert_eq!(provider.inner.cache_entries(), shared_entries, "{scope:?}");
        assert!(c.invalidate(&key(&c, "t.cache.handle", 9)).await.unwrap());
        assert_eq!(handle_run(&c, scope, n.clone()).await, Ok(90));
        assert_eq!(n.load(Ordering::SeqCst), 2, "{scope:?}");
    }

    // The attribute's entry, removed through a key built by hand.
    let (_, c) = InstrumentedProvider::coordinator("cache-handle-attr");
    let n = runs();
    local(&c, 4, n.clone()).await.unwrap();
    assert!(
        c.invalidate(&c.key("t.cache.local").part(&4u64).finish())
            .await
            .unwrap()
    );
    local(&c, 4, n.clone()).await.unwrap();
    assert_eq!(n.load(Ordering::SeqCst), 2);
}

#[test]
fn hits_misses_and_stale_entries_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        telemetry::describe_metrics();
        let (provider, c) = InstrumentedProvider::coordinator("cache-metrics");
        let n = runs();
        provider
            .inner
            .cache_set(
                &key(&c, "t.cache.shared", 1),
                b"garbage",
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        shared(&c, 1, n.clone()).await.unwrap(); // stale
        shared(&c, 1, n.clone()).await.unwrap(); // hit
        shared(&c, 2, n.clone()).await.unwrap(); // miss
        provider.fail_cache.store(true, Ordering::SeqCst);
        shared(&c, 3, n.clone()).await.unwrap(); // error
    });
    let all = counters(&snapshotter);
    for outcome in ["hit", "miss", "stale", "error"] {
        let name = format!("coord_calls_total{{layer=cache,op=t.cache.shared,outcome={outcome}}}");
        assert_eq!(all.get(&name), Some(&1), "{name} in {all:?}");
    }
    // The failed read and the failed write are backend errors of the cache layer.
    assert_eq!(
        all.get("coord_backend_errors_total{kind=unavailable,layer=cache,op=t.cache.shared}"),
        Some(&2),
        "{all:?}"
    );
}
