//! How fire times end, on the memory backend with a manual clock: interval schedules, the
//! at-least hold between two replicas with clocks out of step, overlaps, failures,
//! timeouts, lost locks, missed fire times, graceful shutdown, and bad input.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::{
    outcomes, record_for, records, replica, secs, server, step, t, until, DropFlag, Runs, GRACE,
};
use lock_core::{Admin, LockOptions, Locker};
use lock_scheduler::jiff::SignedDuration;
use lock_scheduler::{
    BoxError, Error, Job, JobContext, ManualClock, OnBusy, RunOutcome, RunRecord, Scheduler,
};
use tokio::sync::Notify;

/// A job that notes each run in `runs` and succeeds.
fn noting(job: Job, runs: &Runs) -> Job {
    let runs = runs.clone();
    job.run(move |ctx: JobContext| {
        let runs = runs.clone();
        async move {
            runs.push(ctx.replica(), ctx.scheduled_at());
            Ok::<_, BoxError>(())
        }
    })
}

/// An interval job fires at the multiples of its period since the Unix epoch, one run per
/// fire time, each with a larger fence.
#[tokio::test]
async fn interval_jobs_fire_at_multiples_of_the_period() {
    let clock = ManualClock::new(secs(1_000_003));
    let scheduler = replica(&server(), &clock, "a");
    let runs = Runs::default();
    scheduler
        .add(noting(
            Job::every("tick", Duration::from_secs(10)).unwrap(),
            &runs,
        ))
        .unwrap();
    let running = scheduler.start().unwrap();
    let mut fences = Vec::new();
    for expected in [1_000_010, 1_000_020, 1_000_030] {
        let record = step(&scheduler, &clock, "tick").await;
        assert_eq!(record.scheduled_at, secs(expected));
        assert_eq!(record.outcome, RunOutcome::Ok);
        assert_eq!(record.replica, "a");
        assert!(record.started_at.is_some());
        fences.push(record.fence.expect("a run has a fence"));
    }
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    assert_eq!(runs.len(), 3);
    assert_eq!(
        scheduler
            .last_success("tick")
            .await
            .unwrap()
            .unwrap()
            .scheduled_at,
        secs(1_000_030)
    );
    running.shutdown(GRACE).await;
}

/// Two replicas over one lock server, the second's clock `behind` the first's; both run a
/// job at second 0 of each minute with a 10 s at-least hold. Returns who ran 10:00:00, and
/// the records B wrote of it once its clock had passed it for a while.
async fn two_replicas(behind: Duration) -> (Vec<(String, SystemTime)>, Vec<RunOutcome>) {
    let server = server();
    let clock_a = ManualClock::at("2026-06-01T09:59:59Z");
    let clock_b = clock_a.offset(SignedDuration::ZERO - SignedDuration::try_from(behind).unwrap());
    let a = replica(&server, &clock_a, "a");
    let b = replica(&server, &clock_b, "b");
    let runs = Runs::default();
    for scheduler in [&a, &b] {
        let job = Job::cron("minutely", "0 * * * * *")
            .unwrap()
            .at_least(Duration::from_secs(10));
        scheduler.add(noting(job, &runs)).unwrap();
    }
    let running_a = a.start().unwrap();
    let running_b = b.start().unwrap();
    let fire = t("2026-06-01T10:00:00Z");

    // A's clock reaches the fire time first: A runs it and holds the lock until 10:00:10.
    clock_a.set(fire);
    assert_eq!(
        record_for(&a, "minutely", fire, "a").await.outcome,
        RunOutcome::Ok
    );
    if behind >= Duration::from_secs(10) {
        // A's hold ends before B's clock reaches the fire time.
        clock_a.set(t("2026-06-01T10:00:10Z"));
        until("A released the lock after its hold", || {
            server.held_keys() == 0
        })
        .await;
    }
    // B's clock reaches the same fire time: A's claim of it stands.
    clock_b.set(fire);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let b_records: Vec<_> = records(&b, "minutely")
        .await
        .into_iter()
        .filter(|r| r.scheduled_at == fire && r.replica == "b")
        .collect();
    let claim = b.locker().fire_claim("minutely").await.unwrap().unwrap();
    assert_eq!((claim.fire_time, claim.replica.as_str()), (fire, "a"));
    let result = (runs.get(), outcomes(&b_records));
    running_a.shutdown(GRACE).await;
    running_b.shutdown(GRACE).await;
    result
}

