//! `distlock cron --metrics-addr` on memory://: the scheduler's series as Prometheus reads
//! them (run durations in buckets up to 8 h, every series labelled `distlock_job` and none
//! `job`, the period, running, last-duration and start gauges), and the README's alert
//! rule, read from the README and evaluated on real scrapes, firing for a job that always
//! fails two periods after its start and never for one that succeeds.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::Child;

use super::promql;
use super::{samples, scrape_now, unix_now, value};
use crate::common::{distlock, free_port, kill, read_when_written, PROMPT};

/// The bucket bounds the README documents for the run durations, as the exporter writes
/// them, and `+Inf`.
const RUN_BUCKETS: [&str; 15] = [
    "0.1", "0.5", "1", "5", "15", "30", "60", "300", "900", "1800", "3600", "7200", "14400",
    "28800", "+Inf",
];

/// A `distlock cron FILE --url memory:// --metrics-addr 127.0.0.1:PORT` running `text`
/// (`{dir}` replaced by its directory), its stderr kept in a file.
struct Cron {
    dir: tempfile::TempDir,
    child: Option<Child>,
    port: u16,
}

impl Cron {
    fn start(text: &str) -> Cron {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("jobs.toml");
        std::fs::write(
            &file,
            text.replace("{dir}", &dir.path().display().to_string()),
        )
        .unwrap();
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let mut cmd = distlock([
            "cron".as_ref(),
            file.as_os_str(),
            "--url".as_ref(),
            "memory://".as_ref(),
            "--metrics-addr".as_ref(),
            addr.as_ref(),
        ]);
        cmd.stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("stderr")).unwrap());
        let child = cmd.spawn().expect("spawn distlock cron");
        Cron {
            dir,
            child: Some(child),
            port,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.path("stderr")).unwrap_or_default()
    }

    /// SIGTERM; it must exit 0.
    async fn terminate(mut self) {
        let mut child = self.child.take().unwrap();
        kill(child.id().expect("running"), libc::SIGTERM);
        let status = tokio::time::timeout(PROMPT, child.wait())
            .await
            .unwrap_or_else(|_| panic!("distlock cron did not stop: {}", self.stderr()))
            .unwrap();
        assert_eq!(status.code(), Some(0), "{}", self.stderr());
    }
}

/// `name{labels}` of a sample line, split into the name and the label names.
fn label_names(series: &str) -> (&str, Vec<&str>) {
    let Some((name, labels)) = series.split_once('{') else {
        return (series, Vec::new());
    };
    let names = labels
        .trim_end_matches('}')
        .split("\",")
        .filter_map(|pair| pair.split_once('=').map(|(k, _)| k))
        .collect();
    (name, names)
}

