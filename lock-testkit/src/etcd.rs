//! Real `etcd` processes: single members and loopback clusters.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

use crate::binary::find_binary;
use crate::etcd_tls::{self, EtcdOptions};
use crate::http;
use crate::ports::{free_ports, loopback, START_ATTEMPTS};
use crate::process::{ManagedProcess, StartError};
use crate::tls::ServerTls;

/// How long a start (or restart) may take before it is a failure.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How often readiness is polled.
const READY_POLL: Duration = Duration::from_millis(10);
/// Bound on one `/health` probe.
const HEALTH_TIMEOUT: Duration = Duration::from_millis(500);
/// Bound on one `/v3/maintenance/status` call in [`EtcdCluster::leader`].
const STATUS_TIMEOUT: Duration = Duration::from_millis(300);
/// How long [`EtcdCluster::leader`] waits for an agreed leader.
const LEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Raft timings for test clusters: fast failover.
const HEARTBEAT_MS: &str = "50";
const ELECTION_MS: &str = "500";

/// One etcd member: a child process with its own client port, peer port and
/// temporary data directory on `127.0.0.1`.
///
/// Either a standalone single-member cluster ([`EtcdServer::start`]) or a
/// member of an [`EtcdCluster`]. Dropping it sends `SIGKILL`, reaps the
/// process and removes the data directory.
#[derive(Debug)]
pub struct EtcdServer {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// The plain-text port serving `/health` when clients are served over TLS.
    metrics_port: Option<u16>,
    tls: Option<ServerTls>,
    /// Declared before `dir`: the process dies before its directory goes.
    process: ManagedProcess,
    data_dir: PathBuf,
    _dir: TempDir,
}

impl EtcdServer {
    /// Starts a single-member etcd and waits until `/health` reports
    /// `{"health":"true"}`.
    ///
    /// # Panics
    ///
    /// If `etcd` is not installed (the message says how to install it), or
    /// the server does not start (the message includes its log).
    pub async fn start() -> EtcdServer {
        EtcdServer::start_with_args(&[]).await
    }

