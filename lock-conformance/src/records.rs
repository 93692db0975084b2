//! The rule of the run-records ability ([`RunRecords`](lock_core::records::RunRecords)).

use std::time::{Duration, SystemTime};

use super::target::{opts, Target};
use lock_core::records::{RunOutcome, RunRecord};

fn record(job: &str, n: u64, outcome: RunOutcome) -> RunRecord {
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + n);
    RunRecord::new(
        job.to_owned(),
        at,
        format!("replica-{n}"),
        at + Duration::from_millis(250),
        outcome,
    )
    .started_at(Some(at + Duration::from_millis(3)))
    .fence(Some(n))
    .detail((outcome == RunOutcome::Failed).then(|| format!("run {n} failed: 'quoted' \"x\"")))
}

/// Run records keep each job's newest `keep` records (`keep` 0 counting as 1), newest
/// first, keep the last success past retention, leave other jobs and the job's lock
/// untouched, and take job names with any characters. A backend without the ability says
/// so and passes.
pub async fn run_records_keep_the_newest(t: &Target) {
    let Some(records) = t.backend.run_records() else {
        eprintln!(
            "conformance [{}]: keeps no run records (run_records() is None)",
            t.caps().name
        );
        return;
    };
    // A name with quotes, a space, a semicolon and non-ASCII: a parameter, never SQL or a
    // pattern.
    let job = t.key("records/nächtlich 'x'; --");
    let other = t.key("records/other");

    // The job's lock is held while its records are written: they must not touch it.
    let locker = t.locker();
    let guard = locker
        .acquire(&job, &opts(Duration::from_secs(10)))
        .await
        .unwrap();
    let holder_before = t.inspect(&job).await.map(|r| r.unwrap());

    records
        .append(&record(&other, 100, RunOutcome::Ok), 5)
        .await
        .unwrap();
    let outcomes = [
        RunOutcome::Ok,
        RunOutcome::Failed,
        RunOutcome::SkippedBusy,
        RunOutcome::TimedOut,
        RunOutcome::LockLost,
    ];
    for (n, outcome) in outcomes.into_iter().enumerate() {
        records
            .append(&record(&job, n as u64, outcome), 3)
            .await
            .unwrap();
    }

    let newest = records.recent(&job, 10).await.unwrap();
    let expected: Vec<_> = (2..5)
        .rev()
        .map(|n| record(&job, n, outcomes[n as usize]))
        .collect();
    assert_eq!(newest, expected, "the newest 3 of 5, newest first");
    assert_eq!(
        records.recent(&job, 2).await.unwrap(),
        expected[..2].to_vec(),
        "limit cuts from the oldest"
    );
    assert_eq!(
        records.last_success(&job).await.unwrap(),
        Some(record(&job, 0, RunOutcome::Ok)),
        "the last success outlives retention"
    );
    assert_eq!(
        records.recent(&other, 10).await.unwrap(),
        vec![record(&other, 100, RunOutcome::Ok)],
        "another job's history is untouched"
    );
    let never = t.key("records/never");
    assert!(records.recent(&never, 10).await.unwrap().is_empty());
    assert_eq!(records.last_success(&never).await.unwrap(), None);

    // A later success replaces the last one.
    records
        .append(&record(&job, 9, RunOutcome::Ok), 3)
        .await
        .unwrap();
    assert_eq!(
        records.last_success(&job).await.unwrap(),
        Some(record(&job, 9, RunOutcome::Ok))
    );

    // The edges: `keep` of 0 counts as 1 (and keeps the last success), a `limit` of 0
    // reads nothing (not "no limit", as some servers take a zero).
    records
        .append(&record(&other, 101, RunOutcome::Failed), 0)
        .await
        .unwrap();
    assert_eq!(
        records.recent(&other, 10).await.unwrap(),
        vec![record(&other, 101, RunOutcome::Failed)],
        "keep 0 counts as 1"
    );
    assert_eq!(
        records.last_success(&other).await.unwrap(),
        Some(record(&other, 100, RunOutcome::Ok))
    );
    assert!(
        records.recent(&job, 0).await.unwrap().is_empty(),
        "limit 0 reads nothing"
    );

    assert!(
        guard.valid_until() > std::time::Instant::now(),
        "the job's lock is still held"
    );
    assert_eq!(
        t.inspect(&job)
            .await
            .map(|r| r.unwrap())
            .map(|h| h.map(|h| h.fence)),
        holder_before.map(|h| h.map(|h| h.fence)),
        "writing records changed nothing on the lock"
    );
    guard.release().await.unwrap();
}
