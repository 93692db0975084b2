//! Leader mode on the memory backend: the elected replica fires every job, a standby takes
//! over when the leader stops, and no fire time runs twice across the change.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use lock_core::{Backend, Locker};
use lock_memory::MemoryBackend;
use lock_scheduler::{BoxError, Job, LeaderMode, Scheduler};

type Runs = Arc<Mutex<BTreeMap<SystemTime, Vec<&'static str>>>>;

fn replica(backend: &Arc<dyn Backend>, name: &'static str, runs: &Runs) -> Scheduler {
    let scheduler = Scheduler::builder(Locker::with_backend(backend.clone()))
        .replica(name)
        .leader(LeaderMode::new("sched/leader").ttl(Duration::from_millis(500)))
        .build()
        .unwrap();
    let runs = runs.clone();
    scheduler
        .add(
            Job::every("tick", Duration::from_secs(1))
                .unwrap()
                .run(move |ctx| {
                    let runs = runs.clone();
                    async move {
                        runs.lock()
                            .unwrap()
                            .entry(ctx.scheduled_at())
                            .or_default()
                            .push(name);
                        Ok::<_, BoxError>(())
                    }
                }),
        )
        .unwrap();
    scheduler
}

async fn until(what: &str, bound: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < bound, "{what} within {bound:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Only the leader fires; once it shuts down (resigning), the standby leads in a greater
/// term well within the TTL and fires the next fire times; each fire time ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_fires_and_a_standby_takes_over() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let runs: Runs = Arc::default();
    let a = replica(&backend, "a", &runs);
    let b = replica(&backend, "b", &runs);
    let running_a = a.start().unwrap();
    until("a leads", Duration::from_secs(2), || a.leading().is_some()).await;
    let running_b = b.start().unwrap();
    let term_a = a.leading().unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(b.leading(), None, "one leader at a time");
    let before: Vec<_> = runs.lock().unwrap().values().flatten().copied().collect();
    assert!(
        before.len() >= 2,
        "the leader ran the fire times: {before:?}"
    );
    assert!(
        before.iter().all(|r| *r == "a"),
        "only the leader fires: {before:?}"
    );
    let stopped = Instant::now();
    running_a.shutdown(Duration::from_secs(5)).await;
    until(
        "b leads after a resigned",
        Duration::from_millis(400),
        || b.leading().is_some(),
    )
    .await;
    assert!(stopped.elapsed() < Duration::from_millis(400));
    assert!(b.leading().unwrap() > term_a, "terms increase");
    let ran_by_a = before.len();
    until("b runs the next fire times", Duration::from_secs(4), || {
        runs.lock()
            .unwrap()
            .values()
            .flatten()
            .filter(|r| **r == "b")
            .count()
            >= 2
    })
    .await;
    running_b.shutdown(Duration::from_secs(5)).await;
    let runs = runs.lock().unwrap();
    for (at, who) in runs.iter() {
        assert_eq!(who.len(), 1, "fire time {at:?} ran on {who:?}");
    }
    assert!(runs.len() >= ran_by_a + 2);
}
