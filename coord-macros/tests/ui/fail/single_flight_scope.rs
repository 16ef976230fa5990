// Guards: `scope` on #[single_flight] is "process" or "cluster" (not #[cached]'s words);
// `lease` belongs to the cluster scope and is a positive duration.
use coord_core::{CoordError, single_flight};

#[single_flight(scope = "shared")]
async fn a() -> Result<u64, CoordError> {
    Ok(1)
}

#[single_flight(lease = "10s")]
async fn b() -> Result<u64, CoordError> {
    Ok(1)
}

#[single_flight(scope = "process", lease = "10s")]
async fn c() -> Result<u64, CoordError> {
    Ok(1)
}

#[single_flight(scope = "cluster", lease = "0s")]
async fn d() -> Result<u64, CoordError> {
    Ok(1)
}

#[single_flight(scope = "cluster", lease = "5s")]
async fn fine() -> Result<u64, CoordError> {
    Ok(1)
}

fn main() {
    let _ = fine();
}