/// Scrapes until `ready` holds for the samples, or panics after [`PROMPT`].
async fn scrape_until(
    cron: &Cron,
    what: &str,
    ready: impl Fn(&std::collections::BTreeMap<String, f64>) -> bool,
) -> String {
    let deadline = Instant::now() + PROMPT;
    loop {
        let text = scrape_now(cron.port).await;
        if ready(&samples(&text)) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "never {what}: {text}\n{}",
            cron.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The scrape of a cron with a quick job, a job that runs until told to stop, an hourly
/// job and a cron job every two seconds: the run durations in buckets 0.1 s to 8 h
/// labelled `distlock_job`, no scheduler series with a `job` label, each job's period and
/// start, the running gauge at 1 during the long run and 0 after it, and the last run's
/// duration at least as long as the run was seen to last.
#[tokio::test]
async fn cron_serves_gauges_and_buckets_by_distlock_job() {
    let spawned = unix_now();
    let cron = Cron::start(
        r#"
shutdown_grace = "1s"
grace = "1s"

[[job]]
name = "quick"
schedule = "every 1s"
command = ["true"]

[[job]]
name = "long"
schedule = "every 1s"
command = ["sh", "-c", "echo started > {dir}/started; while [ ! -e {dir}/stop ]; do sleep 0.02; done"]

[[job]]
name = "hourly"
schedule = "0 0 * * * *"
command = ["true"]

[[job]]
name = "two-seconds"
schedule = "*/2 * * * * *"
command = ["true"]
"#,
    );
    read_when_written(&cron.path("started"), PROMPT).await;
    let seen_running = Instant::now();
    let quick_ok = r#"distlock_scheduler_runs_total{distlock_job="quick",outcome="ok"}"#;
    let text = scrape_until(&cron, "a quick run", |s| value(s, quick_ok) >= 1.0).await;
    let scraped = unix_now();
    let s = samples(&text);

    // The run durations: a histogram with exactly the documented buckets, never a summary.
    for le in RUN_BUCKETS {
        let bucket = format!(
            r#"distlock_scheduler_run_duration_seconds_bucket{{distlock_job="quick",outcome="ok",le="{le}"}}"#
        );
        assert!(value(&s, &bucket) >= 1.0, "{bucket}: {text}");
    }
    let buckets = s
        .keys()
        .filter(|k| {
            k.starts_with(r#"distlock_scheduler_run_duration_seconds_bucket{distlock_job="quick",outcome="ok","#)
        })
        .count();
    assert_eq!(buckets, RUN_BUCKETS.len(), "{text}");
    assert!(
        text.contains("# TYPE distlock_scheduler_run_duration_seconds histogram"),
        "{text}"
    );
    assert!(!text.contains("quantile="), "{text}");

    // Every scheduler series is labelled distlock_job (the clock offset has no label, and
    // memory:// has no server clock), none job.
    let mut scheduler_series = 0;
    for series in s.keys().filter(|k| k.starts_with("distlock_scheduler_")) {
        scheduler_series += 1;
        let (name, labels) = label_names(series);
        assert!(!labels.contains(&"job"), "{series} has a job label");
        assert!(
            labels.contains(&"distlock_job"),
            "{series}: no distlock_job"
        );
        assert_ne!(name, "distlock_scheduler_clock_offset_seconds");
    }
    assert!(scheduler_series > RUN_BUCKETS.len(), "{text}");

    // The gauges: the period of each job, `every` or cron, fired or not; its start.
    for (job, period) in [
        ("quick", 1.0),
        ("long", 1.0),
        ("hourly", 3600.0),
        ("two-seconds", 2.0),
    ] {
        let series = |name: &str| format!(r#"{name}{{distlock_job="{job}"}}"#);
        let period_series = series("distlock_scheduler_period_seconds");
        assert_eq!(
            s.get(&period_series),
            Some(&period),
            "{period_series}: {text}"
        );
        let started = s
            .get(&series("distlock_scheduler_started_timestamp_seconds"))
            .copied()
            .unwrap_or_else(|| panic!("{job}: no start: {text}"));
        assert!(
            (spawned..=scraped).contains(&started),
            "{job} started at {started}, not between {spawned} and {scraped}"
        );
        assert!(
            s.contains_key(&series("distlock_scheduler_running")),
            "{job}: no running gauge: {text}"
        );
    }
    for name in [
        "period_seconds",
        "started_timestamp_seconds",
        "running",
        "last_run_duration_seconds",
    ] {
        assert!(
            text.contains(&format!("# TYPE distlock_scheduler_{name} gauge")),
            "{name}: {text}"
        );
    }
    let running = |s: &std::collections::BTreeMap<String, f64>, job: &str| {
        s.get(&format!(
            r#"distlock_scheduler_running{{distlock_job="{job}"}}"#
        ))
        .copied()
    };
    let last_duration = |s: &std::collections::BTreeMap<String, f64>, job: &str| {
        s.get(&format!(
            r#"distlock_scheduler_last_run_duration_seconds{{distlock_job="{job}"}}"#
        ))
        .copied()
    };
    assert_eq!(running(&s, "long"), Some(1.0), "{text}");
    assert_eq!(running(&s, "hourly"), Some(0.0), "{text}");
    assert!(
        last_duration(&s, "quick").is_some_and(|d| (0.0..10.0).contains(&d)),
        "{text}"
    );
    assert_eq!(last_duration(&s, "long"), None, "still running: {text}");
    assert_eq!(last_duration(&s, "hourly"), None, "never ran: {text}");

    // The long run ends a second later: running back to 0, and its duration at least as
    // long as it was seen running.
    tokio::time::sleep(Duration::from_secs(1)).await;
    std::fs::write(cron.path("stop"), "").unwrap();
    let seen = seen_running.elapsed().as_secs_f64();
    let text = scrape_until(&cron, "the long run's end", |s| {
        last_duration(s, "long").is_some() && running(s, "long") == Some(0.0)
    })
    .await;
    let lasted = last_duration(&samples(&text), "long").unwrap();
    assert!(
        lasted >= seen,
        "the run lasted {lasted}s, seen running {seen}s"
    );
    cron.terminate().await;
}

/// The README's alert rule, read from the README, evaluated on scrapes stored as a
/// Prometheus server with default settings stores them (its own `job` and `instance`
/// labels added): it fires for a job whose command always fails once two of its periods
/// have passed since its start (and not before), never for a job that succeeds.
#[tokio::test]
async fn the_readme_alert_fires_for_a_job_that_never_succeeds() {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let readme = std::fs::read_to_string(&readme).unwrap();
    let rule = promql::rule_expr(&readme, "DistlockJobNotSucceeding")
        .expect("the README has the DistlockJobNotSucceeding rule");
    let cron = Cron::start(
        r#"
[[job]]
name = "fails"
schedule = "every 1s"
at_least = "900ms"
lateness = "800ms"
command = ["false"]

[[job]]
name = "succeeds"
schedule = "every 1s"
at_least = "900ms"
lateness = "800ms"
command = ["true"]
"#,
    );
    let instance = format!("127.0.0.1:{}", cron.port);
    let deadline = Instant::now() + PROMPT;
    let (mut fired, mut quiet_before, mut succeeded) = (0, 0, 0);
    // Until the failing job was found firing on a few scrapes, and the succeeding one
    // evaluated after its successes as often.
    while fired < 3 || succeeded < 3 {
        assert!(
            Instant::now() < deadline,
            "fired {fired} times, succeeded {succeeded}\n{}",
            cron.stderr()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
        let text = scrape_now(cron.port).await;
        let now = unix_now();
        let stored =
            promql::as_stored(&promql::parse_exposition(&text), "distlock-cron", &instance);
        // A scheduler label that collided with the target's would now be exported_job.
        assert!(
            stored.iter().all(|s| !s.contains_key("exported_job")),
            "{text}"
        );
        let firing: Vec<(String, f64)> = promql::eval(&rule, &stored, now)
            .unwrap_or_else(|e| panic!("the README's rule: {e}\n{rule}"))
            .vector()
            .into_iter()
            .map(|(labels, v)| {
                let job = labels
                    .get("distlock_job")
                    .unwrap_or_else(|| panic!("an alert without distlock_job: {labels:?}"));
                (job.clone(), v)
            })
            .collect();
        let s = samples(&text);
        let gauge = |name: &str, job: &str| {
            s.get(&format!(r#"{name}{{distlock_job="{job}"}}"#))
                .copied()
        };
        assert!(
            !firing.iter().any(|(job, _)| job == "succeeds"),
            "the rule fires for a job that succeeds: {firing:?}\n{text}"
        );
        if gauge(
            "distlock_scheduler_last_success_timestamp_seconds",
            "succeeds",
        )
        .is_some()
        {
            succeeded += 1;
        }
        // The failing job: it ran and failed, never succeeded, and the rule fires for it
        // exactly when two periods have passed since it started, its value the time since.
        assert_eq!(
            gauge("distlock_scheduler_last_success_timestamp_seconds", "fails"),
            None,
            "{text}"
        );
        let Some(started) = gauge("distlock_scheduler_started_timestamp_seconds", "fails") else {
            continue;
        };
        assert_eq!(
            gauge("distlock_scheduler_period_seconds", "fails"),
            Some(1.0),
            "{text}"
        );
        let due = now - started > 2.0;
        let fails: Vec<f64> = firing
            .iter()
            .filter(|(job, _)| job == "fails")
            .map(|(_, v)| *v)
            .collect();
        if due {
            assert_eq!(fails.len(), 1, "{firing:?} at {now}, started {started}");
            assert!((fails[0] - (now - started)).abs() < 1e-6, "{fails:?}");
            let failed = r#"distlock_scheduler_runs_total{distlock_job="fails",outcome="failed"}"#;
            assert!(value(&s, failed) >= 1.0, "{text}");
            fired += 1;
        } else {
            assert!(fails.is_empty(), "fires before two periods: {firing:?}");
            quiet_before += 1;
        }
    }
    // Not required (a slow start may miss it), but shown when it happened.
    eprintln!("the rule was quiet on {quiet_before} scrapes before two periods had passed");
    cron.terminate().await;
}

/// The evaluator follows PromQL where the rule depends on it, and the rule the README gave
/// before the label's rename (`{job="sync"}`, `by (job)`) matches nothing once Prometheus
/// has added its own `job` label.
#[test]
fn the_evaluator_follows_promql() {
    let text = "\
distlock_scheduler_last_success_timestamp_seconds{distlock_job=\"a\"} 100
distlock_scheduler_period_seconds{distlock_job=\"a\"} 10
distlock_scheduler_period_seconds{distlock_job=\"b\"} 10
distlock_scheduler_started_timestamp_seconds{distlock_job=\"b\"} 50
old_style{job=\"sync\"} 100
";
    let stored = promql::as_stored(&promql::parse_exposition(text), "scrape", "host:1");
    let jobs = |expr: &str, time: f64| -> Vec<String> {
        let mut jobs: Vec<String> = promql::eval(expr, &stored, time)
            .unwrap_or_else(|e| panic!("{expr}: {e}"))
            .vector()
            .into_iter()
            .map(|(l, _)| l.get("distlock_job").cloned().unwrap_or_default())
            .collect();
        jobs.sort();
        jobs
    };
    let last = "max by (distlock_job) (distlock_scheduler_last_success_timestamp_seconds)";
    let period = "max by (distlock_job) (distlock_scheduler_period_seconds)";
    // `-` binds tighter than `>`, `*` tighter than `-`.
    assert_eq!(
        jobs(&format!("time() - {last} > 2 * {period}"), 120.0),
        Vec::<String>::new()
    );
    assert_eq!(
        jobs(&format!("time() - {last} > 2 * {period}"), 121.0),
        ["a"]
    );
    // `unless` drops what the right side has; `or` adds what the left lacks.
    assert_eq!(jobs(&format!("{period} unless {last}"), 0.0), ["b"]);
    assert_eq!(jobs(&format!("{last} or {period}"), 0.0), ["a", "b"]);
    assert_eq!(jobs(&format!("{period} and {last}"), 0.0), ["a"]);
    // The old rule: the exporter's job label became exported_job.
    assert_eq!(
        jobs("time() - max by (job) (old_style{job=\"sync\"}) > 0", 200.0),
        Vec::<String>::new()
    );
    assert_eq!(
        jobs(
            "time() - max by (exported_job) (old_style{exported_job=\"sync\"}) > 0",
            200.0
        )
        .len(),
        1
    );
    let readme = "```yaml\n- alert: X\n  expr: |\n    up\n      > 0\n  for: 1m\n```\n";
    assert_eq!(
        promql::rule_expr(readme, "X").as_deref(),
        Some("up\n      > 0")
    );
}
