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
        for job in jobs.values() {
            control.spawn_job(inner, job.clone());
        }
        tracing::info!(replica = %inner.replica, jobs = jobs.len(), "scheduler started");
    }
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
    record_missed_while_down(&inner, &job, &zone, after).await;
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
            after = record_missed(&inner, &job, &zone, fire, now, LATE).await;
            continue;
        }
        let task = run_fire(inner.clone(), control.clone(), job.clone(), fire, plan);
        control.spawn_run(task);
        after = at;
    }
}

/// Why a fire time found due too late is missed.
const LATE: &str =
    "the scheduler was late by more than the lateness bound (suspended or overloaded)";

/// Why a fire time passed while no replica was running is missed.
const DOWN: &str = "no replica ran it: the scheduler was not running";

/// At the start: records as missed the fire times after the newest one in the job's
/// history that are already past their lateness bound, when nobody holds the job's lock.
///
/// A fire time whose run is still going (or holding) has no record yet but its lock is
/// held, so it is not taken for missed; the check reads the lock without taking it, so it
/// never makes another replica's fire time skip. Replicas starting together after an
/// outage may each record the same fire times (each records what it saw). Needs a backend
/// that keeps records and can inspect a lock; the newest record is the high-water mark,
/// so a job never recorded has nothing missed.
async fn record_missed_while_down(inner: &Inner, job: &Job, zone: &TimeZone, started: SystemTime) {
    let backend = inner.locker.backend();
    let (Some(records), Some(admin)) = (backend.run_records(), backend.admin()) else {
        return;
    };
    // Records are appended as runs end, not in fire-time order: take the latest fire time.
    let Ok(recent) = records.recent(&job.name, 16).await else {
        return;
    };
    let Some(newest) = recent.iter().map(|r| r.scheduled_at).max() else {
        return;
    };
    let Some(first) = job.schedule.next_after(newest, zone) else {
        return;
    };
    let at = instant_of(&first);
    if started <= at + Plan::new(job, zone, at).lateness {
        return;
    }
    if !matches!(admin.inspect(&job.name).await, Ok(None)) {
        return;
    }
    record_missed(inner, job, zone, first, started, DOWN).await;
}

/// Records `first` and the fire times after it that are past their lateness bound at
/// `now` as missed, and returns the instant to look for the next fire time after.
///
/// At most `keep` records are written (the lock server would keep no more): when more
/// fire times passed, the last record says so and the fire times up to `now − lateness`
/// are skipped without a record each (a one-second schedule after a week's suspension
/// would otherwise be half a million records).
async fn record_missed(
    inner: &Inner,
    job: &Job,
    zone: &TimeZone,
    first: Zoned,
    now: SystemTime,
    why: &str,
) -> SystemTime {
    let past_bound = |fire: &Zoned| {
        let at = instant_of(fire);
        now > at + Plan::new(job, zone, at).lateness
    };
    let mut fire = first;
    let mut count = 0usize;
    loop {
        let at = instant_of(&fire);
        count += 1;
        let next = job.schedule.next_after(at, zone).filter(past_bound);
        let cut_short = next.is_some() && count >= inner.keep;
        let detail = if cut_short {
            format!(
                "{why}; the later fire times until now were missed too, not recorded one by one"
            )
        } else {
            why.to_owned()
        };
        let record = RunRecord {
            job: job.name.clone(),
            scheduled_at: at,
            replica: inner.replica.to_string(),
            started_at: None,
            ended_at: now,
            outcome: RunOutcome::Missed,
            fence: None,
            detail: Some(detail),
        };
        observe::finish(inner, &record, None).await;
        match next {
            Some(next) if !cut_short => fire = next,
            Some(_) => {
                let lateness = Plan::new(job, zone, at).lateness;
                return now.checked_sub(lateness).unwrap_or(at).max(at);
            }
            None => return at,
        }
    }
}

/// One fire time of one job, as its task sees it.
struct FireTime {
    inner: Arc<Inner>,
    control: Control,
    job: Arc<Job>,
    fire: Zoned,
    at: SystemTime,
    plan: Plan,
}

impl FireTime {
    /// The record of this fire time ending now.
    fn record(
        &self,
        outcome: RunOutcome,
        started_at: Option<SystemTime>,
        fence: Option<u64>,
        detail: String,
    ) -> RunRecord {
        RunRecord {
            job: self.job.name.clone(),
            scheduled_at: self.at,
            replica: self.inner.replica.to_string(),
            started_at,
            ended_at: self.inner.clock.now(),
            outcome,
            fence,
            detail: Some(detail).filter(|d| !d.is_empty()),
        }
    }

    /// Ends a fire time that did not run.
    async fn not_run(&self, outcome: RunOutcome, detail: impl Into<String>) -> Ended {
        let record = self.record(outcome, None, None, detail.into());
        observe::finish(&self.inner, &record, None).await;
        Ended {
            record,
            ran_until: None,
        }
    }

