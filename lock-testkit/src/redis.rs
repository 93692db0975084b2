//! Real `redis-server` processes.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::binary::find_binary;
use crate::ports::{free_port, loopback, START_ATTEMPTS};
use crate::process::ManagedProcess;
use crate::tls::ServerTls;

/// How long a start may take before it is a failure.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often readiness is polled.
const READY_POLL: Duration = Duration::from_millis(10);
/// Bound on one readiness probe (connect + PING + reply).
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// Bound on connecting [`RedisServer::client`].
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// Options for [`RedisServer::start_with`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedisOptions {
    /// Persist writes: `--appendonly yes --appendfsync always`, and the data
    /// directory is kept across [`RedisServer::restart`], so every
    /// acknowledged write survives a `SIGKILL`. When false (the default) the
    /// server has no persistence and comes back empty after a restart.
    pub persistent: bool,
    /// Keep RDB snapshots: no automatic saves (`--save ""`) and no append-only file, but
    /// the data directory (with `dump.rdb`) is kept across [`RedisServer::restart`], so a
    /// restart brings back the data set of the last [`RedisServer::save`] — an older
    /// state, as after a crash of a server snapshotting periodically. Ignored when
    /// `persistent` is set (the append-only file wins). Default: false.
    pub rdb: bool,
    /// Require this password (`--requirepass`). [`RedisServer::url`] and
    /// [`RedisServer::client`] include it. Default: none.
    pub password: Option<String>,
    /// Listen with TLS only: `--port 0 --tls-port PORT` with the certificate, key and CA of
    /// `tls`, and `--tls-auth-clients yes|no` as it demands client certificates.
    /// [`RedisServer::port`] is then the TLS port, [`RedisServer::url`] a `rediss://` URL
    /// with the CA (and the client certificate) as distlock parameters, and
    /// [`RedisServer::client`] connects with TLS. The files must outlive the server (keep
    /// the [`TestCerts`](crate::TestCerts)). Default: none (plain text).
    pub tls: Option<ServerTls>,
    /// ACL users, each an `ACL SETUSER` rule line such as
    /// `"locker on >pw ~distlock:* &distlock:* +@all"`, given to the server as `--user`
    /// lines. The `default` user stays as it is (no password unless `password` is set).
    /// Default: none.
    pub users: Vec<String>,
    /// The `redis-server` to run instead of the one found on `PATH` (e.g. an older Redis:
    /// [`redis5_server`](crate::redis5_server)). It always runs as a host process, also in
    /// container mode. Options a version lacks (TLS, ACL users before 6.0) are its refusal
    /// to start. Default: none (the installed `redis-server`).
    pub binary: Option<PathBuf>,
}

/// A `redis-server` child process on `127.0.0.1` and a free port, with its
/// own temporary directory (data and log).
///
/// Dropping it sends `SIGKILL`, reaps the process and removes the directory.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    options: RedisOptions,
    /// Declared before `dir`: the process dies before its directory goes.
    process: ManagedProcess,
    data_dir: PathBuf,
    _dir: TempDir,
}

impl RedisServer {
    /// Starts a server with default options (no persistence, no password)
    /// and waits until it answers `PING`.
    ///
    /// # Panics
    ///
    /// If `redis-server` is not installed (the message says how to install
    /// it), or the server does not start (the message includes its log).
    pub async fn start() -> RedisServer {
        RedisServer::start_with(RedisOptions::default()).await
    }

