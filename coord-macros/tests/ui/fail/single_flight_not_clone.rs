// Guards: #[single_flight] shares one outcome among callers, so it must be `Clone`; the error
// points at the return type.
use coord_core::single_flight;

#[derive(Debug)]
pub struct Report {
    pub rows: Vec<u64>,
}

#[single_flight(key_from = "day")]
async fn build_report(day: u32) -> Report {
    Report {
        rows: vec![u64::from(day)],
    }
}

fn main() {}
