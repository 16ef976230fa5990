// Guards: `key_from_each` takes one lock per element, so the parameter it names must be a
// collection of key parts; a plain value (or a collection of values that are not key parts)
// fails to compile, at the name written in the attribute.
use coord_core::{CoordError, distributed_lock};

#[distributed_lock(key_from_each = "account")]
async fn one_account(account: u64) -> Result<(), CoordError> {
    let _ = account;
    Ok(())
}

struct Opaque;

#[distributed_lock(key_from_each = "things")]
async fn opaque_elements(things: Vec<Opaque>) -> Result<(), CoordError> {
    let _ = things;
    Ok(())
}

fn main() {}
