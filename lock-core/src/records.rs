//! Run records: the optional ability of a lock server to keep the history of scheduled
//! runs ([`RunRecords`]), so that every replica of a scheduler, and `distlock cron status`,
//! read the same history from the server they already lock on.
//!
//! The record and its encoding live here, once; a backend only stores and reads the bytes
//! [`RunRecord::encode`] makes, keyed by the job's name.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::error::{Error, Result};

mod codec;
mod control;

use codec::{from_millis, keep_tail, millis, truncate};
pub use control::JobControl;

/// Longest [`RunRecord::detail`] kept; a longer one is cut (on a character boundary) so a
/// job's error text cannot grow a record without bound.
pub const MAX_DETAIL_LEN: usize = 1024;

/// Longest [`RunRecord::output`] kept: the tail of a command's output, cut at its start
/// (on a character boundary) so the newest lines stay.
pub const MAX_OUTPUT_LEN: usize = 4096;

/// How one fire time of a job ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RunOutcome {
    /// The job ran and succeeded.
    Ok,
    /// The job ran and returned an error (in [`RunRecord::detail`]).
    Failed,
    /// The lock was held elsewhere (another replica's run of the same job): not run.
    SkippedBusy,
    /// The job passed its hard timeout and was cancelled.
    TimedOut,
    /// The lock was lost while the job ran, and the job was cancelled.
    LockLost,
    /// The fire time passed while the scheduler was not running or was too late to run it.
    Missed,
    /// The scheduler shut down while the job ran and the grace period ended first: the job
    /// was cancelled.
    Cut,
    /// The run is under way: written when the fire time was claimed and its lock taken,
    /// replaced by the record of how it ended. One whose lock is gone is abandoned (its
    /// replica died without writing the end).
    Running,
    /// The lock server could not be reached (or failed) until the fire time's deadline: not
    /// run, for a reason that is the infrastructure's, not the job's.
    Unavailable,
}

impl RunOutcome {
    /// Every outcome, in declaration order (for metrics that want a zero per outcome).
    pub const ALL: [RunOutcome; 9] = [
        RunOutcome::Ok,
        RunOutcome::Failed,
        RunOutcome::SkippedBusy,
        RunOutcome::TimedOut,
        RunOutcome::LockLost,
        RunOutcome::Missed,
        RunOutcome::Cut,
        RunOutcome::Running,
        RunOutcome::Unavailable,
    ];

    /// Whether the job itself failed: it ran and ended in an error, a timeout or the loss
    /// of its lock. Such a record becomes the job's
    /// [`last_failure`](RunRecords::last_failure); retention keeps these apart from
    /// successes ([`Retention`]).
    pub const fn is_failure(self) -> bool {
        matches!(
            self,
            RunOutcome::Failed | RunOutcome::TimedOut | RunOutcome::LockLost
        )
    }

    /// The outcome's stable name, as stored and as shown (`"ok"`, `"failed"`,
    /// `"skipped-busy"`, `"timed-out"`, `"lock-lost"`, `"missed"`, `"cut"`, `"running"`,
    /// `"unavailable"`).
    pub const fn as_str(self) -> &'static str {
        match self {
            RunOutcome::Ok => "ok",
            RunOutcome::Failed => "failed",
            RunOutcome::SkippedBusy => "skipped-busy",
            RunOutcome::TimedOut => "timed-out",
            RunOutcome::LockLost => "lock-lost",
            RunOutcome::Missed => "missed",
            RunOutcome::Cut => "cut",
            RunOutcome::Running => "running",
            RunOutcome::Unavailable => "unavailable",
        }
    }

    /// The outcome named `name` ([`as_str`](Self::as_str)), if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.as_str() == name)
    }
}

impl std::fmt::Display for RunOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a run started: its fire time came, a start after downtime caught it up, or an
/// operator triggered it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RunCause {
    /// The schedule's fire time (the default).
    #[default]
    Schedule,
    /// The newest fire time missed while no replica ran, run once at a start within its
    /// starting deadline.
    CatchUp,
    /// `distlock cron trigger` (or [`JobControl::trigger`]): run now, outside the schedule.
    Trigger,
}

