//! What to run: [`Job`] (name, schedule, zone, options and the task) and the
//! [`JobContext`] a run is handed.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::future::{BoxFuture, FutureExt, Shared};
use jiff::tz::TimeZone;
use jiff::Zoned;
use lock_core::BoxError;
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::schedule::{zone_named, Schedule};

/// The task of a job: called once per fire time it runs.
pub(crate) type Task =
    Arc<dyn Fn(JobContext) -> BoxFuture<'static, Result<(), BoxError>> + Send + Sync>;

/// What a fire time does when the job's lock is held elsewhere (another replica's run of
/// the same fire time, or a run of an earlier one still going).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnBusy {
    /// One attempt: a taken lock is [`RunOutcome::SkippedBusy`](crate::RunOutcome::SkippedBusy)
    /// (the default).
    #[default]
    Skip,
    /// Wait for the lock up to this long, but never past the fire time's lateness bound
    /// (see [`Job::lateness`]); a lock still taken then is skipped.
    Wait(Duration),
}

/// A scheduled job: a name, a schedule, a time zone, options, and the task to run.
///
/// The name is the job's lock key on the lock server: every replica registering a job of
/// that name competes for the same lock, so two runs of it never overlap anywhere. Build
/// one with [`Job::cron`] or [`Job::every`], set options, give it its task with
/// [`run`](Self::run), and [`Scheduler::add`](crate::Scheduler::add) it.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lock_scheduler::{BoxError, Job};
///
/// let job = Job::cron("reports/hourly", "0 0 * * * *")?
///     .time_zone("Europe/Berlin")?
///     .timeout(Duration::from_secs(600))
///     .at_least(Duration::from_secs(30))
///     .run(|ctx| async move {
///         // Conditional writes: the fence and the fire time make a retry harmless.
///         println!("report for {} (fence {})", ctx.scheduled_local(), ctx.fence());
///         Ok::<_, BoxError>(())
///     });
/// assert_eq!(job.name(), "reports/hourly");
/// # Ok::<(), lock_scheduler::Error>(())
/// ```
#[derive(Clone)]
#[must_use = "setters return the changed value; it does nothing until used"]
pub struct Job {
    pub(crate) name: String,
    pub(crate) schedule: Schedule,
    pub(crate) zone: Option<TimeZone>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) at_least: Option<Duration>,
    pub(crate) lateness: Option<Duration>,
    pub(crate) ttl: Option<Duration>,
    pub(crate) on_busy: OnBusy,
    pub(crate) catch_up: CatchUp,
    pub(crate) history: Option<lock_core::records::Retention>,
    pub(crate) task: Option<Task>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("name", &self.name)
            .field("schedule", &self.schedule)
            .field("zone", &self.zone.as_ref().and_then(|z| z.iana_name()))
            .field("timeout", &self.timeout)
            .field("at_least", &self.at_least)
            .field("lateness", &self.lateness)
            .field("ttl", &self.ttl)
            .field("on_busy", &self.on_busy)
            .field("catch_up", &self.catch_up)
            .field("history", &self.history)
            .field("task", &self.task.is_some())
            .finish()
    }
}

impl Job {
    /// A job fired by the cron expression `expression` (5 fields, or 6 with seconds first;
    /// see [`Schedule`] for the syntax and the daylight-saving rules).
    ///
    /// # Errors
    /// [`Error::InvalidJobName`] when `name` is not a valid lock key (empty, or longer than
    /// [`MAX_KEY_LEN`](lock_core::MAX_KEY_LEN) bytes); [`Error::InvalidCron`] naming the job
    /// and, when one field alone is wrong, that field.
    pub fn cron(name: impl Into<String>, expression: &str) -> Result<Job> {
        let name = valid_name(name.into())?;
        let schedule = Schedule::cron(&name, expression)?;
        Ok(Job::new(name, schedule))
    }

    /// A job fired every `period`, at `Unix epoch + k × period` (the same instants on
    /// every replica; see [`Schedule`]).
    ///
    /// # Errors
    /// [`Error::InvalidJobName`] as for [`cron`](Self::cron); [`Error::ZeroInterval`] for a
    /// zero `period`.
    pub fn every(name: impl Into<String>, period: Duration) -> Result<Job> {
        let name = valid_name(name.into())?;
        let schedule = Schedule::every(&name, period)?;
        Ok(Job::new(name, schedule))
    }

    fn new(name: String, schedule: Schedule) -> Job {
        Job {
            name,
            schedule,
            zone: None,
            timeout: None,
            at_least: None,
            lateness: None,
            ttl: None,
            on_busy: OnBusy::Skip,
            catch_up: CatchUp::None,
            history: None,
            task: None,
        }
    }

