//! `distlock cron` against real lock servers (lock-testkit): several replicas of one
//! schedule file, each fire time run once, overlaps skipped, failures recorded, a killed
//! replica's lock expiring, graceful shutdown, clock skew against `at_least`, bad files,
//! and the metrics endpoint.
//!
//! Every command appends `JOB SCHEDULED_AT REPLICA start|end NS` lines to one log file, so
//! the checks read what the commands themselves saw, then compare it with the run records
//! (`distlock cron status --json`) and the metrics.
#![cfg(all(feature = "redis", feature = "postgres", feature = "redlock"))]

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{assert_gone, distlock, finish, free_port, kill, scrape, PROMPT};
use lock_testkit::{EtcdServer, PostgresServer, RedisServer};
use serde_json::Value;
use tokio::process::{Child, Command};

/// The heavy scenarios run one at a time: three replicas each on a loaded 2-core machine
/// are enough load; two scenarios at once would only test the machine.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A schedule file and the log its commands append to, in a fresh directory.
struct Setup {
    dir: tempfile::TempDir,
    file: PathBuf,
    log: PathBuf,
}

impl Setup {
    /// `text` with `{log}` replaced by the log's path.
    fn new(text: &str) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("jobs.toml");
        let log = dir.path().join("log");
        std::fs::write(&file, text.replace("{log}", &log.display().to_string())).unwrap();
        Setup { dir, file, log }
    }

    /// Starts `distlock cron FILE --url URL --replica NAME EXTRA…`.
    fn replica(&self, url: &str, name: &str, extra: &[&str]) -> Replica {
        let out = self.dir.path().join(format!("{name}.out"));
        let err = self.dir.path().join(format!("{name}.err"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_distlock"));
        cmd.arg("cron")
            .arg(&self.file)
            .args(["--url", url, "--replica", name])
            .args(extra)
            .env_remove("DISTLOCK_URL")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .kill_on_drop(true);
        Replica {
            name: name.to_owned(),
            child: Some(cmd.spawn().expect("spawn distlock cron")),
            err,
        }
    }

    /// What the commands wrote so far.
    fn lines(&self) -> Vec<Line> {
        read_log(&self.log)
    }

    /// `distlock cron status FILE --url URL --json --last 1000`.
    async fn status(&self, url: &str) -> Value {
        let out = finish(
            distlock([
                "cron".as_ref(),
                "status".as_ref(),
                self.file.as_os_str(),
                "--url".as_ref(),
                url.as_ref(),
                "--json".as_ref(),
                "--last".as_ref(),
                "1000".as_ref(),
            ]),
            PROMPT,
        )
        .await;
        out.expect_code(0);
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:#?}"))
    }
}

/// One `distlock cron` process.
struct Replica {
    name: String,
    child: Option<Child>,
    err: PathBuf,
}

impl Replica {
    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id().expect("running")
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Sends `sig` and waits (up to `limit`) for the exit status.
    async fn stop(&mut self, sig: i32, limit: Duration) -> std::process::ExitStatus {
        kill(self.pid(), sig);
        let mut child = self.child.take().unwrap();
        tokio::time::timeout(limit, child.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "replica {} did not exit within {limit:?}: {}",
                    self.name,
                    self.stderr()
                )
            })
            .unwrap()
    }

    /// SIGTERM; it must exit 0 within `limit`.
    async fn terminate(&mut self, limit: Duration) {
        let status = self.stop(libc::SIGTERM, limit).await;
        assert_eq!(
            status.code(),
            Some(0),
            "replica {} after SIGTERM: {status:?}\n{}",
            self.name,
            self.stderr()
        );
    }
}

/// SIGTERM to every replica at once (a shutdown releases its at-least holds, so replicas
/// stopped one after another could let a late one run a fire time the first had run),
/// then each must exit 0 within `limit`.
async fn terminate_all(replicas: &mut [Replica], limit: Duration) {
    for r in replicas.iter() {
        kill(r.pid(), libc::SIGTERM);
    }
    for r in replicas.iter_mut() {
        let mut child = r.child.take().unwrap();
        let status = tokio::time::timeout(limit, child.wait())
            .await
            .unwrap_or_else(|_| panic!("replica {} did not exit within {limit:?}", r.name))
            .unwrap();
        assert_eq!(
            status.code(),
            Some(0),
            "replica {} after SIGTERM: {status:?}\n{}",
            r.name,
            r.stderr()
        );
    }
}

