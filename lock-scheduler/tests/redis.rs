//! Schedulers over their own connections to one real `redis-server` (lock-testkit): each
//! fire time runs on one of them, never on two, and leaves one record.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use lock_core::Locker;
use lock_redis::RedisBackend;
use lock_scheduler::{BoxError, Job, Scheduler};
use lock_testkit::RedisServer;

/// Every fire time of a 2 s interval job runs once across two replicas, on the system
/// clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_over_redis_run_each_fire_time_once() {
    let server = RedisServer::start().await;
    let runs: Arc<Mutex<Vec<(String, SystemTime)>>> = Arc::default();
    let mut running = Vec::new();
    let mut schedulers = Vec::new();
    for id in ["a", "b"] {
        let backend = RedisBackend::builder(server.addr().to_string())
            .prefix("sched-test:")
            .build()
            .await
            .expect("connect to the test server");
        let scheduler = Scheduler::builder(Locker::new(backend))
            .replica(id)
            .build()
            .unwrap();
        let runs = runs.clone();
        scheduler
            .add(
                Job::every("jobs/tick", Duration::from_secs(2))
                    .unwrap()
                    .run(move |ctx| {
                        let runs = runs.clone();
                        async move {
                            runs.lock()
                                .unwrap()
                                .push((ctx.replica().to_owned(), ctx.scheduled_at()));
                            Ok::<_, BoxError>(())
                        }
                    }),
            )
            .unwrap();
        running.push(scheduler.start().unwrap());
        schedulers.push(scheduler);
    }
    // Four fire times or more pass; on a loaded machine some may be missed, none doubled.
    tokio::time::sleep(Duration::from_secs(9)).await;
    for handle in running {
        handle.shutdown(Duration::from_secs(10)).await;
    }
    let runs = runs.lock().unwrap().clone();
    let mut fire_times: Vec<SystemTime> = runs.iter().map(|(_, at)| *at).collect();
    fire_times.sort();
    let all = fire_times.len();
    fire_times.dedup();
    assert_eq!(all, fire_times.len(), "a fire time ran twice: {runs:?}");
    assert!(!fire_times.is_empty(), "nothing ran");
    for scheduler in &schedulers {
        assert_eq!(scheduler.locker().stats().held, 0);
    }
}

/// Three replicas over a real Redis, 100 fire times of a 200 ms job: the journal holds one
/// record per fire time (the claim winner's), never one per replica, and no duplicate run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_leave_one_record_per_fire_time() {
    use lock_scheduler::RunOutcome;
    let server = RedisServer::start().await;
    let mut running = Vec::new();
    let mut schedulers = Vec::new();
    for id in ["a", "b", "c"] {
        let backend = RedisBackend::builder(server.addr().to_string())
            .prefix("journal-test:")
            .build()
            .await
            .expect("connect to the test server");
        let scheduler = Scheduler::builder(Locker::new(backend))
            .replica(id)
            .keep(1000)
            .build()
            .unwrap();
        scheduler
            .add(
                Job::every("tick", Duration::from_millis(200))
                    .unwrap()
                    .at_least(Duration::from_millis(150))
                    .lateness(Duration::from_millis(120))
                    .run(|_ctx| async { Ok::<_, BoxError>(()) }),
            )
            .unwrap();
        running.push(scheduler.start().unwrap());
        schedulers.push(scheduler);
    }
    let reader = &schedulers[0];
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let records = loop {
        let records = reader.recent("tick", 1000).await.unwrap();
        if records.len() >= 104 {
            break records;
        }
        assert!(std::time::Instant::now() < deadline, "{}", records.len());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for handle in running {
        handle.shutdown(Duration::from_secs(10)).await;
    }
    // Newest first; leave out the newest two (maybe still running) and the oldest ones.
    let mut settled: Vec<_> = records[2..102].to_vec();
    settled.sort_by_key(|r| r.scheduled_at);
    let fires: Vec<SystemTime> = settled.iter().map(|r| r.scheduled_at).collect();
    let mut distinct = fires.clone();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        100,
        "one record per fire time: {settled:#?}"
    );
    let span = fires[99].duration_since(fires[0]).unwrap();
    assert_eq!(
        span,
        Duration::from_millis(99 * 200),
        "consecutive: {settled:#?}"
    );
    for r in &settled {
        assert!(
            matches!(
                r.outcome,
                RunOutcome::Ok | RunOutcome::SkippedBusy | RunOutcome::Missed
            ),
            "{r:?}"
        );
    }
    // How many ran depends on the machine's load (a late wake-up is a miss); one did.
    assert!(settled.iter().any(|r| r.outcome == RunOutcome::Ok));
}
