//! Who runs the server: PostgreSQL refuses to run as root, so a test process running as root
//! starts it as an unprivileged user instead.

use std::ffi::CString;

/// An unprivileged account to run `initdb` and `postgres` as.
#[derive(Debug, Clone)]
pub(crate) struct RunAs {
    pub(crate) name: String,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

/// `None` when this process is not root (the server then runs as this process's user);
/// otherwise the `postgres` account (which the `postgresql` package creates), else `nobody`.
///
/// # Panics
/// As root, when neither account exists.
pub(crate) fn run_as() -> Option<RunAs> {
    // SAFETY: `geteuid` takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let found = ["postgres", "nobody"].iter().find_map(|name| lookup(name));
    Some(found.unwrap_or_else(|| {
        panic!(
            "this test runs as root, and PostgreSQL refuses to run as root; neither a `postgres` \
             nor a `nobody` account exists to run it as. Install PostgreSQL \
             (`apt-get install postgresql`, which creates the `postgres` account)"
        )
    }))
}

/// The account named `name`, through the system's user database (NSS).
fn lookup(name: &str) -> Option<RunAs> {
    let c_name = CString::new(name).ok()?;
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: `passwd` is plain old data; all-zero is a valid (if meaningless) value, and
    // `getpwnam_r` overwrites it before we read it.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call: `c_name` is a NUL-terminated string that
    // outlives it, `entry` and `result` are live locals, and `buf` is a writable buffer of the
    // length passed. The strings `entry` points at live in `buf`, which we do not read.
    let rc = unsafe {
        libc::getpwnam_r(
            c_name.as_ptr(),
            &mut entry,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() {
        return None;
    }
    Some(RunAs {
        name: name.to_owned(),
        uid: entry.pw_uid,
        gid: entry.pw_gid,
    })
}
