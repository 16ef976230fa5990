// Guards: the attributes only go on a function with a body; the item is emitted as it is, and
// the attribute's own mistakes are reported with it.
use coord_core::{CoordError, idempotent, single_flight};

#[single_flight]
struct Quote;

trait Charge {
    #[idempotent(key_from = "id", retention = "forever")]
    async fn charge(&self, id: u64) -> Result<(), CoordError>;
}

fn main() {
    let _ = Quote;
}
