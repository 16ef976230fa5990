//! A Redis Cluster of [`RedisServer`] nodes: started with the slots split evenly between
//! them, joined, and awaited until every node reports the cluster healthy.

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

    /// The node that owns `key`'s slot.
    pub fn node_for(&self, key: &str) -> &RedisServer {
        let slot = self.nodes[0]
            .command(&["CLUSTER", "KEYSLOT", key])
            .int()
            .expect("CLUSTER KEYSLOT answers an integer");
        // The even split made by `start`: node i owns [i*16384/n, (i+1)*16384/n).
        let n = self.nodes.len() as i64;
        let owner = (0..n)
            .find(|&i| (i * 16384 / n..(i + 1) * 16384 / n).contains(&slot))
            .expect("every slot has an owner") as usize;
        &self.nodes[owner]
    }
}
