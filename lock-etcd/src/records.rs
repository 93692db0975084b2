//! Run records ([`RunRecords`]): the scheduler's history, in a key space of its own beside
//! the locks.
//!
//! Job `job`'s records are the keys `<root><hex of job>/r/<slot>` ([`RunRecord::slot`]),
//! each holding one [`RunRecord::encode`], ordered by their create revision (the order etcd
//! first stored them: a put on a kept slot keeps its key's create revision, so a replaced
//! record stays in its place). A success also has the empty marker
//! `<root><hex of job>/s/<slot>`, which classifies it for the trim without reading the
//! records. Its last success is `<root><hex of job>/ok`, its last failure
//! `<root><hex of job>/failed`, its control ([`JobControl::encode`]) `<root><hex of
//! job>/control`; none is under `/r/`, so no trim reaches them. `<root>` is
//! [`beside_prefix`](Shared::beside_prefix)`("runs")` (`distlock.runs/` with the default
//! prefix): no record key is a lock key, and the release watch never sees a trim. The job's
//! name is spelled in hex so that one job's keys can never fall under another's range (a
//! name may hold `/`).

use std::collections::HashSet;

use async_trait::async_trait;
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};
use lock_core::records::{JobControl, Retention, RunOutcome, RunRecord, RunRecords};
use lock_core::Result;

use crate::backend::EtcdBackend;
use crate::error::{failed, unexpected, NAME};
use crate::shared::Shared;

/// Records deleted per trim transaction: each takes a comparison and two deletes (the
/// record and its marker), below etcd's default `--max-txn-ops` (128) per part. An append
/// trims one record in the usual case; more only when the retention was lowered.
const TRIM_BATCH: usize = 50;

/// `<root><hex of job>/`: the keys of one job.
fn job_root(shared: &Shared, job: &str) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut root = shared.beside_prefix("runs");
    root.reserve(job.len() * 2 + 1);
    for byte in job.bytes() {
        root.push(char::from(DIGITS[usize::from(byte >> 4)]));
        root.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    root.push('/');
    root
}

/// `<root><hex of job>/<name>`.
fn job_key(shared: &Shared, job: &str, name: &str) -> String {
    let mut key = job_root(shared, job);
    key.push_str(name);
    key
}

/// The range of a job's records: `<root><hex of job>/r/`.
fn history(shared: &Shared, job: &str) -> String {
    job_key(shared, job, "r/")
}

/// The range of a job's success markers: `<root><hex of job>/s/`.
fn successes(shared: &Shared, job: &str) -> String {
    job_key(shared, job, "s/")
}

/// The key of a job's last success: `<root><hex of job>/ok`.
fn last_success_key(shared: &Shared, job: &str) -> String {
    job_key(shared, job, "ok")
}

/// The key of a job's last failure: `<root><hex of job>/failed`.
fn last_failure_key(shared: &Shared, job: &str) -> String {
    job_key(shared, job, "failed")
}

/// The key of a job's control: `<root><hex of job>/control`.
fn control_key(shared: &Shared, job: &str) -> String {
    job_key(shared, job, "control")
}

/// A job's records, newest (first created) first, at most `limit` (0: all).
fn newest_first(limit: i64) -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(limit)
}

/// The records of `listed` (newest first, under `range`) past their class's bound in
/// `keep`: a record is a success when `marked` holds its name (its key past `range`).
fn past_retention<'a>(
    listed: &'a [KeyValue],
    range: &str,
    marked: &HashSet<&[u8]>,
    keep: Retention,
) -> Vec<&'a KeyValue> {
    let (mut ok, mut other) = (0usize, 0usize);
    listed
        .iter()
        .filter(|kv| {
            let name = kv.key().get(range.len()..).unwrap_or_default();
            let (count, bound) = if marked.contains(name) {
                (&mut ok, keep.successes)
            } else {
                (&mut other, keep.others)
            };
            *count += 1;
            *count > bound
        })
        .collect()
}

