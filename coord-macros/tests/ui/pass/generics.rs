// Guards: generic functions, `impl Trait` parameters, lifetimes and `where` clauses are kept.
use std::fmt::Display;

use coord_core::{CoordError, KeyPart, distributed_lock, idempotent, single_flight};

#[distributed_lock(key_from = "key")]
pub async fn store<K, V>(key: K, value: V) -> Result<String, CoordError>
where
    K: KeyPart + Send,
    V: Display + Send,
{
    Ok(value.to_string())
}

#[single_flight(key_from = "name")]
pub async fn greet<'a>(name: &'a str, suffix: impl Display) -> String {
    format!("{name}{suffix}")
}

#[idempotent(key_from = "id")]
pub async fn with_pattern((a, b): (u8, u8), mut id: u32) -> Result<u32, CoordError> {
    id += u32::from(a) + u32::from(b);
    Ok(id)
}

fn main() {}
