//! The running scheduler: one timer task per job, which spawns one task per fire time it
//! starts, so a run still going never delays the next fire time (that one finds the lock
//! taken and is skipped).

use futures::FutureExt as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use jiff::tz::TimeZone;
use jiff::Zoned;
use lock_core::records::{RunCause, RunOutcome, RunRecord};
use lock_core::sync::lock;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::error::{Error, Result};
use crate::fire::run_fire;
use crate::job::{CatchUp, Job};
use crate::observe;
use crate::plan::{instant_of, Plan};
use crate::state::{Control, ControlState, Ended, Inner, ShutdownReport};

impl Control {
    fn new() -> Control {
        Control {
            state: Arc::new(ControlState {
                stop: watch::Sender::new(false),
                cut: watch::Sender::new(false),
                loops: Mutex::new(JoinSet::new()),
                runs: Mutex::new(JoinSet::new()),
            }),
        }
    }

    /// Starts the timer task of `job` (not after a stop).
    pub(crate) fn spawn_job(&self, inner: &Arc<Inner>, job: Arc<Job>) {
        let mut loops = lock(&self.state.loops);
        if self.stopping() {
            return;
        }
        // The first fire time is the first after now, not after the task's first poll.
        let after = inner.clock.now();
        loops.spawn(crate::control::poll_triggers(
            inner.clone(),
            self.clone(),
            job.clone(),
        ));
        loops.spawn(job_loop(inner.clone(), self.clone(), job, after));
    }

    /// Starts the task of fire time `fire` of `job` (not after a stop).
    pub(crate) fn spawn_fire(
        &self,
        inner: &Arc<Inner>,
        job: &Arc<Job>,
        fire: Zoned,
        plan: Plan,
        cause: RunCause,
    ) {
        let task = run_fire(inner.clone(), self.clone(), job.clone(), fire, plan, cause);
        self.spawn_run(task);
    }

    /// Starts the task of one fire time (not after a stop).
    fn spawn_run(&self, run: impl std::future::Future<Output = Ended> + Send + 'static) {
        let mut runs = lock(&self.state.runs);
        if self.stopping() {
            return;
        }
        // Reap the tasks already done, so a long-running scheduler keeps none.
        while runs.try_join_next().is_some() {}
        runs.spawn(run);
    }
}

/// Checks a job before it is registered.
pub(crate) fn check(inner: &Inner, job: Job) -> Result<Job> {
    let name = || job.name.clone();
    if job.task.is_none() {
        return Err(Error::NoTask { job: name() });
    }
    if job.timeout == Some(Duration::ZERO) {
        return Err(Error::InvalidOption {
            job: name(),
            reason: "the timeout must be longer than zero".to_owned(),
        });
    }
    if let Some(ttl) = job.ttl {
        if let Err(e) = inner.locker.capabilities().effective_ttl(ttl) {
            return Err(Error::InvalidOption {
                job: name(),
                reason: e.to_string(),
            });
        }
    }
    let zone = job.zone.as_ref().unwrap_or(&inner.zone);
    if job.schedule.next_after(inner.clock.now(), zone).is_none() {
        return Err(Error::NeverFires { job: name() });
    }
    Ok(job)
}

/// Starts the timer tasks of every job; a scheduler starts once, on a backend that keeps
/// fire-time claims.
pub(crate) fn start(inner: &Arc<Inner>) -> Result<()> {
    if inner.locker.backend().fire_claims().is_none() {
        return Err(Error::ClaimsNotKept {
            backend: inner.locker.capabilities().name,
        });
    }
    if let Some(mode) = &inner.leader {
        inner.locker.election(&mode.election)?;
        if let Err(e) = inner.locker.capabilities().effective_ttl(mode.ttl) {
            return Err(Error::InvalidOption {
                job: mode.election.clone(),
                reason: e.to_string(),
            });
        }
    }
    {
        // Jobs, then the started state, as `Scheduler::add` takes them: a job added
        // meanwhile is started once, by one of the two.
        let jobs = lock(&inner.jobs);
        let mut started = lock(&inner.started);
        if started.is_some() {
            return Err(Error::AlreadyStarted);
        }
        let control = Control::new();
        *started = Some(control.clone());
        observe::describe();
        if let Some(mode) = &inner.leader {
            let lead = crate::leader::lead(inner.clone(), control.clone(), mode.clone());
            lock(&control.state.loops).spawn(lead);
        }
        for job in jobs.values() {
            control.spawn_job(inner, job.clone());
        }
        tracing::info!(replica = %inner.replica, jobs = jobs.len(), "scheduler started");
    }
    Ok(())
}

