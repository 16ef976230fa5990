//! Recording a run: [`Recorder`] collects the events of one process; [`write_jsonl`] and
//! [`read_jsonl`] move histories through files, one event a line.

use std::io::{BufRead, BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::now_ns;
use crate::event::{CallId, Complete, Event, Invoke, Op, Outcome};

/// The events of one process, in the order they were recorded. Cheap to clone (shared).
///
/// Recording takes a short mutex; the events stay in memory until [`Recorder::events`] or
/// [`Recorder::write_to`]. Nothing is dropped or sampled.
#[derive(Debug, Clone)]
pub struct Recorder {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pid: u32,
    next: AtomicU32,
    events: Mutex<Vec<Event>>,
}

/// A call that was invoked and not yet completed: hand it back to [`Recorder::complete`].
#[derive(Debug, Clone)]
pub struct Invoked {
    pub call: CallId,
    client: u32,
    op: Op,
    key: String,
}

/// How one call ended, for [`Recorder::complete`].
#[derive(Debug, Clone)]
pub struct Ending {
    pub outcome: Outcome,
    pub token: Option<u64>,
    pub answer: Option<String>,
    pub error: Option<String>,
}

impl Ending {
    /// Answered `answer`, holding `token` if any.
    pub fn ok(answer: Option<String>, token: Option<u64>) -> Ending {
        Ending {
            outcome: Outcome::Ok,
            token,
            answer,
            error: None,
        }
    }

    /// Failed with `outcome` (`Fail` or `Info`) and an error of kind `error`.
    pub fn failed(outcome: Outcome, error: impl Into<String>) -> Ending {
        Ending {
            outcome,
            token: None,
            answer: None,
            error: Some(error.into()),
        }
    }
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl Recorder {
    /// A recorder for this process.
    pub fn new() -> Recorder {
        Recorder {
            inner: Arc::new(Inner {
                pid: std::process::id(),
                next: AtomicU32::new(0),
                events: Mutex::new(Vec::new()),
            }),
        }
    }

    /// A fresh call id of this process.
    pub fn next_call(&self) -> CallId {
        let n = self.inner.next.fetch_add(1, Ordering::Relaxed);
        CallId((u64::from(self.inner.pid) << 32) | u64::from(n))
    }

    /// Records that task `client` invokes `op` on `key`, proposing `proposal` (the answer its
    /// body would give) and, for cached reads, a staleness `bound` in nanoseconds.
    pub fn invoke(
        &self,
        client: u32,
        op: Op,
        key: &str,
        proposal: Option<String>,
        bound: Option<u64>,
    ) -> Invoked {
        let call = self.next_call();
        self.push(Event::Invoke(Invoke {
            at: now_ns(),
            pid: self.inner.pid,
            client,
            call,
            op,
            key: key.to_owned(),
            owner: None,
            proposal,
            bound,
            renew: None,
        }));
        Invoked {
            call,
            client,
            op,
            key: key.to_owned(),
        }
    }

    /// Records how `invoked` ended.
    pub fn complete(&self, invoked: &Invoked, ending: Ending) {
        self.push(Event::Complete(Complete {
            at: now_ns(),
            pid: self.inner.pid,
            client: invoked.client,
            call: invoked.call,
            op: invoked.op,
            key: invoked.key.clone(),
            outcome: ending.outcome,
            token: ending.token,
            answer: ending.answer,
            error: ending.error,
        }));
    }

    /// Records that task `client` asks for a lock hold on `key` renewed every `renew`: if it
    /// returns `Ok`, the checker holds it to having held throughout its body.
    pub fn invoke_renewing_lock(&self, client: u32, key: &str, renew: Duration) -> Invoked {
        let call = self.next_call();
        self.push(Event::Invoke(Invoke {
            at: now_ns(),
            pid: self.inner.pid,
            client,
            call,
            op: Op::Lock,
            key: key.to_owned(),
            owner: None,
            proposal: None,
            bound: None,
            renew: Some(u64::try_from(renew.as_nanos()).unwrap_or(u64::MAX)),
        }));
        Invoked {
            call,
            client,
            op: Op::Lock,
            key: key.to_owned(),
        }
    }

    /// Like [`Recorder::invoke`], with the proposal made from the call's own id (so that an
    /// answer names the call whose body produced it). Returns the proposal too.
    pub fn invoke_proposing(
        &self,
        client: u32,
        op: Op,
        key: &str,
        make: impl FnOnce(CallId) -> String,
    ) -> (Invoked, String) {
        let call = self.next_call();
        let proposal = make(call);
        self.push(Event::Invoke(Invoke {
            at: now_ns(),
            pid: self.inner.pid,
            client,
            call,
            op,
            key: key.to_owned(),
            owner: None,
            proposal: Some(proposal.clone()),
            bound: None,
            renew: None,
        }));
        let invoked = Invoked {
            call,
            client,
            op,
            key: key.to_owned(),
        };
        (invoked, proposal)
    }

    /// Records any event (faults, resource events gathered elsewhere).
    pub fn push(&self, event: Event) {
        self.inner
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(event);
    }

    /// A copy of everything recorded so far.
    pub fn events(&self) -> Vec<Event> {
        self.inner
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Writes everything recorded so far to `path` as JSON lines (replacing the file).
    pub fn write_to(&self, path: &Path) -> std::io::Result<()> {
        write_jsonl(path, &self.events())
    }
}

/// Writes `events` to `path`, one JSON object a line (replacing the file).
pub fn write_jsonl(path: &Path, events: &[Event]) -> std::io::Result<()> {
    let mut out = BufWriter::new(std::fs::File::create(path)?);
    for event in events {
        out.write_all(event.to_line().as_bytes())?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

/// Reads a history written by [`write_jsonl`] (blank lines skipped). An unreadable line is an
/// error naming its number, not skipped: a history with holes would check as clean.
pub fn read_jsonl(path: &Path) -> std::io::Result<Vec<Event>> {
    let file = std::io::BufReader::new(std::fs::File::open(path)?);
    let mut events = Vec::new();
    for (n, line) in file.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let event = serde_json::from_str(&line).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}:{}: {e}", path.display(), n + 1),
            )
        })?;
        events.push(event);
    }
    Ok(events)
}
