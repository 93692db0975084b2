//! One run of a job's command: its environment, and stopping it as `distlock run` does
//! (SIGTERM to its process group, SIGKILL after the grace) when the scheduler cancels it.

use std::ffi::OsString;
use std::time::Duration;

use tokio::sync::watch;

use super::{Stops, Task};
use crate::job::{status_code, Job};

/// What the command of one fire time is told, in its environment.
pub struct RunEnv<'a> {
    /// `DISTLOCK_JOB`: the job's name.
    pub job: &'a str,
    /// `DISTLOCK_SCHEDULED_AT`: the fire time, RFC 3339 in UTC.
    pub scheduled_at: String,
    /// `DISTLOCK_FENCE`: the fencing token of the lock this run holds.
    pub fence: u64,
    /// `DISTLOCK_REPLICA`: the replica running it.
    pub replica: &'a str,
}

impl RunEnv<'_> {
    fn vars(&self) -> [(&'static str, String); 5] {
        [
            ("DISTLOCK_JOB", self.job.to_owned()),
            // The job's name is its lock key, as `distlock run` tells its command.
            ("DISTLOCK_KEY", self.job.to_owned()),
            ("DISTLOCK_SCHEDULED_AT", self.scheduled_at.clone()),
            ("DISTLOCK_FENCE", self.fence.to_string()),
            ("DISTLOCK_REPLICA", self.replica.to_owned()),
        ]
    }
}

/// Starts `command` with the run's environment.
///
/// # Errors
/// It could not start (not found, not executable): the run fails with that reason.
pub fn spawn(command: &[String], env: &RunEnv<'_>) -> Result<Job, String> {
    let argv: Vec<OsString> = command.iter().map(OsString::from).collect();
    let vars = env.vars();
    let vars: Vec<(&str, String)> = vars.iter().map(|(k, v)| (*k, v.clone())).collect();
    Job::spawn(&argv, &vars).map_err(|e| e.message)
}

/// A running command of a run. When the scheduler cancels the run (drops its future) while
/// the command runs, the drop hands the command to a background stop (SIGTERM, SIGKILL
/// after the grace) that the process waits for before it exits.
pub struct Running {
    job: Option<Job>,
    grace: Duration,
    stops: Stops,
    hurry: watch::Receiver<bool>,
}

impl Running {
    pub(super) fn new(job: Job, task: &Task) -> Running {
        task.stops.started(job.pgid());
        Running {
            job: Some(job),
            grace: task.grace,
            stops: task.stops.clone(),
            hurry: task.hurry.clone(),
        }
    }

    /// Waits for the command to exit: `Ok(())` for status 0, else the status in words.
    pub async fn wait(&mut self) -> Result<(), String> {
        let job = self.job.as_mut().expect("a running command");
        let status = job.wait().await.map_err(|e| e.message)?;
        self.stops.ended(job.pgid());
        self.job = None;
        if status.success() {
            Ok(())
        } else {
            Err(describe(status))
        }
    }

    /// Stops the command as `distlock run` does; returns once it is gone.
    pub async fn stop(&mut self) {
        if let Some(job) = self.job.as_mut() {
            let mut hurry = self.hurry.clone();
            let _ = job
                .stop_unless(libc::SIGTERM, self.grace, hurry.wait_for(|h| *h))
                .await;
            self.stops.ended(job.pgid());
            self.job = None;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let Some(mut job) = self.job.take() else {
            return;
        };
        let grace = self.grace;
        let mut hurry = self.hurry.clone();
        let stops = self.stops.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(_) => self.stops.spawn(async move {
                let _ = job
                    .stop_unless(libc::SIGTERM, grace, hurry.wait_for(|h| *h))
                    .await;
                stops.ended(job.pgid());
            }),
            // No runtime left to wait on: the command must not outlive the lock.
            Err(_) => job.signal(libc::SIGKILL),
        }
    }
}

/// `exit status 3`, `killed by signal 9`.
fn describe(status: std::process::ExitStatus) -> String {
    let code = status_code(status);
    match status.code() {
        Some(code) => format!("exit status {code}"),
        None => format!("killed by signal {}", code - 128),
    }
}
