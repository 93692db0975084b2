//! The run records of the in-process backend: a bounded journal per job, in memory.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use async_trait::async_trait;
use lock_core::records::{JobControl, Retention, RunOutcome, RunRecord, RunRecords};
use lock_core::sync::lock;
use lock_core::Result;

/// Each job's newest records (oldest at the front), its last success and failure, and its
/// control.
#[derive(Default)]
pub(crate) struct History {
    jobs: Mutex<HashMap<String, Job>>,
}

#[derive(Default)]
struct Job {
    runs: VecDeque<RunRecord>,
    last_success: Option<RunRecord>,
    last_failure: Option<RunRecord>,
    control: Option<JobControl>,
}

#[async_trait]
impl RunRecords for History {
    async fn append(&self, record: &RunRecord, keep: Retention) -> Result<()> {
        let mut jobs = lock(&self.jobs);
        let job = jobs.entry(record.job.clone()).or_default();
        let slot = record.slot();
        match job.runs.iter_mut().find(|r| r.slot() == slot) {
            Some(kept) => *kept = record.clone(),
            None => job.runs.push_back(record.clone()),
        }
        // Newest first, count each class; drop what is past its class's bound.
        let (mut ok, mut other) = (0usize, 0usize);
        let mut keep_flags: Vec<bool> = job
            .runs
            .iter()
            .rev()
            .map(|r| {
                let n = if r.outcome == RunOutcome::Ok {
                    &mut ok
                } else {
                    &mut other
                };
                *n += 1;
                *n <= keep.of(r.outcome)
            })
            .collect();
        keep_flags.reverse();
        let mut flags = keep_flags.into_iter();
        job.runs.retain(|_| flags.next().unwrap_or(true));
        if record.outcome == RunOutcome::Ok {
            job.last_success = Some(record.clone());
        }
        if record.outcome.is_failure() {
            job.last_failure = Some(record.clone());
        }
        Ok(())
    }

    async fn recent(&self, job: &str, limit: usize) -> Result<Vec<RunRecord>> {
        Ok(lock(&self.jobs)
            .get(job)
            .map(|j| j.runs.iter().rev().take(limit).cloned().collect())
            .unwrap_or_default())
    }

    async fn last_success(&self, job: &str) -> Result<Option<RunRecord>> {
        Ok(lock(&self.jobs)
            .get(job)
            .and_then(|j| j.last_success.clone()))
    }

    async fn last_failure(&self, job: &str) -> Result<Option<RunRecord>> {
        Ok(lock(&self.jobs)
            .get(job)
            .and_then(|j| j.last_failure.clone()))
    }

    async fn set_control(&self, job: &str, control: &JobControl) -> Result<()> {
        lock(&self.jobs).entry(job.to_owned()).or_default().control = Some(control.clone());
        Ok(())
    }

    async fn control(&self, job: &str) -> Result<Option<JobControl>> {
        Ok(lock(&self.jobs).get(job).and_then(|j| j.control.clone()))
    }
}
