//! One run of a job's command: its environment, and stopping it as `distlock run` does
//! (SIGTERM to its process group, SIGKILL after the grace) when the scheduler cancels it.

use std::ffi::OsString;
use std::future::Future;
use std::time::Duration;

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

/// Runs `command` to its end, or until `cancel` completes; then the command is stopped
/// (SIGTERM to its group, SIGKILL after `grace`, or at once when `hurry` completes first)
/// and this returns once it is gone.
///
/// `Ok(())` when it exited 0; otherwise the reason, for the run record: its exit status,
/// the signal that killed it, that it could not start, or that it was stopped.
pub async fn run<C, H>(
    command: &[String],
    env: &RunEnv<'_>,
    grace: Duration,
    cancel: C,
    hurry: H,
) -> Result<(), String>
where
    C: Future,
    H: Future,
{
    let argv: Vec<OsString> = command.iter().map(OsString::from).collect();
    let vars = env.vars();
    let vars: Vec<(&str, String)> = vars.iter().map(|(k, v)| (*k, v.clone())).collect();
    let mut job = Job::spawn(&argv, &vars).map_err(|e| e.message)?;
    tokio::pin!(cancel);
    // Biased towards the command's own exit, as in `distlock run`: when it ends just as the
    // run is cancelled, its result is what it did.
    let status = tokio::select! {
        biased;
        status = job.wait() => status.map_err(|e| e.message)?,
        _ = &mut cancel => {
            let status = job
                .stop_unless(libc::SIGTERM, grace, hurry)
                .await
                .map_err(|e| e.message)?;
            return Err(format!("stopped ({})", describe(status)));
        }
    };
    if status.success() {
        Ok(())
    } else {
        Err(describe(status))
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
