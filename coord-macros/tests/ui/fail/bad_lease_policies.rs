// Guards: `on_lost` and `on_abandoned` take one of their words; a near miss gets a suggestion, and
// `renew` takes a bool or an interval.
use coord_core::{CoordError, idempotent};

#[idempotent(key_from = "id", on_lost = "cancle", on_abandoned = "retry", renew = 5)]
async fn charge(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

fn main() {}