    /// Evaluates the schedule in the time zone `name` (an IANA name such as
    /// `Europe/Berlin`, `UTC`, or `local` for the host's zone) instead of the scheduler's
    /// default zone.
    ///
    /// # Errors
    /// [`Error::UnknownTimeZone`] naming the job and the zone.
    pub fn time_zone(self, name: &str) -> Result<Job> {
        let zone = zone_named(Some(&self.name), name)?;
        Ok(self.zone(zone))
    }

    /// Evaluates the schedule in `zone` instead of the scheduler's default zone.
    pub fn zone(mut self, zone: TimeZone) -> Job {
        self.zone = Some(zone);
        self
    }

    /// The hard timeout of a run, counted from the moment the lock is won (tokio's
    /// monotonic clock): a run still going then is cancelled (its future dropped) and
    /// recorded [`TimedOut`](crate::RunOutcome::TimedOut). Default: none.
    ///
    /// A zero timeout is refused by [`Scheduler::add`](crate::Scheduler::add).
    pub fn timeout(mut self, timeout: Duration) -> Job {
        self.timeout = Some(timeout);
        self
    }

    /// How long after the fire time the lock stays held, however quickly the run ended
    /// (ShedLock's `lockAtLeastFor`): a replica whose clock is behind by less than this
    /// (minus the lateness bound) finds the lock still taken and cannot run the same fire
    /// time again.
    ///
    /// Default: half the gap to the next fire time, at most one minute. Whatever is set,
    /// the hold ends by nine tenths of the gap to the next fire time, so it never blocks the
    /// next run. The hold does not keep the run's future: that is dropped when it ends.
    pub fn at_least(mut self, at_least: Duration) -> Job {
        self.at_least = Some(at_least);
        self
    }

    /// How late a fire time may start and still run. A fire time found due later than
    /// this (the process was suspended, the host overloaded), or whose lock is won later
    /// than this, is recorded [`Missed`](crate::RunOutcome::Missed) and not run: no burst
    /// of catch-up runs.
    ///
    /// Default: half the `at_least` hold, at least 500 ms. Keep it below `at_least`: a
    /// replica starts a fire time only while the winner of that fire time still holds the
    /// lock, which is what keeps late replicas from running it twice.
    pub fn lateness(mut self, lateness: Duration) -> Job {
        self.lateness = Some(lateness);
        self
    }

    /// The TTL of the job's lock, renewed by the guard's watchdog every `ttl / 3` while
    /// the run and its hold last. A replica that dies holding the lock blocks the job for
    /// at most this long.
    ///
    /// Default: half the gap to the next fire time, between 1 s and 30 s (then rounded by
    /// the backend's rules).
    pub fn ttl(mut self, ttl: Duration) -> Job {
        self.ttl = Some(ttl);
        self
    }

    /// What a start after downtime does with the fire times no replica ran (default
    /// [`CatchUp::None`]).
    pub fn catch_up(mut self, catch_up: CatchUp) -> Job {
        self.catch_up = catch_up;
        self
    }

    /// How many of the job's records the lock server keeps (successes and other outcomes
    /// apart; the last success and failure always), instead of the scheduler's
    /// [`keep`](crate::SchedulerBuilder::keep).
    pub fn history(mut self, keep: lock_core::records::Retention) -> Job {
        self.history = Some(keep);
        self
    }

    /// What a fire time does when the lock is taken (default [`OnBusy::Skip`]).
    pub fn on_busy(mut self, on_busy: OnBusy) -> Job {
        self.on_busy = on_busy;
        self
    }

