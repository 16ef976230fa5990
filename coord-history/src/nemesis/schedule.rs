//! Seeded fault schedules: the same seed gives the same schedule, so a failing run can be
//! replayed by its printed seed.

use std::time::Duration;

/// A fault a schedule can ask for. The proxy faults are applied by [`super::proxy::Proxy`];
/// the others by the test, with the backend's testing crate (pause, kill, restart) or with
/// signals to its own client processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// The proxy delays every chunk by 50 to 250 ms.
    ProxyDelay,
    /// The proxy drops every byte both ways (a partition between clients and server).
    ProxyBlackhole,
    /// The proxy holds every byte until healed.
    ProxyHold,
    /// The proxy closes the server's side and leaves the client's side silent.
    ProxyHalfOpen,
    /// The proxy closes every connection.
    ProxyReset,
    /// The server is frozen (SIGSTOP) and thawed (SIGCONT).
    ServerPause,
    /// The server is killed (SIGKILL) and restarted with its data (append-only file, fsync
    /// always).
    ServerKillRestart,
    /// The server is killed and restarted without its data: acknowledged state is lost.
    ServerKillWipe,
    /// One client process is frozen (SIGSTOP) past its leases and thawed.
    ClientPause,
    /// One client process's clock (the runtime clock its lease deadlines, renewals and
    /// timeouts are measured on) jumps forward by 3 s at once: every lease it holds looks
    /// lapsed to it, every timeout it is waiting on fires.
    ClockJump,
    /// One client process's clock stands still while its code keeps running, then goes on
    /// from where it stopped: afterwards it is behind the real time by the stall, as after a
    /// backward jump. Timers do not fire meanwhile, so its renewals stop while it believes
    /// its leases are still young.
    ClockStall,
    /// The server's memory is full: `maxmemory` below what it uses, with
    /// `maxmemory-policy noeviction`, so writes fail with `OOM` errors until healed.
    ServerFull,
}

/// What a fault disturbs; one step never takes two faults of one class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultClass {
    Network,
    Server,
    Client,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 12] = [
        FaultKind::ProxyDelay,
        FaultKind::ProxyBlackhole,
        FaultKind::ProxyHold,
        FaultKind::ProxyHalfOpen,
        FaultKind::ProxyReset,
        FaultKind::ServerPause,
        FaultKind::ServerKillRestart,
        FaultKind::ServerKillWipe,
        FaultKind::ClientPause,
        FaultKind::ClockJump,
        FaultKind::ClockStall,
        FaultKind::ServerFull,
    ];

    /// The name recorded in histories (`proxy-hold`, `server-kill-wipe`, ...).
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::ProxyDelay => "proxy-delay",
            FaultKind::ProxyBlackhole => "proxy-blackhole",
            FaultKind::ProxyHold => "proxy-hold",
            FaultKind::ProxyHalfOpen => "proxy-half-open",
            FaultKind::ProxyReset => "proxy-reset",
            FaultKind::ServerPause => "server-pause",
            FaultKind::ServerKillRestart => "server-kill-restart",
            FaultKind::ServerKillWipe => "server-kill-wipe",
            FaultKind::ClientPause => "client-pause",
            FaultKind::ClockJump => "clock-jump",
            FaultKind::ClockStall => "clock-stall",
            FaultKind::ServerFull => "server-full",
        }
    }

    /// What it disturbs.
    pub fn class(self) -> FaultClass {
        match self {
            FaultKind::ProxyDelay
            | FaultKind::ProxyBlackhole
            | FaultKind::ProxyHold
            | FaultKind::ProxyHalfOpen
            | FaultKind::ProxyReset => FaultClass::Network,
            FaultKind::ServerPause
            | FaultKind::ServerKillRestart
            | FaultKind::ServerKillWipe
            | FaultKind::ServerFull => FaultClass::Server,
            FaultKind::ClientPause | FaultKind::ClockJump | FaultKind::ClockStall => {
                FaultClass::Client
            }
        }
    }

    /// Whether the server loses acknowledged data.
    pub fn data_loss(self) -> bool {
        self == FaultKind::ServerKillWipe
    }
}

/// One step: wait `gap`, start every fault, keep them for `hold`, heal them all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub gap: Duration,
    pub faults: Vec<FaultKind>,
    pub hold: Duration,
    /// For [`FaultKind::ProxyDelay`]: the delay.
    pub delay: Duration,
    /// For [`FaultKind::ClientPause`], [`FaultKind::ClockJump`] and
    /// [`FaultKind::ClockStall`]: which client process (an index to take modulo the
    /// number of processes).
    pub target: u64,
}

/// A seeded list of steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub seed: u64,
    pub steps: Vec<Step>,
}

/// splitmix64: small, seedable, good enough to pick faults.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

impl Schedule {
    /// Steps filling about `total`, drawing faults from `kinds`: each step takes one fault, or
    /// (half the time, when `kinds` allow) two or three of different classes at once. Gaps are
    /// 300 to 900 ms, holds `hold_ms` (min, max).
    pub fn seeded(
        seed: u64,
        total: Duration,
        kinds: &[FaultKind],
        hold_ms: (u64, u64),
    ) -> Schedule {
        assert!(
            !kinds.is_empty(),
            "a schedule needs at least one kind of fault"
        );
        let mut rng = Rng::new(seed);
        let mut steps = Vec::new();
        let mut used = Duration::ZERO;
        while used < total {
            let gap = Duration::from_millis(rng.between(300, 900));
            let hold = Duration::from_millis(rng.between(hold_ms.0, hold_ms.1));
            let mut faults = vec![kinds[rng.between(0, kinds.len() as u64 - 1) as usize]];
            if rng.next_u64().is_multiple_of(2) {
                for _ in 0..2 {
                    let extra = kinds[rng.between(0, kinds.len() as u64 - 1) as usize];
                    if faults.iter().all(|f| f.class() != extra.class()) {
                        faults.push(extra);
                    }
                }
            }
            steps.push(Step {
                gap,
                faults,
                hold,
                delay: Duration::from_millis(rng.between(50, 250)),
                target: rng.next_u64(),
            });
            used += gap + hold;
        }
        Schedule { seed, steps }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_one_schedule_and_faults_combine() {
        let a = Schedule::seeded(7, Duration::from_secs(30), &FaultKind::ALL, (300, 1500));
        let b = Schedule::seeded(7, Duration::from_secs(30), &FaultKind::ALL, (300, 1500));
        assert_eq!(a, b);
        assert!(a.steps.iter().any(|s| s.faults.len() > 1), "{a:?}");
        for s in &a.steps {
            for (i, f) in s.faults.iter().enumerate() {
                assert!(s.faults[i + 1..].iter().all(|g| g.class() != f.class()));
            }
        }
    }
}
