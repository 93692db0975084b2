//! Servers never outlive a test binary that dies without dropping them, in either launch
//! mode: processes die of their death signal, containers are removed by the reaper.
//!
//! A helper (this binary re-executed) starts a Redis server and an etcd member, reports
//! their ports, waits for a word on stdin, then aborts or panics with the servers kept in
//! a static (no destructor runs in either case). The parent counts the helper's
//! containers in the engine while they run and after the helper died.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use lock_testkit::{launch_mode, EtcdServer, LaunchMode, RedisServer};

/// Set in the environment of the re-executed helper: `abort` or `panic`.
const HELPER_ENV: &str = "LOCK_TESTKIT_REAPER_HELPER";
/// How long the reaper may take to remove the containers of a dead binary.
const REAP_TIMEOUT: Duration = Duration::from_secs(15);

/// The servers of the helper, never dropped.
static SERVERS: OnceLock<(RedisServer, EtcdServer)> = OnceLock::new();

/// Not a real test on its own: when re-executed with `HELPER_ENV` set, it starts the
/// servers, prints their ports, waits for a line on stdin and dies as `HELPER_ENV` says.
/// Without `HELPER_ENV` it does nothing.
#[tokio::test]
async fn reaper_helper() {
    let Some(how) = std::env::var_os(HELPER_ENV) else {
        return;
    };
    let servers = (RedisServer::start().await, EtcdServer::start().await);
    let ports = [servers.0.port(), servers.1.client_port()];
    SERVERS.set(servers).expect("started once");
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout).unwrap();
    writeln!(stdout, "LOCK_TESTKIT_PORTS={} {}", ports[0], ports[1]).unwrap();
    stdout.flush().unwrap();
    drop(stdout);
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    if how == "abort" {
        std::process::abort();
    }
    // libtest catches the panic and the binary exits with a failure, without dropping
    // the static.
    panic!("the helper panics on purpose");
}

/// The helper's containers (by their name, which holds its pid); 0 as processes.
async fn containers_of(pid: u32) -> usize {
    if launch_mode() != LaunchMode::Containers {
        return 0;
    }
    use testcontainers::bollard;
    let docker = bollard::Docker::connect_with_defaults().expect("engine");
    let options = bollard::query_parameters::ListContainersOptionsBuilder::new()
        .all(true)
        .build();
    let prefix = format!("/distlock-testkit-{pid}-");
    docker
        .list_containers(Some(options))
        .await
        .expect("list containers")
        .iter()
        .filter(|c| {
            c.names
                .iter()
                .flatten()
                .any(|name| name.starts_with(&prefix))
        })
        .count()
}

fn open(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok()
}

async fn servers_are_gone_after_the_helper_dies(how: &str) {
    let exe = std::env::current_exe().unwrap();
    let mut helper: Child = Command::new(exe)
        .args([
            "reaper_helper",
            "--exact",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(HELPER_ENV, how)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run the helper");
    let pid = helper.id();
    let mut lines = BufReader::new(helper.stdout.take().unwrap()).lines();
    let ports: Vec<u16> = loop {
        let line = lines
            .next()
            .expect("the helper ended before reporting its ports")
            .unwrap();
        if let Some(ports) = line.strip_prefix("LOCK_TESTKIT_PORTS=") {
            break ports.split(' ').map(|p| p.parse().unwrap()).collect();
        }
    };
    assert!(ports.iter().all(|&port| open(port)), "servers not serving");
    let running = containers_of(pid).await;
    let expected = match launch_mode() {
        LaunchMode::Containers => 2,
        LaunchMode::Processes => 0,
    };
    assert_eq!(running, expected, "containers of the running helper");

    writeln!(helper.stdin.take().unwrap(), "die").unwrap();
    let status = helper.wait().unwrap();
    assert!(!status.success(), "the helper must die ({how}): {status}");

    let died = Instant::now();
    loop {
        let left = containers_of(pid).await;
        let open_ports: Vec<u16> = ports.iter().copied().filter(|&p| open(p)).collect();
        if left == 0 && open_ports.is_empty() {
            break;
        }
        assert!(
            died.elapsed() < REAP_TIMEOUT,
            "{left} containers and ports {open_ports:?} outlived the helper ({how}) \
             by {REAP_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "{how}: servers gone {:?} after the helper died",
        died.elapsed()
    );
}

#[tokio::test]
async fn servers_are_gone_after_an_abort() {
    servers_are_gone_after_the_helper_dies("abort").await;
}

#[tokio::test]
async fn servers_are_gone_after_a_panic_with_servers_in_a_static() {
    servers_are_gone_after_the_helper_dies("panic").await;
}
