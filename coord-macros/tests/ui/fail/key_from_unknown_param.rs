// Guards: `key_from` naming no parameter points at the string, lists the parameters and
// suggests the closest one.
use coord_core::{CoordError, distributed_lock};

#[distributed_lock(key_from = "tenant")]
async fn rebuild(tenant_id: u64, region: String) -> Result<(), CoordError> {
    let _ = (tenant_id, region);
    Ok(())
}

fn main() {}
