//! Set-up shared by the test binaries: building backends from URLs (the one place that
//! does), the conformance suite run directly, through `Arc<dyn Backend>` and through
//! `distlock::connect`, raw looks at a `redis-server`, the fault hooks over lock-testkit's
//! servers behind fault proxies, and small helpers. Each test binary compiles this module on
//! its own and uses part of it.
#![allow(dead_code)]

#[cfg(feature = "file")]
pub mod file_child;
pub mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use distlock::{Backend, Capabilities, LockOptions, Locker, Owner};
use lock_conformance::{run_all, BoxFuture, Faults, Target};
use lock_testkit::{EtcdServer, FaultProxy, MariaDbServer, PostgresServer, ProxyMode, RedisServer};
use tokio::sync::Mutex;

/// Slack for "returns within its deadline" bounds.
pub const SLACK: Duration = Duration::from_millis(100);

/// Run record `n` of `job`: scheduled `n` seconds after a fixed instant, ended 250 ms later.
pub fn run_record(
    job: &str,
    n: u64,
    outcome: distlock::records::RunOutcome,
) -> distlock::records::RunRecord {
    let at = std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + n);
    distlock::records::RunRecord::new(
        job.to_owned(),
        at,
        format!("replica-{n}"),
        at + Duration::from_millis(250),
        outcome,
    )
    .started_at(Some(at))
    .fence(Some(n))
}

/// One attempt (`Skip`) at a lock of `ttl`, not renewed.
pub fn skip(ttl: Duration) -> LockOptions {
    LockOptions::new().ttl(ttl).skip().watchdog(false)
}

/// A random number, for unique names.
pub fn rand_u32() -> u32 {
    Owner::random().as_u128() as u32
}

// ---------------------------------------------------------------------------------------
// Backends from URLs
// ---------------------------------------------------------------------------------------