fn control_of(inner: &Inner) -> Option<Control> {
    lock(&inner.started).clone()
}

/// Stops `inner`'s scheduler gracefully (see `Running::shutdown`).
pub(crate) async fn shutdown(inner: &Inner, grace: Duration) -> ShutdownReport {
    let Some(control) = control_of(inner) else {
        return ShutdownReport::default();
    };
    // From here a dropped future is a dropped handle: `Drop` aborts what is left.
    let began = Instant::now();
    let deadline = tokio::time::Instant::now() + grace;
    control.state.stop.send_replace(true);
    tracing::info!(replica = %inner.replica, ?grace, "scheduler shutting down");
    // The timer tasks end at once; after them no fire time can start.
    let mut loops = std::mem::take(&mut *lock(&control.state.loops));
    while loops.join_next().await.is_some() {}
    let mut runs = std::mem::take(&mut *lock(&control.state.runs));
    let mut report = ShutdownReport::default();
    let mut collect = |ended: std::result::Result<Ended, tokio::task::JoinError>| match ended {
        Ok(Ended {
            record: None,
            ran_until: _,
        }) => {}
        Ok(Ended {
            record: Some(record),
            ran_until,
        }) => {
            if record.outcome == RunOutcome::Cut {
                report.cut.push(record);
            } else if ran_until.is_some_and(|t| t >= began) {
                report.finished.push(record);
            }
        }
        Err(e) => tracing::error!(error = %e, "a run task failed"),
    };
    loop {
        match tokio::time::timeout_at(deadline, runs.join_next()).await {
            Ok(Some(ended)) => collect(ended),
            Ok(None) => break,
            Err(_) => {
                control.state.cut.send_replace(true);
                while let Some(ended) = runs.join_next().await {
                    collect(ended);
                }
                break;
            }
        }
    }
    tracing::info!(
        finished = report.finished.len(),
        cut = report.cut.len(),
        "scheduler stopped"
    );
    report
}

/// Stops `inner`'s scheduler at once (a dropped `Running`): its tasks are cancelled, and
/// awaited by one of the Locker's background tasks, so that a `Locker::shutdown` started
/// now waits until they are dropped and the releases their guards' drops start are done.
/// (A cancelled task is dropped when a worker next gets to it, which can be after a
/// shutdown that found nothing held: the guard of a run cancelled during its release is
/// no longer held, and its drop had not started the background release yet.)
pub(crate) fn abort(inner: &Inner) {
    if let Some(control) = control_of(inner) {
        control.state.stop.send_replace(true);
        control.state.cut.send_replace(true);
        let mut loops = std::mem::take(&mut *lock(&control.state.loops));
        let mut runs = std::mem::take(&mut *lock(&control.state.runs));
        loops.abort_all();
        runs.abort_all();
        if !loops.is_empty() || !runs.is_empty() {
            // Outside a runtime nothing is spawned, and the sets dropped here are aborted.
            inner.locker.spawn_background(async move {
                while loops.join_next().await.is_some() {}
                while runs.join_next().await.is_some() {}
            });
        }
    }
}

/// Fires `job` at each of its fire times until the scheduler stops.
async fn job_loop(inner: Arc<Inner>, control: Control, job: Arc<Job>, mut after: SystemTime) {
    let zone = job.zone.clone().unwrap_or_else(|| inner.zone.clone());
    // The job's series exist from here, before it ever ran: an alert on a job that never
    // succeeded counts from its start and its period.
    observe::job_started(&job.name, after, job.schedule.period_at(after, &zone));
    let mut stop = control.state.stop.subscribe();
    if let Some(records) = inner.locker.backend().run_records() {
        // The gauge starts from the shared history, not from zero.
        if let Ok(Some(last)) = records.last_success(&job.name).await {
            observe::last_success(&job.name, last.ended_at);
        }
    }
    // The start on the server's clock: the fire times before it were not this replica's
    // (and those found missed while no replica ran are judged on that clock too).
    measure_the_server_clock(&inner, &job).await;
    after = inner.server_time_of(after);
    start_up(&inner, &control, &job, &zone, after).await;
    loop {
        let Some(fire) = job.schedule.next_after(after, &zone) else {
            tracing::warn!(job = job.name, "the schedule has no fire time left");
            return;
        };
        let at = instant_of(&fire);
        // Due when the server's clock reaches it: a replica whose clock is fast must not
        // claim a fire time before the earlier ones were claimed (claims only move
        // forward, so those would then run nowhere).
        loop {
            let ours = inner.ours(at);
            futures::select_biased! {
                _ = stop.wait_for(|stopping| *stopping).fuse() => return,
                _ = inner.clock.sleep_until(ours).fuse() => {}
            }
            // The offset may have moved while we slept (another job's claim measured it).
            if inner.server_now() >= at {
                break;
            }
        }
        let plan = Plan::new(&job, &zone, at);
        // A cron schedule's gaps vary (weekends, months): the period is this fire time's.
        observe::period(&job.name, plan.gap);
        let now = inner.server_now();
        if now > at + plan.lateness {
            after = record_missed(&inner, &job, &zone, fire, now, Found::Late).await;
            continue;
        }
        if !crate::leader::may_fire(&inner, &control, at + plan.lateness).await {
            // Another replica leads: the fire time is its to run (and to claim).
            after = at;
            continue;
        }
        control.spawn_fire(&inner, &job, fire, plan, RunCause::Schedule);
        after = at;
    }
}

