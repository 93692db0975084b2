//! The running scheduler: one timer task per job, which spawns one task per fire time it
//! starts, so a run still going never delays the next fire time (that one finds the lock
//! taken and is skipped).

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures::FutureExt;
use jiff::tz::TimeZone;
use jiff::Zoned;
use lock_core::records::{RunOutcome, RunRecord};
use lock_core::sync::lock;
use lock_core::{LockGuard, LockOptions, WaitStrategy};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::error::{Error, Result};
use crate::job::{Job, JobContext, OnBusy};
use crate::observe;
use crate::scheduler::{Inner, Running, Scheduler, ShutdownReport};

/// The longest default `at_least` hold.
const MAX_DEFAULT_AT_LEAST: Duration = Duration::from_secs(60);
/// The shortest default lateness bound.
const MIN_DEFAULT_LATENESS: Duration = Duration::from_millis(500);
/// The bounds of the default TTL.
const MIN_DEFAULT_TTL: Duration = Duration::from_secs(1);
const MAX_DEFAULT_TTL: Duration = Duration::from_secs(30);
/// The gap assumed after a fire time with no next one.
const LAST_GAP: Duration = Duration::from_secs(24 * 3600);

/// The state of a started scheduler, shared by its tasks.
#[derive(Clone)]
pub(crate) struct Control {
    state: Arc<ControlState>,
}

struct ControlState {
    /// Stop firing (also what [`JobContext::shutting_down`] waits for).
    stop: watch::Sender<bool>,
    /// Cancel the runs still going (the grace period ended).
    cut: watch::Sender<bool>,
    /// The timer tasks, one per job.
    loops: Mutex<JoinSet<()>>,
    /// The tasks of fire times, each ending with its record.
    runs: Mutex<JoinSet<Ended>>,
}

