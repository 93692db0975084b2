//! The command run under the lock: its own process group, stopping it, and the signals
//! distlock forwards to it.

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::exit::{CliError, CANNOT_EXECUTE, INTERNAL, NOT_FOUND};

/// The signals distlock catches while `run` is in charge: each stops the job (forwarded to
/// its process group) instead of killing distlock outright, so the lock is released only
/// once the job is gone.
pub struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

impl Signals {
    /// Starts catching SIGINT, SIGTERM and SIGHUP.
    ///
    /// # Errors
    /// The handlers could not be installed.
    pub fn catch() -> Result<Signals, CliError> {
        let install = |kind| {
            signal(kind).map_err(|e| {
                CliError::new(INTERNAL, format!("cannot install signal handlers: {e}"))
            })
        };
        Ok(Signals {
            interrupt: install(SignalKind::interrupt())?,
            terminate: install(SignalKind::terminate())?,
            hangup: install(SignalKind::hangup())?,
        })
    }

    /// The next caught signal's number.
    pub async fn recv(&mut self) -> i32 {
        tokio::select! {
            Some(()) = self.interrupt.recv() => libc::SIGINT,
            Some(()) = self.terminate.recv() => libc::SIGTERM,
            Some(()) = self.hangup.recv() => libc::SIGHUP,
            else => std::future::pending().await,
        }
    }
}

/// The command, running in its own process group so that stopping it reaches everything
/// it started.
pub struct Job {
    child: Child,
    /// The group's id: the leader's pid, which is not reused while the leader is unreaped.
    pgid: libc::pid_t,
}

impl Job {
    /// Starts `command` (program and arguments) with `env` added to distlock's environment.
    ///
    /// # Errors
    /// The program was not found (127) or could not be executed (126).
    pub fn spawn(command: &[OsString], env: &[(&str, String)]) -> Result<Job, CliError> {
        let Some((program, args)) = command.split_first() else {
            return Err(CliError::new(NOT_FOUND, "no command given"));
        };
        let shown = program.to_string_lossy();
        let mut cmd = Command::new(program);
        cmd.args(args).process_group(0).kill_on_drop(false);
        for (name, value) in env {
            cmd.env(name, value);
        }
        let child = cmd.spawn().map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => CliError::new(
                NOT_FOUND,
                format!("cannot run `{shown}`: command not found"),
            ),
            io::ErrorKind::PermissionDenied => CliError::new(
                CANNOT_EXECUTE,
                format!("cannot run `{shown}`: permission denied (is it an executable file?)"),
            ),
            _ => CliError::new(CANNOT_EXECUTE, format!("cannot run `{shown}`: {e}")),
        })?;
        let pgid = child
            .id()
            .and_then(|pid| libc::pid_t::try_from(pid).ok())
            .ok_or_else(|| CliError::new(INTERNAL, "the started command has no process id"))?;
        Ok(Job { child, pgid })
    }

    /// The id of the command's process group.
    pub fn pgid(&self) -> libc::pid_t {
        self.pgid
    }

    /// Waits until the command exits.
    ///
    /// # Errors
    /// Waiting failed (distlock's own bug or resource exhaustion).
    pub async fn wait(&mut self) -> Result<ExitStatus, CliError> {
        self.child
            .wait()
            .await
            .map_err(|e| CliError::new(INTERNAL, format!("waiting for the command failed: {e}")))
    }

    /// Sends `sig` to the command's whole process group, then SIGCONT so that a stopped
    /// job (e.g. one that tried to read the terminal) wakes up to receive it, as
    /// `timeout(1)` does.
    pub fn signal(&self, sig: i32) {
        send(self.pgid, sig);
        if sig != libc::SIGKILL && sig != libc::SIGCONT {
            send(self.pgid, libc::SIGCONT);
        }
    }

    /// Stops the command: `first` to its group, SIGKILL after `grace` (or at once on a
    /// further caught signal), then waits for it. Whatever else of the group is left when
    /// the leader has exited is killed too: the job must not outlive the lock.
    ///
    /// # Errors
    /// Waiting failed.
    pub async fn stop(
        &mut self,
        first: i32,
        grace: Duration,
        signals: &mut Signals,
    ) -> Result<ExitStatus, CliError> {
        self.stop_unless(first, grace, signals.recv()).await
    }

    /// Like [`stop`](Self::stop), with SIGKILL at once when `hurry` completes before the
    /// grace has passed (a further signal, a shutdown running out of time).
    ///
    /// # Errors
    /// Waiting failed.
    pub async fn stop_unless<F: Future>(
        &mut self,
        first: i32,
        grace: Duration,
        hurry: F,
    ) -> Result<ExitStatus, CliError> {
        self.signal(first);
        let exited = tokio::select! {
            status = self.child.wait() => Some(status),
            _ = tokio::time::sleep(grace) => None,
            _ = hurry => None,
        };
        let status = match exited {
            Some(status) => status.map_err(|e| {
                CliError::new(INTERNAL, format!("waiting for the command failed: {e}"))
            })?,
            None => {
                self.signal(libc::SIGKILL);
                self.wait().await?
            }
        };
        // The leader is reaped, so its pid could in principle be reused; pids cycle through
        // pid_max before reuse, so within these microseconds this reaches only the job's
        // own leftovers.
        send(self.pgid, libc::SIGKILL);
        Ok(status)
    }
}

/// Sends `sig` to the process group `pgid` (a [`Job::pgid`]).
pub fn send(pgid: libc::pid_t, sig: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions; a negative pid names a group.
    // ESRCH (the group is already gone) is the expected outcome once the job has exited.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

/// The shell's view of a finished command: its exit code, or 128 + the signal that killed
/// it.
pub fn status_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => INTERNAL,
    }
}
