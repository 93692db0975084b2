//! A holder in another process for the file backend's tests: the test binary runs itself
//! as a child (one `#[test]` that does nothing unless [`DIR_ENV`] is set), which takes
//! locks in a directory and reports them on stdout.

use std::process::Stdio;
use std::time::Duration;

use distlock::file::FileBackend;
use distlock::{LockOptions, Locker};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};
use tokio::process::{Child, ChildStdout, Command};

/// The lock directory of the child (its mode is on when set).
pub const DIR_ENV: &str = "DISTLOCK_TEST_CHILD_DIR";
/// The keys the child locks, one a line.
pub const KEYS_ENV: &str = "DISTLOCK_TEST_CHILD_KEYS";
/// `hold`: lock every key, report `@@held KEY FENCE` lines and `@@ready`, hold until killed
/// (or until stdin closes: the parent went away); `churn`: lock and release every key in
/// turn for one second, then exit.
pub const MODE_ENV: &str = "DISTLOCK_TEST_CHILD_MODE";

/// The child's side: run by the `#[test]` named in [`spawn`]; nothing when not a child.
pub async fn child_main() {
    let Some(dir) = std::env::var_os(DIR_ENV) else {
        return;
    };
    let keys: Vec<String> = std::env::var(KEYS_ENV)
        .expect("keys")
        .lines()
        .map(str::to_owned)
        .collect();
    let locker = Locker::new(FileBackend::open(dir).expect("the lock directory"));
    let wait = LockOptions::new().wait_for(Duration::from_secs(20));
    match std::env::var(MODE_ENV).as_deref() {
        Ok("hold") => {
            let guards = locker.acquire_many(&keys, &wait).await.expect("granted");
            for guard in &guards {
                // On lines of their own: libtest prints the test's name before its output.
                println!("\n@@held {} {}", guard.key(), guard.fence());
            }
            println!("\n@@ready");
            // Until killed, or the parent closes stdin.
            let mut rest = Vec::new();
            let _ = tokio::io::stdin().read_to_end(&mut rest).await;
            drop(guards);
        }
        Ok("churn") => {
            let end = std::time::Instant::now() + Duration::from_secs(1);
            println!("\n@@ready");
            while std::time::Instant::now() < end {
                for key in &keys {
                    let guard = locker.acquire(key, &wait).await.expect("granted");
                    tokio::task::yield_now().await;
                    guard.release().await.expect("released");
                }
            }
        }
        other => panic!("unknown child mode {other:?}"),
    }
}

/// Starts this test binary as a child running the `#[test]` `test` in `mode` over `dir`
/// and `keys`, and waits for its `ready` line; returns it with the `held` lines before it.
pub async fn spawn(
    test: &str,
    mode: &str,
    dir: &std::path::Path,
    keys: &[String],
) -> (Child, Vec<(String, u64)>) {
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(DIR_ENV, dir)
        .env(KEYS_ENV, keys.join("\n"))
        .env(MODE_ENV, mode)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the child starts");
    let stdout = child.stdout.take().expect("piped");
    let held = tokio::time::timeout(Duration::from_secs(30), read_ready(stdout))
        .await
        .expect("the child reports ready within 30 s");
    (child, held)
}

async fn read_ready(stdout: ChildStdout) -> Vec<(String, u64)> {
    let mut lines = BufReader::new(stdout).lines();
    let mut held = Vec::new();
    while let Some(line) = lines.next_line().await.expect("the child's stdout") {
        if line == "@@ready" {
            // The rest is drained, so that the child never writes into a closed pipe.
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            return held;
        }
        if let Some(rest) = line.strip_prefix("@@held ") {
            let (key, fence) = rest.rsplit_once(' ').expect("held KEY FENCE");
            held.push((key.to_owned(), fence.parse().expect("a fence")));
        }
    }
    panic!("the child exited before it was ready");
}

/// Kills the child with SIGKILL and reaps it.
pub async fn kill9(child: &mut Child) {
    child.start_kill().expect("SIGKILL");
    child.wait().await.expect("reaped");
}
