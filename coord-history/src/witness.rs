//! The protected resource, and the witness of what bodies did.
//!
//! [`WitnessServer`] runs in the test's own process (threads, loopback TCP) and is never
//! faulted: it is the ground truth the checker reads. Clients in any process reach it with
//! [`WitnessClient`]:
//!
//! - [`WitnessClient::fenced_write`]: a write carrying a fencing token. With fencing on (the
//!   default), the resource admits it only if the token is not older than any it admitted for
//!   that key, as `coord_core::fence::Fence` and every real fenced resource do; with fencing off
//!   ([`WitnessServer::start_unfenced`]) it admits everything, which is how a resource without
//!   fencing behaves.
//! - [`WitnessClient::effect`]: a body's effect (an idempotent body ran, a flight began or
//!   ended).
//! - [`WitnessClient::read_version`] and [`WitnessClient::bump_version`]: a versioned source
//!   for cached reads. Each new version (the first read of a key writes version 0) is recorded
//!   as an [`Event::SourceWrite`] stamped when the resource applied it.
//! - [`WitnessClient::generation`]: a counter the test bumps after it destroyed the server's
//!   data, so that clients move to fresh keys.
//!
//! Every write and effect is stamped with the resource's own sequence number and the
//! monotonic clock, and returned by [`WitnessServer::events`].
//!
//! The wire format is one line per request and per reply, keys without whitespace:
//! `W <key> <token> <call> enter|exit` → `A <seq>` or `R <seq>`; `E <key> <call>
//! body|flight_start|flight_end` → `K <seq>`; `V <key>` → `V <version>`; `B <key>` →
//! `V <version>` (the new one); `G` → `G <generation>`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::clock::now_ns;
use crate::event::{CallId, Effect, EffectKind, Event, Phase, ResourceWrite, SourceWrite};

#[derive(Debug, Default)]
struct State {
    seq: u64,
    newest: HashMap<String, u64>,
    versions: HashMap<String, u64>,
    events: Vec<Event>,
    /// The body inside right now, by key: the last admitted `enter`, while its `exit` has not
    /// come, with when it came in.
    inside: HashMap<String, HashMap<CallId, u64>>,
}

impl State {
    /// The current version of source `key`, writing version 0 on first sight.
    fn version(&mut self, key: &str) -> u64 {
        if let Some(v) = self.versions.get(key) {
            return *v;
        }
        self.versions.insert(key.to_owned(), 0);
        self.events.push(Event::SourceWrite(SourceWrite {
            at: now_ns(),
            key: key.to_owned(),
            version: 0,
        }));
        0
    }
}

#[derive(Debug)]
struct Shared {
    fencing: bool,
    state: Mutex<State>,
    generation: AtomicU64,
    stop: AtomicBool,
}

/// The resource and witness, listening on 127.0.0.1. Stops accepting when dropped.
#[derive(Debug)]
pub struct WitnessServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl WitnessServer {
    /// A resource that checks fencing tokens.
    pub fn start() -> WitnessServer {
        WitnessServer::start_with(true)
    }

    /// A resource that admits every write whatever its token: the planted "fencing off".
    pub fn start_unfenced() -> WitnessServer {
        WitnessServer::start_with(false)
    }

