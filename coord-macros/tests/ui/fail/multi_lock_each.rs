// Guards: `key_from_each` names one parameter of the function (a misspelt one is refused at the
// string, with the parameters listed), takes one collection only, and does not combine with
// `key_from` on the same lock, with `permits`, or with `fenced = false` (every key is fenced).
use coord_core::{CoordError, distributed_lock};

#[distributed_lock(key_from_each = "acounts")]
async fn misspelt(accounts: Vec<u64>, amount: u64) -> Result<(), CoordError> {
    let _ = (accounts, amount);
    Ok(())
}

#[distributed_lock(key_from_each = ["accounts", "others"])]
async fn two_collections(accounts: Vec<u64>, others: Vec<u64>) -> Result<(), CoordError> {
    let _ = (accounts, others);
    Ok(())
}

#[distributed_lock(key_from = "tenant", key_from_each = "accounts")]
async fn with_key_from(tenant: u64, accounts: Vec<u64>) -> Result<(), CoordError> {
    let _ = (tenant, accounts);
    Ok(())
}

#[distributed_lock(key_from_each = "accounts", permits = 3)]
async fn with_permits(accounts: Vec<u64>) -> Result<(), CoordError> {
    let _ = accounts;
    Ok(())
}

#[distributed_lock(key_from_each = "accounts", fenced = false)]
async fn unfenced(accounts: Vec<u64>) -> Result<(), CoordError> {
    let _ = accounts;
    Ok(())
}

fn main() {}
