//! The rules the MySQL/MariaDB and PostgreSQL suites check alike, written once: each suite
//! names its server, backend and URLs through [`SqlSuite`] and calls these with them.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{Backend, Error, LockOptions, LockUrl, Locker};
use lock_conformance::{run_faults, Faults, Target};

use crate::common::{self, rand_u32, Proxied, Server};

/// One SQL backend's suite: its test kit server, its backend and its URLs.
pub trait SqlSuite {
    /// The test kit's server.
    type Server: Server;
    /// The backend.
    type Backend: Backend + 'static;
    /// Whether the server speaks first on a new connection (MySQL's handshake) or waits
    /// for the client (PostgreSQL's startup message).
    const SERVER_SPEAKS_FIRST: bool;
    /// Starts a server.
    fn start() -> impl Future<Output = Self::Server>;
    /// A URL to `addr` as the test kit's user, with `password`, with `params` as its query.
    fn url_with(addr: SocketAddr, password: &str, params: &str) -> String;
    /// A URL to `addr` as the test kit's user, with `params` as its query.
    fn url(addr: SocketAddr, params: &str) -> String;
    /// The backend for `url`.
    fn backend(url: &str) -> impl Future<Output = Self::Backend>;
    /// `connect` of the backend (without the test's panic on an error).
    fn connect(url: &LockUrl) -> impl Future<Output = distlock::Result<Self::Backend>>;
}

fn key(name: &str) -> String {
    format!("{name}-{:08x}", rand_u32())
}

/// The shared fault rules on one server reached through a fault proxy (the peer too):
/// restarted (the server keeps its data: the locks survive), killed, paused (SIGSTOP), or
/// cut off by a blackholed network.
pub async fn fault_rules<T: SqlSuite>() {
    let server = Proxied::new(vec![T::start().await]).await;
    let url = T::url(server.addrs()[0], "table=faults&timeout=500ms");
    let faults = Faults::new(Duration::from_millis(500))
        .slack(Duration::from_millis(300))
        .peer(Arc::new(T::backend(&url).await));
    let faults = server.hooks(faults).await;
    let target = Target::new(Arc::new(T::backend(&url).await)).with_faults(faults);
    // The data survives a restart: there is no restart that loses the locks.
    run_faults(&target).await.assert_not_run(&[
        "a_restart_that_loses_the_locks_leaves_holders_not_held",
        "waiters_wake_after_a_restart_that_loses_the_locks",
    ]);
}

/// Fences strictly increase from holder to holder across a clean restart and a `kill -9`
/// (crash recovery), the lock connections reconnecting by themselves each time; a lock
/// held over a crash is still held after it (recovery keeps committed rows).
pub async fn fences_strictly_increase_across_a_restart_and_a_kill<T: SqlSuite>() {
    let mut server = T::start().await;
    let locker = Locker::new(T::backend(&T::url(server.addr(), "table=fences&timeout=1s")).await);
    let k = key("fences");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .wait_for(Duration::from_secs(20))
        .watchdog(false);
    let mut last = 0;
    let mut take = |fence: u64, when: &str| {
        assert!(fence > last, "{when}: fence {fence} after {last}");
        last = fence;
    };
    for round in 0..3 {
        for _ in 0..5 {
            let guard = locker.acquire(&k, &opts).await.unwrap();
            take(guard.fence(), &format!("round {round}"));
            guard.release().await.unwrap();
        }
        match round {
            0 => server.restart().await,
            1 => {
                server.kill();
                server.restart().await;
            }
            _ => {}
        }
    }
    let held = locker.acquire(&k, &opts).await.unwrap();
    take(held.fence(), "before the crash");
    server.kill();
    server.restart().await;
    let other = Locker::new(T::backend(&T::url(server.addr(), "table=fences")).await);
    assert!(
        matches!(
            other.acquire(&k, &LockOptions::new().skip()).await,
            Err(Error::Locked { .. })
        ),
        "the lock survives the crash"
    );
    held.release().await.unwrap();
    let next = other.acquire(&k, &LockOptions::new().skip()).await.unwrap();
    take(next.fence(), "after the crash");
}

/// Nothing listens: the connection is refused at once, a transient `Unavailable` naming
/// the address, within the timeout.
pub async fn an_unreachable_port_is_unavailable_within_the_timeout<T: SqlSuite>() {
    // Nothing listens there, and nothing else can be given it while `closed` lives.
    let closed = lock_testkit::closed_port();
    let port = closed.port();
    let url = T::url_with(
        SocketAddr::from(([127, 0, 0, 1], port)),
        "x",
        "timeout=500ms",
    );
    let started = Instant::now();
    let err = T::connect(&LockUrl::parse(&url).unwrap())
        .await
        .err()
        .expect("nothing listens");
    assert!(started.elapsed() < Duration::from_millis(500) + common::SLACK);
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(err.is_transient());
    let text = err.report().to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(!text.contains(":x@"), "{text}");
}

/// The error of connecting to a server that does not speak the backend's protocol (it
/// answers garbage, first or after the client spoke as the protocol has it, and hangs
/// up), which comes within the timeout (1 s).
pub async fn connecting_to_a_server_that_answers_garbage<T: SqlSuite>() -> Error {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let peer = tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = [0u8; 512];
                if !T::SERVER_SPEAKS_FIRST {
                    let _ = socket.read(&mut buf).await;
                }
                let _ = socket.write_all(b"-ERR unknown command\r\n").await;
                if T::SERVER_SPEAKS_FIRST {
                    let _ = socket.read(&mut buf).await;
                }
            });
        }
    });
    let url = T::url_with(addr, "x", "timeout=1s");
    let started = Instant::now();
    let err = T::connect(&LockUrl::parse(&url).unwrap())
        .await
        .err()
        .expect("not the backend's protocol");
    assert!(started.elapsed() < Duration::from_secs(1) + common::SLACK);
    peer.abort();
    err
}