    /// Takes the lock (one attempt, or the job's bounded wait, never past the lateness
    /// bound); `Err` is how the fire time ended instead.
    async fn lock(&self) -> std::result::Result<LockGuard, Ended> {
        let latest_start = self.at + self.plan.lateness;
        let wait = match self.job.on_busy {
            OnBusy::Skip => WaitStrategy::Skip,
            OnBusy::Wait(bound) => {
                let left = latest_start
                    .duration_since(self.inner.clock.now())
                    .unwrap_or_default();
                WaitStrategy::Wait(bound.min(left))
            }
        };
        let opts = LockOptions::new()
            .ttl(self.plan.ttl)
            .watchdog(true)
            .wait(wait);
        let mut stop = self.control.state.stop.subscribe();
        let acquired = tokio::select! {
            biased;
            _ = stop.wait_for(|stopping| *stopping) => None,
            acquired = self.inner.locker.acquire(self.job.name.as_str(), &opts) => Some(acquired),
        };
        let guard = match acquired {
            None => {
                return Err(self
                    .not_run(RunOutcome::SkippedBusy, SHUT_DOWN_WAITING)
                    .await)
            }
            Some(Ok(guard)) => guard,
            Some(Err(lock_core::Error::Locked { .. } | lock_core::Error::Timeout { .. })) => {
                return Err(self.not_run(RunOutcome::SkippedBusy, HELD_ELSEWHERE).await)
            }
            Some(Err(e)) => {
                let detail = format!("could not take the lock: {e}");
                return Err(self.not_run(RunOutcome::Failed, detail).await);
            }
        };
        let now = self.inner.clock.now();
        if now > latest_start {
            release(guard, &self.job.name).await;
            let late = now.duration_since(self.at).unwrap_or_default();
            let detail =
                format!("the lock was won {late:?} after the fire time, past the lateness bound");
            return Err(self.not_run(RunOutcome::Missed, detail).await);
        }
        if self.control.stopping() {
            release(guard, &self.job.name).await;
            return Err(self
                .not_run(RunOutcome::SkippedBusy, SHUT_DOWN_WAITING)
                .await);
        }
        Ok(guard)
    }

    /// Runs the task under `guard` until it ends, the lock is lost, the timeout passes or
    /// the grace period ends; the task's future is dropped before this returns.
    async fn run(&self, guard: &LockGuard) -> (RunOutcome, String, SystemTime) {
        let started_at = self.inner.clock.now();
        let deadline = self.job.timeout.map(|t| Instant::now() + t);
        let lost = guard.lost().boxed().shared();
        let ctx = JobContext {
            job: Arc::from(self.job.name.as_str()),
            scheduled: self.fire.clone(),
            fence: guard.fence(),
            replica: self.inner.replica.clone(),
            started_at,
            deadline,
            lost: lost.clone(),
            shutting_down: self.control.state.stop.subscribe(),
        };
        let task = self.job.task.as_ref().expect("checked by Scheduler::add");
        // A panic is the job's failure, whether the task panics when called or when polled.
        let run = match std::panic::catch_unwind(AssertUnwindSafe(|| task(ctx))) {
            Ok(future) => AssertUnwindSafe(future).catch_unwind().boxed(),
            Err(panic) => futures::future::ready(Err(panic)).boxed(),
        };
        let mut cut = self.control.state.cut.subscribe();
        let hard_timeout = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        // The run's future lives only inside this select: it is dropped, cancelled where it
        // is suspended, as soon as one branch wins. A loss found with the end wins.
        let (outcome, detail) = tokio::select! {
            biased;
            _ = lost => (RunOutcome::LockLost, LOST.to_owned()),
            _ = cut.wait_for(|cut| *cut) => (RunOutcome::Cut, CUT.to_owned()),
            ended = run => match ended {
                Ok(Ok(())) => (RunOutcome::Ok, String::new()),
                Ok(Err(e)) => (RunOutcome::Failed, e.to_string()),
                Err(panic) => (RunOutcome::Failed, panic_text(&*panic)),
            },
            _ = hard_timeout => (RunOutcome::TimedOut, timed_out(self.job.timeout)),
        };
        (outcome, detail, started_at)
    }

    /// Keeps the lock until `fire time + at_least` on the scheduler's clock (a shutdown or
    /// the loss of the lock ends it sooner), then releases it.
    async fn hold_then_release(&self, guard: LockGuard) {
        let until = self.at + self.plan.at_least;
        if self.inner.clock.now() < until {
            let mut stop = self.control.state.stop.subscribe();
            tokio::select! {
                biased;
                // A shutdown ends the hold at once (see `Running::shutdown`).
                _ = stop.wait_for(|stopping| *stopping) => {}
                _ = guard.lost() => {}
                _ = self.inner.clock.sleep_until(until) => {}
            }
        }
        release(guard, &self.job.name).await;
    }

