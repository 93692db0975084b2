//! One run of a job's command: its environment, and stopping it as `distlock run` does
//! (SIGTERM to its process group, SIGKILL after the grace) when the scheduler cancels it.

use std::ffi::OsString;
use std::time::Duration;

use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use distlock::scheduler::{jiff, JobContext};
use tokio::sync::watch;

use crate::units::fmt_duration;
use crate::verbosity::note;

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

/// How much longer than the CLI's own stop the scheduler's deadline (timeout, shutdown
/// grace) is: time for a stopped command to be reaped before its run is cancelled.
pub(super) const STOP_MARGIN: Duration = Duration::from_secs(1);

/// A wall-clock instant in RFC 3339, UTC (`2026-03-29T01:30:00Z`).
pub(crate) fn rfc3339(t: SystemTime) -> String {
    match jiff::Timestamp::try_from(t) {
        Ok(t) => t.to_string(),
        Err(_) => format!("{t:?}"),
    }
}

/// The commands running, and the stops of commands whose runs the scheduler cancelled
/// (dropped) while they ran: those go on in the background, and the process does not exit
/// before they are done.
#[derive(Clone, Default)]
pub(super) struct Stops(Arc<std::sync::Mutex<StopsState>>);

#[derive(Default)]
struct StopsState {
    /// The process groups of the commands running now.
    running: std::collections::HashSet<libc::pid_t>,
    stopping: Vec<tokio::task::JoinHandle<()>>,
}

impl Stops {
    fn state(&self) -> std::sync::MutexGuard<'_, StopsState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn started(&self, pgid: libc::pid_t) {
        self.state().running.insert(pgid);
    }

    /// The command of group `pgid` has exited and been reaped.
    fn ended(&self, pgid: libc::pid_t) {
        self.state().running.remove(&pgid);
    }

    fn spawn(&self, stop: impl Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(stop);
        self.state().stopping.push(handle);
    }

    /// SIGKILL to every running command's process group, at once.
    pub(super) fn kill_all(&self) {
        for &pgid in &self.state().running {
            crate::job::send(pgid, libc::SIGKILL);
        }
    }

    pub(super) async fn wait(&self) {
        loop {
            let pending = std::mem::take(&mut self.state().stopping);
            if pending.is_empty() {
                return;
            }
            for handle in pending {
                let _ = handle.await;
            }
        }
    }
}

/// What every run of one job needs.
#[derive(Clone)]
pub(super) struct Task {
    pub(super) command: Arc<Vec<String>>,
    pub(super) grace: Duration,
    pub(super) shutdown_grace: Duration,
    pub(super) stops: Stops,
    /// True once a second signal asked for everything to stop at once.
    pub(super) hurry: watch::Receiver<bool>,
}

impl Task {
    /// One run: the command to its end, or stopped when the run is to end early. An early
    /// end leaves the outcome to the scheduler (timed-out, lock-lost, cut): once the command
    /// is gone, this waits to be cancelled.
    pub(super) async fn run(self, ctx: JobContext) -> Result<(), String> {
        let scheduled_at = rfc3339(ctx.scheduled_at());
        let env = RunEnv {
            job: ctx.job(),
            scheduled_at,
            fence: ctx.fence(),
            replica: ctx.replica(),
        };
        let mut cmd = Running::new(spawn(&self.command, &env)?, &self);
        // The CLI stops the command that much before the scheduler's own deadline.
        let timeout = async {
            match ctx.deadline() {
                Some(d) => {
                    let stop_at = d.checked_sub(self.grace + STOP_MARGIN).unwrap_or(d);
                    tokio::time::sleep_until(stop_at.into()).await;
                }
                None => std::future::pending().await,
            }
        };
        let cut = async {
            ctx.shutting_down().await;
            tokio::time::sleep(self.shutdown_grace).await;
        };
        let mut hurry = self.hurry.clone();
        let why = tokio::select! {
            biased;
            result = cmd.wait() => return result,
            () = ctx.lost() => "the lock was lost",
            () = timeout => "it passed its timeout",
            () = cut => "the shutdown grace passed",
            _ = hurry.wait_for(|h| *h) => "of a second signal",
        };
        note!(
            "distlock: stopping {:?} scheduled at {} because {why}: SIGTERM, SIGKILL after {}",
            ctx.job(),
            env.scheduled_at,
            fmt_duration(self.grace)
        );
        cmd.stop().await;
        // The scheduler cancels the run and records why.
        std::future::pending().await
    }
}
