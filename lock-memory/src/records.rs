//! The run records of the in-process backend: a bounded history per job, in memory.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use async_trait::async_trait;
use lock_core::records::{RunOutcome, RunRecord, RunRecords};
use lock_core::sync::lock;
use lock_core::Result;

/// Each job's newest records (oldest at the front) and its last success.
#[derive(Default)]
pub(crate) struct History {
    jobs: Mutex<HashMap<String, Job>>,
}

#[derive(Default)]
struct Job {
    runs: VecDeque<RunRecord>,
    last_success: Option<RunRecord>,
}

#[async_trait]
impl RunRecords for History {
    async fn append(&self, record: &RunRecord, keep: usize) -> Result<()> {
        let mut jobs = lock(&self.jobs);
        let job = jobs.entry(record.job.clone()).or_default();
        job.runs.push_back(record.clone());
        while job.runs.len() > keep.max(1) {
            job.runs.pop_front();
        }
        if record.outcome == RunOutcome::Ok {
            job.last_success = Some(record.clone());
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
}