    /// Like [`start`](Self::start), with `extra_args` appended to etcd's command line
    /// (for example `["--auth-token-ttl", "1"]`).
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start); an argument etcd refuses makes it exit, and the message
    /// includes its log.
    pub async fn start_with_args(extra_args: &[&str]) -> EtcdServer {
        EtcdServer::start_with(EtcdOptions {
            extra_args: extra_args.iter().map(|&a| a.to_owned()).collect(),
            ..EtcdOptions::default()
        })
        .await
    }

    /// Starts a single-member etcd with `options` (TLS, extra arguments) and waits until it
    /// is healthy.
    ///
    /// # Panics
    ///
    /// As [`start_with_args`](Self::start_with_args).
    pub async fn start_with(options: EtcdOptions) -> EtcdServer {
        let extra: Vec<&str> = options.extra_args.iter().map(String::as_str).collect();
        let mut cluster = EtcdCluster::start_inner(1, &extra, options.tls.as_ref()).await;
        cluster
            .members
            .pop()
            .expect("a one-member cluster has a member")
    }

    /// A distlock URL for this member: `etcd://127.0.0.1:PORT`, and with TLS
    /// `?tls=true&ca=CA_FILE` (plus `&cert=…&key=…` when it demands a client certificate).
    pub fn url(&self) -> String {
        etcd_tls::url(&self.endpoint(), self.tls.as_ref())
    }

    /// The TLS this member serves clients with, if any.
    pub fn tls(&self) -> Option<&ServerTls> {
        self.tls.as_ref()
    }

    /// Where `/health` is served: the client port, or the metrics port under TLS.
    fn health_addr(&self) -> SocketAddr {
        loopback(self.metrics_port.unwrap_or(self.client_port))
    }

    /// `127.0.0.1:PORT` (the client port), the form etcd clients take.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The client port.
    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// The peer (raft) port.
    pub fn peer_port(&self) -> u16 {
        self.peer_port
    }

    /// `127.0.0.1:CLIENT_PORT`.
    pub fn addr(&self) -> SocketAddr {
        loopback(self.client_port)
    }

    /// The member name (`--name`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The member's data directory (`--data-dir`), kept across restarts.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The file receiving the member's stdout and stderr.
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// The process id while running.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Kills the member with `SIGKILL` and waits until it is reaped. A no-op
    /// when not running.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Freezes the member with `SIGSTOP` (no client answers, no raft
    /// heartbeats). A no-op when not running.
    pub fn pause(&self) {
        self.process.pause();
    }

    /// Continues a paused member with `SIGCONT`. A no-op when not running.
    pub fn resume(&self) {
        self.process.resume();
    }

    /// Kills the member if running (also when paused) and starts it again
    /// with the same name, ports and data directory (etcd keeps its data),
    /// then waits until `/health` is true.
    ///
    /// For a cluster member, health needs a leader, i.e. a quorum of members
    /// running.
    ///
    /// # Panics
    ///
    /// If the member does not become healthy within 20 s (e.g. no quorum,
    /// or its ports were taken meanwhile); the message includes its log.
    pub async fn restart(&mut self) {
        for attempt in 1..=START_ATTEMPTS {
            self.process
                .respawn()
                .unwrap_or_else(|e| panic!("lock-testkit: cannot respawn etcd: {e}"));
            let addr = self.health_addr();
            let ready = self
                .process
                .wait_ready(READY_TIMEOUT, READY_POLL, || health(addr))
                .await;
            match ready {
                Ok(()) => return,
                Err(e) if e.is_addr_in_use() && attempt < START_ATTEMPTS => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("lock-testkit: etcd restart failed: {e}"),
            }
        }
    }

    /// True while the process has not exited (paused counts as running).
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// True when `GET /health` answers `{"health":"true"}` within 500 ms (on the metrics
    /// port for a TLS member).
    pub async fn health(&self) -> bool {
        health(self.health_addr()).await
    }

    /// `(member_id, leader_id)` from `POST /v3/maintenance/status`, or `None`
    /// if the member does not answer within 300 ms.
    async fn status(addr: SocketAddr) -> Option<(u64, u64)> {
        let (code, body) = http::request(
            addr,
            "POST",
            "/v3/maintenance/status",
            Some("{}"),
            STATUS_TIMEOUT,
        )
        .await
        .ok()?;
        if code != 200 {
            return None;
        }
        let json: Value = serde_json::from_str(&body).ok()?;
        Some((
            json_u64(&json["header"]["member_id"])?,
            json_u64(&json["leader"])?,
        ))
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        // SIGKILL + reap before the data dir is removed.
        self.process.kill();
    }
}

/// The JSON gateway encodes uint64 as strings; accept numbers too.
fn json_u64(value: &Value) -> Option<u64> {
    value
        .as_u64()
        .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
}

async fn health(addr: SocketAddr) -> bool {
    match http::request(addr, "GET", "/health", None, HEALTH_TIMEOUT).await {
        Ok((200, body)) => body
            .split_whitespace()
            .collect::<String>()
            .contains(r#""health":"true""#),
        _ => false,
    }
}

/// A token unique per cluster start, so that members of different clusters
/// (or attempts) can never join each other.
fn cluster_token() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "lock-testkit-{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// An N-member etcd cluster on loopback (`--initial-cluster` with every
/// member), with short raft timings (`--heartbeat-interval 50
/// --election-timeout 500`) so leader failover takes about a second.
///
/// Members are [`EtcdServer`]s, named `m0`, `m1`, ...; kill, pause, resume
/// or restart them through [`member_mut`](Self::member_mut). Dropping the
/// cluster kills every member.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<EtcdServer>,
}

impl EtcdCluster {
    /// Starts `n` members (in parallel: they need each other for a quorum)
    /// and waits until every member's `/health` is true.
    ///
    /// # Panics
    ///
    /// If `n == 0`, if `etcd` is not installed (the message says how to
    /// install it), or if the cluster does not become healthy within 20 s
    /// (the message includes the failing member's log).
    pub async fn start(n: usize) -> EtcdCluster {
        EtcdCluster::start_with_args(n, &[]).await
    }