/// A Redis backend for `url`.
#[cfg(feature = "redis")]
pub async fn redis_backend(url: &str) -> distlock::redis::RedisBackend {
    distlock::redis::RedisBackend::connect(&distlock::LockUrl::parse(url).expect("valid URL"))
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// `redlock://` with `addrs`, and `params` as its query when not empty.
#[cfg(feature = "redlock")]
pub fn redlock_url(addrs: &[std::net::SocketAddr], params: &str) -> String {
    let hosts: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    with_query(format!("redlock://{}", hosts.join(",")), params)
}

/// A Redlock backend over `addrs`, with `params` as the URL's query.
#[cfg(feature = "redlock")]
pub async fn redlock_backend(
    addrs: &[std::net::SocketAddr],
    params: &str,
) -> distlock::redlock::RedlockBackend {
    let url = redlock_url(addrs, params);
    distlock::redlock::RedlockBackend::connect(&distlock::LockUrl::parse(&url).expect("valid URL"))
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// `etcd://` with `endpoints`, and `params` as its query when not empty.
#[cfg(feature = "etcd")]
pub fn etcd_url(endpoints: &[String], params: &str) -> String {
    with_query(format!("etcd://{}", endpoints.join(",")), params)
}

/// An etcd backend over `endpoints`, with `params` as the URL's query.
#[cfg(feature = "etcd")]
pub async fn etcd_backend(endpoints: &[String], params: &str) -> distlock::etcd::EtcdBackend {
    let url = etcd_url(endpoints, params);
    distlock::etcd::EtcdBackend::connect(&distlock::LockUrl::parse(&url).expect("valid URL"))
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// A PostgreSQL backend for `url`.
#[cfg(feature = "postgres")]
pub async fn postgres_backend(url: &str) -> distlock::postgres::PostgresBackend {
    distlock::postgres::PostgresBackend::connect(&distlock::LockUrl::parse(url).expect("valid URL"))
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// `postgres://` to `addr` as the test kit's superuser, with `params` as its query.
pub fn postgres_url(addr: SocketAddr, params: &str) -> String {
    with_query(
        format!(
            "postgres://postgres:{}@{addr}/postgres",
            lock_testkit::POSTGRES_PASSWORD
        ),
        params,
    )
}

/// A MySQL/MariaDB backend for `url`.
#[cfg(feature = "mysql")]
pub async fn mysql_backend(url: &str) -> distlock::mysql::MysqlBackend {
    distlock::mysql::MysqlBackend::connect(&distlock::LockUrl::parse(url).expect("valid URL"))
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// `mysql://` to `addr` as the test kit's `root`, database `distlock`, with `params` as
/// its query.
pub fn mysql_url(addr: SocketAddr, params: &str) -> String {
    with_query(
        format!(
            "mysql://root:{}@{addr}/{}",
            lock_testkit::MARIADB_PASSWORD,
            lock_testkit::MARIADB_DATABASE
        ),
        params,
    )
}

fn with_query(mut url: String, params: &str) -> String {
    if !params.is_empty() {
        url.push('?');
        url.push_str(params);
    }
    url
}

// ---------------------------------------------------------------------------------------
// The conformance suite three ways
// ---------------------------------------------------------------------------------------

/// The whole suite on `backend` used directly.
pub async fn conformance_direct(backend: impl Backend) {
    run_all(&Target::new(Arc::new(backend))).await;
}

/// The whole suite on `backend` through `Arc<dyn Backend>`, wrapped once more: the blanket
/// `impl Backend for Arc<B>` forwards every call.
pub async fn conformance_through_arc_dyn(backend: impl Backend) {
    let backend: Arc<dyn Backend> = Arc::new(backend);
    run_all(&Target::new(Arc::new(backend))).await;
}

/// The whole suite through the facade's `distlock::connect(url)`, after `check` looked at
/// the capabilities of what it built.
pub async fn conformance_through_connect(url: &str, check: impl FnOnce(&Capabilities)) {
    let locker: Locker = distlock::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    check(locker.capabilities());
    run_all(&Target::from_locker(&locker)).await;
}

// ---------------------------------------------------------------------------------------
// Raw looks at a redis-server
// ---------------------------------------------------------------------------------------

/// Whether `key` exists on `server`.
pub async fn raw_exists(server: &RedisServer, key: &str) -> bool {
    let mut raw = server.client().await;
    let n: i64 = redis::cmd("EXISTS")
        .arg(key)
        .query_async(&mut raw)
        .await
        .unwrap();
    n == 1
}

/// Deletes `key` on `server`, behind every backend's back.
pub async fn raw_del(server: &RedisServer, key: &str) {
    let mut raw = server.client().await;
    let _: i64 = redis::cmd("DEL")
        .arg(key)
        .query_async(&mut raw)
        .await
        .unwrap();
}

/// Calls of `cmd` the server has answered so far (`INFO commandstats`).
pub async fn calls(server: &RedisServer, cmd: &str) -> u64 {
    let mut raw = server.client().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut raw)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{cmd}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// How many fence counters `server` holds.
pub async fn fence_counters(server: &RedisServer) -> usize {
    let mut raw = server.client().await;
    let counters: Vec<String> = redis::cmd("KEYS")
        .arg("*:fence")
        .query_async(&mut raw)
        .await
        .unwrap();
    counters.len()
}

// ---------------------------------------------------------------------------------------
// Fault hooks
// ---------------------------------------------------------------------------------------

/// Written before a restart without persistence, and gone after it.
const SENTINEL: &str = "lock-testkit:restart-sentinel";

/// A server process of lock-testkit the fault hooks act on.
pub trait Server: Send + Sync + 'static {
    /// Where it listens.
    fn addr(&self) -> SocketAddr;
    /// Whether a restart keeps its locks (persistence, etcd's log).
    fn keeps_locks(&self) -> bool;
    /// Whether it holds lock state that a restart without persistence loses (fence
    /// counters).
    fn has_lock_state(&self) -> impl Future<Output = bool> + Send + '_;
    /// Marks the data set, to check after the restart that it was lost (or kept).
    fn before_restart(&self) -> impl Future<Output = ()> + Send + '_;
    /// `SIGKILL`, reaped.
    fn kill(&mut self);
    /// `SIGSTOP`.
    fn pause(&self);
    /// `SIGCONT`.
    fn resume(&self);
    /// Started again (killed first if running); after [`before_restart`](Self::before_restart),
    /// checks that the data set was lost or kept as it should.
    fn restart(&mut self) -> impl Future<Output = ()> + Send + '_;
    /// Started again after a kill.
    fn revive(&mut self) -> impl Future<Output = ()> + Send + '_;
}

impl Server for RedisServer {
    fn addr(&self) -> SocketAddr {
        RedisServer::addr(self)
    }
    fn keeps_locks(&self) -> bool {
        self.options().persistent
    }
    async fn has_lock_state(&self) -> bool {
        fence_counters(self).await > 0
    }
    async fn before_restart(&self) {
        assert!(
            self.keeps_locks() || !self.options().rdb,
            "a server that keeps all or nothing"
        );
        let mut raw = self.client().await;
        let () = redis::cmd("SET")
            .arg(SENTINEL)
            .arg(1)
            .query_async(&mut raw)
            .await
            .unwrap();
    }
    fn kill(&mut self) {
        RedisServer::kill(self)
    }
    fn pause(&self) {
        RedisServer::pause(self)
    }
    fn resume(&self) {
        RedisServer::resume(self)
    }
    async fn restart(&mut self) {
        RedisServer::restart(self).await;
        // Clients of the rules may write again at once: only the sentinel tells.
        let kept = raw_exists(self, SENTINEL).await;
        raw_del(self, SENTINEL).await;
        assert_eq!(
            kept,
            self.keeps_locks(),
            "the restart kept the data set (persistence) or wiped it, fence counters included"
        );
    }
    fn revive(&mut self) -> impl Future<Output = ()> + Send + '_ {
        RedisServer::restart(self)
    }
}

impl Server for EtcdServer {
    fn addr(&self) -> SocketAddr {
        EtcdServer::addr(self)
    }
    fn keeps_locks(&self) -> bool {
        true
    }
    async fn has_lock_state(&self) -> bool {
        true
    }
    async fn before_restart(&self) {}
    fn kill(&mut self) {
        EtcdServer::kill(self)
    }
    fn pause(&self) {
        EtcdServer::pause(self)
    }
    fn resume(&self) {
        EtcdServer::resume(self)
    }
    fn restart(&mut self) -> impl Future<Output = ()> + Send + '_ {
        EtcdServer::restart(self)
    }
    fn revive(&mut self) -> impl Future<Output = ()> + Send + '_ {
        EtcdServer::restart(self)
    }
}

impl Server for PostgresServer {
    fn addr(&self) -> SocketAddr {
        PostgresServer::addr(self)
    }
    fn keeps_locks(&self) -> bool {
        true
    }
    async fn has_lock_state(&self) -> bool {
        true
    }
    async fn before_restart(&self) {}
    fn kill(&mut self) {
        PostgresServer::kill(self)
    }
    fn pause(&self) {
        PostgresServer::pause(self)
    }
    fn resume(&self) {
        PostgresServer::resume(self)
    }
    fn restart(&mut self) -> impl Future<Output = ()> + Send + '_ {
        PostgresServer::restart(self)
    }
    fn revive(&mut self) -> impl Future<Output = ()> + Send + '_ {
        PostgresServer::restart(self)
    }
}

