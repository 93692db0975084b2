//! The scheduler: [`Scheduler`], built by [`SchedulerBuilder`], started into a [`Running`]
//! handle whose [`shutdown`](Running::shutdown) returns a [`ShutdownReport`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use jiff::tz::TimeZone;
use jiff::SignedDuration;
use lock_core::records::{JobControl, Retention, RunRecord, RunRecords};
use lock_core::sync::lock;
use lock_core::Locker;

use crate::clock::{Clock, OffsetClock, SystemClock};
use crate::error::{Error, Result};
use crate::job::Job;
use crate::mode::LeaderMode;
use crate::schedule::zone_named;
use crate::state::{Inner, ShutdownReport};

/// How many records per job the lock server keeps by default (see
/// [`SchedulerBuilder::keep`]).
pub const DEFAULT_KEEP: usize = 100;

/// How often a replica reads each job's control for a trigger by default (see
/// [`SchedulerBuilder::control_poll`]).
pub const DEFAULT_CONTROL_POLL: Duration = Duration::from_secs(2);

/// Fires jobs on a [`Locker`]: each fire time of a job runs once across replicas, under
/// the job's lock, whatever the replicas' clocks say.
///
/// For each fire time of each job, the scheduler
/// 1. waits until the lock server's clock (as this replica's clock reads it, corrected by
///    the offset its claims measured) reaches the fire time, and claims it in the lock
///    server ([`Locker::claim_fire_time`]); a fire time claimed already runs elsewhere:
///    nothing is recorded here;
/// 2. takes the lock named after the job, with one attempt ([`OnBusy::Skip`](crate::OnBusy))
///    or a bounded wait; a lock still held by an earlier run is
///    [`SkippedBusy`](crate::RunOutcome::SkippedBusy);
/// 3. runs the task with a [`JobContext`](crate::JobContext) (the fire time, the fence),
///    while the guard's watchdog renews the lock; it cancels the task when the lock is
///    lost ([`LockLost`](crate::RunOutcome::LockLost)) or the hard timeout passes
///    ([`TimedOut`](crate::RunOutcome::TimedOut));
/// 4. records the outcome ([`RunRecord`]) in the lock server where the backend keeps
///    records, and in metrics and tracing everywhere;
/// 5. keeps the lock until `fire time + at_least` on the monotonic clock (as the claim
///    placed the fire time; without the task's future), then releases it.
///
/// A fire time found due later than its lateness bound is
/// [`Missed`](crate::RunOutcome::Missed). Runs go on concurrently with the timer, so a run
/// still going at the next fire time makes that one
/// [`SkippedBusy`](crate::RunOutcome::SkippedBusy) (no overlap) rather than delaying it.
///
/// The backend must keep fire-time claims
/// ([`Backend::fire_claims`](lock_core::Backend::fire_claims)): [`start`](Self::start)
/// refuses one that does not ([`Error::ClaimsNotKept`]).
///
/// A `Scheduler` is cheap to clone (clones share jobs and state).
///
/// # Examples
///
/// ```no_run
/// # async fn demo(locker: lock_core::Locker) -> Result<(), lock_scheduler::Error> {
/// use std::time::Duration;
/// use lock_scheduler::{BoxError, Job, Scheduler};
///
/// let scheduler = Scheduler::builder(locker).replica("web-1").time_zone("UTC").build()?;
/// scheduler.add(
///     Job::cron("report", "0 */5 * * * *")?
///         .time_zone("Europe/Berlin")?
///         .timeout(Duration::from_secs(120))
///         .run(|ctx| async move {
///             println!("report for {} with fence {}", ctx.scheduled_local(), ctx.fence());
///             Ok::<_, BoxError>(())
///         }),
/// )?;
/// let running = scheduler.start()?;
/// // ... until SIGTERM ...
/// let report = running.shutdown(Duration::from_secs(20)).await;
/// for run in &report.cut {
///     eprintln!("cut: {} scheduled at {:?}", run.job, run.scheduled_at);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Scheduler {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("replica", &self.inner.replica)
            .field("zone", &self.inner.zone.iana_name())
            .field("jobs", &self.jobs())
            .finish_non_exhaustive()
    }
}