impl RunCause {
    /// The cause's stable name (`"schedule"`, `"catch-up"`, `"trigger"`).
    pub const fn as_str(self) -> &'static str {
        match self {
            RunCause::Schedule => "schedule",
            RunCause::CatchUp => "catch-up",
            RunCause::Trigger => "trigger",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [RunCause::Schedule, RunCause::CatchUp, RunCause::Trigger]
            .into_iter()
            .find(|c| c.as_str() == name)
    }
}

/// One fire time of one job: under way ([`RunOutcome::Running`]) or as it ended.
///
/// Times are wall-clock instants of the replica that wrote the record (the scheduled time
/// is the schedule's, the same on every replica).
///
/// A record is identified by its job, fire time and fence ([`slot`](Self::slot)): storing
/// a record with the slot of a kept one replaces it, so a run's running record becomes its
/// end record, and every replica that records one fire time it did not run (an outage, a
/// missed fire time) leaves one record, not one each.
///
/// `#[non_exhaustive]`: it may record more later; build one with [`RunRecord::new`] and
/// the setters, each named after its field.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunRecord {
    /// The job's name (also its lock key).
    pub job: String,
    /// The fire time this record is about.
    pub scheduled_at: SystemTime,
    /// The replica that wrote the record.
    pub replica: String,
    /// When the job started, if it ran.
    pub started_at: Option<SystemTime>,
    /// When the run (or the decision not to run) ended.
    pub ended_at: SystemTime,
    /// How it ended.
    pub outcome: RunOutcome,
    /// The fencing token of the lock the run held, if it ran.
    pub fence: Option<u64>,
    /// The job's error text, or why it did not run; at most [`MAX_DETAIL_LEN`] bytes.
    pub detail: Option<String>,
    /// The writing replica's clock minus the lock server's, in milliseconds, as its last
    /// fire-time claim measured it (`None` before one did, on a server without a clock,
    /// and in records written before this field existed).
    pub clock_offset_ms: Option<i64>,
    /// The process that ran the job, if it ran.
    pub pid: Option<u32>,
    /// The tail of the job's output (at most [`MAX_OUTPUT_LEN`] bytes, the newest kept), if
    /// it wrote any and its runner keeps it.
    pub output: Option<String>,
    /// Why the run started.
    pub cause: RunCause,
}

impl RunRecord {
    /// The record of fire time `scheduled_at` of `job`, written by `replica`, that ended at
    /// `ended_at` with `outcome`; it did not start, holds no fence, detail or clock offset
    /// until the setters say so.
    pub fn new(
        job: impl Into<String>,
        scheduled_at: SystemTime,
        replica: impl Into<String>,
        ended_at: SystemTime,
        outcome: RunOutcome,
    ) -> Self {
        RunRecord {
            job: job.into(),
            scheduled_at,
            replica: replica.into(),
            started_at: None,
            ended_at,
            outcome,
            fence: None,
            detail: None,
            clock_offset_ms: None,
            pid: None,
            output: None,
            cause: RunCause::Schedule,
        }
    }

    /// The record's identity within its job: its fire time in milliseconds and its fence
    /// (0 without one), as `"<millis>:<fence>"`. Backends replace a kept record with the
    /// same slot instead of storing a second one.
    pub fn slot(&self) -> String {
        format!("{}:{}", millis(self.scheduled_at), self.fence.unwrap_or(0))
    }

    /// Sets [`pid`](Self::pid).
    #[must_use]
    pub fn pid(mut self, pid: Option<u32>) -> Self {
        self.pid = pid;
        self
    }

    /// Sets [`output`](Self::output) (its newest [`MAX_OUTPUT_LEN`] bytes kept when stored).
    #[must_use]
    pub fn output(mut self, output: Option<String>) -> Self {
        self.output = output;
        self
    }

    /// Sets [`cause`](Self::cause).
    #[must_use]
    pub fn cause(mut self, cause: RunCause) -> Self {
        self.cause = cause;
        self
    }

    /// How long the run took, for a record of a run that started and ended.
    pub fn duration(&self) -> Option<Duration> {
        if self.outcome == RunOutcome::Running {
            return None;
        }
        self.started_at
            .and_then(|s| self.ended_at.duration_since(s).ok())
    }

    /// Sets [`started_at`](Self::started_at).
    #[must_use]
    pub fn started_at(mut self, started_at: Option<SystemTime>) -> Self {
        self.started_at = started_at;
        self
    }

    /// Sets [`fence`](Self::fence).
    #[must_use]
    pub fn fence(mut self, fence: Option<u64>) -> Self {
        self.fence = fence;
        self
    }

