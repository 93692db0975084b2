//! `distlock cron` against real lock servers (lock-testkit): several replicas of one
//! schedule file, each fire time run once, overlaps skipped, failures recorded, a killed
//! replica's lock expiring, graceful shutdown, clock skew against `at_least`, bad files,
//! the metrics endpoint, and the commands' processes (stdin, output, environment, process
//! group, death with distlock, PID 1).
//!
//! Every command appends `JOB SCHEDULED_AT REPLICA start|end NS` lines to one log file, so
//! the checks read what the commands themselves saw, then compare it with the run records
//! (`distlock cron status --json`) and the metrics.
#![cfg(all(feature = "redis", feature = "postgres", feature = "redlock"))]

#[path = "../common/mod.rs"]
mod common;

mod clocks;
mod config;
mod journal;
mod metrics;
mod processes;
mod replicas;
mod shutdown;
mod stopped;

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
    job(status, name)["fire_times"]
        .as_array()
        .expect("fire_times")
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
