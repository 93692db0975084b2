//! The shared "managed server" used by every server kind: one way to launch a server, as
//! a child process or in a container, behind one surface.

use std::error::Error;
use std::ffi::OsString;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::child;
use crate::container::{self, Container};
use crate::images;
use crate::mode::{launch_mode, LaunchMode};
use crate::ports::{free_port, START_ATTEMPTS};

/// How many log lines startup-failure messages include.
const LOG_TAIL_LINES: usize = 40;

/// Why a server did not become ready.
#[derive(Debug, Clone)]
pub enum StartError {
    /// The process exited before it became ready.
    Exited {
        /// The process's name (e.g. `redis-server 127.0.0.1:6379`).
        name: String,
        /// Its exit status, as text.
        status: String,
        /// The last lines it wrote to its log during this start.
        log: String,
    },
    /// The process kept running but never passed its readiness probe.
    TimedOut {
        /// The process's name.
        name: String,
        /// How long was waited.
        after: Duration,
        /// The last lines it wrote to its log during this start.
        log: String,
    },
}

impl StartError {
    /// True when the log says the port was taken ("address already in use"):
    /// the caller may retry on another port.
    pub fn is_addr_in_use(&self) -> bool {
        matches!(self, StartError::Exited { log, .. }
            if log.to_ascii_lowercase().contains("address already in use"))
    }
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Exited { name, status, log } => write!(
                f,
                "{name} exited during startup ({status}); last log lines:\n{log}"
            ),
            StartError::TimedOut { name, after, log } => write!(
                f,
                "{name} did not become ready within {after:?}; last log lines:\n{log}"
            ),
        }
    }
}

impl Error for StartError {}

/// What runs now.
enum Run {
    /// Nothing (never started, killed and reaped, or exited and reaped).
    Stopped,
    /// A child process (exited but not yet reaped included).
    Child(Child),
    /// A container (stopped but not yet removed included: its log stays readable).
    Container(Box<Container>),
}

struct State {
    run: Run,
    /// Log file length when the current child was spawned, so failure
    /// messages show only this run's output.
    log_start: u64,
}

/// A server owned by the test kit, launched in one of two ways chosen by
/// `DISTLOCK_TESTKIT` ([`crate::launch_mode`]):
///
/// * as processes (the default): a child process spawned from the dedicated spawner
///   thread with `PR_SET_PDEATHSIG = SIGKILL`, in its own process group, with stdin
///   closed and stdout/stderr appended to a log file. Signals go to the whole process
///   group (the server and anything it forked);
/// * in containers (`containers`), for a program some image holds (see
///   [`crate::find_binary`]): a container of that image started through
///   `testcontainers` on the **host network** (so the server listens on the same
///   127.0.0.1 port as a process would), running the program's path inside the image
///   with the same arguments, as the same user (via `setpriv`), with the log file's
///   directory and every absolute path on the command line bind-mounted at the same
///   path, and its output appended to the same log file. Pausing freezes the container
///   (`docker pause`), killing is `SIGKILL` to all its processes, a respawn starts a new
///   container with the same command line (ports and mounted data are the same).
///   Containers are named `distlock-testkit-<test binary pid>-<run id>-<n>`, and a
///   reaper process removes those of a test binary that died without dropping them.
///   A program no image holds (a host tool) still runs as a child process.
///
/// Dropping a `ManagedProcess` kills it (and removes its container). All methods take
/// `&self`; the run is kept behind a mutex.
///
/// This is the building block for server kinds: [`crate::RedisServer`] and
/// [`crate::EtcdServer`] are a command line plus a readiness probe on top of
/// it, and get both launch modes from it.
pub struct ManagedProcess {
    name: String,
    program: PathBuf,
    args: Vec<OsString>,
    log_path: PathBuf,
    /// The user and group ids to run as (`None`: as this process).
    user: Option<(u32, u32)>,
    /// Always a child process on the host, also in container mode (a binary of the host
    /// that only shares its file name with an image's server, e.g. an older Redis).
    on_host: bool,
    state: Mutex<State>,
}

impl ManagedProcess {
    /// Spawns `program args...`, appending its stdout and stderr to
    /// `log_path` (created if missing). `name` is used in messages.
    ///
    /// Returns as soon as the process is forked (in container mode: once the container
    /// started); use [`wait_ready`](Self::wait_ready) to wait until it serves.
    ///
    /// # Errors
    ///
    /// If the log file cannot be opened or the program cannot be executed.
    pub fn spawn(
        name: impl Into<String>,
        program: impl Into<PathBuf>,
        args: impl IntoIterator<Item = impl Into<OsString>>,
        log_path: impl Into<PathBuf>,
    ) -> io::Result<ManagedProcess> {
        Self::launch(name, program, args, log_path, None, false)
    }