/// A replica whose clock is behind by less than `at_least` finds the fire time claimed
/// when its clock reaches it: it neither runs it again nor records a skip (the run is
/// A's; a skip would mean an earlier run still held the job).
#[tokio::test]
async fn a_replica_behind_by_less_than_at_least_does_not_run_the_fire_time_again() {
    let fire = t("2026-06-01T10:00:00Z");
    let (runs, b) = two_replicas(Duration::from_secs(5)).await;
    assert_eq!(runs, [("a".to_owned(), fire)]);
    assert_eq!(b, []);
}

/// A replica whose clock is behind by more than `at_least` (A's hold already ended) does
/// not run the fire time again either: the claim, not the hold, ties a run to its fire
/// time.
#[tokio::test]
async fn a_replica_behind_by_more_than_at_least_does_not_run_it_again_either() {
    let fire = t("2026-06-01T10:00:00Z");
    let (runs, b) = two_replicas(Duration::from_secs(15)).await;
    assert_eq!(runs, [("a".to_owned(), fire)]);
    assert_eq!(b, []);
}

/// The lock stays held after a quick run until `fire time + at_least`, then is released.
#[tokio::test]
async fn the_lock_is_held_until_at_least_after_the_fire_time() {
    let server = server();
    let clock = ManualClock::new(secs(1_000_005));
    let scheduler = replica(&server, &clock, "a");
    let runs = Runs::default();
    let job = Job::every("held", Duration::from_secs(60))
        .unwrap()
        .at_least(Duration::from_secs(20));
    scheduler.add(noting(job, &runs)).unwrap();
    let running = scheduler.start().unwrap();
    let record = step(&scheduler, &clock, "held").await;
    assert_eq!(record.scheduled_at, secs(1_000_020));
    let other = Locker::with_backend(server.clone());
    assert!(
        other.try_acquire("held").await.unwrap().is_none(),
        "held after the run"
    );
    clock.set(secs(1_000_039));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        other.try_acquire("held").await.unwrap().is_none(),
        "held until at_least"
    );
    clock.set(secs(1_000_040));
    until("the hold ended", || server.held_keys() == 0).await;
    running.shutdown(GRACE).await;
}

/// A run still going at the next fire time makes that fire time SkippedBusy (no overlap,
/// on any backend: the lock is the job's name), recorded; the long run then ends Ok.
#[tokio::test]
async fn overlapping_runs_are_skipped_and_recorded() {
    let clock = ManualClock::new(secs(1_000_005));
    let scheduler = replica(&server(), &clock, "a");
    let started = Arc::new(AtomicUsize::new(0));
    let finish = Arc::new(Notify::new());
    let (s, f) = (started.clone(), finish.clone());
    scheduler
        .add(
            Job::every("long", Duration::from_secs(10))
                .unwrap()
                .run(move |_ctx| {
                    let (s, f) = (s.clone(), f.clone());
                    async move {
                        s.fetch_add(1, Ordering::SeqCst);
                        f.notified().await;
                        Ok::<_, BoxError>(())
                    }
                }),
        )
        .unwrap();
    let running = scheduler.start().unwrap();
    clock.set(secs(1_000_010));
    until("the first run started", || {
        started.load(Ordering::SeqCst) == 1
    })
    .await;
    let skipped = step(&scheduler, &clock, "long").await;
    assert_eq!(skipped.scheduled_at, secs(1_000_020));
    assert_eq!(skipped.outcome, RunOutcome::SkippedBusy);
    assert_eq!((skipped.started_at, skipped.fence), (None, None));
    finish.notify_one();
    let first = record_for(&scheduler, "long", secs(1_000_010), "a").await;
    assert_eq!(first.outcome, RunOutcome::Ok);
    assert_eq!(
        started.load(Ordering::SeqCst),
        1,
        "the skipped fire time did not run"
    );
    running.shutdown(GRACE).await;
}