    /// Starts a server with `options` and waits until it answers `PING`
    /// (`-NOAUTH` counts as alive when a password is set).
    ///
    /// A port taken between picking it and the server binding it is retried
    /// with a new port a few times.
    ///
    /// # Panics
    ///
    /// Like [`start`](Self::start).
    pub async fn start_with(options: RedisOptions) -> RedisServer {
        let binary = match &options.binary {
            Some(binary) => binary.clone(),
            None => find_binary("redis-server", "redis-server"),
        };
        let dir = tempfile::Builder::new()
            .prefix("lock-testkit-redis-")
            .tempdir()
            .unwrap_or_else(|e| panic!("lock-testkit: cannot create a temp dir: {e}"));
        let data_dir = dir.path().join("data");
        std::fs::create_dir_all(&data_dir)
            .unwrap_or_else(|e| panic!("lock-testkit: cannot create {}: {e}", data_dir.display()));
        let log_path = dir.path().join("redis-server.log");
        for attempt in 1..=START_ATTEMPTS {
            let port = free_port();
            let name = format!("redis-server 127.0.0.1:{port}");
            let args = redis_args(port, &options, &data_dir);
            let process = if options.binary.is_some() {
                ManagedProcess::spawn_on_host(name, &binary, args, &log_path)
            } else {
                ManagedProcess::spawn(name, &binary, args, &log_path)
            }
            .unwrap_or_else(|e| panic!("lock-testkit: cannot spawn {}: {e}", binary.display()));
            let probe = Probe::of(&options, port);
            let ready = process
                .wait_ready(READY_TIMEOUT, READY_POLL, || probe.ping())
                .await;
            match ready {
                Ok(()) => {
                    return RedisServer {
                        port,
                        options,
                        process,
                        data_dir,
                        _dir: dir,
                    }
                }
                Err(e) if e.is_addr_in_use() && attempt < START_ATTEMPTS => continue,
                Err(e) => panic!("lock-testkit: {e}"),
            }
        }
        unreachable!("the last start attempt returns or panics")
    }

