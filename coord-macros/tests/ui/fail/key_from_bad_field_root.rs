// Guards: in a field path, the first segment must be a parameter; the error names the path
// and suggests the parameter.
use coord_core::{CoordError, distributed_lock};

pub struct Order {
    pub customer_id: u64,
}

#[distributed_lock(key_from = "ordr.customer_id")]
async fn ship(order: Order) -> Result<(), CoordError> {
    let _ = order;
    Ok(())
}

fn main() {}