/// With `on_busy = wait`, a fire time whose lock comes free within the bound (and the
/// lateness) runs.
#[tokio::test]
async fn on_busy_wait_runs_when_the_lock_comes_free_in_time() {
    let server = server();
    let clock = ManualClock::new(secs(1_000_005));
    let scheduler = replica(&server, &clock, "a");
    let runs = Runs::default();
    let job = Job::every("patient", Duration::from_secs(60))
        .unwrap()
        .on_busy(OnBusy::Wait(Duration::from_secs(20)))
        .lateness(Duration::from_secs(20));
    scheduler.add(noting(job, &runs)).unwrap();
    let running = scheduler.start().unwrap();
    let other = Locker::with_backend(server.clone());
    let held = other
        .acquire("patient", &LockOptions::new().skip())
        .await
        .unwrap();
    clock.set(secs(1_000_020));
    // The run waits for the lock (no record yet); the other holder lets go.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(runs.len(), 0);
    held.release().await.unwrap();
    let record = record_for(&scheduler, "patient", secs(1_000_020), "a").await;
    assert_eq!(record.outcome, RunOutcome::Ok);
    assert_eq!(runs.len(), 1);
    running.shutdown(GRACE).await;
}

/// A job returning an error is recorded Failed with the error's text; a panicking job too.
#[tokio::test]
async fn failing_jobs_are_recorded_failed() {
    let clock = ManualClock::new(secs(1_000_005));
    let scheduler = replica(&server(), &clock, "a");
    scheduler
        .add(
            Job::every("fails", Duration::from_secs(10))
                .unwrap()
                .run(|_ctx| async { Err::<(), BoxError>("the report server said no".into()) }),
        )
        .unwrap();
    scheduler
        .add(
            Job::every("panics", Duration::from_secs(10))
                .unwrap()
                .run(|_ctx| async {
                    if true {
                        panic!("out of paper");
                    }
                    Ok::<(), BoxError>(())
                }),
        )
        .unwrap();
    let running = scheduler.start().unwrap();
    let failed = step(&scheduler, &clock, "fails").await;
    assert_eq!(failed.outcome, RunOutcome::Failed);
    assert_eq!(failed.detail.as_deref(), Some("the report server said no"));
    assert!(failed.fence.is_some() && failed.started_at.is_some());
    let panicked = record_for(&scheduler, "panics", failed.scheduled_at, "a").await;
    assert_eq!(panicked.outcome, RunOutcome::Failed);
    assert!(panicked.detail.unwrap().contains("out of paper"));
    assert!(scheduler.last_success("fails").await.unwrap().is_none());
    running.shutdown(GRACE).await;
}

/// A job that never ends passes its hard timeout: its future is dropped and the fire time
/// is TimedOut.
#[tokio::test]
async fn a_job_past_its_timeout_is_cancelled_and_timed_out() {
    let clock = ManualClock::new(secs(1_000_005));
    let scheduler = replica(&server(), &clock, "a");
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = dropped.clone();
    scheduler
        .add(
            Job::every("stuck", Duration::from_secs(10))
                .unwrap()
                .timeout(Duration::from_millis(200))
                .run(move |_ctx| {
                    let flag = DropFlag(flag.clone());
                    async move {
                        let _flag = flag;
                        std::future::pending::<()>().await;
                        Ok::<_, BoxError>(())
                    }
                }),
        )
        .unwrap();
    let running = scheduler.start().unwrap();
    let record = step(&scheduler, &clock, "stuck").await;
    assert_eq!(record.outcome, RunOutcome::TimedOut);
    assert!(
        dropped.load(Ordering::SeqCst),
        "the job's future was dropped"
    );
    running.shutdown(GRACE).await;
}

