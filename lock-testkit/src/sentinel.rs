//! A Redis Sentinel deployment on loopback: one master, one replica and three sentinels.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::binary::find_binary;
use crate::ports::{free_port, loopback, START_ATTEMPTS};
use crate::process::ManagedProcess;
use crate::redis::{ping, redis_args, RedisOptions};

/// The master name the sentinels monitor (`sentinel monitor <name> …`).
pub const SENTINEL_MASTER: &str = "distlock-test";
/// The sentinels' `down-after-milliseconds`: how long a silent master takes to be
/// considered down by one sentinel.
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);
/// The sentinels' `failover-timeout`: the bound of one failover, and half the pause
/// before a sentinel tries again after one that did not complete (a lost election).
pub const FAILOVER_TIMEOUT: Duration = Duration::from_millis(2000);
/// How many sentinels run; the quorum is 2.
const SENTINELS: usize = 3;
/// How long a start (processes up, replication linked, sentinels aware of each other and
/// of the replica) may take.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How often readiness and roles are polled.
const POLL: Duration = Duration::from_millis(50);
/// Bound on one request of the kit to a node or a sentinel.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(500);

/// One `redis-server` (data node or sentinel) of the deployment.
#[derive(Debug)]
struct Node {
    port: u16,
    process: ManagedProcess,
}

/// A Redis Sentinel deployment of real processes on `127.0.0.1`: node 0 starts as the
/// master, node 1 as its replica (`--replicaof`), and three `redis-server --sentinel`
/// processes monitor them as [`SENTINEL_MASTER`] with quorum 2, [`DOWN_AFTER`] and
/// [`FAILOVER_TIMEOUT`]. No persistence; everything in one temporary directory (the
/// sentinels rewrite their configuration files there).
///
/// Dropping it kills every process and removes the directory.
#[derive(Debug)]
pub struct RedisSentinels {
    /// Declared before `dir`: the processes die before their directory goes.
    nodes: Vec<Node>,
    sentinels: Vec<Node>,
    dir: TempDir,
}

impl RedisSentinels {
    /// Starts the master, the replica and the sentinels, and waits until the replica is
    /// linked and every sentinel knows the replica and the two other sentinels, so a
    /// failover can happen from then on.
    ///
    /// # Panics
    ///
    /// If `redis-server` is not installed (the message says how to install it), or the
    /// deployment is not ready within 30 s (the message includes the logs).
    pub async fn start() -> RedisSentinels {
        let binary = find_binary("redis-server", "redis-server");
        let dir = tempfile::Builder::new()
            .prefix("lock-testkit-sentinel-")
            .tempdir()
            .unwrap_or_else(|e| panic!("lock-testkit: cannot create a temp dir: {e}"));
        let started = Instant::now();
        let master = start_node(&binary, dir.path(), "node-0", |port, data| {
            data_args(port, data, None)
        })
        .await;
        let master_port = master.port;
        let replica = start_node(&binary, dir.path(), "node-1", |port, data| {
            data_args(port, data, Some(master_port))
        })
        .await;
        let mut deployment = RedisSentinels {
            nodes: vec![master, replica],
            sentinels: Vec::new(),
            dir,
        };
        deployment
            .wait_until("the replica to link to the master", started, || async {
                let info = info(loopback(deployment.nodes[1].port), "replication").await;
                info.is_some_and(|i| i.contains("master_link_status:up"))
            })
            .await;
        for i in 0..SENTINELS {
            let conf = deployment.dir.path().join(format!("sentinel-{i}.conf"));
            let sentinel = start_node(
                &binary,
                deployment.dir.path(),
                &format!("sentinel-{i}"),
                |port, data| sentinel_args(port, data, &conf, master_port),
            )
            .await;
            deployment.sentinels.push(sentinel);
        }
        deployment
            .wait_until(
                "the sentinels to know the replica and each other",
                started,
                || async {
                    let mut ready = true;
                    for sentinel in &deployment.sentinels {
                        let state = sentinel_master_state(loopback(sentinel.port)).await;
                        ready &= state.is_some_and(|(replicas, others)| {
                            replicas >= 1 && others == SENTINELS - 1
                        });
                    }
                    ready
                },
            )
            .await;
        deployment
    }

