//! The shared cache ([`CacheStore`](coord_core::provider::CacheStore)), the tier of
//! `#[cached(scope = "shared" | "two_tier")]` every process sees: a set entry is read back as
//! stored with at most its ttl left, and never after its ttl; a delete removes it; a set
//! replaces value and ttl; entries of different keys, and locks and records at the same key,
//! never collide; zero, tiny and huge ttls are accepted without wrapping around.
//!
//! The runtime keeps a local copy of a shared entry for at most the entry's reported time
//! left, so a store that reports more than it has lets a local tier serve an expired answer:
//! that is why the time left is checked against the ttl that was set.

use std::time::{Duration, Instant};

use coord_core::provider::{CacheEntry, ClaimOutcome, OwnerToken, ReleaseOutcome};
use coord_core::{CallKey, Coordinator};

use super::deadlines::bounded;
use super::durations::{EXTREMES, LONG, SHORT, is_huge};
use super::requests::{claim_req, key, lock_req};

/// A sleep surely past a [`SHORT`] ttl on the store's clock, with a wide margin: a loaded
/// machine or a slow round trip must not make a case flaky.
const PAST_SHORT_TTL: Duration = Duration::from_secs(1);

/// How much of a [`LONG`] ttl a case may have used up before it reads the entry back: far
/// more than any healthy round trip, so only a store that loses or invents time fails.
const READ_BACK_SLACK: Duration = Duration::from_secs(10);

/// The entry at `key`, failing the case on an error.
async fn get(c: &Coordinator, key: &CallKey) -> Option<CacheEntry> {
    c.cache_store()
        .cache_get(key)
        .await
        .unwrap_or_else(|e| panic!("cache_get at {key}: {e}"))
}

/// Stores `value` at `key` for `ttl`, failing the case on an error.
async fn set(c: &Coordinator, key: &CallKey, value: &[u8], ttl: Duration) {
    c.cache_store()
        .cache_set(key, value, ttl)
        .await
        .unwrap_or_else(|e| panic!("cache_set at {key} for {ttl:?}: {e}"));
}

/// Deletes the entry at `key`, failing the case on an error.
async fn delete(c: &Coordinator, key: &CallKey) -> bool {
    c.cache_store()
        .cache_delete(key)
        .await
        .unwrap_or_else(|e| panic!("cache_delete at {key}: {e}"))
}

/// Asserts that `entry` holds `value` and, when the store reports its time left, that it is
/// no more than `ttl` and at least `at_least`.
fn assert_entry(
    what: &str,
    entry: Option<CacheEntry>,
    value: &[u8],
    ttl: Duration,
    at_least: Duration,
) {
    let entry = entry.unwrap_or_else(|| panic!("{what}: no entry"));
    // Shown cut short: a large value would drown the message.
    let shown = |bytes: &[u8]| format!("{} bytes {:?}", bytes.len(), &bytes[..bytes.len().min(48)]);
    assert!(
        entry.value == value,
        "{what}: read back {}, not the {} stored",
        shown(&entry.value),
        shown(value)
    );
    if let Some(left) = entry.ttl_left {
        assert!(
            left <= ttl,
            "{what}: {left:?} left of an entry set for {ttl:?}"
        );
        assert!(
            left >= at_least,
            "{what}: only {left:?} left of an entry set for {ttl:?} a moment ago"
        );
    }
}

/// A set entry reads back byte for byte (empty, binary, protocol-looking and large values
/// alike) with no more time left than its ttl; a key never set reads as absent.
pub async fn cache_set_then_get_returns_the_bytes_and_the_ttl_left(c: Coordinator) {
    let never = key(&c, "cache-never-set");
    assert_eq!(get(&c, &never).await, None, "a key never set has no entry");
    let large: Vec<u8> = (0..256 * 1024).map(|i| (i % 251) as u8).collect();
    let values: [(&str, &[u8]); 5] = [
        ("empty", b""),
        ("text", "naïve receipt ✓".as_bytes()),
        ("binary", &[0, 1, 0xfe, 0xff, 0x80, 0]),
        ("protocol-looking", b"*3\r\n$3\r\nSET\r\n{x}\r\n-ERR\r\n"),
        ("large", &large),
    ];
    for (name, value) in values {
        let k = key(&c, &format!("cache-bytes-{name}"));
        set(&c, &k, value, LONG).await;
        assert_entry(
            &format!("a {name} value"),
            get(&c, &k).await,
            value,
            LONG,
            LONG - READ_BACK_SLACK,
        );
    }
}

