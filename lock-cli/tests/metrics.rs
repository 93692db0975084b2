//! The lock's metrics in the command: `distlock run --metrics-addr` serves them while the
//! command runs (scraped here, on memory:// and on a real redis-server from lock-testkit)
//! and `distlock bench --metrics` shows them in its report; the counts match what the
//! process did, and the key never appears. The scheduler's, served by `distlock cron
//! --metrics-addr`, and the README's alert rule evaluated on them: `metrics/scheduler.rs`.

mod common;
#[path = "metrics/promql.rs"]
mod promql;
#[path = "metrics/scheduler.rs"]
mod scheduler;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::{distlock, finish, free_port, read_when_written, run_args, scrape, PROMPT};
use serde_json::Value;

/// Scrapes until the endpoint answers (it listens before distlock connects).
async fn scrape_now(port: u16) -> String {
    for _ in 0..100 {
        if let Some(body) = scrape(port).await {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the metrics endpoint on port {port} does not answer");
}

/// `name{labels}` → value of a Prometheus text exposition.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

fn value(samples: &BTreeMap<String, f64>, series: &str) -> f64 {
    samples.get(series).copied().unwrap_or(0.0)
}

/// The sum over the series of `name` (any labels).
fn total(samples: &BTreeMap<String, f64>, name: &str) -> f64 {
    samples
        .iter()
        .filter(|(k, _)| k.starts_with(&format!("{name}{{")) || *k == name)
        .map(|(_, v)| v)
        .sum()
}

/// A command that says it started, then runs until `stop` exists; on SIGTERM it says so
/// (`term`) and still waits for `stop` (so that distlock's endpoint can be scraped after a loss).
fn waiting_script(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "trap 'touch {d}/term; while [ ! -e {d}/stop ]; do sleep 0.02; done; exit 0' TERM; \
         echo started > {d}/started; while [ ! -e {d}/stop ]; do sleep 0.02; done"
    )
}

/// `run --metrics-addr` on memory:// serves, while the command runs, one granted
/// acquisition, described, as a histogram with buckets, labelled with the backend and not
/// with the key; a bad address exits 64.
#[tokio::test]
async fn run_serves_the_lock_metrics_while_the_command_runs() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let child = distlock(run_args(
        "memory://",
        "payroll/secret-customer",
        &["--metrics-addr", &addr],
        &waiting_script(dir.path()),
    ))
    .spawn()
    .unwrap();
    read_when_written(&dir.path().join("started"), PROMPT).await;
    let text = scrape_now(port).await;
    let s = samples(&text);
    let granted =
        r#"distlock_lock_acquire_duration_seconds_count{backend="memory",outcome="granted"}"#;
    assert_eq!(value(&s, granted), 1.0, "{text}");
    assert_eq!(
        total(&s, "distlock_lock_acquire_duration_seconds_count"),
        1.0,
        "one acquisition: {text}"
    );
    // It did not wait, lose, fail or hand over anything; the hold is not over yet.
    for name in [
        "distlock_lock_wait_duration_seconds_count",
        "distlock_lock_hold_duration_seconds_count",
        "distlock_lock_lost_total",
        "distlock_lock_renewals_failed_total",
        "distlock_lock_handovers_total",
        "distlock_lock_errors_total",
    ] {
        assert_eq!(total(&s, name), 0.0, "{name}: {text}");
    }
    assert!(
        text.contains("# TYPE distlock_lock_acquire_duration_seconds histogram")
            && text.contains("# HELP distlock_lock_acquire_duration_seconds"),
        "{text}"
    );
    // A histogram with buckets from 0.5 ms to 60 s (cumulative: the one acquisition is in
    // each), never a summary's quantiles, which cannot be aggregated across processes.
    for le in ["0.0005", "0.001", "1", "60", "+Inf"] {
        let bucket = format!(
            r#"distlock_lock_acquire_duration_seconds_bucket{{backend="memory",outcome="granted",le="{le}"}}"#
        );
        assert_eq!(value(&s, &bucket), 1.0, "{bucket}: {text}");
    }
    assert!(!text.contains("quantile="), "{text}");
    assert!(
        !text.contains("secret-customer"),
        "the key is never a label: {text}"
    );
    std::fs::write(dir.path().join("stop"), "").unwrap();
    let out = common::collect(child, std::time::Instant::now(), PROMPT).await;
    out.expect_code(0);

    let bad = finish(
        distlock(run_args(
            "memory://",
            "k",
            &["--metrics-addr", "nonsense"],
            "true",
        )),
        PROMPT,
    )
    .await;
    bad.expect_code(64).expect_stderr("invalid --metrics-addr");
}

