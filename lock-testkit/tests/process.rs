//! Process hygiene: missing binaries fail loudly, and servers die with the
//! test process even when it exits without unwinding.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lock_testkit::{find_binary, EtcdServer, ManagedProcess, RedisServer, StartError};

/// Set in the environment of the re-executed helper.
const HELPER_ENV: &str = "LOCK_TESTKIT_ORPHAN_HELPER";

#[test]
fn missing_binary_panics_with_the_install_command() {
    let panic = std::panic::catch_unwind(|| {
        find_binary(
            "lock-testkit-no-such-binary",
            "lock-testkit-no-such-package",
        )
    })
    .expect_err("a missing binary must panic");
    let message = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .expect("panic message");
    assert!(message.contains("apt-get install -y"), "{message}");
    assert_eq!(
        message,
        "lock-testkit-no-such-binary not found: install it with: \
         sudo apt-get install -y lock-testkit-no-such-package"
    );
}

#[test]
fn installed_binaries_are_found() {
    let redis = find_binary("redis-server", "redis-server");
    let etcd = find_binary("etcd", "etcd-server");
    match lock_testkit::launch_mode() {
        lock_testkit::LaunchMode::Processes => {
            assert!(redis.is_file());
            assert!(etcd.is_file());
        }
        // Paths inside the images, which need not exist on the host.
        lock_testkit::LaunchMode::Containers => {
            assert!(redis.is_absolute() && redis.ends_with("redis-server"));
            assert!(etcd.is_absolute() && etcd.ends_with("etcd"));
        }
    }
}

/// Not a real test on its own: when re-executed with `HELPER_ENV` set, it
/// starts servers, prints their ports and pids, and exits the process without
/// dropping anything. Without `HELPER_ENV` it does nothing.
#[tokio::test]
async fn orphan_helper() {
    if std::env::var_os(HELPER_ENV).is_none() {
        return;
    }
    let redis = RedisServer::start().await;
    let etcd = EtcdServer::start().await;
    let mut stdout = std::io::stdout().lock();
    // libtest has printed "test orphan_helper ... " without a newline.
    writeln!(stdout).unwrap();
    writeln!(stdout, "LOCK_TESTKIT_PORT={}", redis.port()).unwrap();
    writeln!(stdout, "LOCK_TESTKIT_PORT={}", etcd.client_port()).unwrap();
    for pid in [redis.pid(), etcd.pid()].into_iter().flatten() {
        writeln!(stdout, "LOCK_TESTKIT_PID={pid}").unwrap();
    }
    stdout.flush().unwrap();
    // No unwinding, no Drop: only PR_SET_PDEATHSIG can clean up now.
    std::process::exit(0);
}

#[test]
fn servers_die_when_the_test_process_exits_without_dropping() {
    let exe = std::env::current_exe().unwrap();
    let output = Command::new(exe)
        .args([
            "orphan_helper",
            "--exact",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(HELPER_ENV, "1")
        .stdin(Stdio::null())
        .output()
        .expect("run the helper");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "helper failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let values = |prefix: &str| -> Vec<u32> {
        stdout
            .lines()
            .filter_map(|line| line.strip_prefix(prefix))
            .map(|v| v.trim().parse().unwrap())
            .collect()
    };
    let ports = values("LOCK_TESTKIT_PORT=");
    let pids = values("LOCK_TESTKIT_PID=");
    assert_eq!(ports.len(), 2, "helper output:\n{stdout}\n{stderr}");
    assert_eq!(pids.len(), 2, "helper output:\n{stdout}\n{stderr}");

    let deadline = Instant::now() + Duration::from_secs(2);
    let mut alive: Vec<u32> = ports.clone();
    while !alive.is_empty() && Instant::now() < deadline {
        alive.retain(|&port| {
            let addr = SocketAddr::from(([127, 0, 0, 1], port as u16));
            TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok()
        });
        std::thread::sleep(Duration::from_millis(20));
    }
    if !alive.is_empty() {
        // Do not leave orphans behind even when the assertion fails.
        for pid in &pids {
            // SAFETY: plain kill(2).
            unsafe {
                libc::kill(*pid as libc::pid_t, libc::SIGKILL);
            }
        }
        panic!("servers on ports {alive:?} outlived their test process");
    }
    for pid in pids {
        let proc_dir = std::path::PathBuf::from(format!("/proc/{pid}"));
        // Reaped by init; the pid may in theory be reused, so only check
        // that it is not one of our servers any more.
        let cmdline = std::fs::read_to_string(proc_dir.join("cmdline")).unwrap_or_default();
        assert!(
            !cmdline.contains("redis-server") && !cmdline.contains("etcd"),
            "pid {pid} still runs {cmdline:?}"
        );
    }
}

/// PR_SET_PDEATHSIG is tied to the forking *thread*: a server started from
/// a short-lived thread must survive that thread (spawns happen on the test
/// kit's own long-lived spawner thread).
#[test]
fn servers_outlive_the_thread_that_started_them() {
    let server = std::thread::spawn(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(RedisServer::start())
    })
    .join()
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(server.is_running(), "server died with its starting thread");
    let mut stream = TcpStream::connect(server.addr()).unwrap();
    stream.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut reply = [0u8; 7];
    std::io::Read::read_exact(&mut stream, &mut reply).unwrap();
    assert_eq!(&reply, b"+PONG\r\n");
}

fn redis_args(port: u16, dir: &std::path::Path) -> Vec<std::ffi::OsString> {
    let port = port.to_string();
    let mut args: Vec<std::ffi::OsString> = ["--port", &port, "--bind", "127.0.0.1", "--save", ""]
        .iter()
        .map(Into::into)
        .collect();
    args.extend(["--appendonly", "no", "--logfile", "", "--dir"].map(Into::into));
    args.push(dir.into());
    args
}

#[tokio::test]
async fn early_exit_is_reported_with_the_log() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let process = ManagedProcess::spawn(
        "redis-server (port taken)",
        find_binary("redis-server", "redis-server"),
        redis_args(port, dir.path()),
        dir.path().join("server.log"),
    )
    .unwrap();
    let error = process
        .wait_ready(
            Duration::from_secs(10),
            Duration::from_millis(10),
            || async { false },
        )
        .await
        .expect_err("the server cannot bind a taken port");
    assert!(matches!(error, StartError::Exited { .. }), "{error}");
    assert!(error.is_addr_in_use(), "{error}");
    let message = error.to_string();
    assert!(
        message.contains("redis-server (port taken) exited during startup"),
        "{message}"
    );
    assert!(
        message.contains(&port.to_string()),
        "log tail in message: {message}"
    );
    assert!(!process.is_running());
}

#[tokio::test]
async fn readiness_timeout_leaves_the_process_running_until_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let process = ManagedProcess::spawn(
        "redis-server (never ready)",
        find_binary("redis-server", "redis-server"),
        redis_args(port, dir.path()),
        dir.path().join("server.log"),
    )
    .unwrap();
    let error = process
        .wait_ready(
            Duration::from_millis(200),
            Duration::from_millis(10),
            || async { false },
        )
        .await
        .expect_err("the probe never succeeds");
    assert!(matches!(error, StartError::TimedOut { .. }), "{error}");
    assert!(!error.is_addr_in_use());
    assert!(process.is_running());
    let pid = process.pid().unwrap();
    drop(process);
    // Killed and reaped: the pid is gone (not even a zombie).
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
}
