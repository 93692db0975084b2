//! Run records on one Redis server: the node's operations (`RedisNode::append_run`,
//! `RedisNode::recent_runs`, `RedisNode::last_success`) and the backend's
//! [`RunRecords`].

use async_trait::async_trait;
use lock_core::records::{RunOutcome, RunRecord, RunRecords};
use lock_core::Result;
use redis::Value;

use crate::backend::RedisBackend;
use crate::error::NAME;
use crate::handle::RedisNode;
use crate::scripts;

impl RedisNode {
    /// Stores `record` at the head of its job's history list ([`runs_key`]), trims the list
    /// to its newest `keep` records (`keep` of 0 counts as 1), and, for a
    /// [`RunOutcome::Ok`] record, also writes it to the job's last-success key
    /// ([`last_success_key`]), which no trim touches. One script: one round trip, one atomic
    /// step, within the node's [`timeout`](Self::timeout). Touches no lock key.
    ///
    /// [`runs_key`]: Self::runs_key
    /// [`last_success_key`]: Self::last_success_key
    ///
    /// # Errors
    /// As [`ping`](Self::ping); [`Error::Backend`](lock_core::Error::Backend) when a value
    /// of another type sits at the history key (`WRONGTYPE`).
    pub async fn append_run(&self, record: &RunRecord, keep: usize) -> Result<()> {
        let (runs, last_ok) = (
            self.runs_key(&record.job),
            self.last_success_key(&record.job),
        );
        let bytes = record.encode();
        let oldest_kept = keep.max(1) - 1;
        let success = if record.outcome == RunOutcome::Ok {
            "1"
        } else {
            "0"
        };
        let reply = self
            .eval(&scripts::APPEND_RUN, "append_run", |cmd| {
                cmd.arg(2)
                    .arg(&runs)
                    .arg(&last_ok)
                    .arg(&bytes[..])
                    .arg(oldest_kept.to_string())
                    .arg(success);
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
        let mut cmd = redis::cmd("GET");
        cmd.arg(self.last_success_key(job));
        match self.send(&cmd, "last_success").await? {
            Value::Nil => Ok(None),
            item => self.record("last_success", &item).map(Some),
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

/// The history of scheduled runs on this server: a list per job,
/// `<prefix>runs:{<job>}` (newest first), trimmed to `keep` by every append, and the job's
/// last success at `<prefix>runs:{<job>}:ok` (see `RedisNode` for the key layout). Each
/// call is one round trip bounded by the backend's operation timeout; none touches a lock,
/// its fence counter or its waiters.
#[async_trait]
impl RunRecords for RedisBackend {
    /// One script: `LPUSH`, `LTRIM`, and `SET` of the last success for an `Ok` record
    /// (`RedisNode::append_run`).
    async fn append(&self, record: &RunRecord, keep: usize) -> Result<()> {
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
}