/// A fire time no schedule has (the Unix epoch's first millisecond), claimed to read the
/// lock server's clock without claiming a real one: it wins only when the job has no
/// claim yet, and then claims nothing that could ever fire.
const PROBE: Duration = Duration::from_millis(1);

/// Reads the lock server's clock through a claim of [`PROBE`] when no claim of this
/// scheduler measured it yet, so the first fire time is already waited for on the
/// server's clock. A failure or a server without a clock leaves the replica's clock.
async fn measure_the_server_clock(inner: &Inner, job: &Job) {
    if lock(&inner.offset).is_some() {
        return;
    }
    let sent = std::time::Instant::now();
    let asked_at = inner.clock.now();
    let answer = inner
        .locker
        .claim_fire_time(&job.name, UNIX_EPOCH + PROBE, &inner.replica)
        .await;
    if let Ok(Some(server)) = answer.map(|a| a.server_time) {
        observe::clock_offset(inner, asked_at + sent.elapsed() / 2, server);
    }
}

/// Why a fire time found due too late is missed.
const LATE: &str =
    "the scheduler was late by more than the lateness bound (suspended or overloaded)";

/// Why a fire time passed while no replica was running is missed.
const DOWN: &str = "no replica ran it: the scheduler was not running";

/// How missed fire times were found.
enum Found {
    /// Due past their lateness bound when this replica's timer woke (suspended, starved).
    Late,
    /// At a start: passed while no replica ran; how many, and the last of them.
    Down(usize, Zoned),
}

/// At the start, on the server's clock `now`:
///
/// - the newest fire time still within its lateness bound is run (its claim decides
///   whether it already ran elsewhere), so a replica restarted within that bound loses no
///   fire time;
/// - the fire times after the newest one the journal or the claims know, and before that,
///   passed while no replica ran: with [`CatchUp::Latest`] the newest of them within the
///   deadline runs once (when no fire time is within its lateness, which would stand for
///   it), and the others become one `missed` summary record (its slot is the last one's,
///   so replicas starting together leave one record, and one starting after it finds them
///   known).
///
/// Nothing is taken for missed while the job's lock is held (a run going on elsewhere),
/// nor on a backend that keeps no journal or cannot inspect a lock, nor for a job never
/// recorded. In leader mode only the summary is written: the leader fires.
async fn start_up(
    inner: &Arc<Inner>,
    control: &Control,
    job: &Arc<Job>,
    zone: &TimeZone,
    now: SystemTime,
) {
    let recent = due_within_lateness(job, zone, now);
    let spawn = |fire: Zoned, plan: Plan, cause: RunCause| {
        if inner.leader.is_none() {
            control.spawn_fire(inner, job, fire, plan, cause);
        }
    };
    if let Some(newest) = newest_known(inner, job).await {
        // The fire times after the newest known, up to the one due now (or now).
        let until = recent.as_ref().map(instant_of).unwrap_or(now);
        // The first, the one before the newest, and the newest are all that is kept.
        let (mut first, mut prev, mut last): (Option<Zoned>, Option<Zoned>, Option<Zoned>) =
            (None, None, None);
        let mut count = 0usize;
        let mut fire = job.schedule.next_after(newest, zone);
        while let Some(f) = fire.filter(|f| instant_of(f) < until) {
            count += 1;
            if first.is_none() {
                first = Some(f.clone());
            }
            prev = last.replace(f.clone());
            if count >= MAX_COUNTED {
                break;
            }
            fire = job.schedule.next_after(instant_of(&f), zone);
        }
        if let (Some(first), Some(last)) = (first, last) {
            let caught = match job.catch_up {
                CatchUp::Latest { deadline }
                    if recent.is_none()
                        && now.duration_since(instant_of(&last)).unwrap_or_default()
                            <= deadline =>
                {
                    let mut plan = Plan::new(job, zone, instant_of(&last));
                    plan.lateness = deadline;
                    plan.at_least = Duration::ZERO;
                    spawn(last.clone(), plan, RunCause::CatchUp);
                    true
                }
                _ => false,
            };
            let summarised = if caught {
                prev.map(|p| (count - 1, p))
            } else {
                Some((count, last))
            };
            if let Some((n, end)) = summarised {
                record_missed(inner, job, zone, first, now, Found::Down(n, end)).await;
            }
        }
    }
    if let Some(fire) = recent {
        let at = instant_of(&fire);
        spawn(fire, Plan::new(job, zone, at), RunCause::Schedule);
    }
}

