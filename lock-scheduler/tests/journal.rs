//! The run journal on the in-process server, on a manual clock: a run is `running` from its
//! start and its end replaces that record; a start within a fire time's lateness runs it;
//! `catch_up = latest` runs the newest missed fire time once; pauses hold on every replica.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{outcomes, record_for, records, replica, secs, server, step, until, Runs, GRACE};
use lock_scheduler::{
    control, BoxError, CatchUp, Job, JobContext, ManualClock, RunCause, RunOutcome,
};
use tokio::sync::Notify;

fn noting(job: Job, runs: &Runs) -> Job {
    let runs = runs.clone();
    job.run(move |ctx: JobContext| {
        let runs = runs.clone();
        async move {
            runs.push(ctx.replica(), ctx.scheduled_at());
            ctx.keep_output(format!("ran {}\n", ctx.cause().as_str()));
            Ok::<_, BoxError>(())
        }
    })
}

/// While a run goes on, the journal holds its `running` record (replica, pid, fence,
/// start); its end replaces it: one record per fire time, with the output kept.
#[tokio::test]
async fn a_run_is_running_from_its_start_and_its_end_replaces_it() {
    let clock = ManualClock::new(secs(1_000_005));
    let a = replica(&server(), &clock, "a");
    let release = Arc::new(Notify::new());
    let started = Arc::new(AtomicBool::new(false));
    let (r, s) = (release.clone(), started.clone());
    a.add(
        Job::every("long", Duration::from_secs(10))
            .unwrap()
            .run(move |ctx: JobContext| {
                let (r, s) = (r.clone(), s.clone());
                async move {
                    s.store(true, Ordering::SeqCst);
                    r.notified().await;
                    ctx.keep_output("the end\n");
                    Ok::<_, BoxError>(())
                }
            }),
    )
    .unwrap();
    let running = a.start().unwrap();
    clock.set(secs(1_000_010));
    until("the run started", || started.load(Ordering::SeqCst)).await;
    let mut under_way = Vec::new();
    for _ in 0..200 {
        under_way = records(&a, "long").await;
        if !under_way.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(under_way.len(), 1, "{under_way:?}");
    let r = &under_way[0];
    assert_eq!(r.outcome, RunOutcome::Running);
    assert_eq!((r.replica.as_str(), r.pid), ("a", Some(std::process::id())));
    assert!(r.fence.is_some() && r.started_at.is_some());
    release.notify_one();
    let ended = record_for(&a, "long", secs(1_000_010), "a").await;
    assert_eq!(ended.outcome, RunOutcome::Ok);
    assert_eq!(ended.fence, r.fence);
    assert_eq!(ended.output.as_deref(), Some("the end\n"));
    assert_eq!(records(&a, "long").await.len(), 1, "replaced, not added");
    running.shutdown(GRACE).await;
}

/// A replica (re)started 1 s after a fire time, within its lateness (2.5 s), runs it.
#[tokio::test]
async fn a_start_within_a_fire_time_s_lateness_runs_it() {
    let clock = ManualClock::new(secs(1_000_011));
    let a = replica(&server(), &clock, "a");
    let runs = Runs::default();
    a.add(noting(
        Job::every("soon", Duration::from_secs(10)).unwrap(),
        &runs,
    ))
    .unwrap();
    let running = a.start().unwrap();
    let record = record_for(&a, "soon", secs(1_000_010), "a").await;
    assert_eq!(record.outcome, RunOutcome::Ok);
    assert_eq!(runs.get(), [("a".to_owned(), secs(1_000_010))]);
    running.shutdown(GRACE).await;
}

/// Every replica down across three fire times; two replicas start with
/// `catch_up = latest`: the newest missed fire time runs once (cause catch-up) and the two
/// before it are one Missed record. Past the starting deadline nothing is caught up.
#[tokio::test]
async fn catch_up_latest_runs_the_newest_missed_fire_time_once() {
    let server = server();
    let clock = ManualClock::new(secs(1_000_005));
    let runs = Runs::default();
    let job = |deadline: u64| {
        noting(
            Job::every("nightly", Duration::from_secs(10))
                .unwrap()
                .catch_up(CatchUp::Latest {
                    deadline: Duration::from_secs(deadline),
                }),
            &runs,
        )
    };
    let a = replica(&server, &clock, "a");
    a.add(job(60)).unwrap();
    let running = a.start().unwrap();
    assert_eq!(step(&a, &clock, "nightly").await.outcome, RunOutcome::Ok);
    running.shutdown(GRACE).await;

    // Down for 20, 30, 40; back at 45 (past 40's lateness) on two replicas.
    clock.set(secs(1_000_045));
    let (b, c) = (replica(&server, &clock, "b"), replica(&server, &clock, "c"));
    b.add(job(60)).unwrap();
    c.add(job(60)).unwrap();
    let (rb, rc) = (b.start().unwrap(), c.start().unwrap());
    until("the catch-up ran", || runs.len() == 2).await;
    let deadline = std::time::Instant::now() + common::PATIENCE;
    let kept = loop {
        let kept = records(&b, "nightly").await;
        if kept.iter().all(|r| r.outcome != RunOutcome::Running) && kept.len() == 3 {
            break kept;
        }
        assert!(std::time::Instant::now() < deadline, "{kept:#?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(runs.len(), 2, "caught up once: {:?}", runs.get());
    assert_eq!(runs.get()[1].1, secs(1_000_040));
    let caught = &kept[0];
    assert_eq!(
        (caught.scheduled_at, caught.outcome, caught.cause),
        (secs(1_000_040), RunOutcome::Ok, RunCause::CatchUp)
    );
    assert_eq!(caught.output.as_deref(), Some("ran catch-up\n"));
    let missed = kept
        .iter()
        .find(|r| r.outcome == RunOutcome::Missed)
        .unwrap();
    assert_eq!(
        missed.scheduled_at,
        secs(1_000_030),
        "at the last it stands for"
    );
    assert!(missed.detail.as_deref().unwrap().contains("2 fire times"));
    rb.shutdown(GRACE).await;
    rc.shutdown(GRACE).await;

    // Down again until 205: 50..200 missed, 200 older than the 3 s deadline (and past
    // its lateness): one record at 200, nothing caught up.
    clock.set(secs(1_000_205));
    let d = replica(&server, &clock, "d");
    d.add(job(3)).unwrap();
    let rd = d.start().unwrap();
    let missed = record_for(&d, "nightly", secs(1_000_200), "d").await;
    assert_eq!(missed.outcome, RunOutcome::Missed);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(runs.len(), 2, "past its deadline: not caught up");
    rd.shutdown(GRACE).await;
}

/// A pause written through the lock server holds every replica's fire times; a resume
/// lets the next one run.
#[tokio::test]
async fn a_pause_holds_every_replica_until_resumed() {
    let server = server();
    let clock = ManualClock::new(secs(1_000_005));
    let runs = Runs::default();
    let (a, b) = (replica(&server, &clock, "a"), replica(&server, &clock, "b"));
    for s in [&a, &b] {
        s.add(noting(
            Job::every("p", Duration::from_secs(10)).unwrap(),
            &runs,
        ))
        .unwrap();
    }
    let (ra, rb) = (a.start().unwrap(), b.start().unwrap());
    let control = control::pause(a.locker(), "p", "ops").await.unwrap();
    assert!(control.paused);
    assert_eq!(a.control("p").await.unwrap().unwrap().changed_by, "ops");
    clock.set(secs(1_000_010));
    tokio::time::sleep(Duration::from_millis(200)).await;
    clock.set(secs(1_000_020));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(runs.len(), 0, "paused on both replicas");
    assert!(
        records(&a, "p").await.is_empty(),
        "a paused fire time leaves no record"
    );
    control::resume(b.locker(), "p", "ops").await.unwrap();
    clock.set(secs(1_000_030));
    until("a run after the resume", || runs.len() == 1).await;
    assert_eq!(runs.get()[0].1, secs(1_000_030));
    assert_eq!(
        outcomes(&records(&a, "p").await)
            .into_iter()
            .filter(|o| *o != RunOutcome::Running)
            .count(),
        1
    );
    ra.shutdown(GRACE).await;
    rb.shutdown(GRACE).await;
}
