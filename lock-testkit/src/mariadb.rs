//! Real MariaDB servers: `mariadbd` on a free loopback port over a data directory of its
//! own, copied from a template that `mariadb-install-db` made once.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;

use crate::binary::find_host_binary;
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
/// Bound on `mariadb-install-db`.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(120);
/// The password of `root`@`127.0.0.1` on every test server.
pub const MARIADB_PASSWORD: &str = "distlock-test";
/// The database every test server has (created at each start when missing).
pub const MARIADB_DATABASE: &str = "distlock";
/// What installs the server.
const PACKAGE: &str = "mariadb-server";

/// A `mariadbd` child process on `127.0.0.1` and a free port, over a data directory of its
/// own in a temporary directory; user `root`@`127.0.0.1` with the password
/// [`MARIADB_PASSWORD`] (`mysql_native_password`), database [`MARIADB_DATABASE`].
///
/// The data directory is a copy of a template that `mariadb-install-db` made once for the
/// installed `mariadbd` (kept in the system's temporary directory, named after the
/// binary's size and time, and shared by every test process), so a start takes a fraction
/// of a second. InnoDB with its defaults (`innodb_flush_log_at_trx_commit = 1`) and a
/// small buffer pool and log; no binary log; Unix socket inside the temporary directory;
/// it listens on 127.0.0.1 only. Runs as the current user (`--user=root` when that is
/// root). Always a child process on the host, also in container mode.
///
/// Dropping it sends `SIGKILL` to the server, reaps it and removes the directory.
#[derive(Debug)]
pub struct MariaDbServer {
    port: u16,
    /// Declared before `dir`: the process dies before its directory goes.
    process: ManagedProcess,
    data_dir: PathBuf,
    _dir: TempDir,
}

