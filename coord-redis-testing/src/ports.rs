//! Where the processes listen: the loopback address, and free ports on it.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// The address every process started here binds and every test connection dials.
pub(crate) const HOST: &str = "127.0.0.1";

/// A port on 127.0.0.1 that is free now (and, with `bus`, whose +10000 Cluster bus port is
/// free too). Never 6379.
///
/// Free now is not free later: another process may take the port before redis-server binds
/// it, which is why the starters retry on a fresh port when a server does not come up.
/// Test binaries run concurrently, so each process starts its search at a base of its own
/// (derived from its pid) to make such collisions rare.
pub(crate) fn free_port(bus: bool) -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = 20_000 + (std::process::id() % 400) * 50;
    for _ in 0..20_000 {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (base + offset % 30_000) as u16;
        if port == 6379 || port >= 55_000 {
            continue;
        }
        let free = |p: u16| TcpListener::bind((HOST, p)).is_ok();
        if free(port) && (!bus || free(port + 10_000)) {
            return port;
        }
    }
    panic!("no free port found on 127.0.0.1 for redis-server");
}
