// Guards: the shared tier stores the `Ok` value with the coordinator's codec, so it must be
// serde; a local cache would accept it.
use coord_core::cached;

#[derive(Clone)]
struct Report {
    lines: Vec<String>,
}

#[cached(ttl = "1m", scope = "shared")]
async fn report() -> Result<Report, String> {
    Ok(Report { lines: Vec::new() })
}

#[cached(ttl = "1m")]
async fn not_a_result() -> u64 {
    1
}

fn main() {
    let _ = (report(), not_a_result());
}
