//! A Redis Cluster of [`RedisServer`] nodes: started with the slots split evenly between
//! them, joined, and awaited until every node reports the cluster healthy; slots can then be
//! moved between masters while clients use them (a live resharding).

use std::time::Duration;

use crate::certs::TestCerts;
use crate::client::Resp;
use crate::ports::HOST;
use crate::server::{RedisServer, ServerOptions};
use crate::wait::poll_until;

/// A Redis Cluster of masters without replicas, each a [`RedisServer`].
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `masters` nodes (at least three for a real cluster), splits the 16384 slots
    /// evenly between them, joins them and waits until every node reports `cluster_state:ok`.
    pub fn start(masters: usize) -> RedisCluster {
        RedisCluster::start_configured(masters, None)
    }

    /// Like [`RedisCluster::start`], with every node serving TLS with `certs` (not
    /// requiring client certificates) and the cluster bus over TLS (`tls-cluster yes`):
    /// `CLUSTER SLOTS` tells TLS clients the TLS ports. Give clients
    /// [`RedisCluster::tls_urls`].
    pub fn start_tls(masters: usize, certs: &TestCerts) -> RedisCluster {
        RedisCluster::start_configured(masters, Some(certs))
    }

    fn start_configured(masters: usize, tls: Option<&TestCerts>) -> RedisCluster {
        assert!(masters >= 1, "a cluster needs at least one node");
        let mut options = ServerOptions::new().args(&[
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "5000",
        ]);
        if let Some(certs) = tls {
            options = options.tls(certs, false).args(&[
                "--tls-cluster",
                "yes",
                "--tls-replication",
                "yes",
            ]);
        }
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|_| RedisServer::start_configured(options.clone()))
            .collect();
        for (i, node) in nodes.iter().enumerate() {
            let first = i * 16384 / masters;
            let last = (i + 1) * 16384 / masters - 1;
            let reply = node.command(&[
                "CLUSTER",
                "ADDSLOTSRANGE",
                &first.to_string(),
                &last.to_string(),
            ]);
            assert_eq!(reply, Resp::Simple("OK".into()), "assigning slots");
            // Distinct epochs, as `redis-cli --cluster create` sets them.
            let _ = node.command(&["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()]);
        }
        for node in &nodes[1..] {
            // Over a TLS bus, a node is met at its TLS port (its bus port is that +10000).
            let port = if tls.is_some() {
                node.tls_port().expect("a TLS node")
            } else {
                node.port()
            };
            let reply = nodes[0].command(&["CLUSTER", "MEET", HOST, &port.to_string()]);
            assert_eq!(reply, Resp::Simple("OK".into()), "joining the cluster");
        }
        poll_until("the cluster to come up", Duration::from_secs(30), || {
            nodes.iter().all(|n| {
                let info = n.command(&["CLUSTER", "INFO"]).text().unwrap_or_default();
                info.contains("cluster_state:ok")
                    && info.contains(&format!("cluster_known_nodes:{masters}"))
                    && info.contains("cluster_slots_ok:16384")
            })
        });
        RedisCluster { nodes }
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The node at `index`, to pause, resume or restart it. A restarted node keeps its
    /// cluster identity and slots (its `nodes.conf` survives), not its data.
    pub fn node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// Every node's URL, to use as seeds.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Every node's TLS URL (`rediss://`), for a cluster started with
    /// [`RedisCluster::start_tls`].
    pub fn tls_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::tls_url).collect()
    }

    /// The node that owns `key`'s slot, as node 0 sees the slot map now (so also after
    /// [`RedisCluster::move_slots`]).
    pub fn node_for(&self, key: &str) -> &RedisServer {
        let slot = self.nodes[0]
            .command(&["CLUSTER", "KEYSLOT", key])
            .int()
            .expect("CLUSTER KEYSLOT answers an integer");
        let slot = u16::try_from(slot).expect("a slot is below 16384");
        &self.nodes[self.owner_of(slot)]
    }

    /// The index of the node that owns `slot`, as node 0 sees the slot map now.
    pub fn owner_of(&self, slot: u16) -> usize {
        let Resp::Array(ranges) = self.nodes[0].command(&["CLUSTER", "SLOTS"]) else {
            panic!("CLUSTER SLOTS answers an array");
        };
        for range in ranges {
            let Resp::Array(fields) = range else { continue };
            let (Some(first), Some(last)) = (fields[0].int(), fields[1].int()) else {
                continue;
            };
            if !(first..=last).contains(&i64::from(slot)) {
                continue;
            }
            let Some(Resp::Array(master)) = fields.get(2) else {
                panic!("CLUSTER SLOTS names no master for {first}-{last}");
            };
            let port = master.get(1).and_then(Resp::int).expect("a master's port");
            return self
                .nodes
                .iter()
                .position(|n| {
                    i64::from(n.port()) == port || n.tls_port().map(i64::from) == Some(port)
                })
                .expect("the owner is one of the cluster's nodes");
        }
        panic!("no node owns slot {slot}");
    }

    /// The cluster id of the node at `index` (`CLUSTER MYID`).
    pub fn node_id(&self, index: usize) -> String {
        self.nodes[index]
            .command(&["CLUSTER", "MYID"])
            .text()
            .expect("CLUSTER MYID answers the id")
    }

    /// Moves `slots` (all owned by node `from`) to node `to`, while clients keep using them,
    /// `batch` slots at a time, by the steps of the Cluster specification's resharding: on
    /// every slot of the batch `CLUSTER SETSLOT <slot> IMPORTING <from>` on `to`, then
    /// `MIGRATING <to>` on `from`; then each slot's keys with `MIGRATE ... KEYS ...` (in
    /// groups of up to 100, read again with `CLUSTER GETKEYSINSLOT` until none is left), and
    /// last `CLUSTER SETSLOT <slot> NODE <to>` on `to`, on `from` and on every other node.
    ///
    /// While a batch is open, a command for a key not (or no longer) on `from` gets an `ASK`
    /// redirect to `to`, and a multi-key command whose keys are split gets `TRYAGAIN`: the
    /// faults a client meets during a live resharding. Answers how many keys were moved.
    ///
    /// # Panics
    ///
    /// When a node refuses a step (a slot not owned by `from`, a key already on `to`).
    pub fn move_slots(
        &self,
        from: usize,
        to: usize,
        slots: impl IntoIterator<Item = u16>,
        batch: usize,
    ) -> usize {
        assert!(
            from != to && batch > 0,
            "move between two nodes, in batches"
        );
        let (from_id, to_id) = (self.node_id(from), self.node_id(to));
        let (source, target) = (&self.nodes[from], &self.nodes[to]);
        let target_port = target.port().to_string();
        let ok = |reply: Resp, what: &str| {
            assert_eq!(reply, Resp::Simple("OK".into()), "{what}");
        };
        let slots: Vec<String> = slots.into_iter().map(|s| s.to_string()).collect();
        let mut moved = 0;
        for group in slots.chunks(batch) {
            for slot in group {
                ok(
                    target.command(&["CLUSTER", "SETSLOT", slot, "IMPORTING", &from_id]),
                    "SETSLOT IMPORTING",
                );
                ok(
                    source.command(&["CLUSTER", "SETSLOT", slot, "MIGRATING", &to_id]),
                    "SETSLOT MIGRATING",
                );
            }
            for slot in group {
                loop {
                    let Resp::Array(keys) =
                        source.command(&["CLUSTER", "GETKEYSINSLOT", slot, "100"])
                    else {
                        panic!("CLUSTER GETKEYSINSLOT answers an array");
                    };
                    if keys.is_empty() {
                        break;
                    }
                    let keys: Vec<String> = keys.iter().filter_map(Resp::text).collect();
                    let mut args = vec!["MIGRATE", HOST, &target_port, "", "0", "5000", "KEYS"];
                    args.extend(keys.iter().map(String::as_str));
                    let reply = source.command(&args);
                    assert!(
                        matches!(&reply, Resp::Simple(s) if s == "OK" || s == "NOKEY"),
                        "MIGRATE of slot {slot}: {reply:?}"
                    );
                    moved += keys.len();
                }
            }
            for slot in group {
                ok(
                    target.command(&["CLUSTER", "SETSLOT", slot, "NODE", &to_id]),
                    "SETSLOT NODE on the target",
                );
                ok(
                    source.command(&["CLUSTER", "SETSLOT", slot, "NODE", &to_id]),
                    "SETSLOT NODE on the source",
                );
                for (i, other) in self.nodes.iter().enumerate() {
                    if i != from && i != to {
                        ok(
                            other.command(&["CLUSTER", "SETSLOT", slot, "NODE", &to_id]),
                            "SETSLOT NODE on another master",
                        );
                    }
                }
            }
        }
        moved
    }
}
