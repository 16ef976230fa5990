// Guards: `scope` is one of three words, with a suggestion for a near miss; `max_capacity`
// is a positive whole number and has no meaning for a cache without a local tier.
use coord_core::cached;

#[cached(ttl = "1m", scope = "global")]
async fn a() -> Result<u64, String> {
    Ok(1)
}

#[cached(ttl = "1m", scope = "two-tier")]
async fn b() -> Result<u64, String> {
    Ok(1)
}

#[cached(ttl = "1m", max_capacity = 0)]
async fn c() -> Result<u64, String> {
    Ok(1)
}

#[cached(ttl = "1m", scope = "shared", max_capacity = 10)]
async fn d() -> Result<u64, String> {
    Ok(1)
}

fn main() {}
