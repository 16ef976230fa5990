//! Running commands as the server's account, signalling a server's whole process group, and
//! finding a free port.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::user::RunAs;

/// The address every server binds and every test connection dials.
pub(crate) const HOST: &str = "127.0.0.1";

/// Runs `cmd` as `owner` (when this process is root).
pub(crate) fn as_user(cmd: &mut Command, owner: Option<&RunAs>) {
    if let Some(owner) = owner {
        cmd.uid(owner.uid).gid(owner.gid);
        // No HOME of root's: psql and initdb would try to read files there.
        cmd.env("HOME", std::env::temp_dir());
    }
}

/// Sends `sig` to the postmaster `postmaster` and to every process it started (backends and
/// background workers, each of which PostgreSQL makes the leader of a session of its own, so
/// one signal to the postmaster's group would miss them). Returns whether the postmaster got
/// it.
///
/// `SIGSTOP` stops the postmaster first, and waits until it shows as stopped, so it forks
/// nothing new while its children are listed and stopped; `SIGKILL` stops it first too, then
/// kills the children it has (they would be handed to another parent once it died), then it.
pub(crate) fn signal_server(postmaster: u32, sig: libc::c_int) -> bool {
    let pm = postmaster as libc::pid_t;
    // SAFETY (every `kill` here): `kill` takes no pointers, so memory safety is not at stake.
    // The postmaster is our unreaped child, so its pid is its own. A child's pid is read
    // from /proc an instant before it is signalled; a backend that exits in between could in
    // principle have its pid reused, a race a test harness accepts.
    match sig {
        libc::SIGCONT => {
            for child in children(postmaster) {
                unsafe { libc::kill(child as libc::pid_t, sig) };
            }
            unsafe { libc::kill(pm, sig) == 0 }
        }
        libc::SIGSTOP | libc::SIGKILL => {
            let stopped = unsafe { libc::kill(pm, libc::SIGSTOP) == 0 };
            // `kill` returns before the postmaster has stopped: a fork it is inside of still
            // completes, and a child listed before that would be missed (it ran on through a
            // pause). Once the postmaster shows as stopped, its children are all there.
            if stopped {
                wait_stopped(postmaster);
            }
            for child in children(postmaster) {
                unsafe { libc::kill(child as libc::pid_t, sig) };
            }
            if sig == libc::SIGKILL {
                unsafe { libc::kill(pm, sig) == 0 }
            } else {
                stopped
            }
        }
        _ => unsafe { libc::kill(pm, sig) == 0 },
    }
}

/// Kills every process whose working directory is `data_dir` (every PostgreSQL process of a
/// server works in its data directory) and returns how many: a server process that was
/// not, or no longer, a child of the postmaster when the server was killed (orphaned, it
/// belongs to init) would otherwise outlive the test, stopped or running.
pub(crate) fn kill_strays(data_dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let ours = data_dir.to_string_lossy().into_owned();
    let removed = format!("{ours} (deleted)");
    let mut killed = 0;
    for pid in entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
    {
        let Ok(cwd) = std::fs::read_link(format!("/proc/{pid}/cwd")) else {
            continue;
        };
        let cwd = cwd.to_string_lossy();
        if cwd == ours || cwd == removed {
            // SAFETY: `kill` takes no pointers. The pid was read an instant ago as a process
            // working in this server's own directory (a race with pid reuse a test harness
            // accepts, as for `signal_server`).
            killed += usize::from(unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) } == 0);
        }
    }
    killed
}

/// Waits (at most a second) until `pid` shows as stopped in /proc, or is gone.
fn wait_stopped(pid: u32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while std::time::Instant::now() < deadline {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                let rest = &stat[stat.rfind(')')? + 1..];
                rest.split_whitespace().next().map(str::to_owned)
            });
        match state.as_deref() {
            None | Some("T" | "t" | "Z" | "X") => return,
            Some(_) => std::thread::sleep(std::time::Duration::from_micros(200)),
        }
    }
}

/// The processes whose parent is `parent`, from /proc.
fn children(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
                    let rest = &stat[stat.rfind(')')? + 1..];
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

/// A port on 127.0.0.1 that is free now, never 5432.
///
/// Free now is not free later: another process may take it before the server binds it,
/// which is why starting retries on a fresh port. Each test process starts its search at a
/// base of its own (from its pid), so concurrent test binaries rarely collide.
pub(crate) fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = 21_000 + (std::process::id() % 400) * 50;
    for _ in 0..20_000 {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (base + offset % 30_000) as u16;
        if port == 5432 || port >= 55_000 {
            continue;
        }
        if TcpListener::bind((HOST, port)).is_ok() {
            return port;
        }
    }
    panic!("no free port found on 127.0.0.1 for PostgreSQL");
}
