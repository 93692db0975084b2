//! The fire-time claims of the in-process backend: the newest claim per job, in memory.
//!
//! The "server" is the process itself, whose schedulers keep their own clocks (a test's
//! manual clock, a simulation's offset): there is no server clock apart from theirs, so
//! claims answer none (`claimed_at` and `server_time` are `None`) and a scheduler goes by
//! its own clock.

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
        let mut jobs = lock(&self.jobs);
        let won = jobs.get(job).is_none_or(|kept| kept.fire_time < fire_time);
        if won {
            jobs.insert(job.to_owned(), FireClaim::new(fire_time, replica, None));
        }
        Ok(ClaimAnswer::new(won, jobs[job].clone(), None))
    }

    async fn current(&self, job: &str) -> Result<Option<FireClaim>> {
        Ok(lock(&self.jobs).get(job).cloned())
    }
}
