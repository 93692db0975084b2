//! Run records on one Redis server: the node's operations (`RedisNode::append_run`,
//! `RedisNode::recent_runs`, `RedisNode::last_success`, `RedisNode::last_failure`,
//! `RedisNode::set_control`, `RedisNode::control`) and the backend's [`RunRecords`].

use async_trait::async_trait;
use lock_core::records::{JobControl, Retention, RunOutcome, RunRecord, RunRecords};
use lock_core::Result;
use redis::Value;

use crate::backend::RedisBackend;
use crate::error::NAME;
use crate::handle::RedisNode;
use crate::scripts;

impl RedisNode {
    /// Stores `record` in its job's history list ([`runs_key`]): in place of the kept
    /// record of its [`slot`](RunRecord::slot), if any, else as the newest (at the head);
    /// then trims the list to the newest [`successes`](Retention::successes) of `keep`
    /// among the [`RunOutcome::Ok`] records and, apart from them, the newest
    /// [`others`](Retention::others) among the records of every other outcome (each
    /// counting at least 1). An `Ok` record is also written to the job's last-success key
    /// ([`last_success_key`]), a record whose outcome
    /// [`is_failure`](RunOutcome::is_failure) to its last-failure key
    /// ([`last_failure_key`]); no trim touches either. One script: one round trip, one
    /// atomic step, within the node's [`timeout`](Self::timeout) (a request sent again
    /// after a lost reply replaces its own record). Touches no lock key.
    ///
    /// [`runs_key`]: Self::runs_key
    /// [`last_success_key`]: Self::last_success_key
    /// [`last_failure_key`]: Self::last_failure_key
    ///
    /// # Errors
    /// As [`ping`](Self::ping); [`Error::Backend`](lock_core::Error::Backend) when a value
    /// of another type sits at the history key (`WRONGTYPE`; nothing is written then).
    pub async fn append_run(&self, record: &RunRecord, keep: Retention) -> Result<()> {
        let (runs, last_ok, last_failed) = (
            self.runs_key(&record.job),
            self.last_success_key(&record.job),
            self.last_failure_key(&record.job),
        );
        let bytes = record.encode();
        // The slot's exact text in the encoded record: quotes inside a JSON string are
        // escaped, so it is found nowhere else in a record.
        let slot = format!("\"slot\":\"{}\"", record.slot());
        let flag = |yes: bool| if yes { "1" } else { "0" };
        let (successes, others) = (keep.successes.max(1), keep.others.max(1));
        let reply = self
            .eval(&scripts::schedule::APPEND_RUN, "append_run", |cmd| {
                cmd.arg(3)
                    .arg(&runs)
                    .arg(&last_ok)
                    .arg(&last_failed)
                    .arg(&bytes[..])
                    .arg(&slot)
                    .arg(successes.to_string())
                    .arg(others.to_string())
                    .arg(flag(record.outcome == RunOutcome::Ok))
                    .arg(flag(record.outcome.is_failure()));
            })
            .await?;
        match reply {
            Value::Int(1) => Ok(()),
            other => Err(self.unexpected("append_run", &other)),
        }
    }

