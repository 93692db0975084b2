//! A Redis Cluster of real `redis-server` processes on loopback.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::Value;
use tempfile::TempDir;

use crate::binary::find_binary;
use crate::ports::{free_ports, loopback, START_ATTEMPTS};
use crate::process::ManagedProcess;
use crate::redis::{ping, redis_args, RedisOptions};

mod slots;
use slots::crc16;

/// `cluster-node-timeout`: how long a node may be silent before the others count it as
/// failing and its replica takes over (a failover then takes about twice this).
pub const CLUSTER_NODE_TIMEOUT: Duration = Duration::from_millis(1000);
/// How long starting a cluster, or waiting for it to settle after a fault, may take.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one node may take to start.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often readiness and cluster state are polled.
const POLL: Duration = Duration::from_millis(20);
/// Bound on one query of a node (connect included).
const QUERY_TIMEOUT: Duration = Duration::from_millis(500);
/// The number of hash slots of a Redis Cluster.
pub const CLUSTER_SLOTS: u16 = 16384;

/// One `redis-server` of a [`RedisCluster`] (`cluster-enabled yes`), with its own ports
/// (client and cluster bus) and temporary directory (its `nodes.conf` and log).
///
/// Dropping it sends `SIGKILL`, reaps the process and removes the directory.
#[derive(Debug)]
pub struct ClusterNode {
    port: u16,
    bus_port: u16,
    paused: AtomicBool,
    /// Declared before `_dir`: the process dies before its directory goes.
    process: ManagedProcess,
    _dir: TempDir,
}