    /// Sets [`detail`](Self::detail) (cut to [`MAX_DETAIL_LEN`] bytes when stored).
    #[must_use]
    pub fn detail(mut self, detail: Option<String>) -> Self {
        self.detail = detail;
        self
    }

    /// Sets [`clock_offset_ms`](Self::clock_offset_ms).
    #[must_use]
    pub fn clock_offset_ms(mut self, offset_ms: Option<i64>) -> Self {
        self.clock_offset_ms = offset_ms;
        self
    }

    /// The record as the bytes a backend stores: one line of JSON, times in milliseconds
    /// since the Unix epoch. [`decode`](Self::decode) reads it back.
    pub fn encode(&self) -> Vec<u8> {
        let mut detail = self.detail.clone();
        if let Some(d) = detail.as_mut() {
            truncate(d, MAX_DETAIL_LEN);
        }
        let mut output = self.output.clone();
        if let Some(o) = output.as_mut() {
            keep_tail(o, MAX_OUTPUT_LEN);
        }
        let value = serde_json::json!({
            "v": 1,
            "slot": self.slot(),
            "pid": self.pid,
            "output": output,
            "cause": self.cause.as_str(),
            "job": self.job,
            "scheduled_at": millis(self.scheduled_at),
            "replica": self.replica,
            "started_at": self.started_at.map(millis),
            "ended_at": millis(self.ended_at),
            "outcome": self.outcome.as_str(),
            "fence": self.fence,
            "detail": detail,
            "clock_offset_ms": self.clock_offset_ms,
        });
        serde_json::to_vec(&value).expect("a JSON value always serializes")
    }

    /// Reads a record [`encode`](Self::encode) made, stored by the backend named `backend`.
    ///
    /// # Errors
    /// [`Error::Backend`] when the bytes are not such a record (a foreign value under the
    /// records' keys).
    pub fn decode(backend: &'static str, bytes: &[u8]) -> Result<Self> {
        let bad = |why: &str| Error::backend(backend, format!("unreadable run record: {why}"));
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| bad(&e.to_string()))?;
        let text = |name: &str| -> Result<String> {
            value[name]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| bad(&format!("no text field {name}")))
        };
        let time = |name: &str| -> Result<Option<SystemTime>> {
            match &value[name] {
                serde_json::Value::Null => Ok(None),
                v => v
                    .as_i64()
                    .map(|ms| Some(from_millis(ms)))
                    .ok_or_else(|| bad(&format!("field {name} is not a time"))),
            }
        };
        let outcome =
            RunOutcome::from_name(&text("outcome")?).ok_or_else(|| bad("unknown outcome"))?;
        Ok(RunRecord {
            job: text("job")?,
            scheduled_at: time("scheduled_at")?.ok_or_else(|| bad("no scheduled_at"))?,
            replica: text("replica")?,
            started_at: time("started_at")?,
            ended_at: time("ended_at")?.ok_or_else(|| bad("no ended_at"))?,
            outcome,
            fence: value["fence"].as_u64(),
            detail: value["detail"].as_str().map(str::to_owned),
            clock_offset_ms: value["clock_offset_ms"].as_i64(),
            pid: value["pid"].as_u64().and_then(|p| u32::try_from(p).ok()),
            output: value["output"].as_str().map(str::to_owned),
            cause: value["cause"]
                .as_str()
                .and_then(RunCause::from_name)
                .unwrap_or_default(),
        })
    }
}

/// How many records of a job a lock server keeps: the newest `successes` records of
/// [`RunOutcome::Ok`] and, apart from them, the newest `others` of every other outcome
/// (so a run of failures cannot push the last successes out, nor the reverse). Each
/// counts at least 1. The last success and the last failure are kept besides, however old.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retention {
    /// Newest `Ok` records kept.
    pub successes: usize,
    /// Newest records of every other outcome kept.
    pub others: usize,
}

impl Retention {
    /// Keeps `successes` successes and `others` other records (each at least 1).
    pub fn new(successes: usize, others: usize) -> Self {
        Retention {
            successes: successes.max(1),
            others: others.max(1),
        }
    }

    /// Keeps `n` of each.
    pub fn each(n: usize) -> Self {
        Retention::new(n, n)
    }