    /// Like [`spawn`](Self::spawn), but runs the program as the user and group ids `user`
    /// (`setgid`, `setuid`, no supplementary groups) when given: for servers that refuse
    /// to run as root. The death signal is set after the switch, so it still holds.
    ///
    /// # Errors
    ///
    /// Like [`spawn`](Self::spawn).
    pub fn spawn_as(
        name: impl Into<String>,
        program: impl Into<PathBuf>,
        args: impl IntoIterator<Item = impl Into<OsString>>,
        log_path: impl Into<PathBuf>,
        user: Option<(u32, u32)>,
    ) -> io::Result<ManagedProcess> {
        Self::launch(name, program, args, log_path, user, false)
    }

    /// Like [`spawn`](Self::spawn), but always as a child process on the host, also in
    /// container mode: for a host binary that only shares its file name with a server some
    /// image holds (e.g. an older `redis-server` than the image's).
    ///
    /// # Errors
    ///
    /// Like [`spawn`](Self::spawn).
    pub fn spawn_on_host(
        name: impl Into<String>,
        program: impl Into<PathBuf>,
        args: impl IntoIterator<Item = impl Into<OsString>>,
        log_path: impl Into<PathBuf>,
    ) -> io::Result<ManagedProcess> {
        Self::launch(name, program, args, log_path, None, true)
    }

    /// What the three `spawn` forms share: the command line, then the first start.
    fn launch(
        name: impl Into<String>,
        program: impl Into<PathBuf>,
        args: impl IntoIterator<Item = impl Into<OsString>>,
        log_path: impl Into<PathBuf>,
        user: Option<(u32, u32)>,
        on_host: bool,
    ) -> io::Result<ManagedProcess> {
        let process = ManagedProcess {
            name: name.into(),
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            log_path: log_path.into(),
            user,
            on_host,
            state: Mutex::new(State {
                run: Run::Stopped,
                log_start: 0,
            }),
        };
        process.respawn()?;
        Ok(process)
    }

    /// Kills the process if it is running, then spawns the same command line
    /// again (in container mode: removes the container and starts a new one).
    ///
    /// # Errors
    ///
    /// Like [`spawn`](Self::spawn); in container mode also when a local image is missing
    /// (the message names `scripts/local-images.sh`) or the engine refuses the container.
    pub fn respawn(&self) -> io::Result<()> {
        let mut state = self.state();
        stop_locked(&mut state);
        if let Some(spec) = self.container_spec() {
            state.run = Run::Container(Box::new(Container::start(&spec)?));
            state.log_start = 0;
            return Ok(());
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)?;
        let log_start = log.metadata()?.len();
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some((uid, gid)) = self.user {
            // std switches ids (and drops supplementary groups) before the pre-exec hook
            // that sets the death signal, which a change of ids would clear.
            command.uid(uid).gid(gid);
        }
        let child = child::spawn_child(command)?;
        state.run = Run::Child(child);
        state.log_start = log_start;
        Ok(())
    }

    /// In container mode, for a program some image holds: what its container runs.
    fn container_spec(&self) -> Option<container::Spec> {
        if self.on_host || launch_mode() != LaunchMode::Containers {
            return None;
        }
        let (image, program) = images::image_for_program(&self.program)?;
        Some(container::Spec {
            image,
            program,
            args: self.args.clone(),
            log_path: self.log_path.clone(),
            user: self.user.unwrap_or_else(container::current_user),
            mounts: container::mounts_for(&self.args, &self.log_path, &[]),
        })
    }

    /// True when the current (or last) run is a container.
    pub fn in_container(&self) -> bool {
        matches!(self.state().run, Run::Container(_))
    }

    /// The name given at spawn time.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The log file receiving the process's stdout and stderr.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The process id while the process is running (`None` once it exited or
    /// was killed); in a container, the host's pid of the container's first process.
    pub fn pid(&self) -> Option<u32> {
        let mut state = self.state();
        match &mut state.run {
            Run::Stopped => None,
            Run::Child(child) => {
                if child::is_running(child) {
                    Some(child.id())
                } else {
                    state.run = Run::Stopped;
                    None
                }
            }
            Run::Container(container) => container.pid(),
        }
    }

    /// True while the process has not exited (a paused process is running).
    pub fn is_running(&self) -> bool {
        self.pid().is_some()
    }

    /// Sends `SIGKILL` to the process group (in a container: to all its processes) and
    /// waits until the process is reaped. Works on paused processes; a no-op when not
    /// running.
    pub fn kill(&self) {
        let mut state = self.state();
        match std::mem::replace(&mut state.run, Run::Stopped) {
            Run::Stopped => {}
            Run::Child(child) => child::kill(child),
            Run::Container(container) => {
                container.kill();
                // Kept until the next start or drop: its log stays readable.
                state.run = Run::Container(container);
            }
        }
    }

