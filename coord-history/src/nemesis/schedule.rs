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
    /// How many of the first steps hold every kind asked for once ([`Schedule::covering`]; 0
    /// for [`Schedule::seeded`]): a run must inject them all, late or not.
    pub covering: usize,
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

/// A seed for a run: `COORD_HISTORY_SEED` when set (decimal, or hexadecimal with `0x`, as
/// [`seed_text`] prints it), else a fresh one from the time and the process id, so that every
/// run draws another schedule and a failing one replays exactly from its printed seed.
///
/// # Panics
///
/// When `COORD_HISTORY_SEED` is set to something that is not a number.
pub fn run_seed() -> u64 {
    match std::env::var("COORD_HISTORY_SEED") {
        Ok(text) => {
            parse_seed(&text).unwrap_or_else(|| panic!("COORD_HISTORY_SEED={text} is not a number"))
        }
        Err(_) => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            Rng::new(nanos ^ (u64::from(std::process::id()) << 40)).next_u64()
        }
    }
}

/// A seed as written: decimal, or hexadecimal after `0x` (underscores allowed in both).
pub fn parse_seed(text: &str) -> Option<u64> {
    let text = text.trim().replace('_', "");
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// A seed as a run prints it (`0x…`), which [`parse_seed`] reads back.
pub fn seed_text(seed: u64) -> String {
    format!("{seed:#x}")
}

/// Every fault of `kinds` once, in a seeded order, grouped into as few steps as one fault of a
/// class per step allows (so the steps number as many as the largest class has kinds), except
/// that a kind for which `alone` is true takes a step of its own (a fault aimed to bite that
/// another fault in its step would blunt). Works on any kind of fault that has a class, so a
/// backend with faults of its own uses it too.
pub fn cover<K: Copy>(
    rng: &mut Rng,
    kinds: &[K],
    class: impl Fn(K) -> FaultClass,
    alone: impl Fn(K) -> bool,
) -> Vec<Vec<K>> {
    let mut shuffled = kinds.to_vec();
    for i in (1..shuffled.len()).rev() {
        let j = rng.between(0, i as u64) as usize;
        shuffled.swap(i, j);
    }
    let mut steps: Vec<Vec<K>> = Vec::new();
    for kind in shuffled {
        if alone(kind) {
            steps.push(vec![kind]);
            continue;
        }
        match steps
            .iter_mut()
            .find(|step| step.iter().all(|&k| !alone(k) && class(k) != class(kind)))
        {
            Some(step) => step.push(kind),
            None => steps.push(vec![kind]),
        }
    }
    steps
}

impl Schedule {
    /// Steps that hold every kind of `kinds` at least once ([`cover`]; the kinds in `alone`
    /// each in a step of its own), then, while the steps so far fill less than `total`, steps
    /// drawn as [`Schedule::seeded`] draws them. Gaps are `gap_ms` (min, max), holds
    /// `hold_ms`. The covering steps come first, so a run as short as they are still meets
    /// every kind; among them, those holding a kind of `alone` or `early` come first of all,
    /// while the clients are in their stride (a fault aimed at a hold needs the hold to be
    /// there, which after a kill or a reset may take seconds).
    pub fn covering(
        seed: u64,
        total: Duration,
        kinds: &[FaultKind],
        alone: &[FaultKind],
        early: &[FaultKind],
        hold_ms: (u64, u64),
        gap_ms: (u64, u64),
    ) -> Schedule {
        assert!(
            !kinds.is_empty(),
            "a schedule needs at least one kind of fault"
        );
        let mut rng = Rng::new(seed);
        let mut steps = Vec::new();
        let mut used = Duration::ZERO;
        let mut covered = cover(&mut rng, kinds, FaultKind::class, |k| alone.contains(&k));
        covered.sort_by_key(|faults| {
            !faults
                .iter()
                .any(|k| alone.contains(k) || early.contains(k))
        });
        let covering = covered.len();
        for faults in covered {
            let step = Step {
                gap: Duration::from_millis(rng.between(gap_ms.0, gap_ms.1)),
                faults,
                hold: Duration::from_millis(rng.between(hold_ms.0, hold_ms.1)),
                delay: Duration::from_millis(rng.between(50, 250)),
                target: rng.next_u64(),
            };
            used += step.gap + step.hold;
            steps.push(step);
        }
        if used < total {
            let rest = Schedule::seeded(rng.next_u64(), total - used, kinds, hold_ms);
            steps.extend(rest.steps);
        }
        Schedule {
            seed,
            steps,
            covering,
        }
    }

    /// Makes every step that holds one of `kinds` hold at least `min` (a pause that must
    /// outlast a lease, say).
    pub fn hold_at_least(&mut self, kinds: &[FaultKind], min: Duration) {
        for step in &mut self.steps {
            if step.faults.iter().any(|f| kinds.contains(f)) {
                step.hold = step.hold.max(min);
            }
        }
    }

    /// How long the whole schedule takes, gaps and holds.
    pub fn length(&self) -> Duration {
        self.steps.iter().map(|s| s.gap + s.hold).sum()
    }

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
        Schedule {
            seed,
            steps,
            covering: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_covering_schedule_holds_every_kind_and_replays_from_its_seed() {
        for seed in [0, 1, 7, 0x5eed_2026, u64::MAX] {
            let a = Schedule::covering(
                seed,
                Duration::from_secs(4),
                &FaultKind::ALL,
                &[FaultKind::ClientPause],
                &[FaultKind::ServerPause],
                (300, 900),
                (200, 500),
            );
            let b = Schedule::covering(
                seed,
                Duration::from_secs(4),
                &FaultKind::ALL,
                &[FaultKind::ClientPause],
                &[FaultKind::ServerPause],
                (300, 900),
                (200, 500),
            );
            assert_eq!(a, b);
            for kind in FaultKind::ALL {
                assert!(
                    a.steps.iter().any(|s| s.faults.contains(&kind)),
                    "seed {seed}: {kind:?} missing from {a:?}"
                );
            }
            // The network class has the most kinds (5), and the client pause has a step of
            // its own: the covering part is 6 steps.
            assert!(a.steps.len() >= 6, "{a:?}");
            let pause = a
                .steps
                .iter()
                .find(|s| s.faults.contains(&FaultKind::ClientPause))
                .expect("a client pause");
            assert_eq!(pause.faults, [FaultKind::ClientPause], "{a:?}");
            // The aimed faults come first, then the rest of the covering steps.
            assert_eq!(a.covering, 6, "{a:?}");
            let aimed = |s: &Step| {
                s.faults
                    .iter()
                    .any(|k| matches!(k, FaultKind::ClientPause | FaultKind::ServerPause))
            };
            assert!(a.steps[..2].iter().all(aimed), "{a:?}");
            assert!(!a.steps[2..6].iter().any(aimed), "{a:?}");
            for s in &a.steps {
                for (i, f) in s.faults.iter().enumerate() {
                    assert!(s.faults[i + 1..].iter().all(|g| g.class() != f.class()));
                }
            }
        }
        let a = Schedule::covering(
            1,
            Duration::ZERO,
            &FaultKind::ALL,
            &[FaultKind::ClientPause],
            &[FaultKind::ServerPause],
            (300, 900),
            (200, 500),
        );
        let b = Schedule::covering(
            2,
            Duration::ZERO,
            &FaultKind::ALL,
            &[FaultKind::ClientPause],
            &[FaultKind::ServerPause],
            (300, 900),
            (200, 500),
        );
        assert_ne!(a.steps, b.steps, "two seeds drew one schedule");
    }

    #[test]
    fn seeds_read_back_as_printed() {
        for seed in [0, 7, 0x5eed_2026, u64::MAX] {
            assert_eq!(parse_seed(&seed_text(seed)), Some(seed));
            assert_eq!(parse_seed(&seed.to_string()), Some(seed));
        }
        assert_eq!(parse_seed("0x5eed_2026"), Some(0x5eed_2026));
        assert_eq!(parse_seed("seven"), None);
    }

    #[test]
    fn hold_at_least_lengthens_only_the_steps_named() {
        let mut s = Schedule::covering(
            3,
            Duration::ZERO,
            &FaultKind::ALL,
            &[],
            &[],
            (300, 400),
            (200, 300),
        );
        s.hold_at_least(&[FaultKind::ServerPause], Duration::from_millis(1500));
        for step in &s.steps {
            if step.faults.contains(&FaultKind::ServerPause) {
                assert_eq!(step.hold, Duration::from_millis(1500));
            } else {
                assert!(step.hold <= Duration::from_millis(400));
            }
        }
    }

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
