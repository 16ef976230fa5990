//! Where the PostgreSQL server binaries are.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The variable that names the directory holding `initdb`, `postgres` and `psql`, when they
/// are somewhere the search below does not look.
pub const BIN_DIR_ENV: &str = "POSTGRES_BIN_DIR";

/// The directory holding the PostgreSQL server binaries (`initdb`, `postgres`, `psql`), or a
/// panic that says how to get them.
///
/// Looked for, in order: the directory named by `POSTGRES_BIN_DIR` (it must hold them), the
/// `--bindir` that `pg_config` reports, the newest `/usr/lib/postgresql/<version>/bin`
/// (where Debian and Ubuntu put them, off the `PATH`), and every directory on the `PATH`.
pub fn postgres_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(BIN_DIR_ENV) {
        let dir = PathBuf::from(dir);
        assert!(
            has_server(&dir),
            "{BIN_DIR_ENV} is {}, which does not hold `initdb`, `postgres` and `psql`",
            dir.display()
        );
        return dir;
    }
    candidates()
        .into_iter()
        .find(|dir| has_server(dir))
        .unwrap_or_else(|| {
            panic!(
                "the PostgreSQL server binaries (`initdb`, `postgres`, `psql`) were not found. \
                 These tests start their own PostgreSQL server: install it (Debian/Ubuntu: \
                 `apt-get install postgresql`) or set {BIN_DIR_ENV} to the directory that \
                 holds them"
            )
        })
}

fn has_server(dir: &Path) -> bool {
    ["initdb", "postgres", "psql"]
        .iter()
        .all(|name| dir.join(name).is_file())
}

/// Directories that may hold the binaries, best first.
fn candidates() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        if out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            if !text.is_empty() {
                dirs.push(PathBuf::from(text));
            }
        }
    }
    // Debian keeps one directory per major version; the newest wins.
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<(u32, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let version = e.file_name().to_str()?.parse::<u32>().ok()?;
                Some((version, e.path().join("bin")))
            })
            .collect();
        versions.sort_by_key(|v| std::cmp::Reverse(v.0));
        dirs.extend(versions.into_iter().map(|(_, dir)| dir));
    }
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs
}