    /// `redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/distlock-test`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinel_addrs()
            .iter()
            .map(ToString::to_string)
            .collect();
        format!("redis+sentinel://{}/{SENTINEL_MASTER}", hosts.join(","))
    }

    /// The sentinels' addresses.
    pub fn sentinel_addrs(&self) -> Vec<SocketAddr> {
        self.sentinels.iter().map(|s| loopback(s.port)).collect()
    }

    /// The data nodes' addresses: node 0 started as the master, node 1 as the replica.
    pub fn node_addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(|n| loopback(n.port)).collect()
    }

    /// Data node `i`'s address.
    ///
    /// # Panics
    ///
    /// If there is no node `i` (there are two).
    pub fn node_addr(&self, i: usize) -> SocketAddr {
        loopback(self.nodes[i].port)
    }

    /// The master the sentinels name now: the address most of the sentinels that answer
    /// give (`SENTINEL get-master-addr-by-name`); `None` when none answers.
    pub async fn current_master(&self) -> Option<SocketAddr> {
        let mut named: Vec<(SocketAddr, usize)> = Vec::new();
        for sentinel in self.sentinel_addrs() {
            if let Some(addr) = master_addr(sentinel).await {
                match named.iter_mut().find(|(a, _)| *a == addr) {
                    Some((_, n)) => *n += 1,
                    None => named.push((addr, 1)),
                }
            }
        }
        named.into_iter().max_by_key(|(_, n)| *n).map(|(a, _)| a)
    }

    /// The index of the data node the sentinels name as master.
    pub async fn master_index(&self) -> Option<usize> {
        let master = self.current_master().await?;
        self.nodes.iter().position(|n| loopback(n.port) == master)
    }

    /// What data node `i` says it is (`ROLE`): `master` or `slave`; `None` when it does
    /// not answer within 500 ms.
    pub async fn role(&self, i: usize) -> Option<String> {
        let reply: redis::Value = request(self.node_addr(i), redis::cmd("ROLE")).await?;
        match reply {
            redis::Value::Array(items) => match items.first() {
                Some(redis::Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into()),
                _ => None,
            },
            _ => None,
        }
    }

    /// Kills (`SIGKILL`) the data node the sentinels name as master, and returns its
    /// index.
    ///
    /// # Panics
    ///
    /// If no sentinel names a master that is one of the data nodes.
    pub async fn kill_master(&mut self) -> usize {
        let i = self
            .master_index()
            .await
            .unwrap_or_else(|| panic!("lock-testkit: no sentinel names a master; {}", self.logs()));
        self.kill_node(i);
        i
    }

    /// Kills data node `i` with `SIGKILL` (a no-op when it is not running).
    pub fn kill_node(&mut self, i: usize) {
        self.nodes[i].process.kill();
    }

    /// Starts data node `i` again, on its port with its first command line (node 0 as a
    /// master, node 1 as a replica of node 0's port), without data, and waits until it
    /// answers `PING`. The sentinels then reconfigure it as a replica of the current
    /// master (after a few seconds: see [`wait_for_role`](Self::wait_for_role)).
    ///
    /// # Panics
    ///
    /// If it does not come back within 10 s (the message includes its log).
    pub async fn restart_node(&mut self, i: usize) {
        let node = &self.nodes[i];
        node.process.kill();
        let data = self.dir.path().join(format!("node-{i}"));
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(&data)
            .unwrap_or_else(|e| panic!("lock-testkit: cannot create {}: {e}", data.display()));
        node.process.respawn().unwrap_or_else(|e| {
            panic!("lock-testkit: cannot respawn {}: {e}", node.process.name())
        });
        let addr = loopback(node.port);
        node.process
            .wait_ready(Duration::from_secs(10), POLL, || ping(addr, false))
            .await
            .unwrap_or_else(|e| panic!("lock-testkit: restart failed: {e}"));
    }

    /// Waits until the sentinels name a master other than `old` and that node says it is
    /// a master; returns its address and how long it took.
    ///
    /// # Panics
    ///
    /// If that does not happen within `timeout` (the message includes the logs).
    pub async fn wait_for_new_master(&self, old: SocketAddr, timeout: Duration) -> SocketAddr {
        let started = Instant::now();
        loop {
            if let Some(i) = self.master_index().await {
                if self.node_addr(i) != old && self.role(i).await.as_deref() == Some("master") {
                    return self.node_addr(i);
                }
            }
            if started.elapsed() > timeout {
                panic!(
                    "lock-testkit: no failover from {old} within {timeout:?}; {}",
                    self.logs()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until data node `i` says it is a `role` (`master` or `slave`), and returns
    /// how long that took.
    ///
    /// # Panics
    ///
    /// If it does not within `timeout` (the message includes the logs).
    pub async fn wait_for_role(&self, i: usize, role: &str, timeout: Duration) -> Duration {
        let started = Instant::now();
        loop {
            if self.role(i).await.as_deref() == Some(role) {
                return started.elapsed();
            }
            if started.elapsed() > timeout {
                panic!(
                    "lock-testkit: node {i} is not a {role} after {timeout:?}; {}",
                    self.logs()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// A new raw connection to data node `i`, for tests to look at keys and stats.
    ///
    /// # Panics
    ///
    /// If connecting fails or takes more than 10 s.
    pub async fn node_client(&self, i: usize) -> redis::aio::MultiplexedConnection {
        let url = format!("redis://{}", self.node_addr(i));
        let client = redis::Client::open(url.as_str()).expect("a valid URL");
        match tokio::time::timeout(
            Duration::from_secs(10),
            client.get_multiplexed_async_connection(),
        )
        .await
        {
            Ok(Ok(connection)) => connection,
            Ok(Err(e)) => panic!("lock-testkit: cannot connect to {url}: {e}"),
            Err(_) => panic!("lock-testkit: connecting to {url} timed out"),
        }
    }

    /// The last lines of every process's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for node in self.nodes.iter().chain(&self.sentinels) {
            out.push_str(&format!(
                "\n--- {} ---\n{}",
                node.process.name(),
                node.process.log_tail(30)
            ));
        }
        out
    }

    async fn wait_until<F, Fut>(&self, what: &str, started: Instant, mut ready: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        while !ready().await {
            for node in self.nodes.iter().chain(&self.sentinels) {
                if let Some(error) = node.process.check_exited() {
                    panic!("lock-testkit: waiting for {what}: {error}");
                }
            }
            if started.elapsed() > START_TIMEOUT {
                panic!(
                    "lock-testkit: waited {START_TIMEOUT:?} for {what}; {}",
                    self.logs()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// Starts a `redis-server` whose arguments `args(port, dir)` gives on a free port (with
/// the data directory `dir/name`), and waits until it answers `PING`; a port taken
/// meanwhile is retried with a new one.
async fn start_node(
    binary: &Path,
    dir: &Path,
    name: &str,
    args: impl Fn(u16, &Path) -> Vec<OsString>,
) -> Node {
    let data = dir.join(name);
    std::fs::create_dir_all(&data)
        .unwrap_or_else(|e| panic!("lock-testkit: cannot create {}: {e}", data.display()));
    let log = dir.join(format!("{name}.log"));
    for attempt in 1..=START_ATTEMPTS {
        let port = free_port();
        let process = ManagedProcess::spawn(
            format!("{name} 127.0.0.1:{port}"),
            binary,
            args(port, &data),
            &log,
        )
        .unwrap_or_else(|e| panic!("lock-testkit: cannot spawn {}: {e}", binary.display()));
        match process
            .wait_ready(Duration::from_secs(10), POLL, || {
                ping(loopback(port), false)
            })
            .await
        {
            Ok(()) => return Node { port, process },
            Err(e) if e.is_addr_in_use() && attempt < START_ATTEMPTS => continue,
            Err(e) => panic!("lock-testkit: {e}"),
        }
    }
    unreachable!("the last start attempt returns or panics")
}

/// A data node's command line: the test kit's usual one, without persistence, and
/// `--replicaof 127.0.0.1 <port>` for a replica.
fn data_args(port: u16, data: &Path, replica_of: Option<u16>) -> Vec<OsString> {
    let mut args = redis_args(port, &RedisOptions::default(), data);
    if let Some(master) = replica_of {
        args.extend([
            "--replicaof".into(),
            "127.0.0.1".into(),
            master.to_string().into(),
        ]);
    }
    args
}

/// Writes sentinel `port`'s configuration file `conf` (the sentinel rewrites it, so it
/// lives in the temporary directory) and returns its command line.
fn sentinel_args(port: u16, data: &Path, conf: &PathBuf, master_port: u16) -> Vec<OsString> {
    let name = SENTINEL_MASTER;
    let text = format!(
        "port {port}\n\
         bind 127.0.0.1\n\
         protected-mode no\n\
         daemonize no\n\
         logfile \"\"\n\
         dir \"{}\"\n\
         sentinel monitor {name} 127.0.0.1 {master_port} 2\n\
         sentinel down-after-milliseconds {name} {}\n\
         sentinel failover-timeout {name} {}\n\
         sentinel parallel-syncs {name} 1\n",
        data.display(),
        DOWN_AFTER.as_millis(),
        FAILOVER_TIMEOUT.as_millis(),
    );
    std::fs::write(conf, text)
        .unwrap_or_else(|e| panic!("lock-testkit: cannot write {}: {e}", conf.display()));
    vec![conf.into(), "--sentinel".into()]
}

/// Sends `cmd` to `addr` on a fresh connection, within 500 ms.
async fn request<T: redis::FromRedisValue>(addr: SocketAddr, cmd: redis::Cmd) -> Option<T> {
    let exchange = async {
        let client = redis::Client::open(format!("redis://{addr}").as_str()).ok()?;
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        cmd.query_async::<T>(&mut conn).await.ok()
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .ok()
        .flatten()
}

/// `INFO section` of the server at `addr`.
async fn info(addr: SocketAddr, section: &str) -> Option<String> {
    let mut cmd = redis::cmd("INFO");
    cmd.arg(section);
    request(addr, cmd).await
}

/// The master address the sentinel at `addr` names.
async fn master_addr(sentinel: SocketAddr) -> Option<SocketAddr> {
    let mut cmd = redis::cmd("SENTINEL");
    cmd.arg("get-master-addr-by-name").arg(SENTINEL_MASTER);
    let (host, port): (String, u16) = request(sentinel, cmd).await?;
    format!("{host}:{port}").parse().ok()
}

/// How many replicas and other sentinels the sentinel at `addr` knows for the master.
async fn sentinel_master_state(sentinel: SocketAddr) -> Option<(usize, usize)> {
    let mut cmd = redis::cmd("SENTINEL");
    cmd.arg("master").arg(SENTINEL_MASTER);
    let fields: Vec<String> = request(sentinel, cmd).await?;
    let field = |name: &str| -> Option<usize> {
        let at = fields.iter().position(|f| f == name)?;
        fields.get(at + 1)?.parse().ok()
    };
    Some((field("num-slaves")?, field("num-other-sentinels")?))
}
