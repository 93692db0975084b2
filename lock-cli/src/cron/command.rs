//! One run of a job's command: its environment, its output relayed with the job and the
//! fire time, stopping it as `distlock run` does (SIGTERM to its process group, SIGKILL
//! after the grace) when the scheduler cancels it, and stopping what it left in its group
//! when it exits.

use std::ffi::OsString;
use std::time::Duration;

use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use distlock::scheduler::jiff::{self, Zoned};
use distlock::scheduler::JobContext;
use tokio::sync::watch;

use crate::units::fmt_duration;
use crate::verbosity::note;

use crate::job::{status_code, Input, Job, Spawn};

/// What the command of one fire time is told, in its environment.
pub struct RunEnv<'a> {
    /// `DISTLOCK_JOB`: the job's name.
    pub job: &'a str,
    /// `DISTLOCK_SCHEDULED_AT`: the fire time, RFC 3339 in UTC.
    pub scheduled_at: String,
    /// `DISTLOCK_SCHEDULED_LOCAL`: the fire time in the job's time zone, RFC 3339 with
    /// its offset.
    pub scheduled_local: String,
    /// `DISTLOCK_TIME_ZONE`: the job's time zone, its IANA name (left out for a zone
    /// without one).
    pub time_zone: Option<String>,
    /// `DISTLOCK_FENCE`: the fencing token of the lock this run holds.
    pub fence: u64,
    /// `DISTLOCK_REPLICA`: the replica running it.
    pub replica: &'a str,
}

impl RunEnv<'_> {
    fn vars(&self) -> Vec<(&'static str, String)> {
        let mut vars = vec![
            ("DISTLOCK_JOB", self.job.to_owned()),
            // The job's name is its lock key, as `distlock run` tells its command.
            ("DISTLOCK_KEY", self.job.to_owned()),
            ("DISTLOCK_SCHEDULED_AT", self.scheduled_at.clone()),
            ("DISTLOCK_SCHEDULED_LOCAL", self.scheduled_local.clone()),
            ("DISTLOCK_FENCE", self.fence.to_string()),
            ("DISTLOCK_REPLICA", self.replica.to_owned()),
        ];
        if let Some(zone) = &self.time_zone {
            vars.push(("DISTLOCK_TIME_ZONE", zone.clone()));
        }
        vars
    }

    /// What each line of the command's output is relayed after:
    /// `[nightly-report 2026-12-07T01:30:00Z] `.
    fn prefix(&self) -> String {
        format!("[{} {}] ", self.job, self.scheduled_at)
    }
}

/// A fire time in its zone, RFC 3339 with the zone's offset
/// (`2026-12-07T02:30:00+01:00`), and the zone's IANA name when it has one.
pub(crate) fn local_time(t: &Zoned) -> (String, Option<String>) {
    let local = t.timestamp().display_with_offset(t.offset()).to_string();
    (local, t.time_zone().iana_name().map(str::to_owned))
}

/// Starts `command` with the run's environment, stdin from /dev/null, its output relayed
/// line by line with the job and the fire time before each line.
///
/// # Errors
/// It could not start (not found, not executable): the run fails with that reason.
pub fn spawn(command: &[String], env: &RunEnv<'_>) -> Result<Job, String> {
    let argv: Vec<OsString> = command.iter().map(OsString::from).collect();
    let vars = env.vars();
    let how = Spawn {
        env: &vars,
        stdin: Input::Null,
        prefix: Some(env.prefix()),
    };
    Job::spawn(&argv, &how).map_err(|e| e.message)
}

