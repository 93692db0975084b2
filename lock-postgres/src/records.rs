//! Run records ([`RunRecords`]) in the table `<table>_runs` beside the lease table.

use async_trait::async_trait;
use lock_core::records::{JobControl, Retention, RunOutcome, RunRecord, RunRecords};
use lock_core::Result;
use tokio_postgres::Row;

use crate::backend::PostgresBackend;
use crate::error::NAME;
use crate::sql::{CONTROL, LAST_FAILURE, LAST_SUCCESS};

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

    /// The record column of the job's reserved row `id`, if there is one.
    async fn run_row(&self, op: &'static str, job: &str, id: i64) -> Result<Option<Vec<u8>>> {
        let rows = self
            .query(op, |s| &s.run_row, &[&job.as_bytes(), &id])
            .await?;
        rows.first()
            .map(|row| self.get::<&[u8]>(op, row, 0).map(<[u8]>::to_vec))
            .transpose()
    }
}

/// The history of scheduled runs in the table `"schema"."<table>_runs"` (created with the
/// lease table): a row `(job, id, record, slot, ok)` per record, `id` from the table's
/// sequence in the order they were first stored (a record of a kept slot replaces its row,
/// which keeps its id), `ok` its class; and reserved rows below id 1, which no trim
/// deletes: `id = 0` the job's last success, `-1` its last failure, `-2` its control. Job
/// names are `bytea` parameters, never spliced into SQL. Each call is one prepared
/// statement on the lock connection, within the operation timeout; none touches the lease
/// table.
#[async_trait]
impl RunRecords for PostgresBackend {
    /// One statement: upserts the record by `(job, slot)`, replaces the last success or
    /// failure when it is one, and deletes the job's rows past the newest of their class
    /// in `keep`. Two appends running at once each count the rows stored before them, so
    /// together they may leave one row too many, until the next append.
    async fn append(&self, record: &RunRecord, keep: Retention) -> Result<()> {
        const OP: &str = "append run";
        let rows = self
            .query(
                OP,
                |s| &s.append_run,
                &[
                    &record.job.as_bytes(),
                    &record.encode(),
                    &bigint(keep.successes.max(1)),
                    &bigint(keep.others.max(1)),
                    &record.slot(),
                    &(record.outcome == RunOutcome::Ok),
                    &record.outcome.is_failure(),
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
        self.run_row("last success", job, LAST_SUCCESS)
            .await?
            .map(|bytes| RunRecord::decode(NAME, &bytes))
            .transpose()
    }

    /// One `SELECT` of the row `id = -1`.
    async fn last_failure(&self, job: &str) -> Result<Option<RunRecord>> {
        self.run_row("last failure", job, LAST_FAILURE)
            .await?
            .map(|bytes| RunRecord::decode(NAME, &bytes))
            .transpose()
    }

    /// One upsert of the row `id = -2`.
    async fn set_control(&self, job: &str, control: &JobControl) -> Result<()> {
        const OP: &str = "set control";
        self.query(
            OP,
            |s| &s.set_control,
            &[&job.as_bytes(), &control.encode()],
        )
        .await?;
        Ok(())
    }

    /// One `SELECT` of the row `id = -2`.
    async fn control(&self, job: &str) -> Result<Option<JobControl>> {
        self.run_row("control", job, CONTROL)
            .await?
            .map(|bytes| JobControl::decode(NAME, &bytes))
            .transpose()
    }
}