    /// The TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        loopback(self.port)
    }

    /// `redis://127.0.0.1:PORT`, or `redis://:PASSWORD@127.0.0.1:PORT` when
    /// a password is set (percent-encoded). With [`RedisOptions::tls`], a distlock URL
    /// `rediss://…?ca=CA_FILE` (and `&cert=…&key=…` when the server demands a client
    /// certificate), which redis-rs itself does not take.
    pub fn url(&self) -> String {
        match &self.options.password {
            None => self.url_as_user("", None),
            Some(password) => self.url_as_user("", Some(password)),
        }
    }

    /// [`url`](Self::url) as ACL user `user` (empty: no user name) with `password`, both
    /// percent-encoded.
    pub fn url_as_user(&self, user: &str, password: Option<&str>) -> String {
        let mut userinfo = percent_encode(user);
        if let Some(password) = password {
            userinfo.push(':');
            userinfo.push_str(&percent_encode(password));
        }
        if !userinfo.is_empty() {
            userinfo.push('@');
        }
        let Some(tls) = &self.options.tls else {
            return format!("redis://{userinfo}127.0.0.1:{}", self.port);
        };
        let mut url = format!(
            "rediss://{userinfo}127.0.0.1:{}?ca={}",
            self.port,
            percent_encode(&tls.ca.to_string_lossy())
        );
        if tls.client_certs {
            url.push_str(&format!(
                "&cert={}&key={}",
                percent_encode(&tls.client_cert.to_string_lossy()),
                percent_encode(&tls.client_key.to_string_lossy())
            ));
        }
        url
    }

    /// The options the server was started with.
    pub fn options(&self) -> &RedisOptions {
        &self.options
    }

    /// The server's working directory (`--dir`), where the append-only files
    /// of a persistent server live.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The file receiving the server's stdout and stderr.
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// The process id while running.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Kills the server with `SIGKILL` and waits until it is reaped; new
    /// connections are refused afterwards. A no-op when not running.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Freezes the server with `SIGSTOP`: connections stay open but nothing
    /// is answered. A no-op when not running.
    pub fn pause(&self) {
        self.process.pause();
    }

    /// Continues a paused server with `SIGCONT`. A no-op when not running.
    pub fn resume(&self) {
        self.process.resume();
    }

    /// Kills the server if it is running (also when paused) and starts it
    /// again on the same port, then waits until it answers `PING`.
    ///
    /// A server with neither option comes back with an empty data set; a
    /// persistent one reloads its append-only file; one with `rdb` loads its
    /// last snapshot ([`save`](Self::save)).
    ///
    /// # Panics
    ///
    /// If the server does not come back (e.g. the port was taken by someone
    /// else meanwhile); the message includes its log.
    pub async fn restart(&mut self) {
        self.process.kill();
        if !self.options.persistent && !self.options.rdb {
            // Nothing should be there (no RDB, no AOF), but make "empty after
            // restart" unconditional.
            let _ = std::fs::remove_dir_all(&self.data_dir);
            std::fs::create_dir_all(&self.data_dir).unwrap_or_else(|e| {
                panic!(
                    "lock-testkit: cannot create {}: {e}",
                    self.data_dir.display()
                )
            });
        }
        let probe = Probe::of(&self.options, self.port);
        for attempt in 1..=START_ATTEMPTS {
            self.process
                .respawn()
                .unwrap_or_else(|e| panic!("lock-testkit: cannot respawn redis-server: {e}"));
            let ready = self
                .process
                .wait_ready(READY_TIMEOUT, READY_POLL, || probe.ping())
                .await;
            match ready {
                Ok(()) => return,
                Err(e) if e.is_addr_in_use() && attempt < START_ATTEMPTS => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("lock-testkit: restart failed: {e}"),
            }
        }
    }

    /// Writes an RDB snapshot now (`SAVE`, synchronous), which a restart of a server with
    /// [`RedisOptions::rdb`] loads.
    ///
    /// # Panics
    ///
    /// If the server cannot be reached or refuses to save.
    pub async fn save(&self) {
        let mut connection = self.client().await;
        redis::cmd("SAVE")
            .query_async::<()>(&mut connection)
            .await
            .unwrap_or_else(|e| panic!("lock-testkit: SAVE on {} failed: {e}", self.addr()));
    }

    /// True while the server process has not exited (paused counts as
    /// running).
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// True when a `PING` on a fresh connection is answered within 500 ms
    /// (`PONG`, or `NOAUTH` when a password is set), over TLS for a TLS server.
    pub async fn ping(&self) -> bool {
        Probe::of(&self.options, self.port).ping().await
    }

    /// A new raw connection (authenticated when a password is set) for tests
    /// to poke at keys.
    ///
    /// # Panics
    ///
    /// If connecting fails or takes more than 10 s (e.g. the server is
    /// killed or paused).
    pub async fn client(&self) -> redis::aio::MultiplexedConnection {
        let client = redis_client(&self.options, self.port)
            .unwrap_or_else(|e| panic!("lock-testkit: bad redis client for {}: {e}", self.addr()));
        match tokio::time::timeout(CLIENT_TIMEOUT, client.get_multiplexed_async_connection()).await
        {
            Ok(Ok(connection)) => connection,
            Ok(Err(e)) => panic!(
                "lock-testkit: cannot connect to redis at {}: {e}",
                self.addr()
            ),
            Err(_) => panic!(
                "lock-testkit: connecting to redis at {} timed out after {CLIENT_TIMEOUT:?}",
                self.addr()
            ),
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL + reap before the temp dir is removed (field drop order
        // would do the same; this makes it explicit).
        self.process.kill();
    }
}

/// `redis-server` command line (the cluster kit adds its options to it).
pub(crate) fn redis_args(port: u16, options: &RedisOptions, data_dir: &Path) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "--port".into(),
        if options.tls.is_some() {
            "0".into()
        } else {
            port.to_string().into()
        },
        "--bind".into(),
        "127.0.0.1".into(),
        "--save".into(),
        "".into(),
        "--dir".into(),
        data_dir.into(),
        "--daemonize".into(),
        "no".into(),
        "--protected-mode".into(),
        "no".into(),
        "--loglevel".into(),
        "warning".into(),
        "--logfile".into(),
        "".into(),
    ];
    if options.persistent {
        args.extend(["--appendonly", "yes", "--appendfsync", "always"].map(OsString::from));
    } else {
        args.extend(["--appendonly", "no"].map(OsString::from));
    }
    if let Some(password) = &options.password {
        args.extend(["--requirepass".into(), password.into()]);
    }
    if let Some(tls) = &options.tls {
        args.extend([
            "--tls-port".into(),
            port.to_string().into(),
            "--tls-cert-file".into(),
            tls.cert.clone().into(),
            "--tls-key-file".into(),
            tls.key.clone().into(),
            "--tls-ca-cert-file".into(),
            tls.ca.clone().into(),
            "--tls-auth-clients".into(),
            if tls.client_certs { "yes" } else { "no" }.into(),
        ]);
    }
    for user in &options.users {
        args.push("--user".into());
        args.extend(user.split_whitespace().map(OsString::from));
    }
    args
}

