//! The `#[cached]` layer: an answer kept for `ttl` and handed to later calls with the same key,
//! without reaching single-flight, the lock or the body. The tiers it reads and writes are in
//! `cache_tiers.rs`.
//!
//! Every ttl is counted from the moment it refers to, not from when this call got round to
//! writing: an entry the body produced lives `ttl` from the body's return (a stall of the
//! process between the two shortens what is written, down to nothing; a call that joined
//! another's run counts from its own miss, which came first), and a local copy of a
//! shared entry lives no longer than the shared entry's remaining life as of the read's sending.

use std::time::Instant;

use crate::report::CacheOutcome;
use crate::runtime::cache_tiers::{CacheForm, CacheOutput, LocalTier, tier_for};
use crate::runtime::call::Call;

/// Answers from the cache, or runs `body` (the inner layers) and keeps its outcome.
pub async fn cached<R, F>(call: &Call<'_>, form: CacheForm<R>, body: F) -> R
where
    R: CacheOutput,
    F: Future<Output = R>,
{
    let spec = call
        .spec
        .cache
        .as_ref()
        .expect("the macro emits a cache spec with #[cached]");
    let erased = spec
        .scope
        .has_local()
        .then(|| tier_for::<R>(call.spec.name, spec));
    let local = erased.as_ref().map(|tier| {
        tier.as_any()
            .downcast_ref::<LocalTier<R>>()
            .expect("local tiers are kept by output type")
    });
    if let Some(value) = local.and_then(|tier| tier.get(&call.key)) {
        call.record_cache(CacheOutcome::Hit);
        return value;
    }

    let codec = call.coordinator.codec();
    let shared = spec.scope.has_shared();
    let mut outcome = CacheOutcome::Miss;
    if let (true, Some(decode)) = (shared, form.decode) {
        // The entry's remaining life is as of some moment after the read was sent: counting a
        // local copy from the sending never keeps it past the shared entry's end.
        let asked_at = local.map(|_| Instant::now());
        match call.coordinator.cache_store().cache_get(&call.key).await {
            Ok(Some(entry)) => match decode(&entry.value, codec) {
                Ok(value) => {
                    if let (Some(tier), Some(asked_at)) = (local, asked_at) {
                        let ttl = entry
                            .ttl_left
                            .map_or(spec.local_ttl(), |left| left.min(spec.local_ttl()))
                            .saturating_sub(asked_at.elapsed());
                        tier.insert(call.key.clone(), value.clone(), ttl);
                    }
                    call.record_cache(CacheOutcome::Hit);
                    return value;
                }
                Err(message) => {
                    tracing::warn!(key = %call.key, error = %message, "coord: a shared cache entry did not decode (written by another build, or not by coord); treating it as a miss");
                    outcome = CacheOutcome::Stale;
                }
            },
            Ok(None) => {}
            Err(err) => {
                crate::telemetry::backend_error("cache", call.spec.name, &err);
                tracing::warn!(key = %call.key, error = %err, "coord: reading the shared cache failed; treating it as a miss");
                outcome = CacheOutcome::Error;
            }
        }
    }
    call.record_cache(outcome);

    // A call that did not run the body itself (it joined a flight) counts its answer from
    // this moment, which is no later than the leader's return: never too long a life.
    let missed_at = Instant::now();
    let output = body.await;
    if !(output.is_ok() || spec.cache_err) {
        return output;
    }
    // The answer is as old as the body's return: what passed since (a stall, the lock layer's
    // release) is taken off every ttl written.
    let answered_at = call.body_returned().unwrap_or(missed_at);
    let since = Instant::now().saturating_duration_since(answered_at);
    if let Some(tier) = local {
        tier.insert(
            call.key.clone(),
            output.clone(),
            spec.local_ttl().saturating_sub(since),
        );
    }
    let ttl = spec.ttl.saturating_sub(since);
    if ttl.is_zero() && !spec.ttl.is_zero() {
        tracing::warn!(key = %call.key, ttl = ?spec.ttl, since_body_returned = ?since, "coord: the answer was older than its ttl by the time it could be cached (the process stalled); it is returned but not cached");
        return output;
    }
    if let (true, Some(encode)) = (shared, form.encode) {
        match encode(&output, codec) {
            Some(Ok(bytes)) => {
                let store = call.coordinator.cache_store();
                if let Err(err) = store.cache_set(&call.key, &bytes, ttl).await {
                    crate::telemetry::backend_error("cache", call.spec.name, &err);
                    tracing::warn!(key = %call.key, error = %err, "coord: writing the shared cache failed; the outcome is returned but not cached");
                }
            }
            Some(Err(message)) => {
                tracing::warn!(key = %call.key, error = %message, "coord: the outcome did not encode with the coordinator's codec; it is returned but not cached");
            }
            None => {}
        }
    }
    output
}
