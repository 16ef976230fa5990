// Guards: `local_ttl` must be shorter than `ttl`, and belongs to `two_tier` only.
use coord_core::cached;

#[cached(ttl = "10s", scope = "two_tier", local_ttl = "10s")]
async fn a() -> Result<u64, String> {
    Ok(1)
}

#[cached(ttl = "10s", scope = "two_tier", local_ttl = "1m")]
async fn b() -> Result<u64, String> {
    Ok(1)
}

#[cached(ttl = "10s", local_ttl = "1s")]
async fn c() -> Result<u64, String> {
    Ok(1)
}

fn main() {}
