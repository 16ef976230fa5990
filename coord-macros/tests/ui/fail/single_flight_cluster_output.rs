// Guards: `scope = "cluster"` hands the outcome to other instances, so the output must be a
// `Result` whose `Ok` is serde and whose error converts from `CoordError` (followers of a
// failed leader get `LeaderFailed` through it); the process scope accepts all three.
use coord_core::{CoordError, single_flight};

#[derive(Clone)]
struct Report {
    lines: Vec<String>,
}

#[single_flight(scope = "cluster")]
async fn report() -> Result<Report, CoordError> {
    Ok(Report { lines: Vec::new() })
}

#[single_flight(scope = "cluster")]
async fn not_a_result() -> u64 {
    1
}

#[single_flight(scope = "cluster")]
async fn plain_error() -> Result<u64, String> {
    Ok(1)
}

#[single_flight(scope = "process")]
async fn fine_in_process() -> Result<Report, String> {
    Ok(Report { lines: Vec::new() })
}

fn main() {
    let _ = (report(), not_a_result(), plain_error(), fine_in_process());
}
