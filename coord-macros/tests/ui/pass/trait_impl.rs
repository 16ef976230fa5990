// Guards: native `async fn` in a trait impl keeps matching the trait's signature.
use coord_core::{CoordError, distributed_lock, single_flight};

#[allow(async_fn_in_trait)]
pub trait Store {
    async fn load(&self, id: u64) -> Result<String, CoordError>;
    async fn count(&self) -> usize;
}

pub struct Memory;

impl Store for Memory {
    #[distributed_lock(key_from = "id", wait = "100ms")]
    async fn load(&self, id: u64) -> Result<String, CoordError> {
        Ok(id.to_string())
    }

    #[single_flight]
    async fn count(&self) -> usize {
        0
    }
}

fn main() {}
