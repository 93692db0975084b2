//! Run records ([`RunRecords`]): the scheduler's history, in a key space of its own beside
//! the locks.
//!
//! Job `job`'s records are the keys `<root><hex of job>/r/<unique name>`, each holding one
//! [`RunRecord::encode`], ordered by their create revision (the order etcd stored them); its
//! last success is `<root><hex of job>/ok`. `<root>` is
//! [`beside_prefix`](Shared::beside_prefix)`("runs")` (`distlock.runs/` with the default
//! prefix): no record key is a lock key, and the release watch never sees a trim. The job's
//! name is spelled in hex so that one job's keys can never fall under another's range (a
//! name may hold `/`).

use async_trait::async_trait;
use etcd_client::{GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse};
use lock_core::records::{RunOutcome, RunRecord, RunRecords};
use lock_core::{Owner, Result};

use crate::backend::EtcdBackend;
use crate::error::{failed, unexpected, NAME};
use crate::shared::Shared;

/// Deletes per trim transaction: below etcd's default `--max-txn-ops` (128). An append
/// trims one record in the usual case; more only when `keep` was lowered.
const TRIM_BATCH: usize = 100;

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

/// The range of a job's records: `<root><hex of job>/r/`.
fn history(shared: &Shared, job: &str) -> String {
    let mut key = job_root(shared, job);
    key.push_str("r/");
    key
}

/// The key of a job's last success: `<root><hex of job>/ok`.
fn last_success_key(shared: &Shared, job: &str) -> String {
    let mut key = job_root(shared, job);
    key.push_str("ok");
    key
}

/// A job's records, newest (last created) first, at most `limit` (0: all).
fn newest_first(limit: i64) -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(limit)
}

impl Shared {
    /// One transaction puts the record under a new key (and over the last success when it
    /// is one) and lists the job's record keys, newest first; a second deletes those past
    /// `keep` (usually the one oldest record; a batch per [`TRIM_BATCH`] when `keep` was
    /// lowered). Each request within the operation timeout.
    async fn append_run(&self, record: &RunRecord, keep: usize) -> Result<()> {
        const DOING: &str = "appending a run record";
        let keep = keep.max(1);
        let range = history(self, &record.job);
        let bytes = record.encode();
        let mut ops = vec![TxnOp::put(
            format!("{range}{}", Owner::random()),
            bytes.clone(),
            None,
        )];
        if record.outcome == RunOutcome::Ok {
            ops.push(TxnOp::put(last_success_key(self, &record.job), bytes, None));
        }
        // Ops of a transaction see the writes before them: the list includes the new key.
        ops.push(TxnOp::get(range, Some(newest_first(0).with_keys_only())));
        let mut kv = self.client().kv_client();
        let answer = self
            .within(DOING, async {
                kv.txn(Txn::new().and_then(ops))
                    .await
                    .map_err(failed(DOING))
            })
            .await?;
        let listed = answer
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Get(get) => Some(get),
                _ => None,
            })
            .ok_or_else(|| unexpected("a transaction without its range's answer"))?;
        let old: Vec<Vec<u8>> = listed
            .kvs()
            .iter()
            .skip(keep)
            .map(|kv| kv.key().to_vec())
            .collect();
        for batch in old.chunks(TRIM_BATCH) {
            const TRIM: &str = "trimming run records";
            let deletes: Vec<TxnOp> = batch
                .iter()
                .map(|k| TxnOp::delete(k.clone(), None))
                .collect();
            self.within(TRIM, async {
                kv.txn(Txn::new().and_then(deletes))
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

    /// One get: the job's last success.
    async fn last_success(&self, job: &str) -> Result<Option<RunRecord>> {
        const DOING: &str = "reading the last success";
        let mut kv = self.client().kv_client();
        let answer = self
            .within(DOING, async {
                kv.get(last_success_key(self, job), None)
                    .await
                    .map_err(failed(DOING))
            })
            .await?;
        answer
            .kvs()
            .first()
            .map(|kv| RunRecord::decode(NAME, kv.value()))
            .transpose()
    }
}

/// The history of scheduled runs in the cluster, beside the locks: job `job`'s records
/// under `<prefix minus its last character>.runs/<hex of job>/r/` (`distlock.runs/…` with
/// the default prefix), in the order etcd created them, and its last success at
/// `….runs/<hex of job>/ok`, which no trim touches. An append is one transaction (put,
/// and list the job's keys) and one more deleting what is past `keep`; a read is one
/// range. Every request is bounded by the operation timeout and goes to the preferred
/// member, as the lock's do; none touches a lock key, lease or watch.
#[async_trait]
impl RunRecords for EtcdBackend {
    async fn append(&self, record: &RunRecord, keep: usize) -> Result<()> {
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
}
