//! FaultProxy in front of a real redis-server.

use std::io;
use std::time::{Duration, Instant};

use lock_testkit::{FaultProxy, ProxyMode, RedisServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PONG: &[u8] = b"+PONG\r\n";

async fn send_ping(stream: &mut TcpStream) -> io::Result<()> {
    stream.write_all(b"*1\r\n$4\r\nPING\r\n").await
}

async fn read_pong(stream: &mut TcpStream) -> io::Result<()> {
    let mut reply = [0u8; PONG.len()];
    stream.read_exact(&mut reply).await?;
    assert_eq!(&reply, PONG);
    Ok(())
}

async fn ping(stream: &mut TcpStream) -> io::Result<()> {
    send_ping(stream).await?;
    read_pong(stream).await
}

/// PING with a time limit: `Err` on timeout or I/O error.
async fn ping_within(stream: &mut TcpStream, limit: Duration) -> io::Result<()> {
    tokio::time::timeout(limit, ping(stream))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "ping timed out"))?
}

async fn setup() -> (RedisServer, FaultProxy) {
    let server = RedisServer::start().await;
    let proxy = FaultProxy::start(server.addr()).await;
    assert_ne!(proxy.port(), server.port());
    assert_eq!(proxy.addr().port(), proxy.port());
    assert_eq!(proxy.upstream(), server.addr());
    (server, proxy)
}

#[tokio::test]
async fn pass_forwards_both_ways() {
    let (_server, proxy) = setup().await;
    assert_eq!(proxy.mode(), ProxyMode::Pass);
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    for _ in 0..3 {
        ping_within(&mut stream, Duration::from_secs(2))
            .await
            .unwrap();
    }
    // A larger payload both ways (SET + GET of 1 MiB).
    let value = "x".repeat(1 << 20);
    let mut connection = redis::Client::open(format!("redis://{}", proxy.addr()))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    redis::cmd("SET")
        .arg("big")
        .arg(&value)
        .query_async::<()>(&mut connection)
        .await
        .unwrap();
    let back: String = redis::cmd("GET")
        .arg("big")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(back.len(), value.len());
}

#[tokio::test]
async fn delay_adds_latency_per_direction() {
    let (_server, proxy) = setup().await;
    let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
    ping_within(&mut open, Duration::from_secs(2))
        .await
        .unwrap();

    let delay = ProxyMode::Delay {
        to_server: Duration::from_millis(100),
        to_client: Duration::from_millis(150),
    };
    proxy.set_mode(delay);
    assert_eq!(proxy.mode(), delay);

    // Applies to an already open connection ...
    let started = Instant::now();
    ping_within(&mut open, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );

    // ... and to a new one.
    let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
    let started = Instant::now();
    ping_within(&mut fresh, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );

    proxy.set_mode(ProxyMode::Pass);
    let started = Instant::now();
    ping_within(&mut fresh, Duration::from_secs(2))
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn blackhole_silences_connections_until_pass() {
    let (_server, proxy) = setup().await;
    let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
    ping_within(&mut open, Duration::from_secs(2))
        .await
        .unwrap();

    proxy.set_mode(ProxyMode::Blackhole);
    // The open connection goes silent.
    send_ping(&mut open).await.unwrap();
    let silent = tokio::time::timeout(Duration::from_millis(300), read_pong(&mut open)).await;
    assert!(silent.is_err(), "blackholed request must time out");
    // A new connection is accepted but silent too.
    let mut during = TcpStream::connect(proxy.addr()).await.unwrap();
    assert!(ping_within(&mut during, Duration::from_millis(300))
        .await
        .is_err());

    proxy.set_mode(ProxyMode::Pass);
    let mut after = TcpStream::connect(proxy.addr()).await.unwrap();
    ping_within(&mut after, Duration::from_secs(2))
        .await
        .unwrap();
    // Held bytes are forwarded once healed: the earlier PING is answered.
    tokio::time::timeout(Duration::from_secs(2), read_pong(&mut open))
        .await
        .expect("held request answered after Pass")
        .unwrap();
}

#[tokio::test]
async fn reset_aborts_open_and_new_connections() {
    let (_server, proxy) = setup().await;
    let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
    ping_within(&mut open, Duration::from_secs(2))
        .await
        .unwrap();

    proxy.set_mode(ProxyMode::Reset);
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(2), open.read(&mut buf))
        .await
        .expect("a reset connection must not hang");
    let error = read.expect_err("an open connection must error after Reset");
    assert_eq!(error.kind(), io::ErrorKind::ConnectionReset, "{error}");

    // New connections are accepted and reset right away.
    let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
    let result = ping_within(&mut fresh, Duration::from_secs(2)).await;
    let error = result.expect_err("a new connection must fail during Reset");
    assert_ne!(error.kind(), io::ErrorKind::TimedOut, "{error}");

    proxy.set_mode(ProxyMode::Pass);
    let mut after = TcpStream::connect(proxy.addr()).await.unwrap();
    ping_within(&mut after, Duration::from_secs(2))
        .await
        .unwrap();
}