    fn start_with(fencing: bool) -> WitnessServer {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind the witness on loopback");
        let addr = listener.local_addr().expect("witness address");
        let shared = Arc::new(Shared {
            fencing,
            state: Mutex::new(State::default()),
            generation: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let accept_shared = shared.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if accept_shared.stop.load(Ordering::Acquire) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let shared = accept_shared.clone();
                std::thread::spawn(move || serve(stream, &shared));
            }
        });
        WitnessServer { addr, shared }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Also listens on a Unix socket at `path` (replacing a stale file there), for clients in
    /// other network namespaces, which cannot reach this process's loopback: a socket in the
    /// file system is reachable from every namespace of the machine.
    pub fn listen_unix(&self, path: &std::path::Path) -> std::io::Result<()> {
        let _ = std::fs::remove_file(path);
        let listener = std::os::unix::net::UnixListener::bind(path)?;
        let accept_shared = self.shared.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if accept_shared.stop.load(Ordering::Acquire) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let shared = accept_shared.clone();
                std::thread::spawn(move || {
                    if let Ok(out) = stream.try_clone() {
                        serve_lines(stream, out, &shared);
                    }
                });
            }
        });
        Ok(())
    }

    /// Everything the resource saw so far, in its own order.
    pub fn events(&self) -> Vec<Event> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .events
            .clone()
    }

    /// The bodies inside right now on keys starting with `prefix`: per key, the call whose
    /// `enter` was admitted last, if its `exit` has not come (admitted or refused), with when
    /// it came in
    /// (the monotonic clock of [`crate::clock::now_ns`]). A nemesis aims a fault with it: a
    /// pause that starts while a holder is inside is one that can bite.
    pub fn inside(&self, prefix: &str) -> Vec<(CallId, u64)> {
        let state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        state
            .inside
            .iter()
            .filter(|(key, _)| key.starts_with(prefix))
            .flat_map(|(_, calls)| calls.iter().map(|(call, at)| (*call, *at)))
            .collect()
    }

    /// Moves clients to fresh keys (after the server's data was destroyed).
    pub fn bump_generation(&self) -> u64 {
        self.shared.generation.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The current generation.
    pub fn generation(&self) -> u64 {
        self.shared.generation.load(Ordering::Acquire)
    }
}

impl Drop for WitnessServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(stream: TcpStream, shared: &Shared) {
    let _ = stream.set_nodelay(true);
    let Ok(out) = stream.try_clone() else {
        return;
    };
    serve_lines(stream, out, shared);
}

fn serve_lines(input: impl Read, mut out: impl Write, shared: &Shared) {
    for line in BufReader::new(input).lines() {
        let Ok(line) = line else { return };
        let reply = answer(&line, shared);
        if out.write_all(reply.as_bytes()).is_err() || out.write_all(b"\n").is_err() {
            return;
        }
    }
}

fn answer(line: &str, shared: &Shared) -> String {
    let parts: Vec<&str> = line.split_whitespace().collect();
    match parts.as_slice() {
        ["W", key, token, call, phase] => {
            let (Ok(token), Ok(call)) = (token.parse::<u64>(), call.parse::<u64>()) else {
                return "X bad write".into();
            };
            let phase = if *phase == "enter" {
                Phase::Enter
            } else {
                Phase::Exit
            };
            let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            let newest = state.newest.get(*key).copied().unwrap_or(0);
            let accepted = !shared.fencing || token >= newest;
            if accepted {
                state.newest.insert((*key).to_owned(), token.max(newest));
            }
            state.seq += 1;
            let seq = state.seq;
            let at = now_ns();
            match phase {
                // The newest admitted holder is the one inside: an older one whose body ended
                // without its `exit` (cancelled, say) is not, and any later write of its is
                // refused.
                Phase::Enter if accepted => {
                    let calls = state.inside.entry((*key).to_owned()).or_default();
                    calls.clear();
                    calls.insert(CallId(call), at);
                }
                Phase::Enter => {}
                Phase::Exit => {
                    if let Some(calls) = state.inside.get_mut(*key) {
                        calls.remove(&CallId(call));
                    }
                }
            }
            state.events.push(Event::Resource(ResourceWrite {
                seq,
                at,
                key: (*key).to_owned(),
                token,
                call: CallId(call),
                phase,
                accepted,
            }));
            format!("{} {seq}", if accepted { "A" } else { "R" })
        }
        ["E", key, call, kind] => {
            let Ok(call) = call.parse::<u64>() else {
                return "X bad effect".into();
            };
            let kind = match *kind {
                "body" => EffectKind::Body,
                "flight_start" => EffectKind::FlightStart,
                _ => EffectKind::FlightEnd,
            };
            let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            state.seq += 1;
            let seq = state.seq;
            state.events.push(Event::Effect(Effect {
                seq,
                at: now_ns(),
                key: (*key).to_owned(),
                call: CallId(call),
                kind,
            }));
            format!("K {seq}")
        }
        ["V", key] => {
            let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            format!("V {}", state.version(key))
        }
        ["B", key] => {
            let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            let version = state.version(key) + 1;
            state.versions.insert((*key).to_owned(), version);
            state.events.push(Event::SourceWrite(SourceWrite {
                at: now_ns(),
                key: (*key).to_owned(),
                version,
            }));
            format!("V {version}")
        }
        ["G"] => format!("G {}", shared.generation.load(Ordering::Acquire)),
        _ => "X unknown request".into(),
    }
}

