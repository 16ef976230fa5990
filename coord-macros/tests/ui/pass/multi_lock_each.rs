// `key_from_each` over the collections it accepts: owned and borrowed vectors, slices, arrays
// and sets, with the other lock options.
use std::collections::BTreeSet;

use coord_core::{CoordError, distributed_lock, fencing_token_of};

#[distributed_lock(key_from_each = "accounts", lease = "10s", wait = "5s", renew = true)]
async fn transfer(accounts: Vec<String>, cents: u64) -> Result<u64, CoordError> {
    let _ = fencing_token_of;
    Ok(cents)
}

#[distributed_lock(key_from_each = "ids", fenced = true)]
async fn borrowed(ids: &[u64]) -> Result<(), CoordError> {
    let _ = ids;
    Ok(())
}

#[distributed_lock(key_from_each = "pair")]
async fn array(pair: [&'static str; 2]) -> Result<(), CoordError> {
    let _ = pair;
    Ok(())
}

#[distributed_lock(key_from_each = "set", on_lost = "signal", renew = "2s")]
async fn set(set: BTreeSet<u32>) -> Result<(), CoordError> {
    let _ = set;
    Ok(())
}

fn main() {
    let _ = (transfer, borrowed, array, set);
}
