//! The lock's metrics in the command: `distlock run --metrics-addr` serves them while the
//! command runs (scraped here, on memory:// and on a real redis-server from lock-testkit)
//! and `distlock bench --metrics` shows them in its report; the counts match what the
//! process did, and the key never appears.

mod common;

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
/// acquisition, described, labelled with the backend and not with the key; a bad address
/// exits 64.
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
        "distlock_locks_lost_total",
        "distlock_lock_renewals_failed_total",
        "distlock_lock_handovers_total",
        "distlock_lock_errors_total",
    ] {
        assert_eq!(total(&s, name), 0.0, "{name}: {text}");
    }
    assert!(
        text.contains("# TYPE distlock_lock_acquire_duration_seconds summary")
            && text.contains("# HELP distlock_lock_acquire_duration_seconds"),
        "{text}"
    );
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
    one(r#"distlock_locks_lost_total{backend="redis"}"#);
    one(r#"distlock_lock_renewals_failed_total{backend="redis"}"#);
    one(r#"distlock_lock_errors_total{backend="redis",kind="not_held"}"#);
    one(r#"distlock_lock_hold_duration_seconds_count{backend="redis"}"#);
    assert_eq!(total(&lost, "distlock_lock_errors_total"), 1.0, "{text}");
    std::fs::write(dir.path().join("stop"), "").unwrap();
    let out = common::collect(child, std::time::Instant::now(), PROMPT).await;
    out.expect_code(76);
}

/// Waits until `path` exists (an empty marker file); panics after [`PROMPT`].
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