    /// The whole fire time: lock, run, record, hold, release.
    async fn go(self) -> Ended {
        let guard = match self.lock().await {
            Ok(guard) => guard,
            Err(ended) => return ended,
        };
        tracing::Span::current().record("fence", guard.fence());
        let started = Instant::now();
        let (outcome, detail, started_at) = self.run(&guard).await;
        let elapsed = started.elapsed();
        let ran_until = Instant::now();
        let record = self.record(outcome, Some(started_at), Some(guard.fence()), detail);
        observe::finish(&self.inner, &record, Some(elapsed)).await;
        match outcome {
            // Known gone: dropping the guard is all that is left to do.
            RunOutcome::LockLost => drop(guard),
            RunOutcome::Cut => release(guard, &self.job.name).await,
            _ => self.hold_then_release(guard).await,
        }
        Ended {
            record,
            ran_until: Some(ran_until),
        }
    }
}

const SHUT_DOWN_WAITING: &str = "the scheduler shut down while waiting for the lock";
const HELD_ELSEWHERE: &str = "the lock was held elsewhere";
const LOST: &str = "the lock was lost while the job ran; the job was cancelled";
const CUT: &str = "the shutdown's grace period ended while the job ran; the job was cancelled";

fn timed_out(timeout: Option<Duration>) -> String {
    format!(
        "the job passed its timeout of {:?} and was cancelled",
        timeout.unwrap_or_default()
    )
}

/// The task of one fire time, in its tracing span.
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
    let at = instant_of(&fire);
    FireTime {
        inner,
        control,
        job,
        fire,
        at,
        plan,
    }
    .go()
    .instrument(span)
}

async fn release(guard: LockGuard, job: &str) {
    if let Err(e) = guard.release().await {
        tracing::debug!(job, error = %e, "release after the run");
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    let text = if let Some(s) = panic.downcast_ref::<&str>() {
        s
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s
    } else {
        "(not a string)"
    };
    format!("the job panicked: {text}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::BoxError;

    fn plan(job: Job) -> Plan {
        let job = job.run(|_ctx| async { Ok::<_, BoxError>(()) });
        Plan::new(
            &job,
            &TimeZone::UTC,
            // A fire time on every period used here (a whole hour).
            SystemTime::UNIX_EPOCH + Duration::from_secs(3600 * 300_000),
        )
    }

    fn every(period: Duration) -> Job {
        Job::every("j", period).unwrap()
    }

    /// The defaults follow the gap: at_least half of it (at most a minute), lateness half
    /// of at_least (at least 500 ms), TTL half the gap between 1 s and 30 s.
    #[test]
    fn defaults_follow_the_gap() {
        let p = plan(every(Duration::from_secs(10)));
        assert_eq!(
            (p.at_least, p.lateness, p.ttl),
            (
                Duration::from_secs(5),
                Duration::from_millis(2500),
                Duration::from_secs(5)
            )
        );
        let p = plan(every(Duration::from_secs(3600)));
        assert_eq!(
            (p.at_least, p.lateness, p.ttl),
            (
                Duration::from_secs(60),
                Duration::from_secs(30),
                Duration::from_secs(30)
            )
        );
        let p = plan(every(Duration::from_secs(1)));
        assert_eq!(
            (p.at_least, p.lateness, p.ttl),
            (
                Duration::from_millis(500),
                Duration::from_millis(500),
                Duration::from_secs(1)
            )
        );
    }

    /// A cron gap is measured from the fire time to the next one.
    #[test]
    fn cron_gaps_are_measured_per_fire_time() {
        let p = plan(Job::cron("j", "*/2 * * * * *").unwrap());
        assert_eq!(p.at_least, Duration::from_secs(1));
        assert_eq!(p.lateness, Duration::from_millis(500));
    }

    /// An at_least set by hand is kept, but never past nine tenths of the gap, so it never
    /// blocks the next fire time.
    #[test]
    fn at_least_never_reaches_the_next_fire_time() {
        let minute = Duration::from_secs(60);
        let p = plan(every(minute).at_least(Duration::from_secs(50)));
        assert_eq!(p.at_least, Duration::from_secs(50));
        let p = plan(every(minute).at_least(Duration::from_secs(120)));
        assert_eq!(p.at_least, Duration::from_secs(54));
        let p = plan(
            every(minute)
                .lateness(Duration::from_secs(7))
                .ttl(Duration::from_secs(9)),
        );
        assert_eq!(
            (p.lateness, p.ttl),
            (Duration::from_secs(7), Duration::from_secs(9))
        );
    }
}