/// Builds a [`Scheduler`]; start with [`Scheduler::builder`].
#[must_use = "setters return the changed value; it does nothing until used"]
pub struct SchedulerBuilder {
    locker: Locker,
    replica: Option<String>,
    zone: ZoneChoice,
    clock: Option<Arc<dyn Clock>>,
    keep: Retention,
    leader: Option<LeaderMode>,
    control_poll: Duration,
}

enum ZoneChoice {
    Named(String),
    Given(TimeZone),
}

impl std::fmt::Debug for SchedulerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerBuilder")
            .field("replica", &self.replica)
            .field("keep", &self.keep)
            .finish_non_exhaustive()
    }
}

impl SchedulerBuilder {
    /// The replica's id, written in every record it makes (default: `hostname-pid`).
    pub fn replica(mut self, replica: impl Into<String>) -> Self {
        self.replica = Some(replica.into());
        self
    }

    /// The default time zone of jobs that set none (default `UTC`, never the host's zone
    /// unless asked for: `local` names it). Checked by [`build`](Self::build).
    pub fn time_zone(mut self, name: impl Into<String>) -> Self {
        self.zone = ZoneChoice::Named(name.into());
        self
    }

    /// The default time zone of jobs that set none.
    pub fn zone(mut self, zone: TimeZone) -> Self {
        self.zone = ZoneChoice::Given(zone);
        self
    }

    /// The wall clock the schedule is read on (default [`SystemClock`]); a
    /// [`ManualClock`](crate::ManualClock) for tests.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Reads the schedule on the system clock shifted by `offset` (negative: behind), as
    /// a replica whose clock is that far off would. For tests and simulations only.
    pub fn clock_offset(self, offset: SignedDuration) -> Self {
        self.clock(OffsetClock::new(offset))
    }

    /// How many records per job the lock server keeps: `records` successes and, apart
    /// from them, `records` of every other outcome (default [`DEFAULT_KEEP`]; 0 counts as
    /// 1); older ones are removed as new ones are written. The last success and the last
    /// failure are kept apart, however old. A fire time has one record whichever replicas
    /// saw it (a duplicate run, which claims prevent, would have its own). A job's own
    /// [`Job::history`](crate::Job::history) overrides it.
    pub fn keep(self, records: usize) -> Self {
        self.retention(Retention::each(records))
    }

    /// As [`keep`](Self::keep), with the successes and the other outcomes counted apart.
    pub fn retention(mut self, keep: Retention) -> Self {
        self.keep = keep;
        self
    }

    /// How often each replica reads every job's control for a trigger (default
    /// [`DEFAULT_CONTROL_POLL`]; at least 100 ms): one read per job per period. A pause
    /// is read at every fire time, whatever this is.
    pub fn control_poll(mut self, period: Duration) -> Self {
        self.control_poll = period.max(Duration::from_millis(100));
        self
    }

    /// Leader mode: only the replica elected in `mode`'s election fires jobs; the others
    /// stand by and take over within the leadership's TTL when it dies. Each run still
    /// claims its fire time and takes the job's lock, so a change of leader neither runs a
    /// fire time twice nor overlaps two runs. Default: every replica fires, and each fire
    /// time's claim decides which replica runs it.
    ///
    /// Choose it when the jobs should run where one process keeps their state (a cache, a
    /// connection pool), or to keep every replica but one from contending at each fire
    /// time; keep the default when any replica may run any fire time (the default spreads
    /// runs over replicas and needs no election).
    pub fn leader(mut self, mode: LeaderMode) -> Self {
        self.leader = Some(mode);
        self
    }

    /// The scheduler.
    ///
    /// # Errors
    /// [`Error::UnknownTimeZone`] for a default zone not in the time zone database.
    pub fn build(self) -> Result<Scheduler> {
        let zone = match self.zone {
            ZoneChoice::Named(name) => zone_named(None, &name)?,
            ZoneChoice::Given(zone) => zone,
        };
        Ok(Scheduler {
            inner: Arc::new(Inner {
                locker: self.locker,
                clock: self.clock.unwrap_or_else(|| Arc::new(SystemClock)),
                replica: self.replica.unwrap_or_else(default_replica).into(),
                zone,
                keep: self.keep,
                control_poll: self.control_poll,
                pending: Mutex::new(std::collections::VecDeque::new()),
                jobs: Mutex::new(BTreeMap::new()),
                started: Mutex::new(None),
                offset: Mutex::new(None),
                leader: self.leader,
                leading: tokio::sync::watch::Sender::new(None),
            }),
        })
    }
}

