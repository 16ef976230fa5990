//! Heap allocations per call on the in-process hot paths, counted by a counting global
//! allocator: an uncontended `#[distributed_lock]` call and an `#[idempotent]` replay, after
//! warm-up, with metrics and tracing compiled in and no recorder or subscriber installed.
//!
//! A count, not a time: it does not move with the machine's load, so it can be held. Each
//! ceiling is the count of the code that set it; a change that allocates more per call fails
//! here and has to say why (and raise the ceiling) in the same commit.
//!
//! One test in this binary, so no other test's allocations can be counted; and only the
//! allocations of the thread that enabled counting are counted (the call runs on it: a
//! current-thread runtime, `block_on` per call).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use coord_core::{CoordError, Coordinator, distributed_lock, idempotent};

/// Counts the allocations of the current thread while counting is on, then hands every request
/// to [`System`] unchanged.
struct CountingAllocator;

thread_local! {
    /// Whether this thread counts its allocations.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    /// Allocations (including reallocations) counted on this thread.
    static COUNTED: Cell<u64> = const { Cell::new(0) };
}

fn count_one() {
    // `try_with`: a thread being torn down no longer has its thread-locals; its allocations
    // are not ours to count. Both keys are `const`-initialised `Cell`s without a destructor, so
    // reaching them never allocates (no lazy initialisation, no destructor registration) and
    // cannot re-enter the allocator.
    let on = COUNTING.try_with(Cell::get).unwrap_or(false);
    if on {
        let _ = COUNTED.try_with(|n| n.set(n.get() + 1));
    }
}

// SAFETY: every method forwards its arguments unchanged to `System`, which implements
// `GlobalAlloc` soundly, and returns what `System` returned, so each method meets the
// contract `GlobalAlloc` requires (alignment, size, ownership of the returned block, no
// unwinding) exactly as `System` does. The only other thing done is `count_one`, which touches
// two thread-local `Cell`s: it neither allocates nor frees (see there), cannot panic (`try_with`
// and `Cell::get`/`set` do not, and the count cannot realistically overflow a `u64`), and keeps
// no pointer, so it cannot affect the blocks handed out.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: forwarded as received; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: forwarded as received; the caller upholds `alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: forwarded as received; `ptr` came from this allocator, which is `System`'s.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as received; `ptr` came from this allocator, which is `System`'s.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Allocations `f` makes on this thread.
fn allocations_of(f: impl FnOnce()) -> u64 {
    let before = COUNTED.with(Cell::get);
    COUNTING.with(|on| on.set(true));
    f();
    COUNTING.with(|on| on.set(false));
    COUNTED.with(Cell::get) - before
}

struct Service {
    coord: Coordinator,
}

impl Service {
    #[distributed_lock(key_from = "tenant", coordinator = self.coord, name = "alloc.lock")]
    async fn locked(&self, tenant: u64) -> Result<u64, CoordError> {
        Ok(std::hint::black_box(tenant))
    }

    #[idempotent(key_from = "tenant", coordinator = self.coord, name = "alloc.idem")]
    async fn once(&self, tenant: u64) -> Result<u64, CoordError> {
        Ok(std::hint::black_box(tenant))
    }

    async fn plain(&self, tenant: u64) -> Result<u64, CoordError> {
        Ok(std::hint::black_box(tenant))
    }
}

const WARM_UP: u64 = 200;
const CALLS: u64 = 1000;

/// Allocations per call of `call`, averaged over [`CALLS`] calls after [`WARM_UP`] calls, each
/// in its own `block_on` (as the in-process benches run them).
fn per_call<F: Future<Output = Result<u64, CoordError>>>(
    rt: &tokio::runtime::Runtime,
    call: impl Fn() -> F,
) -> f64 {
    for _ in 0..WARM_UP {
        rt.block_on(call()).expect("an uncontended call succeeds");
    }
    let counted = allocations_of(|| {
        for _ in 0..CALLS {
            rt.block_on(call()).expect("an uncontended call succeeds");
        }
    });
    counted as f64 / CALLS as f64
}

/// The most allocations one uncontended `#[distributed_lock]` call may make: the call key (one
/// shared string, which the in-process lock table keeps as its entry's key) and the hold (the
/// node that the reentrancy check, `fencing_token()` and `is_held()` read), as before the
/// in-process performance work of issue 25.
const LOCK_CEILING: f64 = 2.0;
/// The most allocations one `#[idempotent]` replay may make: the call key, and the provider's
/// boxed answer (the contract's futures are boxed; a replay's answer carries the stored bytes,
/// so it cannot be a zero-sized constant). 6.3 before that work, when records lived in moka.
const REPLAY_CEILING: f64 = 2.0;

#[test]
fn the_hot_paths_allocate_no_more_than_they_did() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let service = Service {
        coord: Coordinator::builder()
            .namespace("alloc")
            .memory()
            .build()
            .expect("an in-process coordinator"),
    };
    rt.block_on(service.once(1)).expect("the outcome to replay");

    let plain = per_call(&rt, || service.plain(1));
    let lock = per_call(&rt, || service.locked(1));
    let replay = per_call(&rt, || service.once(1));
    println!(
        "allocations per call: plain {plain}, uncontended #[distributed_lock] {lock} \
         (ceiling {LOCK_CEILING}), #[idempotent] replay {replay} (ceiling {REPLAY_CEILING})"
    );
    assert_eq!(plain, 0.0, "a plain call in block_on allocates nothing");
    assert!(
        lock <= LOCK_CEILING,
        "an uncontended #[distributed_lock] call allocates {lock} times, more than the \
         {LOCK_CEILING} it did: find the new allocation (or say why it is needed and raise the \
         ceiling)"
    );
    assert!(
        replay <= REPLAY_CEILING,
        "an #[idempotent] replay allocates {replay} times, more than the {REPLAY_CEILING} it \
         did: find the new allocation (or say why it is needed and raise the ceiling)"
    );
}
