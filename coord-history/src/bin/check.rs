//! Re-checks recorded histories: `check <history.jsonl>...` reads every file (one event a
//! line; several files are one history, e.g. one per process), decides every promise, prints
//! the figures and each violation with its events, and exits 1 when any promise was broken
//! (2 when a file cannot be read).

fn main() {
    let paths: Vec<String> = std::env::args().skip(1).collect();
    if paths.is_empty() {
        eprintln!("usage: check <history.jsonl>...");
        std::process::exit(2);
    }
    let mut events = Vec::new();
    for path in &paths {
        match coord_history::read_jsonl(std::path::Path::new(path)) {
            Ok(mut e) => events.append(&mut e),
            Err(err) => {
                eprintln!("cannot read {path}: {err}");
                std::process::exit(2);
            }
        }
    }
    let report = coord_history::check(&events);
    print!("{report}");
    std::process::exit(if report.violations.is_empty() { 0 } else { 1 });
}
