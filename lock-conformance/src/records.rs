//! The rule of the run-records ability ([`RunRecords`](lock_core::records::RunRecords)).

use std::time::{Duration, SystemTime};

use super::target::{opts, Target};
use lock_core::records::{JobControl, Retention, RunOutcome, RunRecord};

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

/// Run records keep each job's newest records of each class (successes, others; 0
/// counting as 1), newest first, keep the last success and failure past retention, leave other jobs and the job's lock
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
        .append(&record(&other, 100, RunOutcome::Ok), Retention::each(5))
        .await
        .unwrap();
    let outcomes = [
        RunOutcome::Ok,
        RunOutcome::Failed,
        RunOutcome::SkippedBusy,
        RunOutcome::TimedOut,
        RunOutcome::Missed,
    ];
    for (n, outcome) in outcomes.into_iter().enumerate() {
        records
            .append(&record(&job, n as u64, outcome), Retention::each(3))
            .await
            .unwrap();
    }

    let newest = records.recent(&job, 10).await.unwrap();
    // Each class keeps its newest 3: the other outcomes 4, 3, 2 (1 went), the success 0.
    let expected: Vec<_> = [4u64, 3, 2, 0]
        .into_iter()
        .map(|n| record(&job, n, outcomes[n as usize]))
        .collect();
    assert_eq!(newest, expected, "the newest 3 of each class, newest first");
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
        records.last_failure(&job).await.unwrap(),
        Some(record(&job, 3, RunOutcome::TimedOut)),
        "the last failure is the newest run that failed (a miss is no failure)"
    );
    assert_eq!(
        records.recent(&other, 10).await.unwrap(),
        vec![record(&other, 100, RunOutcome::Ok)],
        "another job's history is untouched"
    );
    let never = t.key("records/never");
    assert!(records.recent(&never, 10).await.unwrap().is_empty());
    assert_eq!(records.last_success(&never).await.unwrap(), None);
    assert_eq!(records.last_failure(&never).await.unwrap(), None);

    // A later success replaces the last one.
    records
        .append(&record(&job, 9, RunOutcome::Ok), Retention::each(3))
        .await
        .unwrap();
    assert_eq!(
        records.last_success(&job).await.unwrap(),
        Some(record(&job, 9, RunOutcome::Ok))
    );

    // The edges: `keep` of 0 counts as 1 (and keeps the last success), a `limit` of 0
    // reads nothing (not "no limit", as some servers take a zero).
    records
        .append(&record(&other, 101, RunOutcome::Failed), Retention::each(0))
        .await
        .unwrap();
    assert_eq!(
        records.recent(&other, 10).await.unwrap(),
        vec![
            record(&other, 101, RunOutcome::Failed),
            record(&other, 100, RunOutcome::Ok)
        ],
        "keep 0 counts as 1 of each class: the newest failure, the newest success"
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

/// A record replaces the kept record of its slot (job, fire time, fence) where it stands;
/// retention counts successes and other outcomes apart; a job's control is one value that
/// retention never touches. A backend without the ability says so and passes.
pub async fn run_records_replace_their_slot(t: &Target) {
    let Some(records) = t.backend.run_records() else {
        eprintln!(
            "conformance [{}]: keeps no run records (run_records() is None)",
            t.caps().name
        );
        return;
    };
    let job = t.key("records/journal");
    let keep = Retention::new(2, 2);

    // A run under way, then a later one, then the first one's end: it stays in its place.
    let running = record(&job, 1, RunOutcome::Running).output(Some("half".into()));
    records.append(&running, keep).await.unwrap();
    let second = record(&job, 2, RunOutcome::Ok);
    records.append(&second, keep).await.unwrap();
    let ended = record(&job, 1, RunOutcome::Failed).output(Some("half, then all".into()));
    assert_eq!(ended.slot(), running.slot());
    records.append(&ended, keep).await.unwrap();
    assert_eq!(
        records.recent(&job, 10).await.unwrap(),
        vec![second.clone(), ended.clone()],
        "the end replaced the running record in its place"
    );
    assert_eq!(
        records.last_failure(&job).await.unwrap(),
        Some(ended.clone())
    );

    // Two replicas recording one fire time they did not run (no fence): one record.
    let base = record(&job, 3, RunOutcome::Unavailable).fence(None);
    let mut other_replica = base.clone();
    other_replica.replica = "replica-other".into();
    records.append(&base, keep).await.unwrap();
    records.append(&other_replica, keep).await.unwrap();
    // Two runs of one fire time (two fences): both kept, the duplicate visible.
    let dup = record(&job, 3, RunOutcome::Ok).fence(Some(33));
    records.append(&dup, keep).await.unwrap();
    assert_eq!(
        records.recent(&job, 10).await.unwrap(),
        vec![
            dup.clone(),
            other_replica.clone(),
            second.clone(),
            ended.clone()
        ],
        "one record per slot; 2 successes and 2 others, nothing trimmed yet"
    );

    // Retention by class: a stream of failures never pushes the successes out.
    for n in 10..15 {
        records
            .append(&record(&job, n, RunOutcome::Failed), keep)
            .await
            .unwrap();
    }
    let kept = records.recent(&job, 10).await.unwrap();
    assert_eq!(
        kept,
        vec![
            record(&job, 14, RunOutcome::Failed),
            record(&job, 13, RunOutcome::Failed),
            dup.clone(),
            second.clone(),
        ],
        "the newest 2 failures and the newest 2 successes"
    );

    // The control: none, then set, then replaced; untouched by appends.
    assert_eq!(records.control(&job).await.unwrap(), None);
    let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_800_000_000_123);
    let paused = JobControl::new("op@host 'q'", at).paused(true);
    records.set_control(&job, &paused).await.unwrap();
    records
        .append(&record(&job, 20, RunOutcome::Failed), keep)
        .await
        .unwrap();
    assert_eq!(records.control(&job).await.unwrap(), Some(paused));
    let triggered = JobControl::new("op@host", at + Duration::from_secs(1))
        .trigger(Some(at + Duration::from_secs(1)));
    records.set_control(&job, &triggered).await.unwrap();
    assert_eq!(records.control(&job).await.unwrap(), Some(triggered));
    assert_eq!(
        records
            .control(&t.key("records/journal-other"))
            .await
            .unwrap(),
        None,
        "another job has no control"
    );
}
