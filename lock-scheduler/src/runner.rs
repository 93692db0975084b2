//! The running scheduler: one timer task per job, one task per fire time it runs.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::job::Job;
use crate::scheduler::{Inner, Running, Scheduler, ShutdownReport};

/// The state of a started scheduler.
pub(crate) struct Control {}

impl Control {
    pub(crate) fn spawn_job(&self, _inner: &Arc<Inner>, _job: Arc<Job>) {
        todo!()
    }
}

pub(crate) fn check(_inner: &Inner, job: Job) -> Result<Job> {
    Ok(job)
}

pub(crate) fn start(_scheduler: &Scheduler) -> Result<Running> {
    todo!()
}

pub(crate) async fn shutdown(_running: Running, _grace: Duration) -> ShutdownReport {
    todo!()
}

pub(crate) fn abort(_scheduler: &Scheduler) {
    todo!()
}
