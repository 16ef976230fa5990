//! `#[cached]` takes its fixed place (inside idempotency, outside single-flight and the lock)
//! in every one of the 24 orders the four attributes can be written in.
//!
//! Each order is a function with all four layers. The first call misses the cache, leads its
//! flight and takes the lock. Then the idempotency record is purged, so the next call gets
//! past idempotency (which must come first: it reports `executed`) and is answered by the
//! cache (a hit) without reaching single-flight or the lock, and without running the body.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use coord_core::report::{CacheOutcome, FlightOutcome, IdempotencyOutcome, LockOutcome};
use coord_core::{
    CoordError, Coordinator, cached, distributed_lock, idempotent, observe, single_flight,
};

type Runs = Arc<AtomicUsize>;
type Call = fn(Coordinator, Runs) -> Pin<Box<dyn Future<Output = Result<u64, CoordError>>>>;

/// `stack!(name, "op", [I C F L], (c, id))` defines `name` with the attributes written in the
/// order of the letters (I idempotent, C cached, F single_flight, L distributed_lock), each
/// repeating the shared options (allowed when they agree). The coordinator and key parameters
/// come from the caller, so the attributes (built up over several expansions) and the
/// function's parameters name the same variables.
macro_rules! stack {
    ($name:ident, $op:literal, [$($layer:ident)*], ($c:ident, $id:ident)) => {
        stack!(@munch $name, $op, ($c, $id), [$($layer)*], []);
    };
    (@munch $name:ident, $op:literal, ($c:ident, $id:ident), [I $($rest:ident)*], [$($done:tt)*]) => {
        stack!(@munch $name, $op, ($c, $id), [$($rest)*], [$($done)*
            #[idempotent(key_from = [$id], coordinator = $c, name = $op)]]);
    };
    (@munch $name:ident, $op:literal, ($c:ident, $id:ident), [C $($rest:ident)*], [$($done:tt)*]) => {
        stack!(@munch $name, $op, ($c, $id), [$($rest)*], [$($done)*
            #[cached(key_from = [$id], coordinator = $c, name = $op, ttl = "1m")]]);
    };
    (@munch $name:ident, $op:literal, ($c:ident, $id:ident), [F $($rest:ident)*], [$($done:tt)*]) => {
        stack!(@munch $name, $op, ($c, $id), [$($rest)*], [$($done)*
            #[single_flight(key_from = [$id], coordinator = $c, name = $op)]]);
    };
    (@munch $name:ident, $op:literal, ($c:ident, $id:ident), [L $($rest:ident)*], [$($done:tt)*]) => {
        stack!(@munch $name, $op, ($c, $id), [$($rest)*], [$($done)*
            #[distributed_lock(key_from = [$id], coordinator = $c, name = $op)]]);
    };
    (@munch $name:ident, $op:literal, ($c:ident, $id:ident), [], [$($done:tt)*]) => {
        $($done)*
        async fn $name($c: &Coordinator, $id: u64, runs: Runs) -> Result<u64, CoordError> {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok($id)
        }
    };
}

/// Defines every order (each with its operation name) and lists them as `(name, call)`.
macro_rules! orders {
    ($($name:ident = [$($layer:ident)*] $op:literal;)*) => {
        $(stack!($name, $op, [$($layer)*], (c, id));)*

        const ORDERS: &[(&str, Call)] = &[
            $(($op, |c, runs| Box::pin(async move { $name(&c, 7, runs).await })),)*
        ];
    };
}

orders! {
    icfl = [I C F L] "icfl";
    iclf = [I C L F] "iclf";
    ifcl = [I F C L] "ifcl";
    iflc = [I F L C] "iflc";
    ilcf = [I L C F] "ilcf";
    ilfc = [I L F C] "ilfc";
    cifl = [C I F L] "cifl";
    cilf = [C I L F] "cilf";
    cfil = [C F I L] "cfil";
    cfli = [C F L I] "cfli";
    clif = [C L I F] "clif";
    clfi = [C L F I] "clfi";
    ficl = [F I C L] "ficl";
    filc = [F I L C] "filc";
    fcil = [F C I L] "fcil";
    fcli = [F C L I] "fcli";
    flic = [F L I C] "flic";
    flci = [F L C I] "flci";
    licf = [L I C F] "licf";
    lifc = [L I F C] "lifc";
    lcif = [L C I F] "lcif";
    lcfi = [L C F I] "lcfi";
    lfic = [L F I C] "lfic";
    lfci = [L F C I] "lfci";
}

#[tokio::test(flavor = "current_thread")]
async fn every_written_order_nests_idempotency_cache_flight_lock() {
    assert_eq!(ORDERS.len(), 24, "every permutation of four attributes");
    for (order, call) in ORDERS {
        let c = Coordinator::builder()
            .namespace(format!("orders-{order}"))
            .memory()
            .build()
            .unwrap();
        let runs: Runs = Arc::default();

        let (out, first) = observe(call(c.clone(), runs.clone())).await;
        assert_eq!(out.unwrap(), 7, "{order}");
        assert_eq!(
            first.idempotency(),
            Some(IdempotencyOutcome::Executed),
            "{order}"
        );
        assert_eq!(first.cache(), Some(CacheOutcome::Miss), "{order}");
        assert_eq!(first.flight(), Some(FlightOutcome::Led), "{order}");
        assert_eq!(first.lock(), Some(LockOutcome::Acquired), "{order}");

        let (out, replay) = observe(call(c.clone(), runs.clone())).await;
        assert_eq!(out.unwrap(), 7, "{order}");
        assert!(replay.replayed(), "{order}: a duplicate replays");
        assert_eq!(
            replay.cache(),
            None,
            "{order}: a replay never reaches the cache"
        );

        let key = c.key(order).part(&7u64).finish();
        assert!(
            c.purge_record(&key).await.unwrap(),
            "{order}: the record was there"
        );
        let (out, hit) = observe(call(c.clone(), runs.clone())).await;
        assert_eq!(out.unwrap(), 7, "{order}");
        assert_eq!(
            hit.idempotency(),
            Some(IdempotencyOutcome::Executed),
            "{order}"
        );
        assert_eq!(
            hit.cache(),
            Some(CacheOutcome::Hit),
            "{order}: answered by the cache"
        );
        assert_eq!(hit.flight(), None, "{order}: a hit skips single-flight");
        assert_eq!(hit.lock(), None, "{order}: a hit skips the lock");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{order}: the body ran once");
    }
}