impl Server for MariaDbServer {
    fn addr(&self) -> SocketAddr {
        MariaDbServer::addr(self)
    }
    fn keeps_locks(&self) -> bool {
        true
    }
    async fn has_lock_state(&self) -> bool {
        true
    }
    async fn before_restart(&self) {}
    fn kill(&mut self) {
        MariaDbServer::kill(self)
    }
    fn pause(&self) {
        MariaDbServer::pause(self)
    }
    fn resume(&self) {
        MariaDbServer::resume(self)
    }
    fn restart(&mut self) -> impl Future<Output = ()> + Send + '_ {
        MariaDbServer::restart(self)
    }
    fn revive(&mut self) -> impl Future<Output = ()> + Send + '_ {
        MariaDbServer::restart(self)
    }
}

/// Servers each reached through a [`FaultProxy`], and the fault hooks that act on all of
/// them at once.
pub struct Proxied<S> {
    servers: Arc<Mutex<Vec<S>>>,
    proxies: Arc<Vec<FaultProxy>>,
}

#[derive(Clone, Copy)]
enum Action {
    Restart,
    Kill,
    Revive,
    Pause,
    Resume,
    Cut,
    Heal,
}

impl<S: Server> Proxied<S> {
    /// Puts a fault proxy in front of each of `servers`.
    pub async fn new(servers: Vec<S>) -> Self {
        let mut proxies = Vec::new();
        for server in &servers {
            proxies.push(FaultProxy::start(server.addr()).await);
        }
        Proxied {
            servers: Arc::new(Mutex::new(servers)),
            proxies: Arc::new(proxies),
        }
    }

