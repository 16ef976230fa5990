// Guards: #[distributed_lock] on a function returning `()` (no return type written) is
// rejected: a lock that was not taken has to be reported through the return value.
use coord_core::distributed_lock;

#[distributed_lock(key_from = "id")]
async fn rebuild(id: u64) {
    let _ = id;
}

fn main() {}
