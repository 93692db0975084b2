//! Run records: the optional ability of a lock server to keep the history of scheduled
//! runs ([`RunRecords`]), so that every replica of a scheduler, and `distlock cron status`,
//! read the same history from the server they already lock on.
//!
//! The record and its encoding live here, once; a backend only stores and reads the bytes
//! [`RunRecord::encode`] makes, keyed by the job's name.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use crate::error::{Error, Result};

/// Longest [`RunRecord::detail`] kept; a longer one is cut (on a character boundary) so a
/// job's error text cannot grow a record without bound.
pub const MAX_DETAIL_LEN: usize = 1024;

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
}

impl RunOutcome {
    /// Every outcome, in declaration order (for metrics that want a zero per outcome).
    pub const ALL: [RunOutcome; 7] = [
        RunOutcome::Ok,
        RunOutcome::Failed,
        RunOutcome::SkippedBusy,
        RunOutcome::TimedOut,
        RunOutcome::LockLost,
        RunOutcome::Missed,
        RunOutcome::Cut,
    ];

    /// The outcome's stable name, as stored and as shown (`"ok"`, `"failed"`,
    /// `"skipped-busy"`, `"timed-out"`, `"lock-lost"`, `"missed"`, `"cut"`).
    pub const fn as_str(self) -> &'static str {
        match self {
            RunOutcome::Ok => "ok",
            RunOutcome::Failed => "failed",
            RunOutcome::SkippedBusy => "skipped-busy",
            RunOutcome::TimedOut => "timed-out",
            RunOutcome::LockLost => "lock-lost",
            RunOutcome::Missed => "missed",
            RunOutcome::Cut => "cut",
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

/// One fire time of one job, as it ended.
///
/// Times are wall-clock instants of the replica that wrote the record (the scheduled time
/// is the schedule's, the same on every replica).
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
        }
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
        let value = serde_json::json!({
            "v": 1,
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
        })
    }
}

fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

fn millis(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

fn from_millis(ms: i64) -> SystemTime {
    if ms >= 0 {
        UNIX_EPOCH + Duration::from_millis(ms.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_millis(ms.unsigned_abs())
    }
}

/// A lock server keeping the history of scheduled runs, beside its locks.
///
/// Rules an implementation keeps (the conformance rule `run_records_keep_the_newest`
/// checks them):
/// - records of a job are kept in the order the server stored them; [`recent`](Self::recent)
///   gives them newest first;
/// - at most `keep` records per job survive an [`append`](Self::append) (the oldest go
///   first); other jobs' records are untouched;
/// - every [`RunOutcome::Ok`] record appended also becomes the job's
///   [`last_success`](Self::last_success), which retention never removes;
/// - records live apart from every lock: writing or reading them never touches a lock,
///   fence counter or waiter, and the job name is a parameter, never spliced into a
///   query;
/// - every request is bounded by the timeout the lock's requests have.
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
    /// Stores `record` under its job, then trims the job's history to its newest `keep`
    /// records (`keep` of 0 counts as 1). An `Ok` record also replaces the job's last
    /// success.
    ///
    /// # Errors
    /// [`Error::Unavailable`] (transient) when the server could not be reached or did not
    /// answer in time; the record may or may not be stored.
    ///
    /// # Cancel safety
    /// A dropped call may or may not have stored the record (and trimmed the history).
    async fn append(&self, record: &RunRecord, keep: usize) -> Result<()>;

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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written() {
        let record = RunRecord {
            job: "jobs/nightly".into(),
            scheduled_at: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
            replica: "host-a".into(),
            started_at: Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_200)),
            ended_at: UNIX_EPOCH + Duration::from_millis(1_700_000_001_000),
            outcome: RunOutcome::Failed,
            fence: Some(42),
            detail: Some("exit status 3 \"quoted\" ünïcode".into()),
            clock_offset_ms: Some(-6042),
        };
        assert_eq!(RunRecord::decode("test", &record.encode()).unwrap(), record);
        let skipped = RunRecord {
            started_at: None,
            fence: None,
            detail: None,
            outcome: RunOutcome::SkippedBusy,
            ..record
        };
        assert_eq!(
            RunRecord::decode("test", &skipped.encode()).unwrap(),
            skipped
        );
    }

    #[test]
    fn a_long_detail_is_cut_on_a_character_boundary() {
        let record = RunRecord {
            job: "j".into(),
            scheduled_at: UNIX_EPOCH,
            replica: "r".into(),
            started_at: None,
            ended_at: UNIX_EPOCH,
            outcome: RunOutcome::Failed,
            fence: None,
            detail: Some("é".repeat(MAX_DETAIL_LEN)),
            clock_offset_ms: None,
        };
        let back = RunRecord::decode("test", &record.encode()).unwrap();
        let detail = back.detail.unwrap();
        assert!(detail.len() <= MAX_DETAIL_LEN && detail.len() >= MAX_DETAIL_LEN - 1);
        assert!(detail.chars().all(|c| c == 'é'));
    }

    #[test]
    fn foreign_bytes_are_a_backend_error() {
        assert!(matches!(
            RunRecord::decode("test", b"not json"),
            Err(Error::Backend { .. })
        ));
        assert!(matches!(
            RunRecord::decode("test", br#"{"job":"j","outcome":"exploded"}"#),
            Err(Error::Backend { .. })
        ));
    }

    #[test]
    fn every_outcome_has_a_name_that_reads_back() {
        for o in RunOutcome::ALL {
            assert_eq!(RunOutcome::from_name(o.as_str()), Some(o));
        }
    }
}