/// The lock taken away behind the scheduler's back (an admin's force-release): the run is
/// cancelled, its future dropped, the fire time LockLost; `ctx.lost()` had resolved.
#[tokio::test]
async fn a_lock_taken_away_cancels_the_run() {
    let server = server();
    let clock = ManualClock::new(secs(1_000_005));
    let scheduler = replica(&server, &clock, "a");
    let dropped = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicBool::new(false));
    let saw_lost = Arc::new(AtomicBool::new(false));
    let (flag, s, seen) = (dropped.clone(), started.clone(), saw_lost.clone());
    scheduler
        .add(
            Job::every("taken", Duration::from_secs(10))
                .unwrap()
                .ttl(Duration::from_millis(1500))
                .run(move |ctx: JobContext| {
                    let flag = DropFlag(flag.clone());
                    let (s, seen) = (s.clone(), seen.clone());
                    tokio::spawn({
                        let lost = ctx.lost();
                        async move {
                            lost.await;
                            seen.store(true, Ordering::SeqCst);
                        }
                    });
                    async move {
                        let _flag = flag;
                        s.store(true, Ordering::SeqCst);
                        std::future::pending::<()>().await;
                        Ok::<_, BoxError>(())
                    }
                }),
        )
        .unwrap();
    let running = scheduler.start().unwrap();
    clock.set(secs(1_000_010));
    until("the run started", || started.load(Ordering::SeqCst)).await;
    assert!(server.force_release("taken").await.unwrap());
    let record = record_for(&scheduler, "taken", secs(1_000_010), "a").await;
    assert_eq!(record.outcome, RunOutcome::LockLost);
    assert!(
        dropped.load(Ordering::SeqCst),
        "the job's future was dropped"
    );
    until("ctx.lost() resolved", || saw_lost.load(Ordering::SeqCst)).await;
    running.shutdown(GRACE).await;
}

/// A scheduler that wakes long after its fire times (a suspended machine) records the
/// ones passed by more than the lateness bound as one Missed record (at the last of
/// them, saying how many from which), runs none of them, and goes on with the next fire time.
#[tokio::test]
async fn fire_times_passed_while_suspended_are_missed() {
    let clock = ManualClock::new(secs(1_000_005));
    let scheduler = replica(&server(), &clock, "a");
    let runs = Runs::default();
    scheduler
        .add(noting(
            Job::every("sleepy", Duration::from_secs(10)).unwrap(),
            &runs,
        ))
        .unwrap();
    let running = scheduler.start().unwrap();
    // Default lateness for a 10 s period: at_least 5 s, lateness 2.5 s.
    clock.set(secs(1_000_035));
    let record = record_for(&scheduler, "sleepy", secs(1_000_030), "a").await;
    assert_eq!(record.outcome, RunOutcome::Missed);
    assert_eq!((record.started_at, record.fence), (None, None));
    let detail = record.detail.unwrap();
    assert!(
        detail.contains("3 fire times from 1970-01-12T13:46:50Z to this one"),
        "{detail}"
    );
    assert_eq!(runs.len(), 0, "no catch-up burst");
    let next = step(&scheduler, &clock, "sleepy").await;
    assert_eq!(
        (next.scheduled_at, next.outcome),
        (secs(1_000_040), RunOutcome::Ok)
    );
    assert_eq!(
        outcomes(&records(&scheduler, "sleepy").await),
        [RunOutcome::Ok, RunOutcome::Missed]
    );
    running.shutdown(GRACE).await;
}

/// A fire time found due within its lateness bound still runs (late, but not missed).
#[tokio::test]
async fn a_fire_time_due_within_the_lateness_bound_runs() {
    let clock = ManualClock::new(secs(1_000_005));
    let scheduler = replica(&server(), &clock, "a");
    let runs = Runs::default();
    let job = Job::every("late", Duration::from_secs(10))
        .unwrap()
        .lateness(Duration::from_secs(3));
    scheduler.add(noting(job, &runs)).unwrap();
    let running = scheduler.start().unwrap();
    clock.set(secs(1_000_012));
    let record = record_for(&scheduler, "late", secs(1_000_010), "a").await;
    assert_eq!(record.outcome, RunOutcome::Ok);
    assert_eq!(runs.get(), [("a".to_owned(), secs(1_000_010))]);
    running.shutdown(GRACE).await;
}