/// An entry is not returned once its ttl has passed, while an entry set beside it with a long
/// ttl still is.
pub async fn cache_entry_is_absent_after_its_ttl(c: Coordinator) {
    let brief = key(&c, "cache-brief");
    let lasting = key(&c, "cache-lasting");
    set(&c, &lasting, b"lasting", LONG).await;
    let before_set = Instant::now();
    set(&c, &brief, b"brief", SHORT).await;
    let read = get(&c, &brief).await;
    // The set ran after `before_set` and the read before now: if less than the ttl lies
    // between them, the entry cannot have expired yet, whatever the round trips took.
    if before_set.elapsed() < SHORT {
        assert_entry(
            "read back within its ttl",
            read,
            b"brief",
            SHORT,
            Duration::ZERO,
        );
    }
    tokio::time::sleep(PAST_SHORT_TTL).await;
    assert_eq!(
        get(&c, &brief).await,
        None,
        "an entry set for {SHORT:?} is still returned {PAST_SHORT_TTL:?} later"
    );
    assert_entry(
        "the long-lived entry beside it",
        get(&c, &lasting).await,
        b"lasting",
        LONG,
        LONG - READ_BACK_SLACK,
    );
}

/// Deleting an entry removes it and says so; deleting what is not there says so too; a key
/// set again after its delete holds the new value.
pub async fn cache_delete_removes_the_entry(c: Coordinator) {
    let k = key(&c, "cache-delete");
    assert!(
        !delete(&c, &k).await,
        "nothing to delete at a key never set"
    );
    set(&c, &k, b"doomed", LONG).await;
    assert!(delete(&c, &k).await, "the entry was there");
    assert_eq!(get(&c, &k).await, None, "a deleted entry is gone");
    assert!(!delete(&c, &k).await, "nothing left to delete");
    set(&c, &k, b"reborn", LONG).await;
    assert_entry(
        "set again after the delete",
        get(&c, &k).await,
        b"reborn",
        LONG,
        LONG - READ_BACK_SLACK,
    );
}

/// Entries at keys of different operations, parts or namespaces never collide: each reads
/// back its own value, and deleting one leaves the others.
pub async fn cache_keys_of_other_operations_and_parts_do_not_collide(c: Coordinator) {
    let keys = [
        c.key("cache.report").finish(),
        c.key("cache.report").part(&1).finish(),
        c.key("cache.report").part(&2).finish(),
        c.key("cache.report").part(&1).part(&2).finish(),
        c.key("cache.report").part("1:2").finish(),
        c.key("cache.report").part(&12).finish(),
        c.key("cache.reports").part(&1).finish(),
        c.key("cache.other").part(&1).finish(),
        CallKey::builder(&format!("{}-other", c.namespace()), "cache.report")
            .part(&1)
            .finish(),
    ];
    for (i, a) in keys.iter().enumerate() {
        for b in &keys[i + 1..] {
            assert_ne!(a, b, "the case needs distinct keys");
        }
    }
    let value = |i: usize| format!("value of key {i}").into_bytes();
    for (i, k) in keys.iter().enumerate() {
        set(&c, k, &value(i), LONG).await;
    }
    for (i, k) in keys.iter().enumerate() {
        assert_entry(
            &format!("`{k}` among similar keys"),
            get(&c, k).await,
            &value(i),
            LONG,
            LONG - READ_BACK_SLACK,
        );
    }
    assert!(delete(&c, &keys[1]).await);
    for (i, k) in keys.iter().enumerate() {
        let read = get(&c, k).await;
        if i == 1 {
            assert_eq!(read, None, "`{k}` was deleted");
        } else {
            assert_entry(
                &format!("`{k}` after `{}` was deleted", keys[1]),
                read,
                &value(i),
                LONG,
                LONG - READ_BACK_SLACK,
            );
        }
    }
}

/// A set replaces whatever was there, value and ttl: a shorter value leaves nothing of the
/// longer one, a shorter ttl is not outlived, and a longer ttl keeps the entry past the old
/// one.
pub async fn cache_set_replaces_the_value_and_the_ttl(c: Coordinator) {
    const MID: Duration = Duration::from_secs(20);
    let k = key(&c, "cache-replace");
    set(&c, &k, b"a first, longer value", LONG).await;
    set(&c, &k, b"xy", MID).await;
    assert_entry(
        "replaced by a shorter value with a shorter ttl",
        get(&c, &k).await,
        b"xy",
        MID,
        MID - READ_BACK_SLACK,
    );

    let shortened = key(&c, "cache-replace-shorter");
    set(&c, &shortened, b"long-lived", LONG).await;
    set(&c, &shortened, b"short-lived", SHORT).await;
    tokio::time::sleep(PAST_SHORT_TTL).await;
    assert_eq!(
        get(&c, &shortened).await,
        None,
        "the replaced entry's longer ttl must not outlive the new one"
    );

    let lengthened = key(&c, "cache-replace-longer");
    set(&c, &lengthened, b"short-lived", SHORT).await;
    set(&c, &lengthened, b"long-lived", LONG).await;
    tokio::time::sleep(PAST_SHORT_TTL).await;
    assert_entry(
        "replaced with a longer ttl",
        get(&c, &lengthened).await,
        b"long-lived",
        LONG,
        LONG - READ_BACK_SLACK,
    );
}