impl ClusterNode {
    async fn start(binary: &Path) -> ClusterNode {
        let dir = tempfile::Builder::new()
            .prefix("lock-testkit-cluster-")
            .tempdir()
            .unwrap_or_else(|e| panic!("lock-testkit: cannot create a temp dir: {e}"));
        let log_path = dir.path().join("redis-server.log");
        for attempt in 1..=START_ATTEMPTS {
            let ports = free_ports(2);
            let (port, bus_port) = (ports[0], ports[1]);
            let mut args = redis_args(port, &RedisOptions::default(), dir.path());
            let nodes_conf = dir.path().join("nodes.conf");
            args.extend([
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-config-file".into(),
                OsString::from(nodes_conf),
                "--cluster-node-timeout".into(),
                CLUSTER_NODE_TIMEOUT.as_millis().to_string().into(),
                "--cluster-port".into(),
                bus_port.to_string().into(),
            ]);
            let process = ManagedProcess::spawn(
                format!("redis-server (cluster) 127.0.0.1:{port}"),
                binary,
                args,
                &log_path,
            )
            .unwrap_or_else(|e| panic!("lock-testkit: cannot spawn {}: {e}", binary.display()));
            match process
                .wait_ready(READY_TIMEOUT, POLL, || ping(loopback(port), false))
                .await
            {
                Ok(()) => {
                    return ClusterNode {
                        port,
                        bus_port,
                        paused: AtomicBool::new(false),
                        process,
                        _dir: dir,
                    }
                }
                Err(e) if e.is_addr_in_use() && attempt < START_ATTEMPTS => continue,
                Err(e) => panic!("lock-testkit: {e}"),
            }
        }
        unreachable!("the last start attempt returns or panics")
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster bus port (`cluster-port`).
    pub fn bus_port(&self) -> u16 {
        self.bus_port
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        loopback(self.port)
    }

    /// `redis://127.0.0.1:port`: this node alone (a plain client on it gets `MOVED` for
    /// keys of other nodes' slots).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The file receiving the server's output.
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// True while the process has not exited (paused counts as running).
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// True while the node runs and is not paused: it answers.
    pub fn is_serving(&self) -> bool {
        self.is_running() && !self.paused.load(Ordering::SeqCst)
    }

    /// Kills the node with `SIGKILL` and reaps it. Its replica, if any, is promoted by the
    /// cluster after about twice [`CLUSTER_NODE_TIMEOUT`] ([`RedisCluster::wait_failover`]).
    pub fn kill(&self) {
        self.process.kill();
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Freezes the node with `SIGSTOP`: connections stay open, nothing is answered. A pause
    /// longer than [`CLUSTER_NODE_TIMEOUT`] lets the cluster fail a master over to its replica.
    pub fn pause(&self) {
        self.process.pause();
        self.paused.store(true, Ordering::SeqCst);
    }

    /// Continues a paused node with `SIGCONT`.
    pub fn resume(&self) {
        self.process.resume();
        self.paused.store(false, Ordering::SeqCst);
    }

    /// A new raw connection to this node alone, for tests to poke at its keys.
    ///
    /// # Panics
    ///
    /// If connecting fails or takes more than 500 ms.
    pub async fn client(&self) -> redis::aio::MultiplexedConnection {
        connect(self.port)
            .await
            .unwrap_or_else(|e| panic!("lock-testkit: cannot connect to {}: {e}", self.addr()))
    }

    /// Runs `cmd` on this node within 500 ms.
    async fn query(&self, cmd: &redis::Cmd) -> Result<Value, String> {
        let run = async {
            let mut conn = connect(self.port).await?;
            cmd.query_async::<Value>(&mut conn)
                .await
                .map_err(|e| e.to_string())
        };
        match tokio::time::timeout(QUERY_TIMEOUT, run).await {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within {QUERY_TIMEOUT:?}")),
        }
    }

    /// `CLUSTER INFO` (or `INFO replication`) as text.
    async fn info(&self, cmd: &str, section: Option<&str>) -> Result<String, String> {
        let mut c = redis::cmd(cmd);
        if let Some(section) = section {
            c.arg(section);
        }
        match self.query(&c).await? {
            Value::BulkString(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
            Value::VerbatimString { text, .. } => Ok(text),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        self.process.kill();
    }
}

async fn connect(port: u16) -> Result<redis::aio::MultiplexedConnection, String> {
    let client =
        redis::Client::open(format!("redis://127.0.0.1:{port}")).map_err(|e| e.to_string())?;
    match tokio::time::timeout(QUERY_TIMEOUT, client.get_multiplexed_async_connection()).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("connecting took more than {QUERY_TIMEOUT:?}")),
    }
}

/// A Redis Cluster on loopback: `masters` masters sharing the 16384 slots, each with
/// `replicas_per_master` replicas, every node a [`ClusterNode`] (`cluster-enabled yes`,
/// `cluster-node-timeout` [`CLUSTER_NODE_TIMEOUT`], no persistence), the slots assigned with
/// `redis-cli --cluster create … --cluster-replicas N --cluster-yes`.
///
/// Nodes are numbered in start order; which of them are masters is read from the cluster
/// ([`master_of_slot`](Self::master_of_slot)), since failovers change it. Dropping the
/// cluster kills every node.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<ClusterNode>,
}

impl RedisCluster {
    /// Starts the nodes, creates the cluster and waits until every node reports
    /// `cluster_state:ok`, agrees on the owner of every slot, and every replica is in sync
    /// with its master ([`wait_settled`](Self::wait_settled)).
    ///
    /// # Panics
    ///
    /// If `redis-server` or `redis-cli` is missing (the message says how to install them),
    /// `masters` is below 3 (Redis Cluster needs three), a node does not start, or the
    /// cluster does not settle within 30 s.
    pub async fn start(masters: usize, replicas_per_master: usize) -> RedisCluster {
        assert!(
            masters >= 3,
            "lock-testkit: a Redis Cluster needs at least 3 masters"
        );
        let server = find_binary("redis-server", "redis-server");
        let cli = find_binary("redis-cli", "redis-tools");
        let mut nodes = Vec::new();
        for _ in 0..masters * (1 + replicas_per_master) {
            nodes.push(ClusterNode::start(&server).await);
        }
        let mut create = std::process::Command::new(&cli);
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        create
            .arg("--cluster-replicas")
            .arg(replicas_per_master.to_string())
            .arg("--cluster-yes");
        let output = tokio::task::spawn_blocking(move || create.output())
            .await
            .expect("lock-testkit: the redis-cli task panicked")
            .unwrap_or_else(|e| panic!("lock-testkit: cannot run {}: {e}", cli.display()));
        if !output.status.success() {
            panic!(
                "lock-testkit: redis-cli --cluster create failed ({}):\n{}\n{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let cluster = RedisCluster { nodes };
        cluster.wait_settled().await;
        cluster
    }

    /// All nodes, in start order.
    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    /// Node `i`.
    ///
    /// # Panics
    ///
    /// If `i >= len()`.
    pub fn node(&self, i: usize) -> &ClusterNode {
        &self.nodes[i]
    }

    /// Number of nodes (masters and replicas).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when there are no nodes (never, for a started cluster).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// `127.0.0.1:port` of every node, in start order (seed nodes for a cluster client).
    pub fn seeds(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect()
    }

    /// `redis://127.0.0.1:port` of every node, in start order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(ClusterNode::url).collect()
    }

    /// `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,…`: every node as a seed.
    pub fn url(&self) -> String {
        format!("redis+cluster://{}", self.seeds().join(","))
    }

    /// The hash slot of `key`, as the cluster computes it: CRC16 (XMODEM) of its hash tag
    /// (the text between the first `{` and the next `}`, when not empty), or of the whole
    /// key, mod 16384. Computed here, independently of the client library under test.
    pub fn slot_of(key: &str) -> u16 {
        let bytes = key.as_bytes();
        let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
            let close = bytes[open + 1..].iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &bytes[open + 1..open + 1 + close])
        });
        crc16(tagged.unwrap_or(bytes)) % CLUSTER_SLOTS
    }

    /// The index of the node serving `slot` as master, as a serving node reports it.
    ///
    /// # Panics
    ///
    /// If no serving node answers, or none knows a master for the slot.
    pub async fn master_of_slot(&self, slot: u16) -> usize {
        let map = self
            .slot_map()
            .await
            .unwrap_or_else(|e| panic!("lock-testkit: {e}"));
        map.iter()
            .find(|(start, end, _)| (*start..=*end).contains(&slot))
            .map(|(_, _, master)| *master)
            .unwrap_or_else(|| panic!("lock-testkit: no master for slot {slot}"))
    }

    /// The index of the master node holding `key` (see [`slot_of`](Self::slot_of)).
    ///
    /// # Panics
    ///
    /// As [`master_of_slot`](Self::master_of_slot).
    pub async fn master_of_key(&self, key: &str) -> usize {
        self.master_of_slot(Self::slot_of(key)).await
    }

    /// The indices of the current masters, each once, in slot order.
    ///
    /// # Panics
    ///
    /// As [`master_of_slot`](Self::master_of_slot).
    pub async fn masters(&self) -> Vec<usize> {
        let map = self
            .slot_map()
            .await
            .unwrap_or_else(|e| panic!("lock-testkit: {e}"));
        let mut masters: Vec<usize> = Vec::new();
        for (_, _, master) in map {
            if !masters.contains(&master) {
                masters.push(master);
            }
        }
        masters
    }

    /// The indices of the serving replicas of node `master` that are in sync with it
    /// (`INFO replication` on the master: `state=online`).
    ///
    /// # Panics
    ///
    /// If the master does not answer.
    pub async fn replicas_of(&self, master: usize) -> Vec<usize> {
        let info = self.nodes[master]
            .info("INFO", Some("replication"))
            .await
            .unwrap_or_else(|e| panic!("lock-testkit: node {master}: {e}"));
        info.lines()
            .filter(|l| l.starts_with("slave") && l.contains("state=online"))
            .filter_map(|l| {
                l.split(",port=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u16>()
                    .ok()
            })
            .filter_map(|port| self.nodes.iter().position(|n| n.port == port))
            .filter(|&i| self.nodes[i].is_serving())
            .collect()
    }

    /// Waits until a node other than `old` serves `slot` as master (its replica was
    /// promoted after `old` was killed or paused), and the cluster is settled again
    /// ([`wait_settled`](Self::wait_settled)); returns the new master's index.
    ///
    /// # Panics
    ///
    /// If that does not happen within 30 s.
    pub async fn wait_failover(&self, slot: u16, old: usize) -> usize {
        let started = Instant::now();
        loop {
            if let Ok(map) = self.slot_map().await {
                let master = map
                    .iter()
                    .find(|(start, end, _)| (*start..=*end).contains(&slot))
                    .map(|(_, _, m)| *m);
                if let Some(master) = master.filter(|&m| m != old) {
                    self.wait_settled().await;
                    return master;
                }
            }
            if started.elapsed() > SETTLE_TIMEOUT {
                panic!("lock-testkit: slot {slot} was not failed over from node {old} within {SETTLE_TIMEOUT:?}");
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until every serving node reports `cluster_state:ok`, all of them map every
    /// slot to the same serving masters, and every serving replica's link to its master is
    /// up (`master_link_status:up`).
    ///
    /// # Panics
    ///
    /// If that does not happen within 30 s; the message says what was still wrong.
    pub async fn wait_settled(&self) {
        let started = Instant::now();
        loop {
            let problem = self.settled().await;
            let Err(problem) = problem else { return };
            if started.elapsed() > SETTLE_TIMEOUT {
                panic!(
                    "lock-testkit: the cluster did not settle within {SETTLE_TIMEOUT:?}: {problem}"
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn settled(&self) -> Result<(), String> {
        let mut first: Option<Vec<(u16, u16, usize)>> = None;
        for (i, node) in self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.is_serving())
        {
            let info = node
                .info("CLUSTER", Some("INFO"))
                .await
                .map_err(|e| format!("node {i}: {e}"))?;
            if !info.contains("cluster_state:ok") {
                return Err(format!("node {i} is not in cluster_state:ok"));
            }
            let map = self
                .node_slot_map(node)
                .await
                .map_err(|e| format!("node {i}: {e}"))?;
            let covered: u32 = map.iter().map(|(s, e, _)| u32::from(e - s) + 1).sum();
            if covered != u32::from(CLUSTER_SLOTS) {
                return Err(format!("node {i} maps {covered} slots"));
            }
            if let Some((_, _, m)) = map.iter().find(|(_, _, m)| !self.nodes[*m].is_serving()) {
                return Err(format!(
                    "node {i} still names node {m} (not serving) a master"
                ));
            }
            match &first {
                None => first = Some(map),
                Some(first) if *first != map => {
                    return Err(format!("node {i} disagrees on the slot map"))
                }
                Some(_) => {}
            }
            let replication = node
                .info("INFO", Some("replication"))
                .await
                .map_err(|e| format!("node {i}: {e}"))?;
            if replication.contains("role:slave") && !replication.contains("master_link_status:up")
            {
                return Err(format!("replica {i} is not in sync with its master"));
            }
        }
        if first.is_none() {
            return Err("no node is serving".into());
        }
        Ok(())
    }

    /// The slot map as the first serving node that answers reports it.
    async fn slot_map(&self) -> Result<Vec<(u16, u16, usize)>, String> {
        let mut last = "no node is serving".to_owned();
        for node in self.nodes.iter().filter(|n| n.is_serving()) {
            match self.node_slot_map(node).await {
                Ok(map) => return Ok(map),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// `CLUSTER SLOTS` of `node`: `(first slot, last slot, master index)` ranges, sorted.
    async fn node_slot_map(&self, node: &ClusterNode) -> Result<Vec<(u16, u16, usize)>, String> {
        let reply = node.query(redis::cmd("CLUSTER").arg("SLOTS")).await?;
        let ports: Vec<u16> = self.nodes.iter().map(|n| n.port).collect();
        slots::parse_slot_map(&reply, &ports)
    }
}