impl Shared {
    /// One transaction puts the record at its slot's key (a new key is the newest; a kept
    /// one keeps its place), puts or deletes its success marker, puts the last success or
    /// failure when it is one, and lists the job's record keys (newest first) and success
    /// markers; a second deletes the records past their class's bound (usually one; a
    /// batch per [`TRIM_BATCH`] when the retention was lowered), each only while it is as
    /// listed (a record replaced since is left for the next append's trim). Each request
    /// within the operation timeout.
    async fn append_run(&self, record: &RunRecord, keep: Retention) -> Result<()> {
        const DOING: &str = "appending a run record";
        let keep = Retention::new(keep.successes, keep.others);
        let job = &record.job;
        let (range, marks) = (history(self, job), successes(self, job));
        let slot = record.slot();
        let bytes = record.encode();
        let success = record.outcome == RunOutcome::Ok;
        let mut ops = vec![TxnOp::put(format!("{range}{slot}"), bytes.clone(), None)];
        let mark = format!("{marks}{slot}");
        ops.push(if success {
            TxnOp::put(mark, Vec::new(), None)
        } else {
            // A kept record of this slot may have been a success.
            TxnOp::delete(mark, None)
        });
        if success {
            ops.push(TxnOp::put(last_success_key(self, job), bytes.clone(), None));
        }
        if record.outcome.is_failure() {
            ops.push(TxnOp::put(last_failure_key(self, job), bytes, None));
        }
        // Ops of a transaction see the writes before them: the lists include the new keys.
        ops.push(TxnOp::get(
            range.as_str(),
            Some(newest_first(0).with_keys_only()),
        ));
        ops.push(TxnOp::get(
            marks.as_str(),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        ));
        let mut kv = self.client().kv_client();
        let answer = self
            .within(DOING, async {
                kv.txn(Txn::new().and_then(ops))
                    .await
                    .map_err(failed(DOING))
            })
            .await?;
        let mut lists = answer.op_responses().into_iter().filter_map(|op| match op {
            TxnOpResponse::Get(get) => Some(get),
            _ => None,
        });
        let (Some(listed), Some(marked)) = (lists.next(), lists.next()) else {
            return Err(unexpected("a transaction without its ranges' answers"));
        };
        let marked: HashSet<&[u8]> = marked
            .kvs()
            .iter()
            .map(|kv| kv.key().get(marks.len()..).unwrap_or_default())
            .collect();
        let old = past_retention(listed.kvs(), &range, &marked, keep);
        for batch in old.chunks(TRIM_BATCH) {
            const TRIM: &str = "trimming run records";
            let unchanged: Vec<Compare> = batch
                .iter()
                .map(|kv| Compare::mod_revision(kv.key(), CompareOp::Equal, kv.mod_revision()))
                .collect();
            let deletes: Vec<TxnOp> = batch
                .iter()
                .flat_map(|kv| {
                    let name = kv.key().get(range.len()..).unwrap_or_default();
                    let mut mark = marks.as_bytes().to_vec();
                    mark.extend_from_slice(name);
                    [TxnOp::delete(kv.key(), None), TxnOp::delete(mark, None)]
                })
                .collect();
            self.within(TRIM, async {
                kv.txn(Txn::new().when(unchanged).and_then(deletes))
                    .await
                    .map_err(failed(TRIM))
            })
            .await?;
        }
        Ok(())
    }