/// Graceful shutdown: a run that finishes within the grace period is reported finished,
/// one that does not is cut (future dropped, recorded Cut); no fire time starts after it
/// and every lock is released.
#[tokio::test]
async fn shutdown_lets_runs_finish_within_the_grace_and_cuts_the_rest() {
    let server = server();
    let clock = ManualClock::new(secs(1_000_005));
    let scheduler = replica(&server, &clock, "a");
    let started = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicBool::new(false));
    let s = started.clone();
    scheduler
        .add(
            Job::every("polite", Duration::from_secs(10))
                .unwrap()
                .run(move |ctx: JobContext| {
                    let s = s.clone();
                    async move {
                        s.fetch_add(1, Ordering::SeqCst);
                        ctx.shutting_down().await;
                        assert!(ctx.is_shutting_down());
                        Ok::<_, BoxError>(())
                    }
                }),
        )
        .unwrap();
    let (s, flag) = (started.clone(), dropped.clone());
    scheduler
        .add(
            Job::every("stubborn", Duration::from_secs(10))
                .unwrap()
                .run(move |_ctx| {
                    let s = s.clone();
                    let flag = DropFlag(flag.clone());
                    async move {
                        let _flag = flag;
                        s.fetch_add(1, Ordering::SeqCst);
                        std::future::pending::<()>().await;
                        Ok::<_, BoxError>(())
                    }
                }),
        )
        .unwrap();
    let running = scheduler.start().unwrap();
    clock.set(secs(1_000_010));
    until("both runs started", || started.load(Ordering::SeqCst) == 2).await;
    assert_eq!(server.held_keys(), 2);

    let report = running.shutdown(Duration::from_secs(3)).await;
    assert_eq!(report.finished.len(), 1, "{report:?}");
    assert_eq!(report.finished[0].job, "polite");
    assert_eq!(report.finished[0].outcome, RunOutcome::Ok);
    assert_eq!(report.cut.len(), 1, "{report:?}");
    assert_eq!(report.cut[0].job, "stubborn");
    assert_eq!(report.cut[0].outcome, RunOutcome::Cut);
    assert_eq!(report.cut[0].scheduled_at, secs(1_000_010));
    assert!(
        dropped.load(Ordering::SeqCst),
        "the cut run's future was dropped"
    );
    scheduler.locker().settle().await;
    assert_eq!(server.held_keys(), 0, "every lock released");
    assert_eq!(
        outcomes(&records(&scheduler, "stubborn").await),
        [RunOutcome::Cut]
    );
    // No fire time starts after the shutdown.
    clock.set(secs(1_000_020));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(started.load(Ordering::SeqCst), 2);
    assert_eq!(records(&scheduler, "polite").await.len(), 1);
}

/// A shutdown releases the at-least hold of a run that already ended, without waiting.
#[tokio::test]
async fn shutdown_releases_holds_at_once() {
    let server = server();
    let clock = ManualClock::new(secs(1_000_005));
    let scheduler = replica(&server, &clock, "a");
    let runs = Runs::default();
    scheduler
        .add(noting(
            Job::every("quick", Duration::from_secs(600)).unwrap(),
            &runs,
        ))
        .unwrap();
    let running = scheduler.start().unwrap();
    step(&scheduler, &clock, "quick").await;
    assert_eq!(server.held_keys(), 1, "held for at_least");
    let began = std::time::Instant::now();
    let report = running.shutdown(Duration::from_secs(60)).await;
    assert!(
        began.elapsed() < Duration::from_secs(30),
        "did not wait for the hold"
    );
    assert!(
        report.finished.is_empty() && report.cut.is_empty(),
        "{report:?}"
    );
    scheduler.locker().settle().await;
    assert_eq!(server.held_keys(), 0);
}