/// How long a run waits, once its command is gone, for the rest of the command's output
/// (a process left running with `leave_children` may hold the pipe open: its lines are
/// still relayed, after the run).
const OUTPUT_WAIT: Duration = Duration::from_millis(500);

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
    /// The command stays in hand (its group, its output) until [`end`](Self::end).
    pub async fn wait(&mut self) -> Result<(), String> {
        let job = self.job.as_mut().expect("a running command");
        let status = job.wait().await.map_err(|e| e.message)?;
        if status.success() {
            Ok(())
        } else {
            Err(describe(status))
        }
    }

    /// Once the command has exited: stops what it left running in its process group
    /// (unless `leave_children`), then returns the tail of its output.
    pub async fn end(&mut self, leave_children: bool, run: &str) -> String {
        let Some(job) = self.job.as_mut() else {
            return String::new();
        };
        if !leave_children && job.group_alive() {
            note!(
                "distlock: {run}: the command exited leaving processes in its group;                  stopping them: SIGTERM, SIGKILL after {} (leave_children = true keeps                  them)",
                fmt_duration(self.grace)
            );
            let mut hurry = self.hurry.clone();
            job.end_group(self.grace, hurry.wait_for(|h| *h)).await;
        }
        let tail = job.output_tail(OUTPUT_WAIT).await.unwrap_or_default();
        self.stops.ended(job.pgid());
        self.job = None;
        tail
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
            // Also when the command has exited and its leftovers were being stopped: the
            // stop signals the group and SIGKILLs what is left.
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

/// The failure's detail for the run record: the status, then as much of the output's
/// tail as the record keeps, on one line (`exit status 3; output ends "…\nno space\n"`).
fn failure_detail(status: &str, tail: &str) -> String {
    if tail.is_empty() {
        return status.to_owned();
    }
    let max = distlock::records::MAX_DETAIL_LEN;
    let head = format!("{status}; output ends ");
    let room = max.saturating_sub(head.len());
    // The quoted text grows by its escapes: keep less, in proportion, until it fits.
    let mut keep = room.saturating_sub(2);
    loop {
        let mut start = tail.len().saturating_sub(keep);
        while !tail.is_char_boundary(start) {
            start += 1;
        }
        let quoted = format!("{:?}", &tail[start..]);
        if quoted.len() <= room || keep == 0 {
            return format!("{head}{quoted}");
        }
        keep = (keep * room / quoted.len()).min(keep - 1);
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
    /// The job's `leave_children`.
    pub(super) leave_children: bool,
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
        let (scheduled_local, time_zone) = local_time(ctx.scheduled_local());
        let env = RunEnv {
            job: ctx.job(),
            scheduled_at,
            scheduled_local,
            time_zone,
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
        // The exit's result, or why the command is to be stopped (the select's output
        // holds a watch guard, which must not live across an await).
        let why = tokio::select! {
            biased;
            result = cmd.wait() => Err(result),
            () = ctx.lost() => Ok("the lock was lost"),
            () = timeout => Ok("it passed its timeout"),
            () = cut => Ok("the shutdown grace passed"),
            _ = hurry.wait_for(|h| *h) => Ok("of a second signal"),
        };
        let why = match why {
            Ok(why) => why,
            Err(result) => {
                let run = format!("{:?} scheduled at {}", ctx.job(), env.scheduled_at);
                let tail = cmd.end(self.leave_children, &run).await;
                if !tail.is_empty() {
                    // The record keeps the tail (its newest 4 KiB), whatever the outcome.
                    ctx.keep_output(tail.clone());
                }
                return result.map_err(|status| failure_detail(&status, &tail));
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_keeps_the_status_and_the_end_of_the_output_on_one_line() {
        assert_eq!(failure_detail("exit status 3", ""), "exit status 3");
        assert_eq!(
            failure_detail("exit status 3", "a\nno space left\n"),
            "exit status 3; output ends \"a\\nno space left\\n\""
        );
        let max = distlock::records::MAX_DETAIL_LEN;
        for tail in ["x".repeat(4096), "\n".repeat(4096), "é\n".repeat(1500)] {
            let d = failure_detail("killed by signal 9", &tail);
            assert!(d.len() <= max, "{} > {max}", d.len());
            assert!(d.len() > max / 3, "keeps what fits: {}", d.len());
            assert!(!d.contains('\n'), "one line");
            assert!(d.starts_with("killed by signal 9; output ends \""), "{d}");
            assert!(
                d.ends_with(&format!("{:?}", &tail[tail.len() - 4..])[1..]),
                "{d}"
            );
        }
    }

    #[test]
    fn the_local_fire_time_has_its_offset_and_zone() {
        let t: Zoned = "2026-12-07T02:30:00+01:00[Europe/Berlin]".parse().unwrap();
        assert_eq!(
            local_time(&t),
            (
                "2026-12-07T02:30:00+01:00".to_owned(),
                Some("Europe/Berlin".to_owned())
            )
        );
        let utc: Zoned = "2026-12-07T01:30:00+00:00[UTC]".parse().unwrap();
        assert_eq!(local_time(&utc).0, "2026-12-07T01:30:00+00:00");
    }
}
