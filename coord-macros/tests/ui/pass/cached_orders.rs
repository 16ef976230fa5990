// Guards: `#[cached]` stacks with the other three attributes in any written order, takes each
// scope, and a shared scope accepts a serde `Ok` type.
use coord_core::{CoordError, cached, distributed_lock, idempotent, single_flight};

#[cached(key_from = "id", ttl = "30s")]
#[idempotent]
#[single_flight]
#[distributed_lock]
async fn cache_first(id: u64) -> Result<u64, CoordError> {
    Ok(id)
}

#[distributed_lock(key_from = "id")]
#[single_flight]
#[cached(ttl = "1m", scope = "shared")]
#[idempotent]
async fn cache_third(id: u64) -> Result<u64, CoordError> {
    Ok(id)
}

#[single_flight(key_from = "id")]
#[cached(ttl = "1m", scope = two_tier, local_ttl = "10s", max_capacity = 500)]
async fn two_tier(id: u64) -> Result<String, CoordError> {
    Ok(id.to_string())
}

#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct Quote {
    cents: u64,
}

#[derive(Clone, serde::Serialize, serde::Deserialize)]
enum QuoteError {
    Unknown,
}

#[cached(key_from = "symbol", ttl = "5s", scope = "shared", cache_err = true)]
async fn quote(symbol: String) -> Result<Quote, QuoteError> {
    if symbol.is_empty() {
        return Err(QuoteError::Unknown);
    }
    Ok(Quote { cents: 1 })
}

// A local cache needs no serde, and no `From<CoordError>` for the error.
#[derive(Clone)]
struct Plain(u64);

#[cached(ttl = "1s")]
async fn plain() -> Result<Plain, std::sync::Arc<std::io::Error>> {
    Ok(Plain(1))
}

fn main() {
    let _ = (cache_first(1), cache_third(1), two_tier(1), quote(String::new()), plain());
}