    /// One range: the job's newest `limit` records.
    async fn recent_runs(&self, job: &str, limit: usize) -> Result<Vec<RunRecord>> {
        const DOING: &str = "reading run records";
        if limit == 0 {
            // A range's limit of 0 would mean no limit.
            return Ok(Vec::new());
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut kv = self.client().kv_client();
        let answer = self
            .within(DOING, async {
                kv.get(history(self, job), Some(newest_first(limit)))
                    .await
                    .map_err(failed(DOING))
            })
            .await?;
        answer
            .kvs()
            .iter()
            .map(|kv| RunRecord::decode(NAME, kv.value()))
            .collect()
    }

    /// One get: the value of `key`, if any.
    async fn get_one(&self, doing: &'static str, key: String) -> Result<Option<Vec<u8>>> {
        let mut kv = self.client().kv_client();
        let answer = self
            .within(doing, async {
                kv.get(key, None).await.map_err(failed(doing))
            })
            .await?;
        Ok(answer.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// One get: the job's last success.
    async fn last_success(&self, job: &str) -> Result<Option<RunRecord>> {
        self.get_one("reading the last success", last_success_key(self, job))
            .await?
            .map(|bytes| RunRecord::decode(NAME, &bytes))
            .transpose()
    }

    /// One get: the job's last failure.
    async fn last_failure(&self, job: &str) -> Result<Option<RunRecord>> {
        self.get_one("reading the last failure", last_failure_key(self, job))
            .await?
            .map(|bytes| RunRecord::decode(NAME, &bytes))
            .transpose()
    }

    /// One put: the job's control.
    async fn set_control(&self, job: &str, control: &JobControl) -> Result<()> {
        const DOING: &str = "setting a job's control";
        let mut kv = self.client().kv_client();
        self.within(DOING, async {
            kv.put(control_key(self, job), control.encode(), None)
                .await
                .map_err(failed(DOING))
        })
        .await?;
        Ok(())
    }

    /// One get: the job's control.
    async fn control(&self, job: &str) -> Result<Option<JobControl>> {
        self.get_one("reading a job's control", control_key(self, job))
            .await?
            .map(|bytes| JobControl::decode(NAME, &bytes))
            .transpose()
    }
}

/// The history of scheduled runs in the cluster, beside the locks: job `job`'s records
/// under `<prefix minus its last character>.runs/<hex of job>/r/<slot>`
/// (`distlock.runs/…` with the default prefix), in the order etcd first created them, its
/// successes marked under `…/s/<slot>`, and its last success, last failure and control at
/// `….runs/<hex of job>/ok`, `…/failed` and `…/control`, which no trim touches. An append
/// is one transaction (put, mark, and list the job's keys) and one more deleting what is
/// past the retention; a read is one range or get. Every request is bounded by the
/// operation timeout and goes to the preferred member, as the lock's do; none touches a
/// lock key, lease or watch.
#[async_trait]
impl RunRecords for EtcdBackend {
    async fn append(&self, record: &RunRecord, keep: Retention) -> Result<()> {
        let (member, _) = self.shared.members.pick();
        let result = self.shared.append_run(record, keep).await;
        self.shared.members.note(member, result)
    }

    async fn recent(&self, job: &str, limit: usize) -> Result<Vec<RunRecord>> {
        let (member, _) = self.shared.members.pick();
        let result = self.shared.recent_runs(job, limit).await;
        self.shared.members.note(member, result)
    }

    async fn last_success(&self, job: &str) -> Result<Option<RunRecord>> {
        let (member, _) = self.shared.members.pick();
        let result = self.shared.last_success(job).await;
        self.shared.members.note(member, result)
    }

    async fn last_failure(&self, job: &str) -> Result<Option<RunRecord>> {
        let (member, _) = self.shared.members.pick();
        let result = self.shared.last_failure(job).await;
        self.shared.members.note(member, result)
    }

    async fn set_control(&self, job: &str, control: &JobControl) -> Result<()> {
        let (member, _) = self.shared.members.pick();
        let result = self.shared.set_control(job, control).await;
        self.shared.members.note(member, result)
    }

    async fn control(&self, job: &str) -> Result<Option<JobControl>> {
        let (member, _) = self.shared.members.pick();
        let result = self.shared.control(job).await;
        self.shared.members.note(member, result)
    }
}
