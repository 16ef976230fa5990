//! Server restarts, as a transport sees them: whenever it (re)connects to a node it reads
//! `run_id` from `INFO server` and reports it to the provider's [`ServerWatch`]. A node whose
//! run id changed was restarted (or replaced): that is logged at error level once per change
//! and counted.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Command, Fault, Reply};

/// Remembers each node's run id and counts the restarts seen.
#[derive(Debug)]
pub(crate) struct ServerWatch {
    /// Where the provider connects (for log lines), without credentials.
    address: String,
    run_ids: Mutex<HashMap<String, String>>,
    restarts: AtomicU64,
}

impl ServerWatch {
    pub(crate) fn new(address: String) -> ServerWatch {
        ServerWatch {
            address,
            run_ids: Mutex::new(HashMap::new()),
            restarts: AtomicU64::new(0),
        }
    }

    /// How many restarts were seen so far.
    pub(crate) fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Records `node`'s `INFO server` reply. Returns true when it reveals a restart.
    ///
    /// A reply without a run id (a server that hides it, an `INFO` the ACL refuses) is
    /// ignored: restarts of such a node go unnoticed.
    pub(crate) fn observe_info(&self, node: &str, info: &Reply) -> bool {
        let Reply::Data(text) = info else {
            return false;
        };
        let text = String::from_utf8_lossy(text);
        match info_field(&text, "run_id") {
            Some(run_id) => self.observe(node, run_id),
            None => false,
        }
    }

    /// Records `node`'s answer to `INFO server`. A failed one is only logged (debug level):
    /// that node's restarts go unnoticed until it is next asked.
    pub(crate) fn observe_reply(&self, node: &str, info: Result<Reply, Fault>) {
        match info {
            Ok(info) => {
                self.observe_info(node, &info);
            }
            Err(err) => {
                tracing::debug!(node, error = ?err, "coord-redis: INFO server failed");
            }
        }
    }

    /// Records that `node` now runs as `run_id`. Returns true when that is a change.
    pub(crate) fn observe(&self, node: &str, run_id: &str) -> bool {
        let previous = {
            let mut ids = self.run_ids.lock().unwrap_or_else(|e| e.into_inner());
            match ids.get(node) {
                Some(known) if known == run_id => return false,
                _ => ids.insert(node.to_owned(), run_id.to_owned()),
            }
        };
        let Some(previous) = previous else {
            tracing::debug!(node, run_id, "coord-redis: connected to a Redis node");
            return false;
        };
        tracing::error!(
            address = %self.address,
            node,
            old_run_id = %previous,
            new_run_id = run_id,
            "coord-redis: the Redis server at {node} restarted (its run id changed from \
             {previous} to {run_id}). Unless it persisted every write, it forgot locks that \
             were held (a second caller may now enter a section whose holder still runs) and \
             idempotency records (in-flight markers and stored outcomes: a retried operation \
             may run again); with fencing, a reset counter is still caught by the fencing \
             token, which is at least the server time in microseconds"
        );
        // Counted after the log line: whoever sees the count (a test, a metric scrape) can
        // already read the line that explains it.
        self.restarts.fetch_add(1, Ordering::Relaxed);
        true
    }
}

/// The value of `field` in an `INFO` text (`field:value` lines).
pub(crate) fn info_field<'t>(text: &'t str, field: &str) -> Option<&'t str> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        (name == field).then(|| value.trim())
    })
}

/// `INFO server`, for run ids.
pub(crate) fn info_server<'a>() -> Command<'a> {
    Command::new("INFO").arg("server")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(s: &str) -> Reply {
        Reply::Data(s.as_bytes().to_vec())
    }

    #[test]
    fn run_id_changes_count_once_each() {
        let watch = ServerWatch::new("a:1".to_owned());
        let info = |id: &str| {
            data(&format!(
                "# Server\r\nredis_version:7.0.0\r\nrun_id:{id}\r\n"
            ))
        };
        assert!(!watch.observe_info("n:1", &info("aaa")));
        assert!(!watch.observe_info("n:1", &info("aaa")));
        assert!(!watch.observe_info("n:2", &info("bbb")), "another node");
        assert!(watch.observe_info("n:1", &info("ccc")));
        assert!(!watch.observe_info("n:1", &info("ccc")));
        assert!(
            !watch.observe_info("n:1", &data("# Server\r\n")),
            "no run id"
        );
        assert_eq!(watch.restarts(), 1);
    }
}