    /// The proxies' addresses, in the servers' order: what the backend connects to.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.proxies.iter().map(FaultProxy::addr).collect()
    }

    /// `faults` with hooks acting on every server: a restart (keeping or losing the locks,
    /// as the servers do), kill (the proxies refuse connections too, as a dead host does),
    /// pause and a blackholed network.
    pub async fn hooks(&self, faults: Faults) -> Faults {
        let faults = if self.servers.lock().await[0].keeps_locks() {
            faults.restart_keeping_locks(self.hook(Action::Restart))
        } else {
            faults.restart_losing_locks(self.hook(Action::Restart))
        };
        faults
            .kill(self.hook(Action::Kill), self.hook(Action::Revive))
            .pause(self.hook(Action::Pause), self.hook(Action::Resume))
            .blackhole(self.hook(Action::Cut), self.hook(Action::Heal))
    }

    fn hook(&self, action: Action) -> impl Fn() -> BoxFuture + Send + Sync + 'static {
        let (servers, proxies) = (self.servers.clone(), self.proxies.clone());
        move || {
            let (servers, proxies) = (servers.clone(), proxies.clone());
            Box::pin(async move {
                let mut servers = servers.lock().await;
                if let Action::Restart = action {
                    restart_all(&mut servers).await;
                }
                for (server, proxy) in servers.iter_mut().zip(proxies.iter()) {
                    match action {
                        Action::Restart => {}
                        Action::Kill => {
                            server.kill();
                            proxy.set_mode(ProxyMode::Refuse);
                        }
                        Action::Revive => {
                            proxy.set_mode(ProxyMode::Pass);
                            server.revive().await;
                        }
                        Action::Pause => server.pause(),
                        Action::Resume => server.resume(),
                        Action::Cut => proxy.set_mode(ProxyMode::Blackhole),
                        Action::Heal => proxy.set_mode(ProxyMode::Pass),
                    }
                }
            })
        }
    }
}

/// Restarts every server at once (all down, then all up, as after a power cut), so that no
/// lock is granted on servers already back and then lost with those still to restart.
async fn restart_all<S: Server>(servers: &mut [S]) {
    // Something to lose on a majority (a grant needs no more).
    let mut with_state = 0;
    for server in servers.iter() {
        with_state += usize::from(server.has_lock_state().await);
        server.before_restart().await;
    }
    assert!(
        with_state > servers.len() / 2,
        "lock state to lose on a majority: {with_state} of {}",
        servers.len()
    );
    for server in servers.iter_mut() {
        server.kill();
    }
    for server in servers.iter_mut() {
        server.restart().await;
    }
}

// ---------------------------------------------------------------------------------------
// Fences of one key
// ---------------------------------------------------------------------------------------

/// The fences of `n` grants of one key on `node`, taken and released back to back as fast
/// as the node answers (a loopback round trip is well under a millisecond, so many grants
/// share one millisecond of the server clock), and how many of them fell in the same
/// millisecond as the grant before (by the client's clock, a hint for the report).
#[cfg(feature = "redis")]
pub async fn fences_of_a_tight_loop(
    node: &distlock::redis::RedisNode,
    key: &str,
    n: usize,
) -> (Vec<u64>, usize) {
    let ttl = distlock::redis::CAPABILITIES
        .effective_ttl(Duration::from_secs(10))
        .expect("a valid TTL");
    let mut fences = Vec::with_capacity(n);
    let mut same_ms = 0;
    let mut last_ms = None;
    for _ in 0..n {
        let owner = Owner::random();
        match node.try_acquire(key, owner, ttl).await {
            Ok(distlock::Attempt::Granted { fence, .. }) => fences.push(fence),
            other => panic!("a free key was not granted: {other:?}"),
        }
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        same_ms += usize::from(last_ms == Some(ms));
        last_ms = Some(ms);
        assert!(node.release(key, owner).await.expect("release"));
    }
    (fences, same_ms)
}

/// Panics unless every fence of `fences` is greater than the one before, naming the first
/// pair that is not.
pub fn assert_strictly_increasing(fences: &[u64]) {
    if let Some(i) = fences.windows(2).position(|w| w[1] <= w[0]) {
        panic!(
            "fences must strictly increase: grant {} got {} after {} (of {} grants)",
            i + 1,
            fences[i + 1],
            fences[i],
            fences.len()
        );
    }
}
