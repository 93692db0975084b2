//! Real PostgreSQL servers: `initdb` into a temporary directory, `postgres` on a free
//! loopback port.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;

use crate::binary::find_binary;
use crate::child::{wait_stopped, ProcStat};
use crate::mode::{launch_mode, LaunchMode};
use crate::oneshot::run_to_end;
use crate::ports::loopback;
use crate::process::start::{client_within, start_on_free_port, Readiness};
use crate::process::ManagedProcess;

/// How long a start may take before it is a failure, and how often readiness is polled.
const READY: Readiness = Readiness {
    timeout: Duration::from_secs(30),
    poll: Duration::from_millis(20),
};
/// Bound on one readiness probe (connect + `SELECT 1`).
const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);
/// Bound on `initdb`.
const INITDB_TIMEOUT: Duration = Duration::from_secs(60);
/// The superuser's password on every test server.
pub const POSTGRES_PASSWORD: &str = "distlock-test";
/// Where Debian installs the server binaries: `/usr/lib/postgresql/<version>/bin`.
const DEBIAN_ROOT: &str = "/usr/lib/postgresql";
/// The unprivileged user the server runs as when the tests run as root.
const UNPRIVILEGED: &str = "nobody";

/// A `postgres` child process on `127.0.0.1` and a free port, over a fresh cluster
/// (`initdb`) in its own temporary directory; superuser `postgres` with the password
/// [`POSTGRES_PASSWORD`] (SCRAM), database `postgres`.
///
/// Tuned for tests, not for durability against power loss: `fsync=off` and
/// `full_page_writes=off`, so a commit is written to the operating system but not forced
/// to disk. Killing the server (`SIGKILL`) loses nothing committed; only a crash of the
/// machine could. Unix sockets are off; it listens on 127.0.0.1 only.
///
/// PostgreSQL refuses to run as root: when the tests run as root, `initdb` and `postgres`
/// run as `nobody` (its uid and gid from the system's user database), with the directory
/// handed over to it.
///
/// Dropping it sends `SIGKILL` to the server and its processes, reaps them and removes
/// the directory.
#[derive(Debug)]
pub struct PostgresServer {
    port: u16,
    /// Declared before `dir`: the process dies before its directory goes.
    process: ManagedProcess,
    data_dir: PathBuf,
    _dir: TempDir,
}

impl PostgresServer {
    /// Initializes a cluster, starts the server and waits until it answers a query.
    ///
    /// # Panics
    ///
    /// If PostgreSQL is not installed (the message says how to install it), `initdb`
    /// fails, or the server does not start (the message includes its log).
    pub async fn start() -> PostgresServer {
        let bin = find_bin_dir();
        let user = unprivileged_user();
        let dir = tempfile::Builder::new()
            .prefix("lock-testkit-postgres-")
            .tempdir()
            .unwrap_or_else(|e| panic!("lock-testkit: cannot create a temp dir: {e}"));
        let data_dir = dir.path().join("data");
        let password_file = dir.path().join("password");
        std::fs::write(&password_file, POSTGRES_PASSWORD)
            .unwrap_or_else(|e| panic!("lock-testkit: cannot write the password file: {e}"));
        if let Some((uid, gid)) = user {
            for path in [dir.path(), &password_file] {
                chown(path, uid, gid);
            }
        }
        initdb(&bin, &data_dir, &password_file, user);
        let log_path = dir.path().join("postgres.log");
        let spawn = |port| {
            ManagedProcess::spawn_as(
                format!("postgres 127.0.0.1:{port}"),
                bin.join("postgres"),
                postgres_args(port, &data_dir),
                &log_path,
                user,
            )
        };
        let (port, process) = start_on_free_port("postgres", READY, spawn, probe).await;
        PostgresServer {
            port,
            process,
            data_dir,
            _dir: dir,
        }
    }