    /// Job `job`'s newest `limit` records, newest first: one `LRANGE`, within the node's
    /// timeout (no request at all for a `limit` of 0).
    ///
    /// # Errors
    /// As [`ping`](Self::ping); [`Error::Backend`](lock_core::Error::Backend) when the
    /// history key holds something else than run records (another type, or a list of
    /// foreign values).
    pub async fn recent_runs(&self, job: &str, limit: usize) -> Result<Vec<RunRecord>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // LRANGE's stop is inclusive; past the end is the end.
        let stop = i64::try_from(limit - 1).unwrap_or(i64::MAX);
        let mut cmd = redis::cmd("LRANGE");
        cmd.arg(self.runs_key(job)).arg(0).arg(stop);
        match self.send(&cmd, "recent_runs").await? {
            Value::Array(items) => items
                .iter()
                .map(|item| self.record("recent_runs", item))
                .collect(),
            Value::Nil => Ok(Vec::new()),
            other => Err(self.unexpected("recent_runs", &other)),
        }
    }

    /// Job `job`'s last [`RunOutcome::Ok`] record, `None` when none was stored: one `GET`,
    /// within the node's timeout.
    ///
    /// # Errors
    /// As [`recent_runs`](Self::recent_runs).
    pub async fn last_success(&self, job: &str) -> Result<Option<RunRecord>> {
        self.stored_record(self.last_success_key(job), "last_success")
            .await
    }

    /// Job `job`'s last record whose outcome [`is_failure`](RunOutcome::is_failure),
    /// `None` when none was stored: one `GET`, within the node's timeout.
    ///
    /// # Errors
    /// As [`recent_runs`](Self::recent_runs).
    pub async fn last_failure(&self, job: &str) -> Result<Option<RunRecord>> {
        self.stored_record(self.last_failure_key(job), "last_failure")
            .await
    }

    /// Replaces job `job`'s control with `control` ([`JobControl::encode`]'s bytes at
    /// [`control_key`](Self::control_key)): one `SET`, within the node's timeout. No trim
    /// touches it.
    ///
    /// # Errors
    /// As [`ping`](Self::ping).
    pub async fn set_control(&self, job: &str, control: &JobControl) -> Result<()> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.control_key(job)).arg(control.encode());
        match self.send(&cmd, "set_control").await? {
            Value::Okay => Ok(()),
            other => Err(self.unexpected("set_control", &other)),
        }
    }

    /// Job `job`'s control, `None` when none was set: one `GET`, within the node's timeout.
    ///
    /// # Errors
    /// As [`ping`](Self::ping); [`Error::Backend`](lock_core::Error::Backend) when the key
    /// holds something else than a control (another type, or foreign bytes).
    pub async fn control(&self, job: &str) -> Result<Option<JobControl>> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(self.control_key(job));
        match self.send(&cmd, "control").await? {
            Value::Nil => Ok(None),
            Value::BulkString(bytes) => JobControl::decode(NAME, &bytes).map(Some),
            other => Err(self.unexpected("control", &other)),
        }
    }

    /// The record at `key` (a `GET`), if any.
    async fn stored_record(&self, key: String, op: &'static str) -> Result<Option<RunRecord>> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(key);
        match self.send(&cmd, op).await? {
            Value::Nil => Ok(None),
            item => self.record(op, &item).map(Some),
        }
    }

    /// The record a stored value holds.
    fn record(&self, op: &'static str, item: &Value) -> Result<RunRecord> {
        match item {
            Value::BulkString(bytes) => RunRecord::decode(NAME, bytes),
            other => Err(self.unexpected(op, other)),
        }
    }
}

/// The history of scheduled runs on this server: a list per job, `<prefix>runs:{<job>}`
/// (newest first; a record replaces the kept one of its slot where it stands), trimmed by
/// every append to the newest successes and the newest other records `keep` says, the
/// job's last success at `<prefix>runs:{<job>}:ok`, its last failure at
/// `<prefix>runs:{<job>}:failed` and its control at `<prefix>runs:{<job>}:control` (see
/// `RedisNode` for the key layout; the job's hash tag keeps them on one cluster slot). Each
/// call is one round trip bounded by the backend's operation timeout; none touches a lock,
/// its fence counter or its waiters.
#[async_trait]
impl RunRecords for RedisBackend {
    /// One script: `LRANGE` of the history, `LSET` over the record of the same slot or
    /// `LPUSH`, the trim by class (`LSET` of a marker over each record past its bound, one
    /// `LREM` of the markers), and `SET` of the last success or failure
    /// (`RedisNode::append_run`).
    async fn append(&self, record: &RunRecord, keep: Retention) -> Result<()> {
        self.node.append_run(record, keep).await
    }

    /// One `LRANGE` (`RedisNode::recent_runs`).
    async fn recent(&self, job: &str, limit: usize) -> Result<Vec<RunRecord>> {
        self.node.recent_runs(job, limit).await
    }

    /// One `GET` (`RedisNode::last_success`).
    async fn last_success(&self, job: &str) -> Result<Option<RunRecord>> {
        self.node.last_success(job).await
    }

    /// One `GET` (`RedisNode::last_failure`).
    async fn last_failure(&self, job: &str) -> Result<Option<RunRecord>> {
        self.node.last_failure(job).await
    }

    /// One `SET` (`RedisNode::set_control`).
    async fn set_control(&self, job: &str, control: &JobControl) -> Result<()> {
        self.node.set_control(job, control).await
    }

    /// One `GET` (`RedisNode::control`).
    async fn control(&self, job: &str) -> Result<Option<JobControl>> {
        self.node.control(job).await
    }
}