    /// Like [`start`](Self::start), with `extra_args` appended to every member's command
    /// line.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub async fn start_with_args(n: usize, extra_args: &[&str]) -> EtcdCluster {
        EtcdCluster::start_inner(n, extra_args, None).await
    }

    async fn start_inner(n: usize, extra_args: &[&str], tls: Option<&ServerTls>) -> EtcdCluster {
        assert!(n > 0, "an etcd cluster needs at least one member");
        let binary = find_binary("etcd", "etcd-server");
        for attempt in 1..=START_ATTEMPTS {
            let cluster = EtcdCluster::spawn(&binary, n, extra_args, tls);
            match cluster.wait_all_healthy().await {
                Ok(()) => return cluster,
                Err(e) if e.is_addr_in_use() && attempt < START_ATTEMPTS => continue,
                Err(e) => panic!("lock-testkit: {e}"),
            }
        }
        unreachable!("the last start attempt returns or panics")
    }

    /// Spawns all members on fresh ports without waiting.
    fn spawn(binary: &Path, n: usize, extra_args: &[&str], tls: Option<&ServerTls>) -> EtcdCluster {
        // Per member: client, peer and (under TLS) metrics port.
        let per = if tls.is_some() { 3 } else { 2 };
        let ports = free_ports(per * n);
        let token = cluster_token();
        let names: Vec<String> = (0..n).map(|i| format!("m{i}")).collect();
        let initial_cluster = names
            .iter()
            .enumerate()
            .map(|(i, name)| format!("{name}=http://127.0.0.1:{}", ports[per * i + 1]))
            .collect::<Vec<_>>()
            .join(",");
        let members = names
            .into_iter()
            .enumerate()
            .map(|(i, name)| {
                let (client_port, peer_port) = (ports[per * i], ports[per * i + 1]);
                let metrics_port = tls.map(|_| ports[per * i + 2]);
                let dir = data_parent()
                    .unwrap_or_else(|e| panic!("lock-testkit: cannot create a temp dir: {e}"));
                // etcd creates the data dir itself (mode 0700).
                let data_dir = dir.path().join("data");
                let scheme = if tls.is_some() { "https" } else { "http" };
                let client_url = format!("{scheme}://127.0.0.1:{client_port}");
                let peer_url = format!("http://127.0.0.1:{peer_port}");
                let mut args: Vec<OsString> = vec![
                    "--name".into(),
                    name.clone().into(),
                    "--data-dir".into(),
                    data_dir.clone().into(),
                    "--listen-client-urls".into(),
                    client_url.clone().into(),
                    "--advertise-client-urls".into(),
                    client_url.into(),
                    "--listen-peer-urls".into(),
                    peer_url.clone().into(),
                    "--initial-advertise-peer-urls".into(),
                    peer_url.into(),
                    "--initial-cluster".into(),
                    initial_cluster.clone().into(),
                    "--initial-cluster-state".into(),
                    "new".into(),
                    "--initial-cluster-token".into(),
                    token.clone().into(),
                    "--heartbeat-interval".into(),
                    HEARTBEAT_MS.into(),
                    "--election-timeout".into(),
                    ELECTION_MS.into(),
                    "--logger".into(),
                    "zap".into(),
                    "--log-outputs".into(),
                    "stderr".into(),
                    "--log-level".into(),
                    "error".into(),
                ];
                if let (Some(tls), Some(metrics_port)) = (tls, metrics_port) {
                    args.extend(etcd_tls::tls_args(tls, metrics_port));
                }
                args.extend(extra_args.iter().map(OsString::from));
                let process = ManagedProcess::spawn(
                    format!(
                        "etcd {name} (client 127.0.0.1:{client_port}, peer 127.0.0.1:{peer_port})"
                    ),
                    binary,
                    args,
                    dir.path().join("etcd.log"),
                )
                .unwrap_or_else(|e| panic!("lock-testkit: cannot spawn {}: {e}", binary.display()));
                EtcdServer {
                    name,
                    client_port,
                    peer_port,
                    metrics_port,
                    tls: tls.cloned(),
                    process,
                    data_dir,
                    _dir: dir,
                }
            })
            .collect();
        EtcdCluster { members }
    }

    /// Polls every member until all are healthy; fails as soon as one exits.
    async fn wait_all_healthy(&self) -> Result<(), StartError> {
        let started = Instant::now();
        loop {
            if let Some(error) = self.members.iter().find_map(|m| m.process.check_exited()) {
                return Err(error);
            }
            let mut unhealthy = None;
            for member in &self.members {
                if !member.health().await {
                    unhealthy = Some(member);
                    break;
                }
            }
            let Some(member) = unhealthy else {
                return Ok(());
            };
            if started.elapsed() >= READY_TIMEOUT {
                return Err(member.process.timed_out(READY_TIMEOUT));
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// The members' endpoints (`127.0.0.1:CLIENT_PORT`), in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdServer::endpoint).collect()
    }

    /// All members, in member order.
    pub fn members(&self) -> &[EtcdServer] {
        &self.members
    }

    /// Member `i`.
    ///
    /// # Panics
    ///
    /// If `i >= len()`.
    pub fn member(&self, i: usize) -> &EtcdServer {
        &self.members[i]
    }

    /// Member `i`, mutably (to kill or restart it).
    ///
    /// # Panics
    ///
    /// If `i >= len()`.
    pub fn member_mut(&mut self, i: usize) -> &mut EtcdServer {
        &mut self.members[i]
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false (a cluster has at least one member); for symmetry with
    /// [`len`](Self::len).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The index of the current leader.
    ///
    /// Asks every member in parallel via etcd's JSON gateway (`POST
    /// /v3/maintenance/status` with `{}`, 300 ms each; paused or killed
    /// members simply do not answer), and returns member `i` when a quorum
    /// (`len()/2 + 1`) of the answering members name the same leader id and
    /// member `i` itself answered with that id as its own `member_id`. This
    /// ignores stale views, e.g. followers that still name a just-paused
    /// leader. Retries every 50 ms.
    ///
    /// # Panics
    ///
    /// If no agreed leader is found within 10 s (e.g. no quorum is running).
    pub async fn leader(&self) -> usize {
        let quorum = self.members.len() / 2 + 1;
        let started = Instant::now();
        loop {
            let mut queries = tokio::task::JoinSet::new();
            for (i, member) in self.members.iter().enumerate() {
                let addr = member.addr();
                queries.spawn(async move { (i, EtcdServer::status(addr).await) });
            }
            let mut answers = Vec::new();
            while let Some(joined) = queries.join_next().await {
                if let Ok((i, Some(status))) = joined {
                    answers.push((i, status));
                }
            }
            for &(i, (member_id, _)) in &answers {
                let votes = answers
                    .iter()
                    .filter(|(_, (_, leader))| *leader == member_id)
                    .count();
                if votes >= quorum {
                    return i;
                }
            }
            if started.elapsed() >= LEADER_TIMEOUT {
                panic!(
                    "lock-testkit: no etcd leader agreed by a quorum within {LEADER_TIMEOUT:?} \
                     (answers as (member index, (member_id, leader_id)): {answers:?})"
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A member's temporary directory: in memory (`/dev/shm`) where the machine has it, so
/// that etcd's write-ahead-log syncs do not wait behind a disk shared with every other test
/// process (a slow sync makes a healthy member miss a test's short timeout); in the default
/// temporary directory otherwise. Nothing here needs to survive the machine.
fn data_parent() -> std::io::Result<TempDir> {
    let mut builder = tempfile::Builder::new();
    builder.prefix("lock-testkit-etcd-");
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = builder.tempdir_in(shm) {
            return Ok(dir);
        }
    }
    builder.tempdir()
}