    /// The task: called once for each fire time this replica runs, with its
    /// [`JobContext`]. An `Err` is recorded [`Failed`](crate::RunOutcome::Failed) with the
    /// error's text; a panic in the task is recorded `Failed` too.
    ///
    /// The returned future is dropped (cancelled at the await it is suspended on) when
    /// the lock is lost, the hard timeout passes, or a shutdown's grace period ends.
    pub fn run<F, Fut, E>(mut self, task: F) -> Job
    where
        F: Fn(JobContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError>,
    {
        self.task = Some(Arc::new(move |ctx| {
            let run = task(ctx);
            async move { run.await.map_err(Into::into) }.boxed()
        }));
        self
    }

    /// The job's name, also its lock key.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The job's schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// What a start after downtime does with missed fire times ([`Job::catch_up`]).
    pub fn catch_up_value(&self) -> CatchUp {
        self.catch_up
    }

    /// The job's own retention, if set ([`Job::history`]).
    pub fn history_value(&self) -> Option<lock_core::records::Retention> {
        self.history
    }

    /// The job's own time zone, if set (else the scheduler's default applies).
    pub fn time_zone_value(&self) -> Option<&TimeZone> {
        self.zone.as_ref()
    }
}

fn valid_name(name: String) -> Result<String> {
    match lock_core::validate_key(&name) {
        Ok(()) => Ok(name),
        Err(lock_core::Error::InvalidKey { key, reason }) => {
            Err(Error::InvalidJobName { job: key, reason })
        }
        Err(other) => Err(Error::Lock(other)),
    }
}

/// What a run is told: which fire time it is, its fencing token, and signals to stop.
///
/// Idempotency is the job's business, and this is what it needs for it: make the job's
/// writes conditional on the [`fence`](Self::fence) (refuse a write carrying a fence lower
/// than one already seen) or keyed by the [`scheduled_at`](Self::scheduled_at) fire time
/// (a second run of the same fire time finds its result already there).
///
/// Cheap to clone; clones can be moved into tasks the job spawns.
#[derive(Clone)]
pub struct JobContext {
    pub(crate) job: Arc<str>,
    pub(crate) scheduled: Zoned,
    pub(crate) fence: u64,
    pub(crate) replica: Arc<str>,
    pub(crate) started_at: SystemTime,
    pub(crate) deadline: Option<Instant>,
    pub(crate) lost: Shared<BoxFuture<'static, ()>>,
    pub(crate) shutting_down: watch::Receiver<bool>,
    pub(crate) cause: lock_core::records::RunCause,
    pub(crate) output: Arc<std::sync::Mutex<Option<String>>>,
}

impl std::fmt::Debug for JobContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobContext")
            .field("job", &self.job)
            .field("scheduled", &self.scheduled.to_string())
            .field("fence", &self.fence)
            .field("replica", &self.replica)
            .finish_non_exhaustive()
    }
}

impl JobContext {
    /// The job's name.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The fire time this run is for (the schedule's instant, the same on every replica;
    /// not when the run started).
    pub fn scheduled_at(&self) -> SystemTime {
        SystemTime::from(self.scheduled.timestamp())
    }

    /// The fire time in the job's time zone.
    pub fn scheduled_local(&self) -> &Zoned {
        &self.scheduled
    }

    /// The fencing token of the lock this run holds: strictly greater than that of every
    /// earlier run of the job (on backends whose tokens are monotonic).
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// The replica running it.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// When the run started, on the scheduler's clock.
    pub fn started_at(&self) -> SystemTime {
        self.started_at
    }

    /// When the hard timeout cancels the run (tokio's monotonic clock), if it has one.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// A future that resolves as soon as the job's lock is known gone
    /// ([`LockGuard::lost`](lock_core::LockGuard::lost)). The run's own future is dropped
    /// then anyway; this is for work the job handed to other tasks, which should stop
    /// writing.
    ///
    /// # Cancel safety
    /// Dropping it has no effect; make another at any time.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.lost.clone()
    }

    /// Whether the job's lock is known gone (see [`lost`](Self::lost)).
    pub fn is_lost(&self) -> bool {
        self.lost.clone().now_or_never().is_some()
    }

    /// A future that resolves when the scheduler begins a shutdown: the run has the grace
    /// period left to finish before it is cut.
    ///
    /// # Cancel safety
    /// Dropping it has no effect; make another at any time.
    pub fn shutting_down(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.shutting_down.clone();
        async move {
            let _ = rx.wait_for(|stopping| *stopping).await;
        }
    }

    /// Whether the scheduler is shutting down.
    pub fn is_shutting_down(&self) -> bool {
        *self.shutting_down.borrow()
    }

    /// Why this run started: its fire time, a catch-up after downtime, or a trigger.
    pub fn cause(&self) -> lock_core::records::RunCause {
        self.cause
    }

    /// Keeps `tail` (the end of the job's output) in the run's record, replacing what an
    /// earlier call kept; the record keeps its newest
    /// [`MAX_OUTPUT_LEN`](lock_core::records::MAX_OUTPUT_LEN) bytes.
    pub fn keep_output(&self, tail: impl Into<String>) {
        *lock_core::sync::lock(&self.output) = Some(tail.into());
    }
}

/// What a start after downtime does with the fire times no replica ran
/// ([`Job::catch_up`]).
///
/// Whatever it is, a fire time still within its lateness bound at the start is run, and
/// the fire times missed before it are written as one summary record, not one each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum CatchUp {
    /// Run none of them (the default).
    #[default]
    None,
    /// Run the newest of them once, on one replica, if it is within `deadline` of the
    /// start (Kubernetes' `startingDeadlineSeconds`, systemd's `Persistent=`); the record
    /// says [`RunCause::CatchUp`](lock_core::records::RunCause::CatchUp).
    Latest {
        /// How old a missed fire time may be and still be caught up.
        deadline: Duration,
    },
}