/// Most missed fire times counted one by one at a start (a one-second schedule after a
/// long outage would otherwise be counted for a long time).
const MAX_COUNTED: usize = 100_000;

/// The newest fire time of `job` before `now` still within its lateness bound.
fn due_within_lateness(job: &Job, zone: &TimeZone, now: SystemTime) -> Option<Zoned> {
    let window = Plan::new(job, zone, now).lateness;
    let mut fire = job.schedule.next_after(now.checked_sub(window)?, zone);
    let mut due = None;
    for _ in 0..10_000 {
        let Some(f) = fire.filter(|f| instant_of(f) < now) else {
            break;
        };
        let at = instant_of(&f);
        if now <= at + Plan::new(job, zone, at).lateness {
            due = Some(f.clone());
        }
        fire = job.schedule.next_after(at, zone);
    }
    due
}

/// The newest fire time of `job` the lock server knows of: in its journal (a trigger's
/// instant aside) or claimed (the probe aside); `None` for a job never recorded or
/// claimed, while its lock is held, or where the server keeps no journal or cannot
/// inspect locks.
async fn newest_known(inner: &Inner, job: &Job) -> Option<SystemTime> {
    let backend = inner.locker.backend();
    let (records, admin) = (backend.run_records()?, backend.admin()?);
    // Records are stored as runs start and end, not in fire-time order: take the latest.
    let recent = records.recent(&job.name, 16).await.ok()?;
    let claimed = match inner.locker.fire_claim(&job.name).await {
        Ok(claim) => claim
            .map(|c| c.fire_time)
            .filter(|at| *at > UNIX_EPOCH + PROBE),
        Err(_) => return None,
    };
    let newest = recent
        .iter()
        .filter(|r| r.cause != RunCause::Trigger)
        .map(|r| r.scheduled_at)
        .chain(claimed)
        .max()?;
    if !matches!(admin.inspect(&job.name).await, Ok(holders) if holders.is_empty()) {
        return None;
    }
    Some(newest)
}

/// Records `first` and the fire times after it that are past their lateness bound at
/// `now` as missed, in one record at the last of them (so a replica starting later takes
/// them all for known), and returns that last one to look for the next fire time after.
/// A replica that found them [`Found::Late`] records them only if it wins the last one's
/// claim.
async fn record_missed(
    inner: &Inner,
    job: &Job,
    zone: &TimeZone,
    first: Zoned,
    now: SystemTime,
    found: Found,
) -> SystemTime {
    let why = match found {
        Found::Late => LATE,
        Found::Down(..) => DOWN,
    };
    let late = matches!(found, Found::Late);
    let (count, last) = match found {
        Found::Down(count, last) => (count, last),
        Found::Late => {
            let past_bound = |fire: &Zoned| {
                let at = instant_of(fire);
                now > at + Plan::new(job, zone, at).lateness
            };
            let mut last = first.clone();
            let mut count = 1usize;
            while let Some(next) = job
                .schedule
                .next_after(instant_of(&last), zone)
                .filter(past_bound)
            {
                last = next;
                count += 1;
                if count >= MAX_COUNTED {
                    break;
                }
            }
            (count, last)
        }
    };
    let at = instant_of(&last);
    if late {
        // Found late by this replica alone: the record is the claim winner's, as a run's
        // is (another replica may have run these fire times, or be recording them).
        match inner
            .locker
            .claim_fire_time(&job.name, at, &inner.replica)
            .await
        {
            Ok(answer) if answer.won => {}
            _ => return at,
        }
    }
    let detail = if count == 1 {
        why.to_owned()
    } else {
        format!(
            "{why}; {count} fire times from {} to this one were missed",
            jiff::Timestamp::try_from(instant_of(&first))
                .map(|t| t.to_string())
                .unwrap_or_default()
        )
    };
    let record = RunRecord::new(
        job.name.clone(),
        at,
        inner.replica.to_string(),
        now,
        RunOutcome::Missed,
    )
    .detail(Some(detail))
    .clock_offset_ms(inner.offset_ms());
    observe::finish(inner, &record, None).await;
    at
}