/// Bad input is a typed error naming the job (and the cron field), never a panic.
#[test]
fn bad_input_is_refused_with_typed_errors() {
    match Job::cron("report", "0 */5 * * 13 *") {
        Err(Error::InvalidCron { job, field, .. }) => {
            assert_eq!(job, "report");
            assert_eq!(field, Some("month"));
        }
        other => panic!("expected InvalidCron, got {other:?}"),
    }
    match Job::cron("report", "61 * * * *") {
        Err(Error::InvalidCron { field, .. }) => assert_eq!(field, Some("minute")),
        other => panic!("expected InvalidCron, got {other:?}"),
    }
    let text = Job::cron("report", "* * *").unwrap_err().to_string();
    assert!(
        text.contains("report") && text.contains("found 3"),
        "{text}"
    );
    assert!(matches!(
        Job::cron("", "* * * * *"),
        Err(Error::InvalidJobName { .. })
    ));
    assert!(matches!(
        Job::every("x".repeat(2000), Duration::from_secs(1)),
        Err(Error::InvalidJobName { .. })
    ));
    assert!(
        matches!(Job::every("zero", Duration::ZERO), Err(Error::ZeroInterval { job }) if job == "zero")
    );

    let locker = Locker::new(lock_memory::MemoryBackend::new());
    let scheduler = Scheduler::builder(locker).build().unwrap();
    let no_task = Job::every("idle", Duration::from_secs(1)).unwrap();
    assert!(matches!(scheduler.add(no_task), Err(Error::NoTask { .. })));
    let ok = |_ctx| async { Ok::<_, BoxError>(()) };
    let never = Job::cron("feb30", "0 0 0 30 2 *").unwrap().run(ok);
    assert!(matches!(
        scheduler.add(never),
        Err(Error::NeverFires { .. })
    ));
    let zero = Job::every("z", Duration::from_secs(1))
        .unwrap()
        .timeout(Duration::ZERO)
        .run(ok);
    assert!(matches!(
        scheduler.add(zero),
        Err(Error::InvalidOption { .. })
    ));
    let bad_ttl = Job::every("t", Duration::from_secs(1))
        .unwrap()
        .ttl(Duration::ZERO)
        .run(ok);
    assert!(matches!(
        scheduler.add(bad_ttl),
        Err(Error::InvalidOption { .. })
    ));
    scheduler
        .add(Job::every("once", Duration::from_secs(1)).unwrap().run(ok))
        .unwrap();
    let again = Job::every("once", Duration::from_secs(1)).unwrap().run(ok);
    assert!(matches!(
        scheduler.add(again),
        Err(Error::DuplicateJob { .. })
    ));
    assert!(matches!(
        scheduler.next_fire("nope"),
        Err(Error::UnknownJob { .. })
    ));
}

/// `start` twice is refused; jobs added after the start fire too.
#[tokio::test]
async fn jobs_added_after_the_start_fire() {
    let clock = ManualClock::new(secs(1_000_005));
    let scheduler = replica(&server(), &clock, "a");
    let running = scheduler.start().unwrap();
    assert!(matches!(scheduler.start(), Err(Error::AlreadyStarted)));
    let runs = Runs::default();
    scheduler
        .add(noting(
            Job::every("late-comer", Duration::from_secs(10)).unwrap(),
            &runs,
        ))
        .unwrap();
    let record = step(&scheduler, &clock, "late-comer").await;
    assert_eq!(record.outcome, RunOutcome::Ok);
    running.shutdown(GRACE).await;
}

/// After a long suspension one Missed record stands for every fire time passed (not one
/// each: a one-second schedule after a week would be half a million), and the schedule
/// goes on from now.
#[tokio::test]
async fn a_long_suspension_writes_one_missed_record() {
    let clock = ManualClock::new(secs(1_000_000));
    let scheduler = Scheduler::builder(Locker::new(lock_memory::MemoryBackend::new()))
        .replica("a")
        .clock(clock.clone())
        .keep(3)
        .build()
        .unwrap();
    let runs = Runs::default();
    scheduler
        .add(noting(
            Job::every("tiny", Duration::from_secs(1)).unwrap(),
            &runs,
        ))
        .unwrap();
    let running = scheduler.start().unwrap();
    clock.set(secs(1_000_100));
    let missed = record_for(&scheduler, "tiny", secs(1_000_099), "a").await;
    assert_eq!(missed.outcome, RunOutcome::Missed);
    let detail = missed.detail.unwrap();
    assert!(
        detail.contains("99 fire times from 1970-01-12T13:46:41Z"),
        "{detail}"
    );
    // The fire time due now runs; none between the first and it.
    let now = record_for(&scheduler, "tiny", secs(1_000_100), "a").await;
    assert_eq!(now.outcome, RunOutcome::Ok);
    assert_eq!(runs.get(), [("a".to_owned(), secs(1_000_100))]);
    let kept = records(&scheduler, "tiny").await;
    assert_eq!(
        kept.iter()
            .map(|r| (r.scheduled_at, r.outcome))
            .collect::<Vec<_>>(),
        [
            (secs(1_000_100), RunOutcome::Ok),
            (secs(1_000_099), RunOutcome::Missed),
        ]
    );
    running.shutdown(GRACE).await;
}

