//! Time zones and daylight-saving transitions: the rules of `Schedule`, checked on the
//! schedule alone and on a running scheduler driven by a manual clock.

mod common;

use std::time::SystemTime;

use common::{replica, server, show, step, t, Runs};
use lock_scheduler::jiff::tz::TimeZone;
use lock_scheduler::{BoxError, Error, Job, ManualClock, RunOutcome, Scheduler};

fn zone(name: &str) -> TimeZone {
    TimeZone::get(name).expect("zone")
}

/// The fire times of `expression` in `zone` from `from` (exclusive) to `to` (inclusive).
fn fire_times(expression: &str, zone_name: &str, from: &str, to: &str) -> Vec<String> {
    let job = Job::cron("j", expression).unwrap();
    let zone = zone(zone_name);
    let (mut at, end) = (t(from), t(to));
    let mut out = Vec::new();
    while let Some(next) = job.schedule().next_after(at, &zone) {
        at = SystemTime::from(next.timestamp());
        if at > end {
            break;
        }
        out.push(next.to_string());
    }
    out
}

/// Berlin springs forward (02:00 CET → 03:00 CEST): 02:30 does not exist that night and
/// fires once, at 03:00 CEST, the first instant after the gap.
#[test]
fn berlin_spring_forward_fires_once_after_the_gap() {
    assert_eq!(
        fire_times(
            "0 30 2 * * *",
            "Europe/Berlin",
            "2026-03-28T12:00:00Z",
            "2026-03-30T12:00:00Z"
        ),
        [
            "2026-03-29T03:00:00+02:00[Europe/Berlin]",
            "2026-03-30T02:30:00+02:00[Europe/Berlin]",
        ]
    );
}

/// Berlin falls back (03:00 CEST → 02:00 CET): 02:30 happens twice and fires once, at its
/// first occurrence (CEST).
#[test]
fn berlin_fall_back_fires_once_at_the_first_occurrence() {
    assert_eq!(
        fire_times(
            "0 30 2 * * *",
            "Europe/Berlin",
            "2026-10-24T12:00:00Z",
            "2026-10-26T12:00:00Z"
        ),
        [
            "2026-10-25T02:30:00+02:00[Europe/Berlin]",
            "2026-10-26T02:30:00+01:00[Europe/Berlin]",
        ]
    );
}

/// New York springs forward (02:00 EST → 03:00 EDT): 02:30 fires once at 03:00 EDT.
#[test]
fn new_york_spring_forward_fires_once_after_the_gap() {
    assert_eq!(
        fire_times(
            "30 2 * * *",
            "America/New_York",
            "2026-03-07T12:00:00Z",
            "2026-03-09T12:00:00Z"
        ),
        [
            "2026-03-08T03:00:00-04:00[America/New_York]",
            "2026-03-09T02:30:00-04:00[America/New_York]",
        ]
    );
}

/// New York falls back (02:00 EDT → 01:00 EST): 01:30 fires once, at 01:30 EDT.
#[test]
fn new_york_fall_back_fires_once_at_the_first_occurrence() {
    assert_eq!(
        fire_times(
            "30 1 * * *",
            "America/New_York",
            "2026-10-31T12:00:00Z",
            "2026-11-02T12:00:00Z"
        ),
        [
            "2026-11-01T01:30:00-04:00[America/New_York]",
            "2026-11-02T01:30:00-05:00[America/New_York]",
        ]
    );
}

/// A step in the hour field follows real time: the repeated hour fires twice (each an
/// hour of real time apart), the skipped one not at all.
#[test]
fn wildcard_hours_keep_their_real_time_cadence() {
    assert_eq!(
        fire_times(
            "0 0 * * * *",
            "Europe/Berlin",
            "2026-10-24T23:30:00Z",
            "2026-10-25T02:30:00Z"
        ),
        [
            "2026-10-25T02:00:00+02:00[Europe/Berlin]",
            "2026-10-25T02:00:00+01:00[Europe/Berlin]",
            "2026-10-25T03:00:00+01:00[Europe/Berlin]",
        ]
    );
    assert_eq!(
        fire_times(
            "0 0 * * * *",
            "Europe/Berlin",
            "2026-03-28T23:30:00Z",
            "2026-03-29T01:30:00Z"
        ),
        [
            "2026-03-29T01:00:00+01:00[Europe/Berlin]",
            "2026-03-29T03:00:00+02:00[Europe/Berlin]",
        ]
    );
}

/// A scheduler over a manual clock, one job at 02:30 local time that notes its runs.
async fn nightly(
    zone: &str,
    start: &str,
) -> (Scheduler, ManualClock, Runs, lock_scheduler::Running) {
    let clock = ManualClock::at(start);
    let scheduler = replica(&server(), &clock, "a");
    let runs = Runs::default();
    let noted = runs.clone();
    let hour = if zone == "America/New_York" && start.starts_with("2026-10") {
        1
    } else {
        2
    };
    scheduler
        .add(
            Job::cron("nightly", &format!("0 30 {hour} * * *"))
                .unwrap()
                .time_zone(zone)
                .unwrap()
                .run(move |ctx| {
                    let noted = noted.clone();
                    async move {
                        noted.push(ctx.replica(), ctx.scheduled_at());
                        Ok::<_, BoxError>(())
                    }
                }),
        )
        .unwrap();
    let running = scheduler.start().unwrap();
    (scheduler, clock, runs, running)
}