    /// Sends `SIGSTOP` to the process group (in a container: freezes it), and returns once
    /// every thread of the process has stopped (at most 5 s): the server then answers
    /// nothing, its sockets stay open and connections hang. A no-op when not running.
    pub fn pause(&self) {
        let mut state = self.state();
        match &mut state.run {
            Run::Stopped => {}
            Run::Child(child) => {
                if child::is_running(child) {
                    child::signal_group(child, libc::SIGSTOP);
                    // Paused means nothing is answered any more, not that a stop is on its
                    // way.
                    child::wait_stopped(child.id());
                }
            }
            Run::Container(container) => container.pause(),
        }
    }

    /// Sends `SIGCONT` to the process group (in a container: thaws it). A no-op when not
    /// running.
    pub fn resume(&self) {
        let mut state = self.state();
        match &mut state.run {
            Run::Stopped => {}
            Run::Child(child) => {
                if child::is_running(child) {
                    child::signal_group(child, libc::SIGCONT);
                }
            }
            Run::Container(container) => container.resume(),
        }
    }

    /// The last `max_lines` lines the current run wrote to the log.
    pub fn log_tail(&self, max_lines: usize) -> String {
        let (start, container_log) = {
            let state = self.state();
            match &state.run {
                Run::Container(container) => (0, Some(container.logs())),
                _ => (state.log_start, None),
            }
        };
        let text = match container_log {
            Some(text) => text,
            None => {
                let mut text = Vec::new();
                let read = File::open(&self.log_path).and_then(|mut file| {
                    file.seek(SeekFrom::Start(start))?;
                    file.read_to_end(&mut text)
                });
                if let Err(e) = read {
                    return format!("<cannot read {}: {e}>", self.log_path.display());
                }
                String::from_utf8_lossy(&text).into_owned()
            }
        };
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(max_lines)..].join("\n")
    }

    /// `Some(StartError::Exited)` when the process has exited (it is reaped; a container
    /// is removed once its log is read).
    pub fn check_exited(&self) -> Option<StartError> {
        let status = {
            let mut state = self.state();
            match &mut state.run {
                Run::Stopped => Some("already killed or reaped".to_owned()),
                Run::Child(child) => match child.try_wait() {
                    Ok(Some(status)) => {
                        state.run = Run::Stopped;
                        Some(status.to_string())
                    }
                    Ok(None) => None,
                    Err(e) => Some(format!("wait failed: {e}")),
                },
                Run::Container(container) => container
                    .exit_status()
                    .map(|status| format!("container {}: {status}", container.name())),
            }
        }?;
        let log = self.log_tail(LOG_TAIL_LINES);
        let mut state = self.state();
        if let Run::Container(container) = std::mem::replace(&mut state.run, Run::Stopped) {
            container.remove();
        }
        Some(StartError::Exited {
            name: self.name.clone(),
            status,
            log,
        })
    }

    /// A [`StartError::TimedOut`] for this process, with its log tail.
    pub fn timed_out(&self, after: Duration) -> StartError {
        StartError::TimedOut {
            name: self.name.clone(),
            after,
            log: self.log_tail(LOG_TAIL_LINES),
        }
    }

    /// Calls `probe` every `interval` until it returns true (ready), the
    /// process exits ([`StartError::Exited`]) or `timeout` passes
    /// ([`StartError::TimedOut`]; the process is left running).
    ///
    /// # Errors
    ///
    /// [`StartError`] as above; its `Display` includes the log tail, ready
    /// for a panic message.
    pub async fn wait_ready<F, Fut>(
        &self,
        timeout: Duration,
        interval: Duration,
        mut probe: F,
    ) -> Result<(), StartError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let started = Instant::now();
        loop {
            if probe().await {
                // Another server may answer on a port this one failed to bind.
                return match self.check_exited() {
                    Some(error) => Err(error),
                    None => Ok(()),
                };
            }
            if let Some(error) = self.check_exited() {
                return Err(error);
            }
            if started.elapsed() >= timeout {
                return Err(self.timed_out(timeout));
            }
            tokio::time::sleep(interval).await;
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the state consistent.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

pub(crate) mod start;

impl fmt::Debug for ManagedProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManagedProcess")
            .field("name", &self.name)
            .field("pid", &self.pid())
            .field("log_path", &self.log_path)
            .finish()
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        stop_locked(&mut self.state());
    }
}

/// Kills what runs and removes a container: nothing is left of the run.
fn stop_locked(state: &mut State) {
    match std::mem::replace(&mut state.run, Run::Stopped) {
        Run::Stopped => {}
        Run::Child(child) => child::kill(child),
        Run::Container(container) => container.remove(),
    }
}
