//! Two schedulers over two connections to one real `redis-server` (lock-testkit): each fire
//! time runs on one of them, never on both.

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
