//! Real ZooKeeper ensembles: three `QuorumPeerMain` JVMs (Debian's `zookeeper` package) on
//! free loopback ports, each over a data directory of its own, started in parallel.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::binary::find_host_binary;
use crate::ports::{free_ports, loopback, START_ATTEMPTS};
use crate::process::ManagedProcess;

/// The ensemble's tick: sessions may last from 2 to 600 ticks (0.2 s to 60 s), and a
/// follower that loses its leader gives up within `syncLimit` ticks.
pub const ZOOKEEPER_TICK: Duration = Duration::from_millis(100);
/// The longest session the test ensembles grant (`maxSessionTimeout`).
pub const ZOOKEEPER_MAX_SESSION: Duration = Duration::from_secs(60);
/// What installs the server (and the Java runtime it needs).
const PACKAGE: &str = "zookeeper";
/// The server's jar, from `libzookeeper-java` (its manifest names its dependencies).
const JAR: &str = "/usr/share/java/zookeeper.jar";
/// How long a start may take before it is a failure (JVM start and leader election).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How often readiness is polled.
const READY_POLL: Duration = Duration::from_millis(50);
/// Bound on one four-letter-word probe.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// Members of an ensemble.
const MEMBERS: usize = 3;
/// The start of an ensemble's directory name in the temp directory, before the test
/// process's pid.
const DIR_PREFIX: &str = "lock-testkit-zookeeper-";

/// One member of a [`ZooKeeperEnsemble`].
#[derive(Debug)]
struct Member {
    client_port: u16,
    process: ManagedProcess,
}

/// A ZooKeeper ensemble of three members on `127.0.0.1`, each a `java … QuorumPeerMain`
/// child process with its own client, quorum and election ports and data directory;
/// tick [`ZOOKEEPER_TICK`], sessions up to [`ZOOKEEPER_MAX_SESSION`], four-letter words
/// allowed, no admin server, small fast-starting JVMs.
///
/// Always child processes on the host, also in container mode (`DISTLOCK_TESTKIT=
/// containers`): no image of the kit holds ZooKeeper, and the JVM needs no isolation.
///
/// Dropping it kills every member and removes the directories.
#[derive(Debug)]
pub struct ZooKeeperEnsemble {
    /// Declared before `_dir`: the processes die before their directories go.
    members: Vec<Member>,
    _dir: TempDir,
}

impl ZooKeeperEnsemble {
    /// Starts the three members in parallel and waits until each serves (`srvr` answers
    /// with a mode: a quorum has formed).
    ///
    /// # Panics
    ///
    /// If ZooKeeper or Java is missing (the message says `apt-get install -y zookeeper`),
    /// or the ensemble does not form (the message includes the members' logs).
    pub async fn start() -> ZooKeeperEnsemble {
        let java = find_host_binary("java", PACKAGE);
        if !Path::new(JAR).exists() {
            panic!(
                "lock-testkit: {JAR} not found: install ZooKeeper with: sudo apt-get install -y {PACKAGE}"
            );
        }
        remove_stale_dirs();
        let dir = tempfile::Builder::new()
            .prefix(&format!("{DIR_PREFIX}{}-", std::process::id()))
            .tempdir()
            .unwrap_or_else(|e| panic!("lock-testkit: cannot create a temp dir: {e}"));
        for attempt in 1..=START_ATTEMPTS {
            let ports = free_ports(3 * MEMBERS);
            let servers: String = (0..MEMBERS)
                .map(|i| {
                    format!(
                        "server.{}=127.0.0.1:{}:{}\n",
                        i + 1,
                        ports[MEMBERS + i],
                        ports[2 * MEMBERS + i]
                    )
                })
                .collect();
            let mut members = Vec::with_capacity(MEMBERS);
            for (i, &client_port) in ports.iter().enumerate().take(MEMBERS) {
                let member_dir = dir.path().join(format!("member{}", i + 1));
                let data = member_dir.join("data");
                std::fs::create_dir_all(&data)
                    .unwrap_or_else(|e| panic!("lock-testkit: cannot create {data:?}: {e}"));
                std::fs::write(data.join("myid"), format!("{}\n", i + 1))
                    .unwrap_or_else(|e| panic!("lock-testkit: cannot write myid: {e}"));
                let cfg = member_dir.join("zoo.cfg");
                std::fs::write(&cfg, config(&data, client_port, &servers))
                    .unwrap_or_else(|e| panic!("lock-testkit: cannot write {cfg:?}: {e}"));
                let process = ManagedProcess::spawn_on_host(
                    format!("zookeeper member {} 127.0.0.1:{client_port}", i + 1),
                    &java,
                    java_args(&cfg),
                    member_dir.join("zookeeper.log"),
                )
                .unwrap_or_else(|e| panic!("lock-testkit: cannot spawn java: {e}"));
                members.push(Member {
                    client_port,
                    process,
                });
            }
            let ready = futures::future::join_all(members.iter().map(|m| {
                m.process
                    .wait_ready(READY_TIMEOUT, READY_POLL, move || serving(m.client_port))
            }))
            .await;
            match ready.into_iter().find_map(Result::err) {
                None => return ZooKeeperEnsemble { members, _dir: dir },
                Some(e) if e.is_addr_in_use() && attempt < START_ATTEMPTS => {
                    drop(members);
                    let _ = std::fs::remove_dir_all(dir.path());
                    continue;
                }
                Some(e) => panic!("lock-testkit: {e}"),
            }
        }
        unreachable!("the last start attempt returns or panics")
    }

