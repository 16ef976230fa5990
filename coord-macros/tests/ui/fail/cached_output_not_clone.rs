// Guards: a cached outcome is handed out as clones: an output that is not `Clone` is refused
// at the return type.
use coord_core::cached;

struct Report {
    lines: Vec<String>,
}

#[cached(ttl = "1m")]
async fn report() -> Result<Report, String> {
    Ok(Report { lines: Vec::new() })
}

fn main() {
    let _ = report();
}
