//! The claim's metrics on a lock server with a clock (a real `redis-server`): fire times
//! another replica claimed are counted as claimed elsewhere, never as skips, and each
//! replica's offset from the server's clock is exported (one test: the recorder is the
//! process's global one).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use jiff::SignedDuration;
use lock_core::Locker;
use lock_redis::RedisBackend;
use lock_scheduler::metric_names::{CLAIMED_ELSEWHERE, CLOCK_OFFSET, JOB_LABEL, SKIPS};
use lock_scheduler::{BoxError, Job, Scheduler};
use lock_testkit::RedisServer;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

/// Three replicas whose clocks are all 2 s ahead of the server's run a job every second:
/// each fire time that ran was claimed elsewhere by the other replicas that asked (at most
/// two per run), nothing counts as a skip, and the offset gauge reads about +2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_elsewhere_are_counted_apart_from_skips_and_the_offset_is_exported() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");

    let server = RedisServer::start().await;
    let runs: Arc<Mutex<Vec<SystemTime>>> = Arc::default();
    let mut running = Vec::new();
    for id in ["a", "b", "c"] {
        let backend = RedisBackend::builder(server.addr().to_string())
            .prefix("sched-metrics:")
            .build()
            .await
            .expect("connect to the test server");
        let scheduler = Scheduler::builder(Locker::new(backend))
            .replica(id)
            .clock_offset(SignedDuration::from_secs(2))
            .build()
            .unwrap();
        let runs = runs.clone();
        scheduler
            .add(
                Job::every("jobs/metered", Duration::from_secs(1))
                    .unwrap()
                    .run(move |ctx| {
                        let runs = runs.clone();
                        async move {
                            runs.lock().unwrap().push(ctx.scheduled_at());
                            Ok::<_, BoxError>(())
                        }
                    }),
            )
            .unwrap();
        running.push(scheduler.start().unwrap());
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    for handle in running {
        handle.shutdown(Duration::from_secs(10)).await;
    }
    let mut runs = runs.lock().unwrap().clone();
    let all = runs.len();
    runs.sort();
    runs.dedup();
    assert_eq!(all, runs.len(), "a fire time ran twice");
    assert!(runs.len() >= 2, "too few fire times ran: {runs:?}");

    let mut counters: HashMap<&'static str, u64> = HashMap::new();
    let mut offset = None;
    for (key, _unit, _help, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let job = key
            .labels()
            .any(|l| l.key() == JOB_LABEL && l.value() == "jobs/metered");
        match (key.name(), value) {
            (CLAIMED_ELSEWHERE, DebugValue::Counter(n)) if job => {
                *counters.entry(CLAIMED_ELSEWHERE).or_default() += n
            }
            (SKIPS, DebugValue::Counter(n)) if job => *counters.entry(SKIPS).or_default() += n,
            (CLOCK_OFFSET, DebugValue::Gauge(g)) => offset = Some(g.into_inner()),
            _ => {}
        }
    }
    let elsewhere = counters.get(CLAIMED_ELSEWHERE).copied().unwrap_or(0);
    assert!(
        elsewhere >= 1 && elsewhere <= 2 * runs.len() as u64,
        "{elsewhere} claims elsewhere for {} runs of three replicas",
        runs.len()
    );
    assert_eq!(
        counters.get(SKIPS).copied().unwrap_or(0),
        0,
        "no run overran"
    );
    let offset = offset.expect("the clock offset gauge is set on a server with a clock");
    assert!(
        (1.5..=2.5).contains(&offset),
        "offset {offset} s, the replicas being 2 s ahead"
    );
}