/// One line of the log.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Line {
    job: String,
    scheduled_at: String,
    replica: String,
    start: bool,
    at_ns: u128,
    pid: i32,
}

fn read_log(path: &Path) -> Vec<Line> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        // A line being written has no newline yet; lines() would show its part: only
        // complete lines end in the pid written last.
        .filter(|l| l.split(' ').count() == 6)
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Line {
                job: f[0].to_owned(),
                scheduled_at: f[1].to_owned(),
                replica: f[2].to_owned(),
                start: match f[3] {
                    "start" => true,
                    "end" => false,
                    other => panic!("bad log line {l:?} ({other})"),
                },
                at_ns: f[4].parse().expect("a timestamp"),
                pid: f[5].parse().expect("a pid"),
            }
        })
        .collect()
}

/// `command = [...]` for a job that logs its start, runs `body` (shell), logs its end
/// and exits `code`.
fn logged(body: &str, code: i32) -> String {
    let line = |what: &str| {
        format!(
            "echo \\\"$DISTLOCK_JOB $DISTLOCK_SCHEDULED_AT $DISTLOCK_REPLICA {what} \
             $(date +%s%N) $$\\\" >> {{log}}"
        )
    };
    format!(
        "[\"sh\", \"-c\", \"{}; {body}; {}; exit {code}\"]",
        line("start"),
        line("end")
    )
}

/// A run as the commands saw it: fire time, replica, start and end (ns since the epoch).
#[derive(Clone, Debug)]
struct Run {
    scheduled_at: String,
    replica: String,
    start: u128,
    end: Option<u128>,
}

/// Per job, its runs in start order, pairing each start with the end of the same process.
fn runs(lines: &[Line]) -> BTreeMap<String, Vec<Run>> {
    let mut by_job: BTreeMap<String, Vec<Run>> = BTreeMap::new();
    let ends: HashMap<i32, u128> = lines
        .iter()
        .filter(|l| !l.start)
        .map(|l| (l.pid, l.at_ns))
        .collect();
    for l in lines.iter().filter(|l| l.start) {
        by_job.entry(l.job.clone()).or_default().push(Run {
            scheduled_at: l.scheduled_at.clone(),
            replica: l.replica.clone(),
            start: l.at_ns,
            end: ends.get(&l.pid).copied(),
        });
    }
    for runs in by_job.values_mut() {
        runs.sort_by_key(|r| r.start);
    }
    by_job
}

/// The fire time's seconds since the epoch (`2026-01-02T03:04:05Z`).
fn epoch_secs(rfc3339: &str) -> i64 {
    let t: jiff::Timestamp = rfc3339
        .parse()
        .unwrap_or_else(|e| panic!("DISTLOCK_SCHEDULED_AT {rfc3339:?}: {e}"));
    assert!(
        rfc3339.ends_with('Z'),
        "DISTLOCK_SCHEDULED_AT is in UTC: {rfc3339}"
    );
    t.as_second()
}

/// The `jobs[]` entry named `name` in a status document.
fn job<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .find(|j| j["name"] == name)
        .unwrap_or_else(|| panic!("no job {name} in {status}"))
}