/// A redis-rs client for the server: plain `redis://`, or TLS trusting the server's CA
/// (and presenting the client certificate when it demands one).
fn redis_client(options: &RedisOptions, port: u16) -> redis::RedisResult<redis::Client> {
    let password = options
        .password
        .as_ref()
        .map(|p| format!(":{}@", percent_encode(p)))
        .unwrap_or_default();
    let Some(tls) = &options.tls else {
        return redis::Client::open(format!("redis://{password}127.0.0.1:{port}"));
    };
    redis::Client::build_with_tls(
        format!("rediss://{password}127.0.0.1:{port}"),
        tls.redis_certificates(),
    )
}

/// How readiness is checked: a raw RESP `PING` on a plain port, a redis-rs TLS connection on
/// a TLS one.
enum Probe {
    Plain { addr: SocketAddr, password: bool },
    Tls(Box<redis::Client>),
}

impl Probe {
    fn of(options: &RedisOptions, port: u16) -> Probe {
        match &options.tls {
            None => Probe::Plain {
                addr: loopback(port),
                password: options.password.is_some(),
            },
            Some(_) => Probe::Tls(Box::new(redis_client(options, port).unwrap_or_else(|e| {
                panic!("lock-testkit: cannot make a TLS client for port {port}: {e}")
            }))),
        }
    }

    async fn ping(&self) -> bool {
        match self {
            Probe::Plain { addr, password } => ping(*addr, *password).await,
            Probe::Tls(client) => {
                let exchange = async {
                    let mut connection = client.get_multiplexed_async_connection().await?;
                    redis::cmd("PING")
                        .query_async::<String>(&mut connection)
                        .await
                };
                matches!(
                    tokio::time::timeout(PROBE_TIMEOUT, exchange).await,
                    Ok(Ok(reply)) if reply == "PONG"
                )
            }
        }
    }
}

/// Speaks RESP directly: `PING` on a fresh connection, expecting `+PONG`
/// (or `-NOAUTH` when `password` is set, which proves the server is alive).
pub(crate) async fn ping(addr: SocketAddr, password: bool) -> bool {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(b"*1\r\n$4\r\nPING\r\n").await?;
        let mut reply = Vec::new();
        let mut buf = [0u8; 64];
        while !reply.ends_with(b"\r\n") {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            reply.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(reply)
    };
    match tokio::time::timeout(PROBE_TIMEOUT, exchange).await {
        Ok(Ok(reply)) => reply.starts_with(b"+PONG") || (password && reply.starts_with(b"-NOAUTH")),
        _ => false,
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `n` independent `redis-server` processes (separate ports and data), for
/// Redlock tests.
#[derive(Debug)]
pub struct RedisNodes {
    nodes: Vec<RedisServer>,
}

impl RedisNodes {
    /// Starts `n` servers with default options and waits until all answer.
    ///
    /// # Panics
    ///
    /// Like [`RedisServer::start`].
    pub async fn start(n: usize) -> RedisNodes {
        let mut nodes = Vec::with_capacity(n);
        for _ in 0..n {
            nodes.push(RedisServer::start().await);
        }
        RedisNodes { nodes }
    }

    /// All servers, in start order.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Server `i`, mutably (to kill or restart it).
    ///
    /// # Panics
    ///
    /// If `i >= len()`.
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// The servers' addresses, in start order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(RedisServer::addr).collect()
    }

    /// The servers' URLs, in start order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Number of servers.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when there are no servers.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::percent_encode;

    #[test]
    fn percent_encoding() {
        assert_eq!(percent_encode("abc-._~XYZ09"), "abc-._~XYZ09");
        assert_eq!(percent_encode("p@ss:w/rd%"), "p%40ss%3Aw%2Frd%25");
    }
}