/// Runs the night on the scheduler: the one run of the night is at `expected` and the
/// next fire time is `next` (the next night), so the night had exactly one run.
async fn one_run_in_the_night(zone: &str, start: &str, expected: &str, next: &str) {
    let (scheduler, clock, runs, running) = nightly(zone, start).await;
    let record = step(&scheduler, &clock, "nightly").await;
    assert_eq!(record.outcome, RunOutcome::Ok);
    assert_eq!(show(record.scheduled_at), expected);
    assert_eq!(runs.get(), [("a".to_owned(), t(expected))]);
    assert_eq!(
        show(SystemTime::from(
            scheduler.next_fire("nightly").unwrap().timestamp()
        )),
        next
    );
    running.shutdown(std::time::Duration::from_secs(5)).await;
}

/// On a running scheduler: Berlin's missing 02:30 runs once, at 03:00 CEST (01:00 UTC).
#[tokio::test]
async fn scheduler_runs_berlin_spring_forward_once() {
    one_run_in_the_night(
        "Europe/Berlin",
        "2026-03-28T22:00:00Z",
        "2026-03-29T01:00:00Z",
        "2026-03-30T00:30:00Z",
    )
    .await;
}

/// On a running scheduler: Berlin's doubled 02:30 runs once, at 02:30 CEST (00:30 UTC);
/// the next run is the following night's 02:30 CET.
#[tokio::test]
async fn scheduler_runs_berlin_fall_back_once() {
    one_run_in_the_night(
        "Europe/Berlin",
        "2026-10-24T22:00:00Z",
        "2026-10-25T00:30:00Z",
        "2026-10-26T01:30:00Z",
    )
    .await;
}

/// On a running scheduler: New York's missing 02:30 runs once, at 03:00 EDT (07:00 UTC).
#[tokio::test]
async fn scheduler_runs_new_york_spring_forward_once() {
    one_run_in_the_night(
        "America/New_York",
        "2026-03-08T04:00:00Z",
        "2026-03-08T07:00:00Z",
        "2026-03-09T06:30:00Z",
    )
    .await;
}

/// On a running scheduler: New York's doubled 01:30 runs once, at 01:30 EDT (05:30 UTC).
#[tokio::test]
async fn scheduler_runs_new_york_fall_back_once() {
    one_run_in_the_night(
        "America/New_York",
        "2026-10-31T23:00:00Z",
        "2026-11-01T05:30:00Z",
        "2026-11-02T06:30:00Z",
    )
    .await;
}

/// An Asia/Shanghai job on a scheduler whose default zone is UTC fires at 09:00 Shanghai
/// (01:00 UTC); a job without a zone on the same scheduler fires at 09:00 UTC. The
/// default zone is UTC, not the host's.
#[tokio::test]
async fn a_shanghai_job_on_a_utc_scheduler() {
    let clock = ManualClock::at("2026-07-01T00:00:00Z");
    let scheduler = replica(&server(), &clock, "a");
    assert_eq!(scheduler.time_zone().iana_name(), Some("UTC"));
    let ok = |_ctx| async { Ok::<_, BoxError>(()) };
    scheduler
        .add(
            Job::cron("shanghai", "0 9 * * *")
                .unwrap()
                .time_zone("Asia/Shanghai")
                .unwrap()
                .run(ok),
        )
        .unwrap();
    scheduler
        .add(Job::cron("utc", "0 9 * * *").unwrap().run(ok))
        .unwrap();
    let next = scheduler.next_fire("shanghai").unwrap();
    assert_eq!(next.to_string(), "2026-07-01T09:00:00+08:00[Asia/Shanghai]");
    assert_eq!(
        scheduler.next_fire("utc").unwrap().to_string(),
        "2026-07-01T09:00:00+00:00[UTC]"
    );
    let running = scheduler.start().unwrap();
    let record = step(&scheduler, &clock, "shanghai").await;
    assert_eq!(show(record.scheduled_at), "2026-07-01T01:00:00Z");
    assert_eq!(record.outcome, RunOutcome::Ok);
    let record = step(&scheduler, &clock, "utc").await;
    assert_eq!(show(record.scheduled_at), "2026-07-01T09:00:00Z");
    running.shutdown(std::time::Duration::from_secs(5)).await;
}

/// Unknown zones are typed errors naming the job (or the scheduler's default).
#[test]
fn unknown_time_zones_are_refused() {
    match Job::cron("j", "* * * * *")
        .unwrap()
        .time_zone("Mars/Olympus")
    {
        Err(Error::UnknownTimeZone { job, name, .. }) => {
            assert_eq!(job.as_deref(), Some("j"));
            assert_eq!(name, "Mars/Olympus");
        }
        other => panic!("expected UnknownTimeZone, got {other:?}"),
    }
    let locker = lock_core::Locker::new(lock_memory::MemoryBackend::new());
    match Scheduler::builder(locker).time_zone("Nowhere/Else").build() {
        Err(Error::UnknownTimeZone {
            job: None, name, ..
        }) => assert_eq!(name, "Nowhere/Else"),
        other => panic!("expected UnknownTimeZone, got {other:?}"),
    }
}
