//! Several replicas of one schedule file on each backend, and a killed replica whose
//! lock expires.

use super::*;

/// The three-replica scenario on `url`; see the tests below.
async fn three_replicas(url: &str) {
    let _serial = SERIAL.lock().await;
    let setup = Setup::new(&format!(
        r#"
# Scheduler defaults: quick stops, a short shutdown. The hold outlasts the lateness
# bound, which keeps a replica woken late from running a fire time again.
at_least = "900ms"
lateness = "800ms"
ttl = "3s"
grace = "2s"
shutdown_grace = "10s"
history = 1000

[[job]]
name = "fast"
schedule = "* * * * * *"
command = {fast}

[[job]]
name = "slow"
schedule = "*/2 * * * * *"
on_busy = "skip"
command = {slow}

[[job]]
name = "failing"
schedule = "*/3 * * * * *"
command = {failing}
"#,
        fast = logged("true", 0),
        slow = logged("sleep 3", 0),
        failing = logged("true", 3),
    ));
    let mut replicas: Vec<Replica> = ["a", "b", "c"]
        .iter()
        .map(|n| setup.replica(url, n, &[]))
        .collect();
    tokio::time::sleep(Duration::from_secs(10)).await;
    terminate_all(&mut replicas, Duration::from_secs(30)).await;
    let lines = setup.lines();
    let runs = runs(&lines);
    let status = setup.status(url).await;
    let stderr: Vec<String> = replicas.iter().map(Replica::stderr).collect();
    let context = format!("{stderr:#?}\n{status:#}");

    // fast: every fire time once, and no second between the first and the last missing.
    let fast = runs
        .get("fast")
        .unwrap_or_else(|| panic!("fast never ran: {context}"));
    let fires: Vec<i64> = fast.iter().map(|r| epoch_secs(&r.scheduled_at)).collect();
    let distinct: BTreeSet<i64> = fires.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        fires.len(),
        "a fire time of fast ran twice: {fast:#?}\n{context}"
    );
    let (first, last) = (*distinct.first().unwrap(), *distinct.last().unwrap());
    assert!(
        last - first >= 5,
        "fast ran too few times: {fast:#?}\n{context}"
    );
    assert_eq!(
        distinct.len() as i64,
        last - first + 1,
        "a fire time of fast did not run: {fast:#?}\n{context}"
    );
    let on: BTreeSet<&str> = fast.iter().map(|r| r.replica.as_str()).collect();
    assert!(!on.is_empty());

    for (name, runs) in &runs {
        assert_no_overlap(name, runs);
    }

    // The records agree with the commands: one ok record per fast run, same replica.
    let ok_fast: BTreeSet<(String, String)> = records(&status, "fast")
        .into_iter()
        .filter(|(_, _, o)| o == "ok")
        .map(|(s, r, _)| (s, r))
        .collect();
    let ran_fast: BTreeSet<(String, String)> = fast
        .iter()
        .map(|r| (r.scheduled_at.clone(), r.replica.clone()))
        .collect();
    assert_eq!(ok_fast, ran_fast, "{context}");

    // slow: each run's overlapping fire time (2 s later, while it still ran) did not run
    // and is recorded as skipped-busy.
    let slow = &runs["slow"];
    let slow_records = records(&status, "slow");
    assert!(!slow.is_empty(), "{context}");
    for run in slow.iter().filter(|r| r.end.is_some()) {
        let next = epoch_secs(&run.scheduled_at) + 2;
        assert!(
            !slow.iter().any(|r| epoch_secs(&r.scheduled_at) == next),
            "slow ran a fire time that overlapped a run: {slow:#?}"
        );
        let skipped = slow_records
            .iter()
            .any(|(s, _, o)| epoch_secs(s) == next && o == "skipped-busy");
        let after_stop = slow_records.iter().all(|(s, _, _)| epoch_secs(s) < next);
        assert!(
            skipped || after_stop,
            "fire time {next} of slow is not recorded as skipped-busy: {slow_records:#?}"
        );
    }
    for (s, r, o) in &slow_records {
        if o == "ok" {
            assert!(
                slow.iter()
                    .any(|run| &run.scheduled_at == s && &run.replica == r),
                "an ok record of slow the commands did not write: {s} {r}"
            );
        }
    }

    // failing: every run is recorded as failed on its replica; none as ok.
    let failing = &runs["failing"];
    let failing_records = records(&status, "failing");
    assert!(!failing.is_empty(), "{context}");
    for run in failing {
        assert!(
            failing_records
                .iter()
                .any(|(s, r, o)| s == &run.scheduled_at && r == &run.replica && o == "failed"),
            "run {run:?} of failing is not recorded as failed: {failing_records:#?}"
        );
    }
    assert!(
        failing_records.iter().all(|(_, _, o)| o != "ok"),
        "{failing_records:#?}"
    );
    assert_eq!(job(&status, "failing")["last_success"], Value::Null);

    // last success and next fire time.
    let last_fast = &job(&status, "fast")["last_success"];
    let newest = fast
        .iter()
        .max_by_key(|r| epoch_secs(&r.scheduled_at))
        .unwrap();
    assert_eq!(
        last_fast["scheduled_at"],
        newest.scheduled_at.as_str(),
        "{status:#}"
    );
    let next: jiff::Timestamp = job(&status, "fast")["next_fire"]
        .as_str()
        .expect("next_fire")
        .parse()
        .unwrap();
    assert!(next > jiff::Timestamp::now() - jiff::SignedDuration::from_secs(2));
}

