//! Helpers of the scheduler's tests: memory-backed replicas, a manual clock, and waits on
//! conditions (never on a fixed sleep) so a loaded machine only makes the tests slower.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use lock_core::Locker;
use lock_memory::MemoryBackend;
use lock_scheduler::{ManualClock, RunOutcome, RunRecord, Scheduler};

/// How long a wait on a condition may take before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The instant an RFC 3339 text names.
pub fn t(rfc3339: &str) -> SystemTime {
    let ts: lock_scheduler::jiff::Timestamp = rfc3339.parse().expect("an RFC 3339 instant");
    SystemTime::from(ts)
}

/// An instant shown as RFC 3339 UTC.
pub fn show(at: SystemTime) -> String {
    lock_scheduler::jiff::Timestamp::try_from(at)
        .expect("in range")
        .to_string()
}

/// The instant `s` seconds after the Unix epoch.
pub fn secs(s: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(s)
}

/// How long a shutdown at the end of a test may take.
pub const GRACE: Duration = Duration::from_secs(10);

/// One shared in-memory lock server.
pub fn server() -> Arc<MemoryBackend> {
    Arc::new(MemoryBackend::new())
}

/// A replica: its own Locker over the shared server, its own clock and id.
pub fn replica(server: &Arc<MemoryBackend>, clock: &ManualClock, id: &str) -> Scheduler {
    Scheduler::builder(Locker::with_backend(server.clone()))
        .replica(id)
        .clock(clock.clone())
        .build()
        .expect("scheduler")
}

/// Waits until `cond` holds, polling; fails the test after [`PATIENCE`].
pub async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(start.elapsed() < PATIENCE, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The job's records, newest first.
pub async fn records(scheduler: &Scheduler, job: &str) -> Vec<RunRecord> {
    scheduler.recent(job, 1000).await.expect("records")
}

/// Waits until the job has a record for `at` written by `replica`, and returns it.
pub async fn record_for(
    scheduler: &Scheduler,
    job: &str,
    at: SystemTime,
    replica: &str,
) -> RunRecord {
    let start = std::time::Instant::now();
    loop {
        if let Some(r) = records(scheduler, job)
            .await
            .into_iter()
            // A run's record says `running` until it ended.
            .find(|r| {
                r.scheduled_at == at && r.replica == replica && r.outcome != RunOutcome::Running
            })
        {
            return r;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "timed out waiting for {replica}'s record of {job} at {}",
            show(at)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Moves `clock` to the job's next fire time and waits for this replica's record of it.
pub async fn step(scheduler: &Scheduler, clock: &ManualClock, job: &str) -> RunRecord {
    let next = SystemTime::from(scheduler.next_fire(job).expect("next fire").timestamp());
    clock.set(next);
    record_for(scheduler, job, next, scheduler.replica()).await
}

/// Where a test job writes the fire times it ran: (replica, fire time).
#[derive(Clone, Default)]
pub struct Runs(Arc<Mutex<Vec<(String, SystemTime)>>>);

impl Runs {
    pub fn push(&self, replica: &str, at: SystemTime) {
        self.0.lock().unwrap().push((replica.to_owned(), at));
    }

    pub fn get(&self) -> Vec<(String, SystemTime)> {
        self.0.lock().unwrap().clone()
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// Sets a flag when dropped: tells whether a job's future was cancelled.
pub struct DropFlag(pub Arc<std::sync::atomic::AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

pub fn outcomes(records: &[RunRecord]) -> Vec<RunOutcome> {
    records.iter().map(|r| r.outcome).collect()
}