/// One connection to a [`WitnessServer`]; requests on it are answered one at a time.
pub struct WitnessClient {
    conn: tokio::sync::Mutex<Conn>,
}

impl std::fmt::Debug for WitnessClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WitnessClient").finish_non_exhaustive()
    }
}

struct Conn {
    read: tokio::io::BufReader<Box<dyn tokio::io::AsyncRead + Send + Unpin>>,
    write: Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
}

impl WitnessClient {
    /// Connects to the witness at `addr`.
    pub async fn connect(addr: SocketAddr) -> std::io::Result<WitnessClient> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (read, write) = stream.into_split();
        Ok(WitnessClient::over(Box::new(read), Box::new(write)))
    }

    /// Connects to the witness's Unix socket at `path` ([`WitnessServer::listen_unix`]).
    pub async fn connect_unix(path: &std::path::Path) -> std::io::Result<WitnessClient> {
        let stream = tokio::net::UnixStream::connect(path).await?;
        let (read, write) = stream.into_split();
        Ok(WitnessClient::over(Box::new(read), Box::new(write)))
    }

    fn over(
        read: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
        write: Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
    ) -> WitnessClient {
        WitnessClient {
            conn: tokio::sync::Mutex::new(Conn {
                read: tokio::io::BufReader::new(read),
                write,
            }),
        }
    }

    async fn request(&self, line: String) -> String {
        let mut conn = self.conn.lock().await;
        conn.write
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("the witness is never faulted: writing to it must work");
        let mut reply = String::new();
        conn.read
            .read_line(&mut reply)
            .await
            .expect("the witness is never faulted: reading from it must work");
        assert!(
            !reply.is_empty() && !reply.starts_with('X'),
            "the witness refused {line:?}: {reply:?}"
        );
        reply.trim_end().to_owned()
    }

    /// A fenced write to `key` by `call` holding `token`: whether the resource admitted it.
    pub async fn fenced_write(&self, key: &str, token: u64, call: CallId, phase: Phase) -> bool {
        let phase = match phase {
            Phase::Enter => "enter",
            Phase::Exit => "exit",
        };
        let reply = self
            .request(format!("W {key} {token} {} {phase}", call.0))
            .await;
        reply.starts_with('A')
    }

    /// Records a body's effect on `key` by `call`.
    pub async fn effect(&self, key: &str, call: CallId, kind: EffectKind) {
        let kind = match kind {
            EffectKind::Body => "body",
            EffectKind::FlightStart => "flight_start",
            EffectKind::FlightEnd => "flight_end",
        };
        self.request(format!("E {key} {} {kind}", call.0)).await;
    }

    /// The current version of the source `key` (0 until first bumped).
    pub async fn read_version(&self, key: &str) -> u64 {
        let reply = self.request(format!("V {key}")).await;
        reply[2..].parse().expect("a version number")
    }

    /// Writes a new version of the source `key`; returns it.
    pub async fn bump_version(&self, key: &str) -> u64 {
        let reply = self.request(format!("B {key}")).await;
        reply[2..].parse().expect("a version number")
    }

    /// The current key generation.
    pub async fn generation(&self) -> u64 {
        let reply = self.request("G".into()).await;
        reply[2..].parse().expect("a generation number")
    }
}