    /// How many records of `outcome`'s class are kept.
    pub fn of(&self, outcome: RunOutcome) -> usize {
        if outcome == RunOutcome::Ok {
            self.successes
        } else {
            self.others
        }
    }
}

/// A lock server keeping the journal of scheduled runs, beside its locks.
///
/// Rules an implementation keeps (the conformance rules `run_records_keep_the_newest`
/// and `run_records_replace_their_slot` check them):
/// - a record is identified by its job and [`RunRecord::slot`]: [`append`](Self::append)
///   of a record whose slot is kept replaces that record where it stands; any other
///   record is stored as the job's newest. [`recent`](Self::recent) gives them newest
///   first;
/// - after an append, at most [`Retention::successes`] `Ok` records and
///   [`Retention::others`] other records of the job survive (the oldest of each class go
///   first); other jobs' records are untouched;
/// - every [`RunOutcome::Ok`] record appended also becomes the job's
///   [`last_success`](Self::last_success), and every record whose outcome
///   [`is_failure`](RunOutcome::is_failure) its [`last_failure`](Self::last_failure);
///   retention never removes either;
/// - a job's [`JobControl`] is one value, replaced by [`set_control`](Self::set_control)
///   and never touched by retention;
/// - records live apart from every lock: writing or reading them never touches a lock,
///   fence counter or waiter, and the job name is a parameter, never spliced into a
///   query;
/// - every request is bounded by the timeout the lock's requests have.
///
/// The caller encodes ([`RunRecord::encode`], [`JobControl::encode`]) and classifies
/// records; a backend stores bytes by job and slot.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(locker: lock_core::Locker) -> lock_core::Result<()> {
/// let Some(records) = locker.backend().run_records() else {
///     return Ok(()); // this server keeps no history
/// };
/// for run in records.recent("jobs/nightly", 10).await? {
///     println!("{:?} on {}: {}", run.scheduled_at, run.replica, run.outcome);
/// }
/// # Ok(()) }
/// ```
#[async_trait]
pub trait RunRecords: Send + Sync {
    /// Stores `record` under its job (replacing the kept record of its slot, if any), then
    /// trims the job's history to `keep`. An `Ok` record also replaces the job's last
    /// success, a failure its last failure.
    ///
    /// # Errors
    /// [`Error::Unavailable`] (transient) when the server could not be reached or did not
    /// answer in time; the record may or may not be stored.
    ///
    /// # Cancel safety
    /// A dropped call may or may not have stored the record (and trimmed the history).
    async fn append(&self, record: &RunRecord, keep: Retention) -> Result<()>;

    /// The job's newest records, newest first, at most `limit`.
    ///
    /// # Errors
    /// As [`append`](Self::append); [`Error::Backend`] for a stored value that is not a
    /// record.
    ///
    /// # Cancel safety
    /// A read: dropping it leaves nothing behind.
    async fn recent(&self, job: &str, limit: usize) -> Result<Vec<RunRecord>>;

    /// The job's last [`RunOutcome::Ok`] record, however old; `None` if it never
    /// succeeded (or its history was never kept here).
    ///
    /// # Errors
    /// As [`recent`](Self::recent).
    ///
    /// # Cancel safety
    /// A read: dropping it leaves nothing behind.
    async fn last_success(&self, job: &str) -> Result<Option<RunRecord>>;

    /// The job's last record whose outcome [`is_failure`](RunOutcome::is_failure), however
    /// old; `None` if it never failed here.
    ///
    /// # Errors
    /// As [`recent`](Self::recent).
    ///
    /// # Cancel safety
    /// A read: dropping it leaves nothing behind.
    async fn last_failure(&self, job: &str) -> Result<Option<RunRecord>>;

    /// Replaces the job's control (pause, trigger) with `control`.
    ///
    /// # Errors
    /// As [`append`](Self::append).
    ///
    /// # Cancel safety
    /// A dropped call may or may not have replaced the control.
    async fn set_control(&self, job: &str, control: &JobControl) -> Result<()>;

    /// The job's control, `None` when none was ever set.
    ///
    /// # Errors
    /// As [`recent`](Self::recent); [`Error::Backend`] for a stored value that is not a
    /// control.
    ///
    /// # Cancel safety
    /// A read: dropping it leaves nothing behind.
    async fn control(&self, job: &str) -> Result<Option<JobControl>>;
}

#[cfg(test)]
mod tests;