/// `clock_offset` builds a scheduler whose clock reads the system clock shifted (for
/// simulations of a replica whose clock is off).
#[test]
fn a_clock_offset_shifts_the_system_clock() {
    let locker = Locker::new(lock_memory::MemoryBackend::new());
    let behind = Scheduler::builder(locker)
        .clock_offset(SignedDuration::from_secs(-3600))
        .build()
        .unwrap();
    let lag = SystemTime::now().duration_since(behind.now()).unwrap();
    assert!(
        lag >= Duration::from_secs(3599) && lag <= Duration::from_secs(3601),
        "{lag:?}"
    );
}

/// The default replica id is `hostname-pid`.
#[test]
fn the_default_replica_is_hostname_pid() {
    let locker = Locker::new(lock_memory::MemoryBackend::new());
    let scheduler = Scheduler::builder(locker).build().unwrap();
    let id = scheduler.replica();
    assert!(id.ends_with(&format!("-{}", std::process::id())), "{id}");
    assert!(id.len() > format!("-{}", std::process::id()).len(), "{id}");
}

/// A task that panics when called (before returning its future) is recorded Failed too,
/// and its lock is released.
#[tokio::test]
async fn a_task_panicking_when_called_is_failed() {
    let server = server();
    let clock = ManualClock::new(secs(1_000_005));
    let scheduler = replica(&server, &clock, "a");
    scheduler
        .add(
            Job::every("eager", Duration::from_secs(10))
                .unwrap()
                .at_least(Duration::ZERO)
                .run(|_ctx| -> std::future::Ready<Result<(), BoxError>> {
                    panic!("no future for you")
                }),
        )
        .unwrap();
    let running = scheduler.start().unwrap();
    let record = step(&scheduler, &clock, "eager").await;
    assert_eq!(record.outcome, RunOutcome::Failed);
    assert!(record.detail.unwrap().contains("no future for you"));
    until("the lock was released", || server.held_keys() == 0).await;
    running.shutdown(GRACE).await;
}