impl MariaDbServer {
    /// Copies the template into a fresh data directory (making the template first if
    /// needed), starts the server and waits until it answers a query.
    ///
    /// # Panics
    ///
    /// If MariaDB is not installed (the message says how to install it),
    /// `mariadb-install-db` fails, or the server does not start (the message includes its
    /// log).
    pub async fn start() -> MariaDbServer {
        let server = find_host_binary("mariadbd", PACKAGE);
        let template = tokio::task::spawn_blocking({
            let server = server.clone();
            move || template(&server)
        })
        .await
        .unwrap_or_else(|e| panic!("lock-testkit: making the MariaDB template panicked: {e}"));
        let dir = tempfile::Builder::new()
            .prefix("lock-testkit-mariadb-")
            .tempdir()
            .unwrap_or_else(|e| panic!("lock-testkit: cannot create a temp dir: {e}"));
        let data_dir = dir.path().join("data");
        copy_dir(&template, &data_dir)
            .unwrap_or_else(|e| panic!("lock-testkit: cannot copy the MariaDB template: {e}"));
        let init = dir.path().join("init.sql");
        std::fs::write(&init, init_sql())
            .unwrap_or_else(|e| panic!("lock-testkit: cannot write {}: {e}", init.display()));
        let log_path = dir.path().join("mariadbd.log");
        let spawn = |port| {
            ManagedProcess::spawn_on_host(
                format!("mariadbd 127.0.0.1:{port}"),
                &server,
                server_args(port, dir.path(), &data_dir, &init),
                &log_path,
            )
        };
        let (port, process) = start_on_free_port("mariadbd", READY, spawn, probe).await;
        MariaDbServer {
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

    /// `mysql://root:<password>@127.0.0.1:PORT/distlock`.
    pub fn url(&self) -> String {
        format!(
            "mysql://root:{MARIADB_PASSWORD}@127.0.0.1:{}/{MARIADB_DATABASE}",
            self.port
        )
    }

    /// The server's data directory (kept across restarts).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The file receiving the server's output.
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// The server's process id while running.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Kills the server with `SIGKILL` and waits until reaped; new connections are refused
    /// afterwards. A no-op when not running.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Freezes the server with `SIGSTOP`: connections stay open but nothing is answered. A
    /// no-op when not running.
    pub fn pause(&self) {
        self.process.pause();
    }

    /// Continues a paused server with `SIGCONT`. A no-op when not running.
    pub fn resume(&self) {
        self.process.resume();
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
            .restart_until_ready("mariadbd", READY, || probe(port))
            .await;
    }

    /// True while the server process has not exited (paused counts as running).
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// A new connection as `root` to [`MARIADB_DATABASE`], for tests to look at or change
    /// tables behind the backend's back.
    ///
    /// # Panics
    ///
    /// If connecting fails or takes more than 10 s.
    pub async fn client(&self) -> mysql_async::Conn {
        client_within("mariadb", self.addr(), connect(self.port)).await
    }
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Run at every start (`--init-file`): the password of `root` over TCP and the database.
fn init_sql() -> String {
    format!(
        "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1';\n\
         ALTER USER 'root'@'127.0.0.1' IDENTIFIED BY '{MARIADB_PASSWORD}';\n\
         GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;\n\
         CREATE DATABASE IF NOT EXISTS {MARIADB_DATABASE};\n"
    )
}

/// Whether this process runs as root (`mariadbd` then needs `--user=root`).
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The options the template and the servers share (InnoDB's sizes must agree).
fn common_args() -> Vec<OsString> {
    let mut args: Vec<OsString> = [
        "--no-defaults",
        "--innodb-buffer-pool-size=16M",
        "--innodb-log-file-size=4M",
        "--skip-name-resolve",
    ]
    .map(OsString::from)
    .to_vec();
    if is_root() {
        args.push("--user=root".into());
    }
    args
}

/// The server's command line: loopback only, its socket and pid file in `dir`.
fn server_args(port: u16, dir: &Path, data_dir: &Path, init: &Path) -> Vec<OsString> {
    let mut args = common_args();
    args.push(format!("--datadir={}", data_dir.display()).into());
    args.push(format!("--port={port}").into());
    args.push("--bind-address=127.0.0.1".into());
    args.push(format!("--socket={}", dir.join("mariadbd.sock").display()).into());
    args.push(format!("--pid-file={}", dir.join("mariadbd.pid").display()).into());
    args.push(format!("--init-file={}", init.display()).into());
    for setting in [
        "--skip-log-bin",
        "--innodb-doublewrite=0",
        "--max-connections=500",
        "--log-warnings=1",
    ] {
        args.push(setting.into());
    }
    args
}

/// The template data directory for `server`, made by `mariadb-install-db` when missing:
/// `<tmp>/lock-testkit-mariadb-template-<size>-<mtime>`, built aside and renamed into place
/// (another process building it at the same time keeps its own copy out of the way).
fn template(server: &Path) -> PathBuf {
    let meta = std::fs::metadata(server)
        .unwrap_or_else(|e| panic!("lock-testkit: cannot stat {}: {e}", server.display()));
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let uid = if is_root() { "root" } else { "user" };
    let target = std::env::temp_dir().join(format!(
        "lock-testkit-mariadb-template-{}-{mtime}-{uid}",
        meta.len()
    ));
    if target.join("mysql").is_dir() {
        return target;
    }
    let install = find_host_binary("mariadb-install-db", PACKAGE);
    let building = tempfile::Builder::new()
        .prefix("lock-testkit-mariadb-building-")
        .tempdir()
        .unwrap_or_else(|e| panic!("lock-testkit: cannot create a temp dir: {e}"));
    let data = building.path().join("data");
    let mut args = common_args();
    args.push(format!("--datadir={}", data.display()).into());
    args.extend(["--auth-root-authentication-method=normal", "--skip-test-db"].map(OsString::from));
    let output = run_bounded(&install, &args, INSTALL_TIMEOUT)
        .unwrap_or_else(|e| panic!("lock-testkit: cannot run mariadb-install-db: {e}"));
    assert!(
        output.status.success(),
        "lock-testkit: mariadb-install-db failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if std::fs::rename(&data, &target).is_err() && !target.join("mysql").is_dir() {
        panic!(
            "lock-testkit: cannot move the MariaDB template to {}",
            target.display()
        );
    }
    target
}

/// Runs `program args…` to its end, killed after `timeout`.
fn run_bounded(
    program: &Path,
    args: &[OsString],
    timeout: Duration,
) -> std::io::Result<std::process::Output> {
    use std::process::{Command, Stdio};
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let started = std::time::Instant::now();
    while child.try_wait()?.is_none() {
        if started.elapsed() > timeout {
            let _ = child.kill();
            return Err(std::io::Error::other(format!(
                "{} ran longer than {timeout:?}",
                program.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output()
}

/// Copies the directory `from` to `to` (files and directories, recursively).
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

async fn connect(port: u16) -> Result<mysql_async::Conn, mysql_async::Error> {
    let opts = mysql_async::OptsBuilder::default()
        .ip_or_hostname("127.0.0.1")
        .tcp_port(port)
        .user(Some("root"))
        .pass(Some(MARIADB_PASSWORD))
        .db_name(Some(MARIADB_DATABASE))
        .prefer_socket(false);
    mysql_async::Conn::new(opts).await
}

/// Whether the server answers `SELECT 1` on a fresh connection within a second.
async fn probe(port: u16) -> bool {
    use mysql_async::prelude::Queryable;
    let query = async {
        let mut conn = connect(port).await?;
        let one: Option<i64> = conn.query_first("SELECT 1").await?;
        let _ = conn.disconnect().await;
        Ok::<_, mysql_async::Error>(one)
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, query).await,
        Ok(Ok(Some(1)))
    )
}