/// On Redis, scraped while distlock waits for a lock held by another `run`, after the grant
/// (one granted acquisition that waited), and after the lock was deleted behind its back
/// while the command runs (one lost lock, one failed renewal, one `not_held` error).
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_metrics_count_a_wait_and_a_loss_on_redis() {
    use common::Sleeper;
    use lock_testkit::RedisServer;

    let server = RedisServer::start().await;
    let url = server.url();
    let holder = Sleeper::start(&url, "nightly", &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut redis = server.client().await;
    let before = script_calls(&mut redis).await;
    let child = distlock(run_args(
        &url,
        "nightly",
        &[
            "--metrics-addr",
            &addr,
            "--wait",
            "15s",
            "--ttl",
            "900ms",
            "--grace",
            "10s",
        ],
        &waiting_script(dir.path()),
    ))
    .spawn()
    .unwrap();
    // The holder is released only once the waiting run has tried the lock (a script call
    // beyond the holder's: it renews only after 10 s): before that, on a loaded machine, the
    // run could find the lock free at its first attempt and never wait.
    let asked = std::time::Instant::now();
    while script_calls(&mut redis).await <= before {
        assert!(
            asked.elapsed() < Duration::from_secs(10),
            "the waiting run never tried the lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Waiting: nothing answered yet, no error (refused attempts are not errors).
    let waiting = samples(&scrape_now(port).await);
    assert_eq!(
        total(&waiting, "distlock_lock_acquire_duration_seconds_count"),
        0.0,
        "{waiting:?}"
    );
    assert_eq!(
        total(&waiting, "distlock_lock_errors_total"),
        0.0,
        "{waiting:?}"
    );
    holder.terminate().await;
    read_when_written(&dir.path().join("started"), PROMPT).await;
    let text = scrape_now(port).await;
    let granted = samples(&text);
    for name in [
        "distlock_lock_acquire_duration_seconds_count",
        "distlock_lock_wait_duration_seconds_count",
    ] {
        let series = format!(r#"{name}{{backend="redis",outcome="granted"}}"#);
        assert_eq!(value(&granted, &series), 1.0, "{series}: {text}");
        assert_eq!(total(&granted, name), 1.0, "{name}: {text}");
    }
    assert!(
        !text.contains("nightly"),
        "the key is never a label: {text}"
    );

    let mut redis = server.client().await;
    let deleted: i64 = redis::cmd("DEL")
        .arg("distlock:{nightly}")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(deleted, 1, "the lock key should exist");
    // distlock notices at its next renewal and sends SIGTERM, which the command waits out.
    read_when_written_or_exists(&dir.path().join("term")).await;
    let text = scrape_now(port).await;
    let lost = samples(&text);
    let one = |series: &str| assert_eq!(value(&lost, series), 1.0, "{series}: {text}");
    one(r#"distlock_lock_lost_total{backend="redis"}"#);
    one(r#"distlock_lock_renewals_failed_total{backend="redis"}"#);
    one(r#"distlock_lock_errors_total{backend="redis",kind="not_held"}"#);
    one(r#"distlock_lock_hold_duration_seconds_count{backend="redis"}"#);
    // Holds take the long buckets (up to a day), latencies the short ones (up to 60 s).
    one(r#"distlock_lock_hold_duration_seconds_bucket{backend="redis",le="86400"}"#);
    assert!(
        !text
            .contains(r#"distlock_lock_hold_duration_seconds_bucket{backend="redis",le="0.0005"}"#),
        "{text}"
    );
    assert_eq!(total(&lost, "distlock_lock_errors_total"), 1.0, "{text}");
    std::fs::write(dir.path().join("stop"), "").unwrap();
    let out = common::collect(child, std::time::Instant::now(), PROMPT).await;
    out.expect_code(76);
}

/// Waits until `path` exists (an empty marker file); panics after [`PROMPT`].
#[cfg(feature = "redis")]
async fn read_when_written_or_exists(path: &Path) {
    let deadline = std::time::Instant::now() + PROMPT;
    while !path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} did not appear",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `bench --metrics`: the report shows the lock's series per workload (`key_label` the
/// workload's keys), and their counts match the bench's own: one granted acquisition and
/// one hold per grant the bench counted, no error. Without the flag the JSON has no
/// `metrics` field.
#[tokio::test]
async fn bench_shows_the_lock_metrics() {
    let args = [
        "bench",
        "--tasks",
        "2",
        "--keys",
        "distinct,one",
        "--duration",
        "200ms",
        "--json",
    ];
    let out = finish(distlock(args.iter().copied().chain(["--metrics"])), PROMPT).await;
    out.expect_code(0);
    let doc: Value = serde_json::from_str(&out.stdout).expect("bench --json");
    let metrics = doc["metrics"]
        .as_object()
        .unwrap_or_else(|| panic!("{doc}"));
    let get = |series: String| {
        metrics
            .get(&series)
            .and_then(Value::as_f64)
            .unwrap_or_else(|| panic!("no {series}: {metrics:#?}"))
    };
    for r in doc["results"].as_array().unwrap() {
        common::check_bench_counts(r);
        let keys = r["keys"].as_str().unwrap();
        let labels = format!(r#"backend="memory",key_label="{keys}""#);
        let grants = r["acquire"]["count"].as_f64().unwrap();
        assert_eq!(
            get(format!(
                "distlock_lock_acquire_duration_seconds_count{{{labels},outcome=\"granted\"}}"
            )),
            grants,
            "{r}"
        );
        assert_eq!(
            get(format!(
                "distlock_lock_hold_duration_seconds_count{{{labels}}}"
            )),
            grants,
            "{r}"
        );
    }
    assert!(
        !metrics
            .keys()
            .any(|k| k.contains("errors_total") || k.contains("lost")),
        "{metrics:#?}"
    );
    assert!(
        !metrics.keys().any(|k| k.contains("distlock-bench/")),
        "the keys are never labels: {metrics:#?}"
    );

    let plain = finish(distlock(args), PROMPT).await;
    plain.expect_code(0);
    let doc: Value = serde_json::from_str(&plain.stdout).expect("bench --json");
    assert!(doc.get("metrics").is_none(), "{doc}");

    let tables = finish(
        distlock([
            "bench",
            "--tasks",
            "2",
            "--keys",
            "one",
            "--duration",
            "200ms",
            "--metrics",
        ]),
        PROMPT,
    )
    .await;
    tables.expect_code(0);
    for needle in [
        "lock metrics recorded during the run",
        r#"distlock_lock_acquire_duration_seconds_count{backend="memory",key_label="one",outcome="granted"}"#,
        r#"distlock_lock_hold_duration_seconds_sum{backend="memory",key_label="one"}"#,
    ] {
        assert!(tables.stdout.contains(needle), "no {needle:?}: {tables:#?}");
    }
}

/// Unix seconds now.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// `run --metrics-textfile` writes, at exit, the exposition node_exporter's textfile
/// collector reads: the lock's series (histograms with buckets) and the run's gauges, all
/// labelled job=NAME; the file is replaced by a rename (a new inode, no temporary file
/// left). A failed run (here from DISTLOCK_METRICS_TEXTFILE) updates the exit code and the
/// end, and keeps the last success of the file.
#[tokio::test]
async fn run_writes_a_textfile_at_exit() {
    use std::os::unix::fs::MetadataExt;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("backup.prom");
    std::fs::write(&path, "# an older file\n").unwrap();
    let inode = std::fs::metadata(&path).unwrap().ino();
    let before = unix_now();
    let path_arg = path.to_str().unwrap();
    let out = finish(
        distlock(run_args(
            "memory://",
            "payroll/backup",
            &["--metrics-textfile", path_arg, "--metrics-job", "backup"],
            "true",
        )),
        PROMPT,
    )
    .await;
    out.expect_code(0);
    let after = unix_now();
    assert_ne!(
        std::fs::metadata(&path).unwrap().ino(),
        inode,
        "not renamed"
    );
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["backup.prom"], "a temporary file was left");

    let text = std::fs::read_to_string(&path).unwrap();
    let s = samples(&text);
    assert_eq!(
        value(&s, r#"distlock_run_last_exit_code{job="backup"}"#),
        0.0,
        "{text}"
    );
    let success = value(
        &s,
        r#"distlock_run_last_success_timestamp_seconds{job="backup"}"#,
    );
    assert!(before - 1.0 <= success && success <= after + 1.0, "{text}");
    let end = value(
        &s,
        r#"distlock_run_last_end_timestamp_seconds{job="backup"}"#,
    );
    assert!(success <= end && end <= after + 1.0, "{text}");
    assert!(
        s.contains_key(r#"distlock_run_last_duration_seconds{job="backup"}"#),
        "{text}"
    );
    assert!(
        text.contains("# TYPE distlock_run_last_exit_code gauge"),
        "{text}"
    );
    assert_eq!(
        value(
            &s,
            // The latency buckets (up to 60 s); which one the grant lands in is the
            // machine's load, not a rule (a loaded CI put one at 2.6 ms).
            r#"distlock_lock_acquire_duration_seconds_bucket{job="backup",backend="memory",outcome="granted",le="60"}"#
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        value(
            &s,
            r#"distlock_lock_hold_duration_seconds_count{job="backup",backend="memory"}"#
        ),
        1.0,
        "{text}"
    );
    assert!(
        !text.contains("payroll"),
        "the key is not the label: {text}"
    );

    let mut failing = distlock(run_args("memory://", "payroll/backup", &[], "exit 3"));
    failing
        .env("DISTLOCK_METRICS_TEXTFILE", &path)
        .env("DISTLOCK_METRICS_JOB", "backup");
    finish(failing, PROMPT).await.expect_code(3);
    let text = std::fs::read_to_string(&path).unwrap();
    let s = samples(&text);
    assert_eq!(
        value(&s, r#"distlock_run_last_exit_code{job="backup"}"#),
        3.0,
        "{text}"
    );
    assert_eq!(
        value(
            &s,
            r#"distlock_run_last_success_timestamp_seconds{job="backup"}"#
        ),
        success,
        "the last success is kept: {text}"
    );
    assert!(
        value(
            &s,
            r#"distlock_run_last_end_timestamp_seconds{job="backup"}"#
        ) >= end,
        "{text}"
    );
}

/// Without --metrics-job the textfile's job label is the key; a command that was not run
/// (not found: 127) has no duration and no success.
#[tokio::test]
async fn the_textfile_job_defaults_to_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nightly.prom");
    let out = finish(
        distlock([
            "run",
            "nightly",
            "--metrics-textfile",
            path.to_str().unwrap(),
            "--",
            "/nonexistent/command",
        ]),
        PROMPT,
    )
    .await;
    out.expect_code(127);
    let text = std::fs::read_to_string(&path).unwrap();
    let s = samples(&text);
    assert_eq!(
        value(&s, r#"distlock_run_last_exit_code{job="nightly"}"#),
        127.0,
        "{text}"
    );
    for absent in [
        "distlock_run_last_success_timestamp_seconds",
        "distlock_run_last_duration_seconds",
    ] {
        assert!(!text.contains(&format!("{absent}{{")), "{absent}: {text}");
    }
}

/// A real Prometheus Pushgateway (Debian's `prometheus-pushgateway`) on a free loopback
/// port, killed when dropped.
struct Pushgateway {
    port: u16,
    _child: tokio::process::Child,
}

impl Pushgateway {
    async fn start() -> Pushgateway {
        let binary = lock_testkit::find_binary("prometheus-pushgateway", "prometheus-pushgateway");
        let port = free_port();
        let child = tokio::process::Command::new(binary)
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start prometheus-pushgateway");
        for _ in 0..200 {
            if scrape(port).await.is_some() {
                return Pushgateway {
                    port,
                    _child: child,
                };
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the pushgateway on port {port} does not answer");
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// The value of the series `name` whose labels include every one of `labels` (the
/// Pushgateway orders labels its own way).
fn find(samples: &BTreeMap<String, f64>, name: &str, labels: &[&str]) -> Option<f64> {
    samples
        .iter()
        .find(|(k, _)| {
            k.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix('{'))
                .is_some_and(|rest| labels.iter().all(|l| rest.contains(l)))
        })
        .map(|(_, v)| *v)
}

/// `run --metrics-push` sends the metrics to a real Pushgateway at exit, as the group of
/// the job (a name with a slash too): a success replaces the group (PUT), a failure (from
/// DISTLOCK_METRICS_PUSH) updates the exit code and keeps the last success (POST). A
/// Pushgateway that cannot be reached turns a success into 69, and leaves a failure's own
/// status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_pushes_to_a_pushgateway() {
    let gateway = Pushgateway::start().await;
    let job = r#"job="jobs/backup""#;
    let out = finish(
        distlock(run_args(
            "memory://",
            "jobs/backup",
            &["--metrics-push", &gateway.url()],
            "true",
        )),
        PROMPT,
    )
    .await;
    out.expect_code(0);
    let text = scrape(gateway.port).await.unwrap();
    let s = samples(&text);
    assert_eq!(
        find(&s, "distlock_run_last_exit_code", &[job]),
        Some(0.0),
        "{text}"
    );
    let success = find(&s, "distlock_run_last_success_timestamp_seconds", &[job])
        .unwrap_or_else(|| panic!("no last success: {text}"));
    assert_eq!(
        find(
            &s,
            "distlock_lock_acquire_duration_seconds_bucket",
            &[
                job,
                r#"backend="memory""#,
                r#"outcome="granted""#,
                // The latency buckets (up to 60 s); which one the grant lands in is the
                // machine's load, not a rule (a loaded CI put one at 2.6 ms).
                r#"le="60""#
            ]
        ),
        Some(1.0),
        "{text}"
    );

    let mut failing = distlock(run_args("memory://", "jobs/backup", &[], "exit 3"));
    failing.env("DISTLOCK_METRICS_PUSH", gateway.url());
    finish(failing, PROMPT).await.expect_code(3);
    let text = scrape(gateway.port).await.unwrap();
    let s = samples(&text);
    assert_eq!(
        find(&s, "distlock_run_last_exit_code", &[job]),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        find(&s, "distlock_run_last_success_timestamp_seconds", &[job]),
        Some(success),
        "the last success is kept: {text}"
    );

    let closed = lock_testkit::closed_port();
    let nowhere = format!("http://127.0.0.1:{}", closed.port());
    let out = finish(
        distlock(run_args(
            "memory://",
            "j",
            &["--metrics-push", &nowhere],
            "true",
        )),
        PROMPT,
    )
    .await;
    out.expect_code(69)
        .expect_stderr("cannot push the metrics to --metrics-push");
    let out = finish(
        distlock(run_args(
            "memory://",
            "j",
            &["--metrics-push", &nowhere],
            "exit 4",
        )),
        PROMPT,
    )
    .await;
    out.expect_code(4)
        .expect_stderr("cannot push the metrics to --metrics-push");
    let bad = finish(
        distlock(run_args(
            "memory://",
            "j",
            &["--metrics-push", "https://pg:9091"],
            "true",
        )),
        PROMPT,
    )
    .await;
    bad.expect_code(64).expect_stderr("https is not supported");
}

/// The scripts the server has run (`EVAL`, `EVALSHA`, `FCALL`), from `INFO commandstats`.
#[cfg(feature = "redis")]
async fn script_calls(redis: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(redis)
        .await
        .unwrap();
    info.lines()
        .filter(|line| {
            ["cmdstat_eval:", "cmdstat_evalsha:", "cmdstat_fcall:"]
                .iter()
                .any(|cmd| line.starts_with(cmd))
        })
        .filter_map(|line| {
            line.split_once("calls=")?
                .1
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}
