//! The metrics the scheduler emits, read back through a local recorder, agree with the
//! run records, and every job has its gauges from its start (one test: the recorder is
//! the process's global one).

mod common;

use std::collections::HashMap;
use std::time::{Duration, UNIX_EPOCH};

use common::{record_for, records, replica, server};
use lock_core::{LockOptions, Locker};
use lock_scheduler::metric_names::{
    outcome_label, JOB_LABEL, LAST_RUN_DURATION, LAST_SUCCESS, PERIOD, RUNNING, RUNS, RUN_DURATION,
    SKIPS, STARTED,
};
use lock_scheduler::{BoxError, Job, ManualClock, RunOutcome};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

/// Runs by job and outcome, durations, skips and the last success match the records, all
/// labelled `distlock_job` (never `job`); the period, start and running gauges are there
/// for every job, one that never fired included, and the last run's duration for the jobs
/// that ran.
#[tokio::test]
async fn metrics_match_the_records() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");

    let server = server();
    // 5 s after a fire time: past its lateness (2.5 s), so the start attempts none.
    let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_000_005));
    let scheduler = replica(&server, &clock, "a");
    let period = Duration::from_secs(10);
    scheduler
        .add(
            Job::every("m-ok", period)
                .unwrap()
                .run(|_ctx| async { Ok::<_, BoxError>(()) }),
        )
        .unwrap();
    scheduler
        .add(
            Job::every("m-fail", period)
                .unwrap()
                .run(|_ctx| async { Err::<(), BoxError>("no".into()) }),
        )
        .unwrap();
    scheduler
        .add(
            Job::every("m-busy", period)
                .unwrap()
                .run(|_ctx| async { Ok::<_, BoxError>(()) }),
        )
        .unwrap();
    // Someone else holds m-busy's lock for the whole test.
    let other = Locker::with_backend(server.clone());
    let _held = other
        .acquire(
            "m-busy",
            &LockOptions::new().skip().ttl(Duration::from_secs(3600)),
        )
        .await
        .unwrap();
    // Hourly: never fires in this test, yet has its period, start and running gauges.
    scheduler
        .add(
            Job::cron("m-hourly", "0 0 * * * *")
                .unwrap()
                .run(|_ctx| async { Ok::<_, BoxError>(()) }),
        )
        .unwrap();
    let running = scheduler.start().unwrap();
    for at in [1_000_010, 1_000_020] {
        let at = UNIX_EPOCH + Duration::from_secs(at);
        clock.set(at);
        for job in ["m-ok", "m-fail", "m-busy"] {
            record_for(&scheduler, job, at, "a").await;
        }
    }
    running.shutdown(Duration::from_secs(10)).await;

    let mut counters: HashMap<(String, Vec<(String, String)>), u64> = HashMap::new();
    let mut gauges: HashMap<(String, Vec<(String, String)>), f64> = HashMap::new();
    let mut histograms: HashMap<(String, Vec<(String, String)>), usize> = HashMap::new();
    for (key, _unit, _help, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let mut labels: Vec<(String, String)> = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        labels.sort();
        let id = (key.name().to_owned(), labels);
        match value {
            DebugValue::Counter(n) => drop(counters.insert(id, n)),
            DebugValue::Gauge(g) => drop(gauges.insert(id, g.into_inner())),
            DebugValue::Histogram(v) => drop(histograms.insert(id, v.len())),
        }
    }
    let labels = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        let mut v: Vec<_> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        v.sort();
        v
    };
    for job in ["m-ok", "m-fail", "m-busy"] {
        let kept = records(&scheduler, job).await;
        assert_eq!(kept.len(), 2, "{job}: {kept:?}");
        for outcome in RunOutcome::ALL {
            let n = kept.iter().filter(|r| r.outcome == outcome).count() as u64;
            let id = (
                RUNS.to_owned(),
                labels(&[(JOB_LABEL, job), ("outcome", outcome_label(outcome))]),
            );
            assert_eq!(counters.get(&id).copied().unwrap_or(0), n, "{id:?}");
            let ran = kept
                .iter()
                .filter(|r| r.outcome == outcome && r.started_at.is_some())
                .count();
            let id = (
                RUN_DURATION.to_owned(),
                labels(&[(JOB_LABEL, job), ("outcome", outcome_label(outcome))]),
            );
            assert_eq!(histograms.get(&id).copied().unwrap_or(0), ran, "{id:?}");
        }
        let skips = kept
            .iter()
            .filter(|r| r.outcome == RunOutcome::SkippedBusy)
            .count() as u64;
        let id = (SKIPS.to_owned(), labels(&[(JOB_LABEL, job)]));
        assert_eq!(counters.get(&id).copied().unwrap_or(0), skips, "{id:?}");
    }
    assert_eq!(
        counters[&(
            RUNS.to_owned(),
            labels(&[(JOB_LABEL, "m-busy"), ("outcome", "skipped_busy")])
        )],
        2
    );
    let last = scheduler.last_success("m-ok").await.unwrap().unwrap();
    let expected = last
        .ended_at
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert_eq!(
        gauges[&(LAST_SUCCESS.to_owned(), labels(&[(JOB_LABEL, "m-ok")]))],
        expected
    );
    assert_eq!(last.ended_at, UNIX_EPOCH + Duration::from_secs(1_000_020));
    assert!(!gauges.contains_key(&(LAST_SUCCESS.to_owned(), labels(&[(JOB_LABEL, "m-fail")]))));

    let gauge = |name: &str, job: &str| gauges.get(&(name.to_owned(), labels(&[(JOB_LABEL, job)])));
    for (job, period) in [
        ("m-ok", 10.0),
        ("m-fail", 10.0),
        ("m-busy", 10.0),
        ("m-hourly", 3600.0),
    ] {
        assert_eq!(gauge(PERIOD, job), Some(&period), "{job}");
        // The timer started at the clock's reading when the scheduler started.
        assert_eq!(gauge(STARTED, job), Some(&1_000_005.0), "{job}");
        assert_eq!(gauge(RUNNING, job), Some(&0.0), "{job}: no run under way");
    }
    // The last run's duration for the jobs that ran (on the monotonic clock: short), none
    // for a job that never ran.
    for job in ["m-ok", "m-fail"] {
        let last = gauge(LAST_RUN_DURATION, job).copied();
        assert!(
            last.is_some_and(|d| (0.0..10.0).contains(&d)),
            "{job}: {last:?}"
        );
    }
    assert_eq!(gauge(LAST_RUN_DURATION, "m-busy"), None);
    assert_eq!(gauge(LAST_RUN_DURATION, "m-hourly"), None);
    // No series of the scheduler carries a `job` label (Prometheus's own target label).
    for (name, labels) in counters
        .keys()
        .chain(gauges.keys())
        .chain(histograms.keys())
    {
        assert!(
            !labels.iter().any(|(k, _)| k == "job"),
            "{name} has a job label: {labels:?}"
        );
    }
}