/// Three replicas of one file on Redis: the fast job's every fire time runs exactly once,
/// runs of a job never overlap, the slow job's overlapped fire times are skipped-busy, the
/// failing job's runs are failed, and `cron status` agrees with what the commands wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_on_redis() {
    let server = RedisServer::start().await;
    three_replicas(&server.url()).await;
}

/// The same on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_on_postgres() {
    let server = PostgresServer::start().await;
    three_replicas(&server.url()).await;
}

/// The same on etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_on_etcd() {
    let server = EtcdServer::start().await;
    three_replicas(&format!("etcd://{}", server.addr())).await;
}

/// A replica killed with SIGKILL in the middle of a run: its lock expires within the TTL
/// and the next fire time runs on another replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replica_s_lock_expires_and_another_runs_the_next_fire_time() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start().await;
    let url = server.url();
    // Every 4 s a run of 3 s; the TTL of 2 s runs out before the next fire time.
    let setup = Setup::new(&format!(
        r#"
ttl = "2s"
at_least = "600ms"
[[job]]
name = "long"
schedule = "*/4 * * * * *"
command = {}
"#,
        logged("sleep 3", 0)
    ));
    let mut replicas: Vec<Replica> = ["a", "b", "c"]
        .iter()
        .map(|n| setup.replica(&url, n, &[]))
        .collect();
    let first = wait_for_start(&setup, Duration::from_secs(20), |_| true).await;
    let victim = replicas
        .iter_mut()
        .find(|r| r.name == first.replica)
        .unwrap();
    let status = victim.stop(libc::SIGKILL, PROMPT).await;
    assert_eq!(status.code(), None, "killed");
    let killed_at = Instant::now();
    // The command died with its distlock (its parent-death signal).
    assert_gone(first.pid, Duration::from_secs(5)).await;

    let next_fire = epoch_secs(&first.scheduled_at) + 4;
    let next = wait_for_start(&setup, Duration::from_secs(20), |l| {
        epoch_secs(&l.scheduled_at) > epoch_secs(&first.scheduled_at)
    })
    .await;
    assert_ne!(next.replica, first.replica);
    assert_eq!(
        epoch_secs(&next.scheduled_at),
        next_fire,
        "the fire time after the kill ran (lock expired within the TTL): {:#?}",
        setup.lines()
    );
    assert!(killed_at.elapsed() < Duration::from_secs(15));
    replicas.retain(|r| r.child.is_some());
    terminate_all(&mut replicas, Duration::from_secs(30)).await;
}
