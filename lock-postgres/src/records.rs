//! Run records ([`RunRecords`]) in the table `<table>_runs` beside the lease table.

use async_trait::async_trait;
use lock_core::records::{RunOutcome, RunRecord, RunRecords};
use lock_core::Result;
use tokio_postgres::Row;

use crate::backend::PostgresBackend;
use crate::error::NAME;

/// `n` as a `bigint` parameter.
fn bigint(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl PostgresBackend {
    /// The record column of `row`.
    fn record(&self, op: &'static str, row: &Row) -> Result<RunRecord> {
        let bytes: &[u8] = self.get(op, row, 0)?;
        RunRecord::decode(NAME, bytes)
    }
}

/// The history of scheduled runs in the table `"schema"."<table>_runs"` (created with the
/// lease table): a row `(job, id, record)` per record, `id` from the table's sequence in
/// the order they were stored, and row `id = 0` the job's last success, which no trim
/// deletes. Job names are `bytea` parameters, never spliced into SQL. Each call is one
/// prepared statement on the lock connection, within the operation timeout; none touches
/// the lease table.
#[async_trait]
impl RunRecords for PostgresBackend {
    /// One statement: inserts the record, replaces the last success for an `Ok` record,
    /// and deletes the job's rows past the newest `keep`. Two appends running at once each
    /// count the rows stored before them, so together they may leave one row too many,
    /// until the next append.
    async fn append(&self, record: &RunRecord, keep: usize) -> Result<()> {
        const OP: &str = "append run";
        let success = record.outcome == RunOutcome::Ok;
        let rows = self
            .query(
                OP,
                |s| &s.append_run,
                &[
                    &record.job.as_bytes(),
                    &record.encode(),
                    &bigint(keep.max(1)),
                    &success,
                ],
            )
            .await?;
        match rows.len() {
            1 => Ok(()),
            n => Err(self.bad_reply(OP, format!("{n} rows"))),
        }
    }

    /// One `SELECT … ORDER BY id DESC LIMIT`.
    async fn recent(&self, job: &str, limit: usize) -> Result<Vec<RunRecord>> {
        const OP: &str = "recent runs";
        if limit == 0 {
            return Ok(Vec::new());
        }
        let rows = self
            .query(OP, |s| &s.recent_runs, &[&job.as_bytes(), &bigint(limit)])
            .await?;
        rows.iter().map(|row| self.record(OP, row)).collect()
    }

    /// One `SELECT` of the row `id = 0`.
    async fn last_success(&self, job: &str) -> Result<Option<RunRecord>> {
        const OP: &str = "last success";
        let rows = self
            .query(OP, |s| &s.last_success, &[&job.as_bytes()])
            .await?;
        rows.first().map(|row| self.record(OP, row)).transpose()
    }
}
