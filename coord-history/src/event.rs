//! What a history is made of: one [`Event`] per JSON line.

use serde::{Deserialize, Serialize};

/// One call, unique in a run: the process id in the high 32 bits, a per-process counter in the
/// low 32 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CallId(pub u64);

impl CallId {
    /// The process that made the call.
    pub fn pid(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

impl std::fmt::Display for CallId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.pid(), self.0 & 0xffff_ffff)
    }
}

/// Which kind of call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// A fenced `#[distributed_lock]` hold; its body writes `enter` and `exit` at the resource.
    Lock,
    /// An `#[idempotent]` call; its body records an effect and answers its proposal.
    Idempotent,
    /// A `#[single_flight]` call; its body records its start and end.
    SingleFlight,
    /// A cached read; answers the version it read.
    CacheRead,
}

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It answered; the answer (and token) are in the event.
    Ok,
    /// It failed and certainly had no effect (a lock not acquired, a key refused as in flight).
    Fail,
    /// It failed and may or may not have had its effect (a timeout, a lost reply): the checker
    /// allows both.
    Info,
}

/// A call began.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invoke {
    /// Monotonic nanoseconds ([`crate::clock::now_ns`]).
    pub at: u64,
    /// The calling process.
    pub pid: u32,
    /// The calling task within the process.
    pub client: u32,
    pub call: CallId,
    pub op: Op,
    pub key: String,
    /// The owner token, when the caller knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// What the body answers if this call runs it (idempotent and single-flight calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposal: Option<String>,
    /// A cached read's staleness bound, in nanoseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound: Option<u64>,
    /// A lock hold renewed this often (nanoseconds): such a hold that returns `Ok` promises it
    /// held throughout its body ([`crate::Promise::HeldThroughout`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew: Option<u64>,
}

/// A call ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Complete {
    pub at: u64,
    pub pid: u32,
    pub client: u32,
    pub call: CallId,
    pub op: Op,
    pub key: String,
    pub outcome: Outcome,
    /// The fencing token the call held, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// What the call answered (`ok` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// The error's kind (`fail` and `info`), e.g. `LockNotAcquired` or `Backend(Timeout)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Which end of a hold a fenced write marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Enter,
    Exit,
}

/// A fenced write as the protected resource saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceWrite {
    /// The resource's own order of everything it saw (writes and effects).
    pub seq: u64,
    pub at: u64,
    pub key: String,
    pub token: u64,
    pub call: CallId,
    pub phase: Phase,
    /// Whether the resource admitted it (its token not older than any admitted before).
    pub accepted: bool,
}

/// What a body did, as the resource saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EffectKind {
    /// An idempotent body's one effect.
    Body,
    /// A single-flight body began.
    FlightStart,
    /// A single-flight body ended.
    FlightEnd,
}

/// A body's effect, as the resource saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Effect {
    pub seq: u64,
    pub at: u64,
    pub key: String,
    pub call: CallId,
    pub kind: EffectKind,
}

/// A fault the nemesis started or healed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    pub at: u64,
    /// What it was (`proxy-hold`, `server-pause`, `server-kill-wipe`, ...).
    pub fault: String,
    /// `true` when it starts, `false` when it is healed.
    pub start: bool,
    /// The server lost acknowledged data (a kill and restart without persistence): promises
    /// about stored state are judged separately before and after it.
    #[serde(default)]
    pub data_loss: bool,
}

/// A new version of a cached source was written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceWrite {
    pub at: u64,
    pub key: String,
    pub version: u64,
}

/// One line of a history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Event {
    Invoke(Invoke),
    Complete(Complete),
    Resource(ResourceWrite),
    Effect(Effect),
    Fault(Fault),
    SourceWrite(SourceWrite),
}

impl Event {
    /// When it happened (monotonic nanoseconds).
    pub fn at(&self) -> u64 {
        match self {
            Event::Invoke(e) => e.at,
            Event::Complete(e) => e.at,
            Event::Resource(e) => e.at,
            Event::Effect(e) => e.at,
            Event::Fault(e) => e.at,
            Event::SourceWrite(e) => e.at,
        }
    }

    /// The event as one JSON line (no newline).
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).expect("events always serialize")
    }
}
