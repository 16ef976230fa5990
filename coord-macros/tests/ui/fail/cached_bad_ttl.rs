// Guards: `ttl` is a compile-checked duration, longer than zero, and required.
use coord_core::cached;

#[cached(key_from = "id", ttl = "5 minutes")]
async fn a(id: u64) -> Result<u64, String> {
    Ok(id)
}

#[cached(key_from = "id", ttl = "0s")]
async fn b(id: u64) -> Result<u64, String> {
    Ok(id)
}

#[cached(key_from = "id")]
async fn c(id: u64) -> Result<u64, String> {
    Ok(id)
}

fn main() {}
