//! Graceful shutdown: SIGTERM lets a run finish or cuts it after the grace, a second
//! signal kills at once, and every lock is released.

use super::*;

/// SIGTERM: no new runs start, the running one finishes within the grace, every lock is
/// released, exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_running_command_finish_and_releases_the_lock() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start().await;
    let url = server.url();
    let setup = Setup::new(&format!(
        r#"
at_least = "600ms"
shutdown_grace = "20s"
[[job]]
name = "steady"
schedule = "* * * * * *"
command = {}
"#,
        logged("sleep 2", 0)
    ));
    let mut replica = setup.replica(&url, "only", &[]);
    let running = wait_for_start(&setup, Duration::from_secs(20), |_| true).await;
    let started = Instant::now();
    replica.terminate(Duration::from_secs(30)).await;
    let stopped_ns = now_ns();
    assert!(started.elapsed() < Duration::from_secs(15));
    let runs = runs(&setup.lines()).remove("steady").unwrap();
    let run = runs
        .iter()
        .find(|r| r.start == running.at_ns)
        .expect("the run");
    assert!(run.end.is_some(), "the running command finished: {runs:#?}");
    assert_eq!(runs.len(), 1, "no run after SIGTERM: {runs:#?}");
    assert!(run.end.unwrap() <= stopped_ns);
    assert_free(&url, "steady").await;
    let _ = replica;
}

/// SIGTERM with a command that outlasts the shutdown grace: it is stopped, named on stderr
/// and recorded as cut; exit 0, lock released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_cuts_a_command_that_outlasts_the_grace() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start().await;
    let url = server.url();
    let setup = Setup::new(&format!(
        r#"
shutdown_grace = "1s"
grace = "1s"
[[job]]
name = "endless"
schedule = "*/2 * * * * *"
command = {}
"#,
        logged("sleep 60", 0)
    ));
    let mut replica = setup.replica(&url, "only", &[]);
    let running = wait_for_start(&setup, Duration::from_secs(20), |_| true).await;
    let started = Instant::now();
    replica.terminate(Duration::from_secs(30)).await;
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_gone(running.pid, Duration::from_secs(5)).await;
    let stderr = replica.stderr();
    assert!(
        stderr.contains("cut") && stderr.contains("endless"),
        "stderr names the cut run: {stderr}"
    );
    assert_free(&url, "endless").await;
    let status = setup.status(&url).await;
    assert!(
        records(&status, "endless")
            .iter()
            .any(|(s, r, o)| s == &running.scheduled_at && r == "only" && o == "cut"),
        "{status:#}"
    );
}

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// `distlock status KEY` says the key is free.
async fn assert_free(url: &str, key: &str) {
    let out = finish(distlock(["status", key, "--url", url, "--json"]), PROMPT).await;
    out.expect_code(0);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["held"], false, "lock {key} released: {v}");
}

/// A second SIGTERM during the shutdown kills a command that ignores SIGTERM at once,
/// instead of waiting out the grace; every lock is released, exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_kills_the_commands_at_once() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start().await;
    let url = server.url();
    let setup = Setup::new(&format!(
        r#"
shutdown_grace = "60s"
grace = "60s"
[[job]]
name = "stubborn"
schedule = "*/2 * * * * *"
command = {}
"#,
        logged("trap '' TERM; while :; do sleep 0.1; done", 0)
    ));
    let mut replica = setup.replica(&url, "only", &[]);
    let running = wait_for_start(&setup, Duration::from_secs(20), |_| true).await;
    let started = Instant::now();
    kill(replica.pid(), libc::SIGTERM);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(common::alive(running.pid), "the command ignores SIGTERM");
    replica.terminate(Duration::from_secs(30)).await;
    assert!(started.elapsed() < Duration::from_secs(30), "no 60 s grace");
    assert_gone(running.pid, Duration::from_secs(5)).await;
    assert_free(&url, "stubborn").await;
    assert!(replica.stderr().contains("again"), "{}", replica.stderr());
}