#[tokio::test]
async fn quick_reset_then_pass_still_resets_open_connections() {
    let (_server, proxy) = setup().await;
    let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
    ping_within(&mut open, Duration::from_secs(2))
        .await
        .unwrap();
    proxy.set_mode(ProxyMode::Reset);
    proxy.set_mode(ProxyMode::Pass); // before the pumps had a chance to look
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(2), open.read(&mut buf))
        .await
        .expect("a reset connection must not hang");
    assert!(read.is_err() || read.unwrap() == 0);
}

#[tokio::test]
async fn refuse_stops_accepting_and_pass_accepts_again() {
    let (_server, proxy) = setup().await;
    let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
    ping_within(&mut open, Duration::from_secs(2))
        .await
        .unwrap();

    proxy.set_mode(ProxyMode::Refuse);
    let error = TcpStream::connect(proxy.addr())
        .await
        .expect_err("connect must fail during Refuse");
    assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused, "{error}");
    // Refuse only affects new connections.
    ping_within(&mut open, Duration::from_secs(2))
        .await
        .unwrap();

    proxy.set_mode(ProxyMode::Pass);
    let mut after = TcpStream::connect(proxy.addr()).await.unwrap();
    ping_within(&mut after, Duration::from_secs(2))
        .await
        .unwrap();

    // Refuse -> Blackhole -> Pass also re-binds (any non-Refuse mode does).
    proxy.set_mode(ProxyMode::Refuse);
    assert!(TcpStream::connect(proxy.addr()).await.is_err());
    proxy.set_mode(ProxyMode::Blackhole);
    let mut silent = TcpStream::connect(proxy.addr()).await.unwrap();
    proxy.set_mode(ProxyMode::Pass);
    ping_within(&mut silent, Duration::from_secs(2))
        .await
        .unwrap();
}

/// A child forked from the test process holds a copy of every descriptor,
/// the listening socket's too, until it execs (the testkit forks every server
/// it starts, often for a test running in parallel): Refuse must stop the
/// listening even then. Here the child waits between fork and exec long
/// enough for the connect to land in that window every time.
#[tokio::test]
async fn refuse_holds_while_a_forked_child_has_not_exec_yet() {
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    let (_server, proxy) = setup().await;
    let child = std::thread::spawn(|| {
        let mut command = Command::new("true");
        // SAFETY: only nanosleep, which is async-signal-safe, between fork
        // and exec.
        unsafe {
            command.pre_exec(|| {
                std::thread::sleep(Duration::from_millis(1500));
                Ok(())
            });
        }
        command.status()
    });
    // Let the fork happen (spawn returns only after the exec).
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set_mode(ProxyMode::Refuse);
    let connected = TcpStream::connect(proxy.addr()).await;
    assert!(!child.is_finished(), "the child exec'd before the connect");
    let error = connected.expect_err("connect must fail during Refuse");
    assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused, "{error}");
    // And the port can be bound again while the child still holds the old
    // socket.
    proxy.set_mode(ProxyMode::Pass);
    let mut after = TcpStream::connect(proxy.addr()).await.unwrap();
    ping_within(&mut after, Duration::from_secs(2))
        .await
        .unwrap();
    assert!(!child.is_finished(), "the child exec'd before the re-bind");
    child.join().unwrap().unwrap();
}

#[tokio::test]
async fn upstream_down_resets_clients() {
    let (mut server, proxy) = setup().await;
    server.kill();
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    let result = ping_within(&mut stream, Duration::from_secs(2)).await;
    let error = result.expect_err("no upstream: the client connection must fail");
    assert_ne!(error.kind(), io::ErrorKind::TimedOut, "{error}");
}

#[tokio::test]
async fn drop_stops_listener_and_connections() {
    let (_server, proxy) = setup().await;
    let addr = proxy.addr();
    let mut open = TcpStream::connect(addr).await.unwrap();
    ping_within(&mut open, Duration::from_secs(2))
        .await
        .unwrap();
    drop(proxy);
    assert!(TcpStream::connect(addr).await.is_err(), "listener closed");
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(2), open.read(&mut buf))
        .await
        .expect("connections are closed when the proxy is dropped");
    assert!(matches!(read, Ok(0) | Err(_)));
}
