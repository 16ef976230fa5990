// Guards: `profile` takes a non-empty string of lowercase letters, digits and `_`, and only
// on a function whose layers have durations to take from it.
use coord_core::{CoordError, cached, distributed_lock, idempotent, single_flight};

#[distributed_lock(profile = payments)]
async fn not_a_string() -> Result<(), CoordError> {
    Ok(())
}

#[distributed_lock(profile = "")]
async fn empty() -> Result<(), CoordError> {
    Ok(())
}

#[idempotent(key_from = "id", profile = "Payments-EU")]
async fn bad_characters(id: u64) -> Result<u64, CoordError> {
    Ok(id)
}

#[distributed_lock(profile = "1st")]
async fn starts_with_a_digit() -> Result<(), CoordError> {
    Ok(())
}

#[single_flight(profile = "payments")]
async fn nothing_to_configure() -> Result<(), CoordError> {
    Ok(())
}

#[cached(ttl = "5s", profile = "payments")]
async fn cache_only() -> Result<u64, CoordError> {
    Ok(1)
}

#[single_flight(profile = "fast")]
#[distributed_lock(profile = "slow")]
async fn two_profiles() -> Result<(), CoordError> {
    Ok(())
}

fn main() {}