/// `hostname-pid`, the default replica id.
pub fn default_replica() -> String {
    format!("{}-{}", hostname(), std::process::id())
}

fn hostname() -> String {
    #[cfg(unix)]
    {
        let mut buf = [0u8; 256];
        // SAFETY: the buffer is valid for its whole length, and gethostname writes at
        // most that many bytes.
        let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
        if rc == 0 {
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            if let Ok(name) = std::str::from_utf8(&buf[..end]) {
                if !name.is_empty() {
                    return name.to_owned();
                }
            }
        }
    }
    std::env::var("HOSTNAME").unwrap_or_else(|_| "host".to_owned())
}

impl Scheduler {
    /// A builder over `locker`: replica `hostname-pid`, default zone `UTC`, the system
    /// clock, [`DEFAULT_KEEP`] records per job.
    pub fn builder(locker: Locker) -> SchedulerBuilder {
        SchedulerBuilder {
            locker,
            replica: None,
            zone: ZoneChoice::Named("UTC".to_owned()),
            clock: None,
            keep: Retention::each(DEFAULT_KEEP),
            control_poll: DEFAULT_CONTROL_POLL,
            leader: None,
        }
    }

    /// Registers `job`. On a started scheduler, the job's first fire time is the first one
    /// after now; after a shutdown it is registered (its history and next fire time can be
    /// read) but never fired.
    ///
    /// # Errors
    /// [`Error::NoTask`] for a job without [`Job::run`]; [`Error::DuplicateJob`] for a name
    /// already registered; [`Error::NeverFires`] for a schedule with no fire time after
    /// now; [`Error::InvalidOption`] for a zero timeout or a TTL the backend refuses.
    pub fn add(&self, job: Job) -> Result<()> {
        let job = crate::runner::check(&self.inner, job)?;
        let mut jobs = lock(&self.inner.jobs);
        if jobs.contains_key(&job.name) {
            return Err(Error::DuplicateJob { job: job.name });
        }
        let job = Arc::new(job);
        jobs.insert(job.name.clone(), job.clone());
        if let Some(control) = lock(&self.inner.started).as_ref() {
            control.spawn_job(&self.inner, job);
        }
        Ok(())
    }

    /// Starts firing every registered job (and those added later), from the first fire
    /// time after now: fire times before the start are not this replica's to run.
    ///
    /// Needs a tokio runtime (the jobs run on tasks of the current one).
    ///
    /// # Errors
    /// [`Error::AlreadyStarted`] when called a second time; [`Error::ClaimsNotKept`] on a
    /// backend that keeps no fire-time claims (Redlock).
    pub fn start(&self) -> Result<Running> {
        crate::runner::start(&self.inner)?;
        Ok(Running {
            scheduler: self.clone(),
            stopped: false,
        })
    }

    /// The term this replica leads in, in leader mode ([`SchedulerBuilder::leader`]);
    /// `None` while it stands by, and always outside leader mode.
    pub fn leading(&self) -> Option<u64> {
        *self.inner.leading.borrow()
    }

    /// The replica id written in this scheduler's records.
    pub fn replica(&self) -> &str {
        &self.inner.replica
    }

    /// The default time zone of jobs that set none.
    pub fn time_zone(&self) -> &TimeZone {
        &self.inner.zone
    }

    /// The Locker the jobs lock on.
    pub fn locker(&self) -> &Locker {
        &self.inner.locker
    }

    /// Now, on the scheduler's clock.
    pub fn now(&self) -> SystemTime {
        self.inner.clock.now()
    }

    /// The names of the registered jobs, sorted.
    pub fn jobs(&self) -> Vec<String> {
        lock(&self.inner.jobs).keys().cloned().collect()
    }

    /// The registered job named `job`.
    pub fn job(&self, job: &str) -> Option<Job> {
        lock(&self.inner.jobs).get(job).map(|j| (**j).clone())
    }

    /// The job's next fire time after now (on the scheduler's clock), in its time zone.
    ///
    /// # Errors
    /// [`Error::UnknownJob`]; [`Error::NeverFires`] when the schedule has no fire time left.
    pub fn next_fire(&self, job: &str) -> Result<jiff::Zoned> {
        let found = lock(&self.inner.jobs).get(job).cloned();
        let job = found.ok_or_else(|| Error::UnknownJob {
            job: job.to_owned(),
        })?;
        let zone = job.zone.as_ref().unwrap_or(&self.inner.zone);
        job.schedule
            .next_after(self.inner.clock.now(), zone)
            .ok_or_else(|| Error::NeverFires {
                job: job.name.clone(),
            })
    }

