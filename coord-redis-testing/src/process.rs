//! What a redis-server process needs around it: the binary, a private scratch directory,
//! and signals to pause and resume it.

use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicU32, Ordering};

/// The `redis-server` binary, or a panic that says how to get one.
///
/// `REDIS_SERVER_BIN` wins when set (and must name a file); otherwise the first
/// `redis-server` on the `PATH`, then in `/usr/bin`, `/usr/local/bin` and `/usr/sbin`.
/// The version is not checked here; the tests need Redis 7.0 or newer.
pub fn redis_server_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("REDIS_SERVER_BIN") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "REDIS_SERVER_BIN points at {}, which is not a file",
            path.display()
        );
        return path;
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/bin", "/usr/local/bin", "/usr/sbin"].map(PathBuf::from));
    dirs.into_iter()
        .map(|d| d.join("redis-server"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "redis-server was not found on the PATH. These tests start their own Redis: \
                 install it (Debian/Ubuntu: `apt-get install redis-server`; it needs Redis 7.0 \
                 or newer) or set REDIS_SERVER_BIN to the binary"
            )
        })
}

/// A fresh, empty directory under the system temporary directory, named for `kind`, this
/// process and a counter, so that no two handles (nor two test processes) share one. Its
/// owner removes it on drop.
pub(crate) fn unique_dir(kind: &str) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "coord-redis-{kind}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a temporary directory for redis-server");
    dir
}

/// Sends `sig` to `child`; panics if the signal cannot be delivered.
pub(crate) fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: `kill` takes no pointers, so memory safety is not at stake; the care is in the
    // target. A `RedisServer` holds its `Child` only once the server answered, and gives it up
    // before reaping it (`RedisServer::kill`): a `Child` signalled here is unreaped, so its
    // pid (kept by the zombie if the server died) names no other process.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    assert_eq!(rc, 0, "signalling redis-server {} failed", child.id());
}