    /// How many members the ensemble has (3).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false: an ensemble has members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The client address of member `i` (0-based).
    pub fn addr(&self, i: usize) -> SocketAddr {
        loopback(self.members[i].client_port)
    }

    /// Every member's client address, in order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        (0..self.len()).map(|i| self.addr(i)).collect()
    }

    /// `127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3`: the connect string of every member.
    pub fn hosts(&self) -> String {
        let addrs: Vec<String> = self.addrs().iter().map(ToString::to_string).collect();
        addrs.join(",")
    }

    /// `zookeeper://<hosts>[?params]`.
    pub fn url(&self, params: &str) -> String {
        if params.is_empty() {
            format!("zookeeper://{}", self.hosts())
        } else {
            format!("zookeeper://{}?{params}", self.hosts())
        }
    }

    /// The member that is leader now (asked with `srvr`), if any answers so.
    pub async fn leader(&self) -> Option<usize> {
        for i in 0..self.len() {
            if mode(self.members[i].client_port).await.as_deref() == Some("leader") {
                return Some(i);
            }
        }
        None
    }

    /// Waits until some member other than `not` (a paused or killed one) is leader and
    /// returns it.
    ///
    /// # Panics
    ///
    /// If none is within 30 s.
    pub async fn wait_for_leader(&self, not: Option<usize>) -> usize {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            for i in (0..self.len()).filter(|&i| Some(i) != not) {
                if mode(self.members[i].client_port).await.as_deref() == Some("leader") {
                    return i;
                }
            }
            assert!(
                Instant::now() < deadline,
                "lock-testkit: no ZooKeeper leader within 30 s"
            );
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// The process id of member `i` while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].process.pid()
    }

    /// The log file of member `i`.
    pub fn log_path(&self, i: usize) -> &Path {
        self.members[i].process.log_path()
    }

    /// Kills member `i` with `SIGKILL` and reaps it.
    pub fn kill(&self, i: usize) {
        self.members[i].process.kill();
    }

    /// Freezes member `i` with `SIGSTOP`: its connections stay open, nothing is answered.
    pub fn pause(&self, i: usize) {
        self.members[i].process.pause();
    }

    /// Continues a paused member with `SIGCONT`.
    pub fn resume(&self, i: usize) {
        self.members[i].process.resume();
    }

    /// Kills member `i` if it runs (also when paused), starts it again on the same ports
    /// and data directory, and waits until it serves in the quorum.
    ///
    /// # Panics
    ///
    /// If it does not come back within a minute (the message includes its log).
    pub async fn restart(&self, i: usize) {
        let member = &self.members[i];
        member.process.kill();
        member
            .process
            .respawn()
            .unwrap_or_else(|e| panic!("lock-testkit: cannot respawn java: {e}"));
        let port = member.client_port;
        if let Err(e) = member
            .process
            .wait_ready(READY_TIMEOUT, READY_POLL, move || serving(port))
            .await
        {
            panic!("lock-testkit: ZooKeeper restart failed: {e}");
        }
    }

    /// True while member `i` has not exited (paused counts as running).
    pub fn is_running(&self, i: usize) -> bool {
        self.members[i].process.is_running()
    }
}

/// Removes the directories of ensembles whose test process is gone: a test binary keeps
/// the ensemble its tests share in a static, which is never dropped.
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(DIR_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        // SAFETY: signal 0 only checks that the process exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The member's configuration: the kit's tick and session bounds, its own data directory
/// and client port on loopback, every member's quorum and election ports.
fn config(data: &Path, client_port: u16, servers: &str) -> String {
    let tick = ZOOKEEPER_TICK.as_millis();
    let max_session = ZOOKEEPER_MAX_SESSION.as_millis();
    format!(
        "tickTime={tick}\n\
         initLimit=100\n\
         syncLimit=5\n\
         dataDir={}\n\
         clientPort={client_port}\n\
         clientPortAddress=127.0.0.1\n\
         maxSessionTimeout={max_session}\n\
         4lw.commands.whitelist=srvr,ruok,stat\n\
         admin.enableServer=false\n\
         standaloneEnabled=false\n\
         reconfigEnabled=false\n\
         forceSync=no\n\
         preAllocSize=1024\n\
         {servers}",
        data.display()
    )
}

/// A small JVM that starts fast: the server's jar (its manifest names the libraries),
/// serial GC, the C1 compiler only.
fn java_args(cfg: &Path) -> Vec<PathBuf> {
    [
        "-Xmx128m",
        "-Xss512k",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-Djava.net.preferIPv4Stack=true",
        "-Dzookeeper.admin.enableServer=false",
        "-cp",
        JAR,
        "org.apache.zookeeper.server.quorum.QuorumPeerMain",
    ]
    .iter()
    .map(PathBuf::from)
    .chain(std::iter::once(cfg.to_path_buf()))
    .collect()
}

/// Whether the member at `port` serves in a quorum (`srvr` names a mode).
async fn serving(port: u16) -> bool {
    mode(port).await.is_some()
}

/// The member's mode (`leader`, `follower`) from `srvr`; `None` when it does not answer
/// or serves no quorum.
async fn mode(port: u16) -> Option<String> {
    let answer = tokio::time::timeout(PROBE_TIMEOUT, four_letters(port, b"srvr"))
        .await
        .ok()??;
    answer
        .lines()
        .find_map(|line| line.strip_prefix("Mode: "))
        .map(|m| m.trim().to_owned())
}

async fn four_letters(port: u16, word: &[u8]) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(loopback(port)).await.ok()?;
    stream.write_all(word).await.ok()?;
    let mut out = Vec::new();
    stream.read_to_end(&mut out).await.ok()?;
    String::from_utf8(out).ok()
}
