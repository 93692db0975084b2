//! The shared "managed child process" used by every server kind.

use std::error::Error;
use std::ffi::OsString;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How many log lines startup-failure messages include.
const LOG_TAIL_LINES: usize = 40;

/// A request to the spawner thread: the command to spawn and where to send
/// the result.
struct SpawnRequest {
    command: Command,
    reply: mpsc::Sender<io::Result<Child>>,
}

/// The channel to the spawner thread, started on first use.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits,
/// not the process. Test threads and tokio worker threads come and go, so all
/// children are forked by this one thread, which blocks on the channel for
/// the rest of the process's life (the sender lives in a static and is never
/// dropped).
fn spawner() -> &'static mpsc::Sender<SpawnRequest> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("lock-testkit-spawner".into())
            .spawn(move || {
                for mut request in rx {
                    let result = request.command.spawn();
                    // The requester may have gone away (panicked); then the
                    // child is dropped here and killed by nobody but
                    // PDEATHSIG at exit. Kill it right away instead.
                    if let Err(mpsc::SendError(Ok(mut child))) = request.reply.send(result) {
                        let _ = child.kill();
                        let _ = child.wait();
                    }
                }
            })
            .expect("lock-testkit: cannot start the spawner thread");
        tx
    })
}

/// Spawns `command` on the spawner thread, in its own process group, with
/// `PR_SET_PDEATHSIG = SIGKILL`.
fn spawn_child(mut command: Command) -> io::Result<Child> {
    let parent = std::process::id() as libc::pid_t;
    command.process_group(0);
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe system calls (prctl, getppid) without allocating.
    unsafe {
        command.pre_exec(move || {
            let signal = libc::SIGKILL as libc::c_ulong;
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal, 0 as libc::c_ulong, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl: then the
            // death signal will never come, so do not start at all.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let (reply, result) = mpsc::channel();
    spawner()
        .send(SpawnRequest { command, reply })
        .map_err(|_| io::Error::other("lock-testkit spawner thread is gone"))?;
    result
        .recv()
        .map_err(|_| io::Error::other("lock-testkit spawner thread is gone"))?
}

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

struct State {
    /// The running (or exited but not yet reaped) child; `None` once reaped.
    child: Option<Child>,
    /// Log file length when the current child was spawned, so failure
    /// messages show only this run's output.
    log_start: u64,
}

/// A child process owned by the test kit: spawned from the dedicated spawner
/// thread with `PR_SET_PDEATHSIG = SIGKILL`, in its own process group, with
/// stdin closed and stdout/stderr appended to a log file.
///
/// Signals go to the whole process group (the server and anything it forked).
/// Dropping a `ManagedProcess` kills and reaps it. All methods take `&self`;
/// the child is kept behind a mutex.
///
/// This is the building block for server kinds: [`crate::RedisServer`] and
/// [`crate::EtcdServer`] are a command line plus a readiness probe on top of
/// it.
pub struct ManagedProcess {
    name: String,
    program: PathBuf,
    args: Vec<OsString>,
    log_path: PathBuf,
    /// The user and group ids to run as (`None`: as this process).
    user: Option<(u32, u32)>,
    state: Mutex<State>,
}

impl ManagedProcess {
    /// Spawns `program args...`, appending its stdout and stderr to
    /// `log_path` (created if missing). `name` is used in messages.
    ///
    /// Returns as soon as the process is forked; use
    /// [`wait_ready`](Self::wait_ready) to wait until it serves.
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
        let process = ManagedProcess {
            name: name.into(),
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            log_path: log_path.into(),
            user: None,
            state: Mutex::new(State {
                child: None,
                log_start: 0,
            }),
        };
        process.respawn()?;
        Ok(process)
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
        let process = ManagedProcess {
            name: name.into(),
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            log_path: log_path.into(),
            user,
            state: Mutex::new(State {
                child: None,
                log_start: 0,
            }),
        };
        process.respawn()?;
        Ok(process)
    }

    /// Kills the process if it is running, then spawns the same command line
    /// again.
    ///
    /// # Errors
    ///
    /// Like [`spawn`](Self::spawn).
    pub fn respawn(&self) -> io::Result<()> {
        let mut state = self.state();
        kill_locked(&mut state);
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
        let child = spawn_child(command)?;
        state.child = Some(child);
        state.log_start = log_start;
        Ok(())
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
    /// was killed).
    pub fn pid(&self) -> Option<u32> {
        let mut state = self.state();
        reap_if_exited(&mut state);
        state.child.as_ref().map(Child::id)
    }

    /// True while the process has not exited (a paused process is running).
    pub fn is_running(&self) -> bool {
        self.pid().is_some()
    }

    /// Sends `SIGKILL` to the process group and waits until the process is
    /// reaped. Works on paused processes; a no-op when not running.
    pub fn kill(&self) {
        kill_locked(&mut self.state());
    }

    /// Sends `SIGSTOP` to the process group (the server freezes; its sockets
    /// stay open and connections hang). A no-op when not running.
    pub fn pause(&self) {
        self.signal_group(libc::SIGSTOP);
    }

    /// Sends `SIGCONT` to the process group. A no-op when not running.
    pub fn resume(&self) {
        self.signal_group(libc::SIGCONT);
    }

    /// The last `max_lines` lines the current run wrote to the log.
    pub fn log_tail(&self, max_lines: usize) -> String {
        let start = self.state().log_start;
        let mut text = Vec::new();
        let read = File::open(&self.log_path).and_then(|mut file| {
            file.seek(SeekFrom::Start(start))?;
            file.read_to_end(&mut text)
        });
        if let Err(e) = read {
            return format!("<cannot read {}: {e}>", self.log_path.display());
        }
        let text = String::from_utf8_lossy(&text);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(max_lines)..].join("\n")
    }

    /// `Some(StartError::Exited)` when the process has exited (it is reaped).
    pub fn check_exited(&self) -> Option<StartError> {
        let status = {
            let mut state = self.state();
            match state.child.as_mut().map(Child::try_wait) {
                None => Some("already killed or reaped".to_owned()),
                Some(Ok(Some(status))) => {
                    state.child = None;
                    Some(status.to_string())
                }
                Some(Ok(None)) => None,
                Some(Err(e)) => Some(format!("wait failed: {e}")),
            }
        }?;
        Some(StartError::Exited {
            name: self.name.clone(),
            status,
            log: self.log_tail(LOG_TAIL_LINES),
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
                return Ok(());
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

    fn signal_group(&self, signal: libc::c_int) {
        let mut state = self.state();
        reap_if_exited(&mut state);
        if let Some(child) = &state.child {
            // The child is not reaped, so its pid (= its process group id)
            // cannot have been reused.
            // SAFETY: plain kill(2) on our own child's process group.
            unsafe {
                libc::kill(-(child.id() as libc::pid_t), signal);
            }
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the state consistent.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

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
        self.kill();
    }
}

fn reap_if_exited(state: &mut State) {
    if let Some(child) = state.child.as_mut() {
        if !matches!(child.try_wait(), Ok(None)) {
            state.child = None;
        }
    }
}

fn kill_locked(state: &mut State) {
    if let Some(mut child) = state.child.take() {
        if matches!(child.try_wait(), Ok(None)) {
            // SAFETY: plain kill(2) on our own, not yet reaped, child's group.
            unsafe {
                libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
            }
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}