    /// The job's newest records in the lock server, newest first, at most `limit`, from
    /// every replica. `job` need not be registered here.
    ///
    /// # Errors
    /// [`Error::RecordsNotKept`] when the backend keeps no records; [`Error::Lock`] when
    /// the server failed.
    ///
    /// # Cancel safety
    /// A read: dropping it leaves nothing behind.
    pub async fn recent(&self, job: &str, limit: usize) -> Result<Vec<RunRecord>> {
        Ok(self.records()?.recent(job, limit).await?)
    }

    /// The job's last successful run recorded in the lock server, by any replica, however
    /// old; `None` if it never succeeded.
    ///
    /// # Errors
    /// As [`recent`](Self::recent).
    ///
    /// # Cancel safety
    /// A read: dropping it leaves nothing behind.
    pub async fn last_success(&self, job: &str) -> Result<Option<RunRecord>> {
        Ok(self.records()?.last_success(job).await?)
    }

    /// The job's last failed run recorded in the lock server (see
    /// [`RunOutcome::is_failure`](lock_core::records::RunOutcome::is_failure)), however
    /// old; `None` if it never failed.
    ///
    /// # Errors
    /// As [`recent`](Self::recent).
    ///
    /// # Cancel safety
    /// A read: dropping it leaves nothing behind.
    pub async fn last_failure(&self, job: &str) -> Result<Option<RunRecord>> {
        Ok(self.records()?.last_failure(job).await?)
    }

    /// The job's control (pause, latest trigger) as every replica reads it; `None` when
    /// none was ever set.
    ///
    /// # Errors
    /// As [`recent`](Self::recent).
    ///
    /// # Cancel safety
    /// A read: dropping it leaves nothing behind.
    pub async fn control(&self, job: &str) -> Result<Option<JobControl>> {
        Ok(self.records()?.control(job).await?)
    }

    fn records(&self) -> Result<&dyn RunRecords> {
        self.inner
            .locker
            .backend()
            .run_records()
            .ok_or(Error::RecordsNotKept {
                backend: self.inner.locker.capabilities().name,
            })
    }
}

/// A started scheduler. [`shutdown`](Self::shutdown) stops it gracefully.
///
/// # Drop
/// Dropping the handle without `shutdown` stops the scheduler at once: no more fire
/// times, and runs under way are cancelled (their futures dropped) without a record; their
/// guards' drop releases the locks in the background (see
/// [`LockGuard`](lock_core::LockGuard#drop)), which a later
/// [`Locker::shutdown`](lock_core::Locker::shutdown) awaits: when it returns, no lock of
/// this scheduler is left on the server, even one whose release was on its way.
#[must_use = "dropping the handle stops the scheduler at once"]
pub struct Running {
    pub(crate) scheduler: Scheduler,
    pub(crate) stopped: bool,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("scheduler", &self.scheduler)
            .finish()
    }
}

impl Running {
    /// The scheduler this handle runs (for its reads: [`Scheduler::recent`], …).
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Stops gracefully: no fire time starts any more; runs under way get `grace` (tokio's
    /// monotonic clock) to finish, and are told by
    /// [`JobContext::shutting_down`](crate::JobContext::shutting_down); those still going
    /// then are cancelled and recorded [`Cut`](crate::RunOutcome::Cut). When it returns,
    /// every lock of this scheduler is released.
    ///
    /// Locks kept after a run for its `at_least` hold are released at once: a shutdown
    /// does not wait for them. The price: a replica whose clock is behind may run a fire
    /// time again that ended here just before the shutdown (within the skew).
    ///
    /// # Cancel safety
    /// Dropping the future stops the scheduler as dropping [`Running`] does: what was not
    /// finished yet is cancelled without a record, and the locks are released in the
    /// background.
    pub async fn shutdown(mut self, grace: Duration) -> ShutdownReport {
        let report = crate::runner::shutdown(&self.scheduler.inner, grace).await;
        self.stopped = true;
        report
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.stopped {
            crate::runner::abort(&self.scheduler.inner);
        }
    }
}