/// A replica starting after every replica was down records the fire times passed since
/// the newest record as one Missed record (and runs none of them); one starting while a run of the
/// job is under way elsewhere (lock held, no record yet) records nothing for it.
#[tokio::test]
async fn fire_times_passed_while_no_replica_ran_are_missed_at_the_start() {
    let server = server();
    let clock = ManualClock::new(secs(1_000_005));
    let a = replica(&server, &clock, "a");
    let runs = Runs::default();
    a.add(noting(
        Job::every("down", Duration::from_secs(10)).unwrap(),
        &runs,
    ))
    .unwrap();
    let running = a.start().unwrap();
    assert_eq!(step(&a, &clock, "down").await.outcome, RunOutcome::Ok);
    running.shutdown(GRACE).await;

    // Nobody runs 20, 30, 40; replica b starts at 45.
    clock.set(secs(1_000_045));
    let b = replica(&server, &clock, "b");
    b.add(noting(
        Job::every("down", Duration::from_secs(10)).unwrap(),
        &runs,
    ))
    .unwrap();
    let running = b.start().unwrap();
    let record = record_for(&b, "down", secs(1_000_040), "b").await;
    assert_eq!(record.outcome, RunOutcome::Missed);
    let detail = record.detail.unwrap();
    assert!(
        detail.contains("not running") && detail.contains("3 fire times"),
        "{detail}"
    );
    let next = step(&b, &clock, "down").await;
    assert_eq!(
        (next.scheduled_at, next.outcome),
        (secs(1_000_050), RunOutcome::Ok)
    );
    assert_eq!(runs.len(), 2);
    running.shutdown(GRACE).await;

    // A run under way on c (lock held, no record yet) when d starts: d records nothing for
    // it.
    let c = replica(&server, &clock, "c");
    let release = Arc::new(Notify::new());
    let started = Arc::new(AtomicBool::new(false));
    let (r, s) = (release.clone(), started.clone());
    c.add(
        Job::every("down", Duration::from_secs(10))
            .unwrap()
            .run(move |_ctx| {
                let (r, s) = (r.clone(), s.clone());
                async move {
                    s.store(true, Ordering::SeqCst);
                    r.notified().await;
                    Ok::<_, BoxError>(())
                }
            }),
    )
    .unwrap();
    let running_c = c.start().unwrap();
    clock.set(secs(1_000_060));
    until("c's run started", || started.load(Ordering::SeqCst)).await;
    // Before c's hold ends (60 + at_least 5 s): the lock is held whether or not the run
    // has ended when d looks.
    clock.set(secs(1_000_064));
    let d = replica(&server, &clock, "d");
    d.add(noting(
        Job::every("down", Duration::from_secs(10)).unwrap(),
        &runs,
    ))
    .unwrap();
    let running_d = d.start().unwrap();
    release.notify_one();
    let record = record_for(&c, "down", secs(1_000_060), "c").await;
    assert_eq!(record.outcome, RunOutcome::Ok);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        records(&d, "down").await.iter().all(|r| r.replica != "d"),
        "d recorded nothing"
    );
    running_c.shutdown(GRACE).await;
    running_d.shutdown(GRACE).await;
}

/// Five replicas whose clocks disagree by up to 1.4 s, over 100 fire times: 100 runs, each
/// fire time once, and not one skip (a replica that finds a fire time claimed by another
/// records nothing; a skip would mean an earlier run still held the job).
#[tokio::test]
async fn five_replicas_run_a_hundred_fire_times_once_each_without_a_skip() {
    let server = server();
    let base = ManualClock::new(secs(1_000_005));
    let runs = Runs::default();
    let mut schedulers = Vec::new();
    let mut running = Vec::new();
    for (i, offset_ms) in [0, -300, 300, -800, 600].into_iter().enumerate() {
        let clock = base.offset(SignedDuration::from_millis(offset_ms));
        let scheduler = replica(&server, &clock, &format!("r{i}"));
        let job = Job::every("hundred", Duration::from_secs(10)).unwrap();
        scheduler.add(noting(job, &runs)).unwrap();
        running.push(scheduler.start().unwrap());
        schedulers.push(scheduler);
    }
    for n in 1..=100u64 {
        let fire = secs(1_000_000 + 10 * n);
        // Every replica's clock past the fire time (the slowest by 0 ms to 1.4 s).
        base.set(fire + Duration::from_millis(800));
        until(&format!("fire time {n} ran"), || {
            runs.get().iter().any(|(_, at)| *at == fire)
        })
        .await;
        // Past the winner's at-least hold (5 s), and its release seen, before the next.
        base.set(fire + Duration::from_secs(6));
        until("the hold ended", || server.held_keys() == 0).await;
    }
    for handle in running {
        handle.shutdown(GRACE).await;
    }
    let runs = runs.get();
    assert_eq!(runs.len(), 100, "{runs:?}");
    let mut fires: Vec<_> = runs.iter().map(|(_, at)| *at).collect();
    fires.dedup();
    assert_eq!(fires.len(), 100, "each fire time once: {runs:?}");
    let all: Vec<RunRecord> = records(&schedulers[0], "hundred").await;
    let skips = all
        .iter()
        .filter(|r| r.outcome == RunOutcome::SkippedBusy)
        .count();
    assert_eq!(skips, 0, "no skip: {all:#?}");
    assert!(all.iter().all(|r| r.outcome == RunOutcome::Ok), "{all:#?}");
}
