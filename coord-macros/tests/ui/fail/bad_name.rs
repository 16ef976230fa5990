// Guards: `name` may only hold ASCII letters, digits and `. _ - /`.
use coord_core::{CoordError, single_flight};

#[single_flight(name = "payments:charge now")]
async fn charge() -> Result<(), CoordError> {
    Ok(())
}

fn main() {}