/// `(scheduled_at, replica, outcome)` of every run record of a job.
fn records(status: &Value, name: &str) -> Vec<(String, String, String)> {
    job(status, name)["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| {
            (
                r["scheduled_at"].as_str().unwrap().to_owned(),
                r["replica"].as_str().unwrap().to_owned(),
                r["outcome"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Runs of one job never overlap: each starts after the previous one ended.
fn assert_no_overlap(name: &str, runs: &[Run]) {
    for pair in runs.windows(2) {
        let end = pair[0]
            .end
            .unwrap_or_else(|| panic!("{name}: a run did not end before the next: {runs:#?}"));
        assert!(
            pair[1].start >= end,
            "{name}: runs overlap: {:?} then {:?}",
            pair[0],
            pair[1]
        );
    }
}

/// Sleeps until the log shows `n` complete runs of `job`, or panics after `limit`.
async fn wait_for_runs(setup: &Setup, job: &str, n: usize, limit: Duration) -> Vec<Run> {
    let deadline = Instant::now() + limit;
    loop {
        let runs = runs(&setup.lines()).remove(job).unwrap_or_default();
        if runs.iter().filter(|r| r.end.is_some()).count() >= n {
            return runs;
        }
        assert!(
            Instant::now() < deadline,
            "{job} did not run {n} times within {limit:?}: {runs:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sleeps until the log has a start line matching `pred`, or panics after `limit`.
async fn wait_for_start(setup: &Setup, limit: Duration, pred: impl Fn(&Line) -> bool) -> Line {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(l) = setup.lines().into_iter().find(|l| l.start && pred(l)) {
            return l;
        }
        assert!(
            Instant::now() < deadline,
            "no matching start within {limit:?}: {:#?}",
            setup.lines()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

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
    // The orphaned command is not ours to wait for.
    kill(first.pid as u32, libc::SIGKILL);

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

/// Three replicas on one Redis server, with clocks 0, 6 s behind and 5 s ahead of the
/// server's, one job every 3 s (the replica ahead by more than the period goes by the
/// server's clock, which its claims measure, so it never claims a fire time before the
/// earlier ones): each fire time runs exactly once, never before the fire time on the
/// server's (here the real) clock and within its lateness bound; the replicas that lost a
/// claim write no record of it, and each record carries its replica's clock offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_offsets_leave_each_fire_time_to_one_run_on_time() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start().await;
    let url = server.url();
    let setup = Setup::new(&format!(
        r#"
history = 1000
grace = "1s"
[[job]]
name = "tick"
schedule = "every 3s"
command = {}
"#,
        logged("true", 0)
    ));
    let mut replicas = [
        setup.replica(&url, "on-time", &["--clock-offset", "0s"]),
        setup.replica(&url, "behind", &["--clock-offset", "-6s"]),
        setup.replica(&url, "ahead", &["--clock-offset", "+5s"]),
    ];
    tokio::time::sleep(Duration::from_secs(26)).await;
    terminate_all(&mut replicas, Duration::from_secs(30)).await;
    let lines = setup.lines();
    let runs = runs(&lines).remove("tick").unwrap_or_default();
    let status = setup.status(&url).await;
    let stderr: Vec<String> = replicas.iter().map(Replica::stderr).collect();
    let context = format!("{runs:#?}\n{stderr:#?}\n{status:#}");
    let fires: Vec<i64> = runs.iter().map(|r| epoch_secs(&r.scheduled_at)).collect();
    let distinct: BTreeSet<i64> = fires.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        fires.len(),
        "a fire time ran twice: {context}"
    );
    let (first, last) = (*distinct.first().unwrap(), *distinct.last().unwrap());
    assert!(last - first >= 14, "too few runs: {context}");
    assert_eq!(
        distinct.len() as i64,
        (last - first) / 3 + 1,
        "a fire time did not run: {context}"
    );
    for run in &runs {
        let fire_ns = epoch_secs(&run.scheduled_at) as u128 * 1_000_000_000;
        // The claim's answer places the server's clock at the middle of a loopback round
        // trip: a few milliseconds of slack.
        assert!(
            run.start + 20_000_000 >= fire_ns,
            "a run started before its fire time: {run:?}\n{context}"
        );
        // The default lateness for 3 s is 750 ms; the command's start follows the grant.
        assert!(
            run.start < fire_ns + 4_000_000_000,
            "a run started late: {run:?}\n{context}"
        );
    }
    // One ok record per run, on its replica; a replica waiting for the server's clock to
    // reach a fire time it claimed when the shutdown came records it skipped-busy.
    let ok: BTreeSet<(String, String)> = records(&status, "tick")
        .into_iter()
        .filter(|(_, _, o)| o == "ok")
        .map(|(s, r, _)| (s, r))
        .collect();
    let ran: BTreeSet<(String, String)> = runs
        .iter()
        .map(|r| (r.scheduled_at.clone(), r.replica.clone()))
        .collect();
    assert_eq!(ok, ran, "{context}");
    // Each record says how far its replica's clock was from the server's.
    for r in job(&status, "tick")["runs"].as_array().expect("runs") {
        let expected = match r["replica"].as_str().unwrap() {
            "behind" => -6000,
            "ahead" => 5000,
            _ => 0,
        };
        let offset = r["clock_offset_ms"]
            .as_i64()
            .unwrap_or_else(|| panic!("a record without the offset: {r}\n{context}"));
        assert!(
            (offset - expected).abs() < 300,
            "offset {offset} ms of {r}: {context}"
        );
    }
}

/// Bad files: exit 64 with one line naming the job and the field, and nothing runs.
#[tokio::test]
async fn bad_files_are_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let good = format!(
        "[[job]]\nname = \"good\"\nschedule = \"* * * * * *\"\ncommand = [\"touch\", \"{}\"]\n",
        marker.display()
    );
    let cases: &[(&str, &str)] = &[
        (
            "[[job]]\nname = \"tz\"\nschedule = \"* * * * * *\"\ntime_zone = \"Mars/Olympus\"\ncommand = [\"true\"]\n",
            "job \"tz\", field `time_zone`",
        ),
        (
            "[[job]]\nname = \"sched\"\nschedule = \"61 * * * * *\"\ncommand = [\"true\"]\n",
            "job \"sched\", field `schedule`",
        ),
        (
            "[[job]]\nname = \"cmd\"\nschedule = \"* * * * * *\"\ncommand = \"true\"\n",
            "job \"cmd\", field `command`",
        ),
        (
            "[[job]]\nname = \"typo\"\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\ntimout = \"1s\"\n",
            "job \"typo\", field `timout`: unknown field",
        ),
        (
            "[[job]]\nname = \"dur\"\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\ntimeout = \"soon\"\n",
            "job \"dur\", field `timeout`",
        ),
        (
            "[[job]]\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\n",
            "job #2, field `name`: missing",
        ),
        (
            "[[job]]\nname = \"late\"\nschedule = \"every 10s\"\nat_least = \"2s\"\nlateness = \"2s\"\ncommand = [\"true\"]\n",
            "job \"late\", field `lateness`: lateness 2s is not below at_least 2s",
        ),
        (
            "[[job]]\nname = \"long\"\nschedule = \"every 10s\"\nlateness = \"5s\"\ncommand = [\"true\"]\n",
            "job \"long\", field `lateness`: lateness 5s is not below at_least 5s (the default",
        ),
        (
            "[[job]]\nname = \"tiny\"\nschedule = \"every 10s\"\nlateness = \"5ms\"\ncommand = [\"true\"]\n",
            "job \"tiny\", field `lateness`: 5ms is shorter than a lock round trip",
        ),
        (
            "[[job]]\nname = \"sub\"\nschedule = \"every 500ms\"\ncommand = [\"true\"]\n",
            "job \"sub\", field `schedule`: `every 500ms` is shorter than one second",
        ),
        (
            "[[job]]\nname = \"months\"\nschedule = \"every 5M\"\ncommand = [\"true\"]\n",
            "job \"months\", field `schedule`: `every 5M` counts in months or years",
        ),
        (
            "[[job]]\nname = \"zoned\"\nschedule = \"every 1m\"\ntime_zone = \"Europe/Berlin\"\ncommand = [\"true\"]\n",
            "job \"zoned\", field `time_zone`: an `every` schedule does not depend on the time zone",
        ),
        ("time_zone = \"Nowhere/Land\"\n", "field `time_zone`"),
        ("[[job]\nname = \"x\"\n", "line 1"),
    ];
    for (i, (text, expected)) in cases.iter().enumerate() {
        // Top-level settings must come first; the good job goes after them.
        let text = if text.starts_with("[[job]]") {
            format!("{good}\n{text}")
        } else {
            format!("{text}\n{good}")
        };
        let file = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(&file, &text).unwrap();
        let out = finish(
            distlock([
                "cron".as_ref(),
                file.as_os_str(),
                "--url".as_ref(),
                "memory://".as_ref(),
            ]),
            PROMPT,
        )
        .await;
        out.expect_code(64).expect_stderr(expected);
        assert_eq!(out.stderr.lines().count(), 1, "one line: {out:#?}\n{text}");
        assert!(
            out.stderr.contains(&file.display().to_string()),
            "names the file: {out:#?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!marker.exists(), "a job ran although the file was bad");
}

/// `name{labels} value` samples of a Prometheus text exposition, keyed by `name{labels}`.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

/// The metrics endpoint serves the Prometheus text format, and its run counters per job
/// and outcome match the run records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_counters_match_the_run_records() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start().await;
    let url = server.url();
    let setup = Setup::new(&format!(
        r#"
history = 1000
at_least = "600ms"
[[job]]
name = "good"
schedule = "*/2 * * * * *"
command = {}
[[job]]
name = "bad"
schedule = "*/2 * * * * *"
command = {}
[[job]]
name = "busy"
schedule = "* * * * * *"
command = {}
"#,
        logged("true", 0),
        logged("true", 1),
        logged("sleep 1.5", 0),
    ));
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut replica = setup.replica(&url, "only", &["--metrics-addr", &addr]);
    wait_for_runs(&setup, "good", 2, Duration::from_secs(20)).await;
    wait_for_runs(&setup, "busy", 2, Duration::from_secs(20)).await;
    // A scrape, the records, and a second scrape equal to the first: nothing ended between
    // (a record is written just after its counter moves, so one try may see it in between).
    let mut last = None;
    let mut matched = false;
    for _ in 0..20 {
        let Some(before_text) = scrape(port).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let status = setup.status(&url).await;
        let after = scrape(port).await.expect("the endpoint answers");
        let (before, after) = (runs_counters(&before_text), runs_counters(&after));
        let mut from_records: BTreeMap<(String, String), f64> = BTreeMap::new();
        for name in ["good", "bad", "busy"] {
            for (_, _, outcome) in records(&status, name) {
                // Records keep `skipped-busy`; metric labels are snake_case.
                let label = outcome.replace('-', "_");
                *from_records.entry((name.to_owned(), label)).or_default() += 1.0;
            }
        }
        if before == after && before == from_records {
            matched = true;
            let count = |job: &str, outcome: &str| {
                before
                    .get(&(job.to_owned(), outcome.to_owned()))
                    .copied()
                    .unwrap_or(0.0)
            };
            assert!(count("good", "ok") >= 2.0, "{before:?}");
            assert!(count("bad", "failed") >= 1.0, "{before:?}");
            assert!(count("busy", "ok") >= 2.0, "{before:?}");
            // The skip counter counts the skipped-busy records; the last-success gauge is
            // the end of the newest ok record.
            let samples = samples(&before_text);
            for job in ["good", "bad", "busy"] {
                let skips = samples
                    .get(&format!("distlock_scheduler_skips_total{{job=\"{job}\"}}"))
                    .copied()
                    .unwrap_or(0.0);
                assert_eq!(skips, count(job, "skipped_busy"), "{job}: {before_text}");
            }
            // Run durations are a histogram with buckets up to a day (they aggregate across
            // replicas), never a summary.
            let bucket = r#"distlock_scheduler_run_duration_seconds_bucket{job="good",outcome="ok",le="86400"}"#;
            assert!(
                samples.get(bucket).copied().unwrap_or(0.0) >= 2.0,
                "{before_text}"
            );
            assert!(!before_text.contains("quantile="), "{before_text}");
            let gauge = samples["distlock_scheduler_last_success_timestamp_seconds{job=\"good\"}"];
            let ended: jiff::Timestamp = job(&status, "good")["last_success"]["ended_at"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!(
                (gauge - ended.as_millisecond() as f64 / 1000.0).abs() < 0.002,
                "last success gauge {gauge} vs record {ended}"
            );
            break;
        }
        last = Some((before, after, from_records));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        matched,
        "the counters never matched the records (before, after, records): {last:#?}"
    );
    replica.terminate(Duration::from_secs(30)).await;
}

/// The run counters of a scrape: `(job, outcome) -> count`, zeros left out.
fn runs_counters(text: &str) -> BTreeMap<(String, String), f64> {
    samples(text)
        .into_iter()
        .filter(|(k, v)| k.starts_with(RUNS_METRIC) && *v > 0.0)
        .map(|(k, v)| {
            let label = |name: &str| {
                let start = k.find(&format!("{name}=\"")).expect("label") + name.len() + 2;
                let end = start + k[start..].find('"').unwrap();
                k[start..end].to_owned()
            };
            ((label("job"), label("outcome")), v)
        })
        .collect()
}

/// The counter of finished fire times, by job and outcome (the scheduler's name).
const RUNS_METRIC: &str = "distlock_scheduler_runs_total{";

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
        if let Some((_, r, o)) = recs.iter().find(|(s, _, _)| s == &running.scheduled_at) {
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
        if let Some((_, _, o)) = recs.iter().find(|(s, _, _)| s == &running.scheduled_at) {
            assert_eq!(o, "lock-lost", "{status:#}");
            break;
        }
        assert!(Instant::now() < deadline, "no record: {status:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    replica.terminate(Duration::from_secs(30)).await;
}

/// A grace longer than the TTL and a program not on PATH are warnings naming the file, the
/// job and the field: the file still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grace_above_the_ttl_and_a_missing_program_are_warnings() {
    let setup = Setup::new(
        r#"
grace = "5s"
[[job]]
name = "quick"
schedule = "every 10s"
ttl = "2s"
command = ["true"]
[[job]]
name = "absent"
schedule = "every 1h"
command = ["no-such-program-distlock-test"]
"#,
    );
    let mut replica = setup.replica("memory://", "only", &[]);
    let deadline = Instant::now() + PROMPT;
    while !replica.stderr().contains("cron: 2 job(s)") {
        assert!(
            Instant::now() < deadline,
            "did not start: {}",
            replica.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    replica.terminate(Duration::from_secs(30)).await;
    let stderr = replica.stderr();
    let file = setup.file.display().to_string();
    for needle in [
        format!("warning: {file}: job \"quick\", field `grace`: the grace 5s"),
        "longer than the lock's TTL 2s".to_owned(),
        format!("warning: {file}: job \"absent\", field `command`: `no-such-program-distlock-test` is not found on PATH"),
    ] {
        assert!(stderr.contains(&needle), "{needle:?} in {stderr}");
    }
}

/// Without --url or DISTLOCK_URL, `distlock cron` refuses to start (every replica would run
/// every job): exit 64, one line saying how to ask for one process explicitly.
#[tokio::test]
async fn no_url_is_refused_and_memory_must_be_asked_for() {
    let setup =
        Setup::new("[[job]]\nname = \"j\"\nschedule = \"every 1h\"\ncommand = [\"true\"]\n");
    let out = finish(distlock(["cron".as_ref(), setup.file.as_os_str()]), PROMPT).await;
    out.expect_code(64)
        .expect_stderr("every replica would run every job")
        .expect_stderr("--url memory://");
    assert_eq!(out.stderr.lines().count(), 1, "{out:#?}");
}

/// Redlock keeps no fire-time claims: the scheduler's refusal is one line, exit 69.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_is_refused_in_one_line() {
    let nodes = lock_testkit::RedisNodes::start(3).await;
    let hosts: Vec<String> = nodes.addrs().iter().map(|a| a.to_string()).collect();
    let url = format!("redlock://{}", hosts.join(","));
    let setup =
        Setup::new("[[job]]\nname = \"j\"\nschedule = \"every 1h\"\ncommand = [\"true\"]\n");
    let out = finish(
        distlock([
            "cron".as_ref(),
            setup.file.as_os_str(),
            "--url".as_ref(),
            url.as_ref(),
        ]),
        PROMPT,
    )
    .await;
    out.expect_code(69)
        .expect_stderr("the redlock backend cannot keep fire-time claims");
    assert_eq!(out.stderr.lines().count(), 1, "{out:#?}");
}
