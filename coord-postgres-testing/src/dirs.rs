//! The directories a server lives in: a private scratch directory per server, and one
//! freshly initialised data directory per test process that every server starts from a copy
//! of (`initdb` once, not once per server).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::user::RunAs;

/// A fresh, empty directory under the system temporary directory, named for `kind`, this
/// process and a counter, owned by `owner` (the server's account) with mode 0700.
pub(crate) fn unique_dir(kind: &str, owner: Option<&RunAs>) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "coord-pg-{kind}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a temporary directory for PostgreSQL");
    give_to(&dir, owner);
    dir
}

/// Makes `path` `owner`'s (when running as root) and private to it.
pub(crate) fn give_to(path: &Path, owner: Option<&RunAs>) {
    if let Some(owner) = owner {
        std::os::unix::fs::chown(path, Some(owner.uid), Some(owner.gid))
            .unwrap_or_else(|e| panic!("chown {} to {}: {e}", path.display(), owner.name));
    }
    if path.is_dir() {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
            .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
    }
}

/// A data directory made by `initdb` once for this process (superuser `postgres`, trust
/// authentication, UTF-8, C locale), removed when the process exits.
fn template(bin: &Path, owner: Option<&RunAs>) -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    extern "C" fn remove_template() {
        if let Some(dir) = TEMPLATE.get() {
            if let Some(parent) = dir.parent() {
                let _ = std::fs::remove_dir_all(parent);
            }
        }
    }
    TEMPLATE.get_or_init(|| {
        let root = unique_dir("template", owner);
        let data = root.join("data");
        let mut cmd = Command::new(bin.join("initdb"));
        cmd.arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"])
            .args(["--locale=C", "--no-instructions"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        crate::process::as_user(&mut cmd, owner);
        let out = cmd.output().unwrap_or_else(|e| {
            panic!(
                "could not run {}: {e}. Install PostgreSQL (`apt-get install postgresql`)",
                bin.join("initdb").display()
            )
        });
        assert!(
            out.status.success(),
            "initdb failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // SAFETY: `remove_template` is an `extern "C" fn()`, as `atexit` requires; it only
        // reads the `OnceLock` (set by now) and cannot unwind into C (a panic in an
        // `extern "C"` function aborts).
        let _ = unsafe { libc::atexit(remove_template) };
        data
    })
}

/// Fills `data` (which must not exist) with a copy of the process's initialised data
/// directory, owned by `owner`.
pub(crate) fn fresh_data_dir(bin: &Path, data: &Path, owner: Option<&RunAs>) {
    let template = template(bin, owner);
    copy_tree(template, data, owner)
        .unwrap_or_else(|e| panic!("copy the template data directory: {e}"));
}

fn copy_tree(from: &Path, to: &Path, owner: Option<&RunAs>) -> std::io::Result<()> {
    std::fs::create_dir(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_tree(&entry.path(), &target, owner)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)?;
            if let Some(owner) = owner {
                std::os::unix::fs::chown(&target, Some(owner.uid), Some(owner.gid))?;
            }
        }
        // initdb makes no symbolic links or special files in a data directory.
    }
    give_to(to, owner);
    Ok(())
}