    /// The TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        loopback(self.port)
    }

    /// `postgres://postgres:<password>@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres:{POSTGRES_PASSWORD}@127.0.0.1:{}/postgres",
            self.port
        )
    }

    /// The cluster's data directory (kept across restarts).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The file receiving the server's output.
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// The postmaster's process id while running.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Kills the server and all its processes with `SIGKILL` and waits until reaped; new
    /// connections are refused afterwards. A no-op when not running.
    pub fn kill(&mut self) {
        // Every backend process of PostgreSQL calls setsid(): a signal to the postmaster's
        // group reaches only the postmaster. Freeze it (no new children), kill its
        // children, then the postmaster itself.
        self.process.pause();
        let killed = self.signal_children(libc::SIGKILL);
        self.process.kill();
        // A killed backend lets go of the shared memory only as it exits, which the kernel
        // finishes after kill(2) returned: a restart before then is refused ("pre-existing
        // shared memory block is still in use"). Wait (bounded) until each is gone.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while killed.iter().any(|&pid| alive(pid)) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Freezes the server and all its processes with `SIGSTOP`: connections stay open but
    /// nothing is answered. A no-op when not running.
    pub fn pause(&self) {
        // The postmaster first, so that it forks no child after the look at its children.
        self.process.pause();
        for pid in self.signal_children(libc::SIGSTOP) {
            wait_stopped(pid);
        }
    }

    /// Continues a paused server with `SIGCONT`. A no-op when not running.
    pub fn resume(&self) {
        self.signal_children(libc::SIGCONT);
        self.process.resume();
    }

    /// Sends `signal` to every child of the postmaster (each in a session of its own, so
    /// out of reach of a signal to the postmaster's group).
    ///
    /// Nothing to do in a container: pause, resume and kill reach all its processes.
    ///
    /// Returns the children signalled.
    fn signal_children(&self, signal: libc::c_int) -> Vec<u32> {
        if self.process.in_container() {
            return Vec::new();
        }
        let Some(parent) = self.process.pid() else {
            return Vec::new();
        };
        let children = children(parent);
        for &pid in &children {
            // SAFETY: plain kill(2); `pid` was a child of our own postmaster a moment ago,
            // and a child not reaped by it (it is stopped or alive) keeps its pid.
            unsafe {
                libc::kill(pid as libc::pid_t, signal);
            }
        }
        children
    }

    /// Kills the server if it is running (also when paused) and starts it again on the
    /// same port over the same data directory (crash recovery: everything committed is
    /// back), then waits until it answers a query.
    ///
    /// # Panics
    ///
    /// If the server does not come back; the message includes its log.
    pub async fn restart(&mut self) {
        self.kill();
        let port = self.port;
        self.process
            .restart_until_ready("postgres", READY, || probe(port))
            .await;
    }

    /// True while the server process has not exited (paused counts as running).
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// A new connection as the superuser, for tests to look at or change tables behind
    /// the backend's back (its connection task runs on the current runtime).
    ///
    /// # Panics
    ///
    /// If connecting fails or takes more than 10 s.
    pub async fn client(&self) -> tokio_postgres::Client {
        client_within("postgres", self.addr(), connect(self.port)).await
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether process `pid` still runs: it exists and is not a zombie (a zombie has
/// released its memory, shared memory included).
fn alive(pid: u32) -> bool {
    ProcStat::read(Path::new(&format!("/proc/{pid}/stat")))
        .is_some_and(|stat| !matches!(stat.state, 'Z' | 'X'))
}

/// The processes whose parent is `parent` (from `/proc/<pid>/stat`).
fn children(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = ProcStat::read(&entry.path().join("stat"))?;
            (stat.ppid == parent).then_some(pid)
        })
        .collect()
}

/// The `bin` directory of the newest PostgreSQL under `/usr/lib/postgresql`, or the one of
/// `postgres` on `PATH`.
///
/// # Panics
///
/// When neither exists, with the install command.
fn find_bin_dir() -> PathBuf {
    if launch_mode() == LaunchMode::Containers {
        // The directory inside the postgres image (`ManagedProcess` runs it there).
        return find_binary("postgres", "postgresql")
            .parent()
            .expect("an absolute path inside the image")
            .to_path_buf();
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(DEBIAN_ROOT)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            (bin.join("postgres").is_file() && bin.join("initdb").is_file())
                .then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return bin;
    }
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .find(|dir| dir.join("postgres").is_file() && dir.join("initdb").is_file())
    });
    on_path.unwrap_or_else(|| {
        panic!(
            "postgres and initdb not found (in {DEBIAN_ROOT}/<version>/bin or on PATH): \
             install them with: sudo apt-get install -y postgresql"
        )
    })
}

/// `nobody`'s uid and gid when this process runs as root (PostgreSQL refuses root), else
/// `None`.
fn unprivileged_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let name = std::ffi::CString::new(UNPRIVILEGED).expect("no NUL");
    // SAFETY: getpwnam with a valid C string; the record is read at once, before any
    // other call could overwrite it.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !entry.is_null(),
        "lock-testkit: PostgreSQL refuses to run as root and there is no user `{UNPRIVILEGED}` to run it as"
    );
    // SAFETY: non-null pointer from getpwnam.
    let (uid, gid) = unsafe { ((*entry).pw_uid, (*entry).pw_gid) };
    Some((uid, gid))
}

fn chown(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
        .unwrap_or_else(|e| panic!("lock-testkit: cannot chown {}: {e}", path.display()));
}

/// `initdb` of a UTF-8 cluster with SCRAM authentication for every connection (in a
/// container of the postgres image in container mode).
fn initdb(bin: &Path, data_dir: &Path, password_file: &Path, user: Option<(u32, u32)>) {
    let mut args: Vec<OsString> = vec!["-D".into(), data_dir.into()];
    args.extend(
        [
            "-U",
            "postgres",
            "--auth=scram-sha-256",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
            "--no-instructions",
        ]
        .map(OsString::from),
    );
    args.push(format!("--pwfile={}", password_file.display()).into());
    let log_path = data_dir.with_file_name("initdb.log");
    let finished = run_to_end(&bin.join("initdb"), args, &log_path, user, INITDB_TIMEOUT)
        .unwrap_or_else(|e| panic!("lock-testkit: cannot run initdb: {e}"));
    assert!(
        finished.success,
        "lock-testkit: initdb failed ({}):\n{}",
        finished.status, finished.output
    );
}

/// The server's command line: loopback only, no Unix socket, no fsync, logs to stderr.
fn postgres_args(port: u16, data_dir: &Path) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["-D".into(), data_dir.into()];
    for setting in [
        format!("port={port}"),
        "listen_addresses=127.0.0.1".to_owned(),
        "unix_socket_directories=".to_owned(),
        "fsync=off".to_owned(),
        "full_page_writes=off".to_owned(),
        "max_connections=300".to_owned(),
        "shared_buffers=32MB".to_owned(),
        "logging_collector=off".to_owned(),
        "log_min_messages=warning".to_owned(),
    ] {
        args.push("-c".into());
        args.push(setting.into());
    }
    args
}

async fn connect(port: u16) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::Config::new()
        .host("127.0.0.1")
        .port(port)
        .user("postgres")
        .password(POSTGRES_PASSWORD)
        .dbname("postgres")
        .connect(tokio_postgres::NoTls)
        .await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Whether the server answers `SELECT 1` on a fresh connection within a second.
async fn probe(port: u16) -> bool {
    let query = async { connect(port).await?.simple_query("SELECT 1").await };
    matches!(tokio::time::timeout(PROBE_TIMEOUT, query).await, Ok(Ok(_)))
}