/// How a fire-time task ended.
struct Ended {
    record: RunRecord,
    /// When the run ended (monotonic), for runs that started.
    ran_until: Option<Instant>,
}

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

    fn stopping(&self) -> bool {
        *self.state.stop.borrow()
    }

    /// Starts the timer task of `job` (not after a stop).
    pub(crate) fn spawn_job(&self, inner: &Arc<Inner>, job: Arc<Job>) {
        let mut loops = lock(&self.state.loops);
        if self.stopping() {
            return;
        }
        // The first fire time is the first after now, not after the task's first poll.
        let after = inner.clock.now();
        loops.spawn(job_loop(inner.clone(), self.clone(), job, after));
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

pub(crate) fn start(scheduler: &Scheduler) -> Result<Running> {
    let inner = &scheduler.inner;
    let control = {
        let mut started = lock(&inner.started);
        if started.is_some() {
            return Err(Error::AlreadyStarted);
        }
        let control = Control::new();
        *started = Some(control.clone());
        control
    };
    observe::describe();
    let jobs: Vec<Arc<Job>> = lock(&inner.jobs).values().cloned().collect();
    for job in jobs {
        control.spawn_job(inner, job);
    }
    tracing::info!(replica = %inner.replica, jobs = scheduler.jobs().len(), "scheduler started");
    Ok(Running {
        scheduler: scheduler.clone(),
        stopped: false,
    })
}

fn control_of(scheduler: &Scheduler) -> Option<Control> {
    lock(&scheduler.inner.started).clone()
}

pub(crate) async fn shutdown(mut running: Running, grace: Duration) -> ShutdownReport {
    let Some(control) = control_of(&running.scheduler) else {
        running.stopped = true;
        return ShutdownReport::default();
    };
    // From here a dropped future is a dropped handle: `Drop` aborts what is left.
    let began = Instant::now();
    let deadline = tokio::time::Instant::now() + grace;
    control.state.stop.send_replace(true);
    tracing::info!(replica = %running.scheduler.inner.replica, ?grace, "scheduler shutting down");
    // The timer tasks end at once; after them no fire time can start.
    let mut loops = std::mem::take(&mut *lock(&control.state.loops));
    while loops.join_next().await.is_some() {}
    let mut runs = std::mem::take(&mut *lock(&control.state.runs));
    let mut report = ShutdownReport::default();
    let mut collect = |ended: std::result::Result<Ended, tokio::task::JoinError>| match ended {
        Ok(Ended { record, ran_until }) => {
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
    running.stopped = true;
    tracing::info!(
        finished = report.finished.len(),
        cut = report.cut.len(),
        "scheduler stopped"
    );
    report
}

pub(crate) fn abort(scheduler: &Scheduler) {
    if let Some(control) = control_of(scheduler) {
        control.state.stop.send_replace(true);
        control.state.cut.send_replace(true);
        drop(std::mem::take(&mut *lock(&control.state.loops)));
        drop(std::mem::take(&mut *lock(&control.state.runs)));
    }
}

/// What one fire time uses: the defaults derived from the gap to the next fire time.
#[derive(Clone, Copy, Debug)]
struct Plan {
    at_least: Duration,
    lateness: Duration,
    ttl: Duration,
}

impl Plan {
    fn new(job: &Job, zone: &TimeZone, fire: SystemTime) -> Plan {
        let gap = job
            .schedule
            .next_after(fire, zone)
            .and_then(|next| SystemTime::from(next.timestamp()).duration_since(fire).ok())
            .unwrap_or(LAST_GAP);
        let at_least = job
            .at_least
            .unwrap_or_else(|| (gap / 2).min(MAX_DEFAULT_AT_LEAST))
            .min(gap.mul_f64(0.9));
        let lateness = job
            .lateness
            .unwrap_or_else(|| (at_least / 2).max(MIN_DEFAULT_LATENESS));
        let ttl = job
            .ttl
            .unwrap_or_else(|| (gap / 2).clamp(MIN_DEFAULT_TTL, MAX_DEFAULT_TTL));
        Plan {
            at_least,
            lateness,
            ttl,
        }
    }
}

fn instant_of(z: &Zoned) -> SystemTime {
    SystemTime::from(z.timestamp())
}

/// Fires `job` at each of its fire times until the scheduler stops.
async fn job_loop(inner: Arc<Inner>, control: Control, job: Arc<Job>, mut after: SystemTime) {
    let zone = job.zone.clone().unwrap_or_else(|| inner.zone.clone());
    let mut stop = control.state.stop.subscribe();
    if let Some(records) = inner.locker.backend().run_records() {
        // The gauge starts from the shared history, not from zero.
        if let Ok(Some(last)) = records.last_success(&job.name).await {
            observe::last_success(&job.name, last.ended_at);
        }
    }
    loop {
        let Some(fire) = job.schedule.next_after(after, &zone) else {
            tracing::warn!(job = job.name, "the schedule has no fire time left");
            return;
        };
        let at = instant_of(&fire);
        tokio::select! {
            biased;
            _ = stop.wait_for(|stopping| *stopping) => return,
            _ = inner.clock.sleep_until(at) => {}
        }
        let plan = Plan::new(&job, &zone, at);
        let now = inner.clock.now();
        if now > at + plan.lateness {
            after = record_missed(&inner, &job, &zone, fire, now).await;
            continue;
        }
        let task = run_fire(inner.clone(), control.clone(), job.clone(), fire, plan);
        control.spawn_run(task);
        after = at;
    }
}

/// Records `first` and the fire times after it that are past their lateness bound at
/// `now` as missed (at most `keep` records: the lock server would keep no more), and
/// returns the last fire time so handled.
async fn record_missed(
    inner: &Inner,
    job: &Job,
    zone: &TimeZone,
    first: Zoned,
    now: SystemTime,
) -> SystemTime {
    let mut fire = first;
    let mut count = 0usize;
    loop {
        let at = instant_of(&fire);
        count += 1;
        let next = job.schedule.next_after(at, zone).filter(|next| {
            now > instant_of(next) + Plan::new(job, zone, instant_of(next)).lateness
        });
        let detail = match (&next, count >= inner.keep) {
            (Some(_), true) => {
                "the scheduler was late by more than the lateness bound (suspended or \
                 overloaded); the later fire times until now were missed too, not \
                 recorded one by one"
            }
            _ => "the scheduler was late by more than the lateness bound (suspended or overloaded)",
        };
        let record = RunRecord {
            job: job.name.clone(),
            scheduled_at: at,
            replica: inner.replica.to_string(),
            started_at: None,
            ended_at: now,
            outcome: RunOutcome::Missed,
            fence: None,
            detail: Some(detail.to_owned()),
        };
        observe::finish(inner, &record, None).await;
        match next {
            Some(next) if count < inner.keep => fire = next,
            Some(_) => {
                // Go on from the newest fire time past its bound, without a record each.
                let mut last = at;
                let mut probe = at;
                while let Some(next) = job.schedule.next_after(probe, zone) {
                    let t = instant_of(&next);
                    if now > t + Plan::new(job, zone, t).lateness {
                        last = t;
                        probe = t;
                    } else {
                        break;
                    }
                    if last >= now {
                        break;
                    }
                }
                return last;
            }
            None => return at,
        }
    }
}

/// One fire time: take the lock, run the task, record, hold until `fire + at_least`,
/// release.
fn run_fire(
    inner: Arc<Inner>,
    control: Control,
    job: Arc<Job>,
    fire: Zoned,
    plan: Plan,
) -> impl std::future::Future<Output = Ended> + Send + 'static {
    let span = tracing::info_span!(
        "scheduled_run",
        job = %job.name,
        scheduled_at = %fire,
        replica = %inner.replica,
        fence = tracing::field::Empty,
    );
    async move {
        let at = instant_of(&fire);
        let latest_start = at + plan.lateness;
        let record = |outcome, started_at, fence, detail: String| RunRecord {
            job: job.name.clone(),
            scheduled_at: at,
            replica: inner.replica.to_string(),
            started_at,
            ended_at: inner.clock.now(),
            outcome,
            fence,
            detail: Some(detail).filter(|d| !d.is_empty()),
        };
        let not_run = |outcome, detail: String| {
            let record = record(outcome, None, None, detail);
            let inner = &inner;
            async move {
            observe::finish(inner, &record, None).await;
            Ended {
                record,
                ran_until: None,
            }
            }
        };
        let wait = match job.on_busy {
            OnBusy::Skip => WaitStrategy::Skip,
            OnBusy::Wait(bound) => {
                let left = latest_start
                    .duration_since(inner.clock.now())
                    .unwrap_or_default();
                WaitStrategy::Wait(bound.min(left))
            }
        };
        let opts = LockOptions::new().ttl(plan.ttl).watchdog(true).wait(wait);
        let mut stop = control.state.stop.subscribe();
        let acquired = tokio::select! {
            biased;
            _ = stop.wait_for(|stopping| *stopping) => None,
            acquired = inner.locker.acquire(job.name.as_str(), &opts) => Some(acquired),
        };
        let guard: LockGuard = match acquired {
            None => {
                return not_run(
                    RunOutcome::SkippedBusy,
                    "the scheduler shut down while waiting for the lock".to_owned(),
                )
                .await
            }
            Some(Ok(guard)) => guard,
            Some(Err(lock_core::Error::Locked { .. } | lock_core::Error::Timeout { .. })) => {
                return not_run(
                    RunOutcome::SkippedBusy,
                    "the lock was held elsewhere".to_owned(),
                )
                .await
            }
            Some(Err(e)) => {
                return not_run(RunOutcome::Failed, format!("could not take the lock: {e}")).await
            }
        };
        tracing::Span::current().record("fence", guard.fence());
        let now = inner.clock.now();
        if now > latest_start {
            drop(guard.release().await);
            let late = now.duration_since(at).unwrap_or_default();
            return not_run(
                RunOutcome::Missed,
                format!("the lock was won {late:?} after the fire time, past the lateness bound"),
            )
            .await;
        }
        if control.stopping() {
            drop(guard.release().await);
            return not_run(
                RunOutcome::SkippedBusy,
                "the scheduler shut down while waiting for the lock".to_owned(),
            )
            .await;
        }

        let started_at = inner.clock.now();
        let started = Instant::now();
        let deadline = job.timeout.map(|t| started + t);
        let lost = guard.lost().boxed().shared();
        let ctx = JobContext {
            job: Arc::from(job.name.as_str()),
            scheduled: fire.clone(),
            fence: guard.fence(),
            replica: inner.replica.clone(),
            started_at,
            deadline,
            lost: lost.clone(),
            shutting_down: control.state.stop.subscribe(),
        };
        let task = job.task.as_ref().expect("checked by Scheduler::add");
        let run = AssertUnwindSafe(task(ctx)).catch_unwind();
        let mut cut = control.state.cut.subscribe();
        let hard_timeout = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        // The run's future lives only inside this select: it is dropped, cancelled where it
        // is suspended, as soon as one branch wins.
        let (outcome, detail) = tokio::select! {
            biased;
            _ = lost.clone() => (RunOutcome::LockLost, "the lock was lost while the job ran; the job was cancelled".to_owned()),
            _ = cut.wait_for(|cut| *cut) => (RunOutcome::Cut, "the shutdown's grace period ended while the job ran; the job was cancelled".to_owned()),
            ended = run => match ended {
                Ok(Ok(())) => (RunOutcome::Ok, String::new()),
                Ok(Err(e)) => (RunOutcome::Failed, e.to_string()),
                Err(panic) => (RunOutcome::Failed, format!("the job panicked: {}", panic_text(&*panic))),
            },
            _ = hard_timeout => (RunOutcome::TimedOut, format!("the job passed its timeout of {:?} and was cancelled", job.timeout.unwrap_or_default())),
        };
        let elapsed = started.elapsed();
        let ran_until = Instant::now();
        let record = record(outcome, Some(started_at), Some(guard.fence()), detail);
        observe::finish(&inner, &record, Some(elapsed)).await;

        match outcome {
            // Gone already: dropping the guard sends nothing more than what is needed.
            RunOutcome::LockLost => drop(guard),
            RunOutcome::Cut => release(guard, &job.name).await,
            _ => {
                let until = at + plan.at_least;
                if inner.clock.now() < until {
                    tokio::select! {
                        biased;
                        // A shutdown ends the hold at once (see `Running::shutdown`).
                        _ = stop.wait_for(|stopping| *stopping) => {}
                        _ = guard.lost() => {}
                        _ = inner.clock.sleep_until(until) => {}
                    }
                }
                release(guard, &job.name).await;
            }
        }
        Ended {
            record,
            ran_until: Some(ran_until),
        }
    }
    .instrument(span)
}

async fn release(guard: LockGuard, job: &str) {
    if let Err(e) = guard.release().await {
        tracing::debug!(job, error = %e, "release after the run");
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s
    } else {
        "(not a string)"
    }
}
