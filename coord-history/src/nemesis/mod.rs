//! Faults, started and healed by the test itself.
//!
//! - [`proxy`]: a TCP proxy between the clients and a server, whose [`proxy::Mode`] the test
//!   switches: delay, blackhole (bytes silently dropped both ways, connections left open: a
//!   partition as the clients see it; those that lost bytes are closed at the heal), hold (bytes kept back until healed), half-open (the
//!   server's side closed, the client's left open and silent), reset (every connection closed,
//!   new ones refused).
//! - [`schedule`]: seeded schedules that combine several faults in one step, so that a run
//!   sees faults overlapping, not one at a time.
//!
//! Pausing (SIGSTOP/SIGCONT), killing and restarting servers and client processes, filling a
//! server's memory, and moving a client process's clock (jumped forward, or stalled while its
//! code runs) are done by the test with the backend's testing crate or its own processes; the
//! schedule names them ([`schedule::FaultKind`]).

pub mod proxy;
pub mod schedule;
