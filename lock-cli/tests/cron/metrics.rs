//! The metrics endpoint against the run records.

use super::*;

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
                    .get(&format!(
                        "distlock_scheduler_skips_total{{distlock_job=\"{job}\"}}"
                    ))
                    .copied()
                    .unwrap_or(0.0);
                assert_eq!(skips, count(job, "skipped_busy"), "{job}: {before_text}");
            }
            // Run durations are a histogram with buckets up to 8 hours (they aggregate
            // across replicas), never a summary.
            for le in ["3600", "28800", "+Inf"] {
                let bucket = format!(
                    r#"distlock_scheduler_run_duration_seconds_bucket{{distlock_job="good",outcome="ok",le="{le}"}}"#
                );
                assert!(
                    samples.get(&bucket).copied().unwrap_or(0.0) >= 2.0,
                    "{bucket}: {before_text}"
                );
            }
            assert!(!before_text.contains("quantile="), "{before_text}");
            let gauge =
                samples["distlock_scheduler_last_success_timestamp_seconds{distlock_job=\"good\"}"];
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

/// The run counters of a scrape: `(distlock_job, outcome) -> count`, zeros left out.
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
            ((label("distlock_job"), label("outcome")), v)
        })
        .collect()
}

/// The counter of finished fire times, by job and outcome (the scheduler's name).
const RUNS_METRIC: &str = "distlock_scheduler_runs_total{";