/// The cache is separate from locks and idempotency records: a lock or a record is no cache
/// entry, a cache entry is neither a held lock nor a record, and writing or deleting one
/// leaves the others at the same key as they were.
pub async fn cache_is_separate_from_locks_and_records(c: Coordinator) {
    let p = c.lock_provider();
    let s = c.idempotency_store();
    let (a, b) = (OwnerToken::new(), OwnerToken::new());

    let held = key(&c, "cache-beside-held");
    p.acquire(lock_req(&held, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .expect("a free lock is granted");
    assert_eq!(
        s.claim(claim_req(&held, a, LONG, None, None))
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    assert_eq!(
        get(&c, &held).await,
        None,
        "a lock and a record are not cache entries"
    );
    set(&c, &held, b"cached", LONG).await;
    assert_eq!(
        p.acquire(lock_req(&held, b, LONG, Duration::ZERO))
            .await
            .unwrap(),
        None,
        "the lock is still held after a cache write at its key"
    );
    assert!(
        matches!(
            s.claim(claim_req(&held, b, LONG, None, None))
                .await
                .unwrap(),
            ClaimOutcome::InFlight { .. }
        ),
        "the record is still in flight after a cache write at its key"
    );
    assert!(delete(&c, &held).await, "the cache entry was there");
    assert_eq!(
        p.release(&held, a).await.unwrap(),
        ReleaseOutcome::Released,
        "a cache delete leaves the lock held"
    );
    assert!(
        s.abandon(&held, a).await.unwrap(),
        "a cache delete leaves the record in place"
    );

    let cached = key(&c, "cache-only");
    set(&c, &cached, b"cached alone", LONG).await;
    let grant = p
        .acquire(lock_req(&cached, a, LONG, Duration::ZERO))
        .await
        .unwrap();
    assert!(grant.is_some(), "a cache entry is not a held lock");
    assert_eq!(
        s.claim(claim_req(&cached, a, LONG, None, None))
            .await
            .unwrap(),
        ClaimOutcome::Claimed,
        "a cache entry is not a record"
    );
    assert_eq!(
        p.release(&cached, a).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert!(s.purge(&cached).await.unwrap());
    assert_entry(
        "the cache entry after a lock and a record came and went at its key",
        get(&c, &cached).await,
        b"cached alone",
        LONG,
        LONG - READ_BACK_SLACK,
    );
}

/// Ttls of zero, 1 µs, `u64::MAX` ms and `Duration::MAX` are accepted, neither panicking nor
/// hanging: a tiny one has passed (at once, or within the store's resolution) and its entry is
/// not returned; a huge one keeps the entry, with no more time left than was set (it does not
/// wrap around to a short or negative expiry).
pub async fn cache_extreme_ttls_are_accepted(c: Coordinator) {
    let store = c.cache_store().clone();
    let keys: Vec<CallKey> = (0..EXTREMES.len())
        .map(|i| key(&c, &format!("cache-extreme-ttl-{i}")))
        .collect();
    for (k, ttl) in keys.iter().zip(EXTREMES) {
        let (store, k) = (store.clone(), k.clone());
        bounded("cache_set with an extreme ttl", async move {
            store.cache_set(&k, b"extreme", ttl).await
        })
        .await
        .unwrap_or_else(|e| panic!("cache_set for {ttl:?}: {e}"));
    }
    tokio::time::sleep(PAST_SHORT_TTL).await;
    for (k, ttl) in keys.iter().zip(EXTREMES) {
        let read = {
            let (store, k) = (store.clone(), k.clone());
            bounded("cache_get after an extreme ttl", async move {
                store.cache_get(&k).await
            })
            .await
            .unwrap_or_else(|e| panic!("cache_get after a set for {ttl:?}: {e}"))
        };
        if is_huge(ttl) {
            assert_entry(
                &format!("an entry set for {ttl:?}"),
                read,
                b"extreme",
                ttl,
                LONG,
            );
            assert!(delete(&c, k).await, "ttl {ttl:?}: the entry was there");
        } else {
            assert_eq!(
                read, None,
                "an entry set for {ttl:?} is still returned {PAST_SHORT_TTL:?} later"
            );
        }
    }
}
