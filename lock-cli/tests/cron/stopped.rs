//! Commands stopped mid-run, past their timeout or on a lost lock, and recorded so.

use super::*;

/// A command running past its `timeout` is stopped (SIGTERM to its group) and the run is
/// recorded timed-out; the lock is held until the command is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_past_its_timeout_is_stopped_and_recorded_timed_out() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start().await;
    let url = server.url();
    let setup = Setup::new(&format!(
        r#"
grace = "2s"
[[job]]
name = "slowpoke"
schedule = "*/5 * * * * *"
timeout = "1s"
command = {}
"#,
        logged("sleep 60", 0)
    ));
    let mut replica = setup.replica(&url, "only", &[]);
    let running = wait_for_start(&setup, Duration::from_secs(20), |_| true).await;
    assert_gone(running.pid, Duration::from_secs(10)).await;
    // The record is written once the scheduler's own deadline (timeout + grace + 1 s)
    // has passed.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = setup.status(&url).await;
        let recs = records(&status, "slowpoke");
        if let Some((_, r, o)) = recs
            .iter()
            .find(|(s, _, o)| s == &running.scheduled_at && o != "running")
        {
            assert_eq!(
                (r.as_str(), o.as_str()),
                ("only", "timed-out"),
                "{status:#}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "no record: {status:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(replica.stderr().contains("timeout"), "{}", replica.stderr());
    replica.terminate(Duration::from_secs(30)).await;
}

/// The lock taken away behind the replica's back (deleted on the server) while the
/// command runs: the command is stopped and the run recorded lock-lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_stops_the_command_and_is_recorded_lock_lost() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start().await;
    let url = server.url();
    let setup = Setup::new(&format!(
        r#"
ttl = "1500ms"
grace = "2s"
[[job]]
name = "doomed"
schedule = "*/5 * * * * *"
command = {}
"#,
        logged("sleep 60", 0)
    ));
    let mut replica = setup.replica(&url, "only", &[]);
    let running = wait_for_start(&setup, Duration::from_secs(20), |_| true).await;
    let mut conn = server.client().await;
    let deleted: i64 = redis::cmd("DEL")
        .arg("distlock:{doomed}")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(deleted, 1, "the lock's key");
    assert_gone(running.pid, Duration::from_secs(10)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = setup.status(&url).await;
        let recs = records(&status, "doomed");
        if let Some((_, _, o)) = recs
            .iter()
            .find(|(s, _, o)| s == &running.scheduled_at && o != "running")
        {
            assert_eq!(o, "lock-lost", "{status:#}");
            break;
        }
        assert!(Instant::now() < deadline, "no record: {status:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    replica.terminate(Duration::from_secs(30)).await;
}
