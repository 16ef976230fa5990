// Guards: a key parameter whose type is not a `KeyPart` is reported at the `key_from` string.
use coord_core::{CoordError, distributed_lock};

pub struct Tenant {
    pub id: u64,
}

#[distributed_lock(key_from = "tenant")]
async fn rebuild(tenant: Tenant) -> Result<(), CoordError> {
    let _ = tenant.id;
    Ok(())
}

fn main() {}
