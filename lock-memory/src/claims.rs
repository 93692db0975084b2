//! The fire-time claims of the in-process backend: the newest claim per job, in memory,
//! on this process's clock (the "server" is the process).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::SystemTime;

use async_trait::async_trait;
use lock_core::claims::{ClaimAnswer, FireClaim, FireClaims};
use lock_core::sync::lock;
use lock_core::Result;

/// Each job's newest claim.
#[derive(Default)]
pub(crate) struct Claims {
    jobs: Mutex<HashMap<String, FireClaim>>,
}

#[async_trait]
impl FireClaims for Claims {
    async fn claim(&self, job: &str, fire_time: SystemTime, replica: &str) -> Result<ClaimAnswer> {
        let now = SystemTime::now();
        let mut jobs = lock(&self.jobs);
        let won = !jobs.get(job).is_some_and(|kept| kept.fire_time >= fire_time);
        if won {
            jobs.insert(
                job.to_owned(),
                FireClaim::new(fire_time, replica, Some(now)),
            );
        }
        Ok(ClaimAnswer::new(won, jobs[job].clone(), Some(now)))
    }

    async fn current(&self, job: &str) -> Result<Option<FireClaim>> {
        Ok(lock(&self.jobs).get(job).cloned())
    }
}
