//! The command run under the lock: its own process group, its stdin and output, stopping
//! it, the signals distlock forwards to it, and reaping orphans when distlock is PID 1.

use std::collections::{BTreeSet, VecDeque};
use std::ffi::OsString;
use std::future::Future;
use std::io::{self, BufRead, BufReader, IsTerminal, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::oneshot;

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

/// Where the command's stdin comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// `/dev/null`: a read ends at once (end of file).
    Null,
    /// distlock's own stdin, unless it is a terminal, then `/dev/null`: in its own process
    /// group the command is not the terminal's foreground job, and a read from the
    /// terminal would stop it (SIGTTIN) while it holds the lock.
    Inherited,
}

/// How the command is started: its stdin, its output, its environment.
pub struct Spawn<'a> {
    /// Variables added to distlock's environment (after [`SCRUBBED`] are removed).
    pub env: &'a [(&'a str, String)],
    /// Where its stdin comes from.
    pub stdin: Input,
    /// `None`: the command writes to distlock's stdout and stderr. `Some(prefix)`: each
    /// line it writes is relayed with `prefix` before it, stdout to stdout and stderr to
    /// stderr, and the last [`TAIL_LEN`] bytes of both are kept ([`Job::output_tail`]).
    pub prefix: Option<String>,
}

/// distlock's own settings that never reach the command's environment: they hold URLs,
/// which may carry the lock server's (or the Pushgateway's) password.
pub const SCRUBBED: [&str; 2] = ["DISTLOCK_URL", "DISTLOCK_METRICS_PUSH"];

/// How much of a command's output (its last bytes, stdout and stderr together) is kept
/// for the run record.
pub const TAIL_LEN: usize = 4096;

/// A relayed line longer than this is cut into several lines, each with the prefix, so
/// that a command writing without newlines cannot grow distlock's memory.
const MAX_LINE: usize = 16 * 1024;

/// The pids of the commands distlock started and has not reaped yet: the orphan reaper
/// ([`reap_orphans_at_pid_1`]) leaves them to their [`Job`]. Locked across the fork and the
/// insertion, so the reaper never sees a command of ours as a stranger.
static OURS: std::sync::Mutex<BTreeSet<libc::pid_t>> = std::sync::Mutex::new(BTreeSet::new());

fn ours() -> std::sync::MutexGuard<'static, BTreeSet<libc::pid_t>> {
    OURS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The command, running in its own process group so that stopping it reaches everything
/// it started.
pub struct Job {
    child: Child,
    /// The group's id: the leader's pid, which is not reused while the leader is unreaped.
    pgid: libc::pid_t,
    /// The relayed output, when the command's lines are prefixed.
    output: Option<Output>,
    /// The leader has been reaped (its pid is free for reuse).
    reaped: bool,
}

impl Job {
    /// Starts `command` (program and arguments) as `how` says, in a process group of its
    /// own, with SIGKILL as its parent-death signal: if distlock dies (even of SIGKILL),
    /// the command dies too, instead of running on while the lock expires and the next
    /// run starts elsewhere. (The kernel sends it when the thread that started the
    /// command ends: distlock starts commands from the runtime's threads, which live as
    /// long as distlock.) What the command started in the background is not reached by
    /// this: it is stopped with the group ([`end_group`](Self::end_group)).
    ///
    /// # Errors
    /// The program was not found (127) or could not be executed (126).
    pub fn spawn(command: &[OsString], how: &Spawn<'_>) -> Result<Job, CliError> {
        let Some((program, args)) = command.split_first() else {
            return Err(CliError::new(NOT_FOUND, "no command given"));
        };
        let shown = program.to_string_lossy();
        let mut cmd = Command::new(program);
        cmd.args(args).process_group(0).kill_on_drop(false);
        for name in SCRUBBED {
            cmd.env_remove(name);
        }
        for (name, value) in how.env {
            cmd.env(name, value);
        }
        let null_stdin = match how.stdin {
            Input::Null => true,
            Input::Inherited => std::io::stdin().is_terminal(),
        };
        if null_stdin {
            cmd.stdin(Stdio::null());
        }
        let mut output = None;
        if let Some(prefix) = &how.prefix {
            let tail = Arc::new(std::sync::Mutex::new(Tail::default()));
            let prefix: Arc<str> = Arc::from(prefix.as_str());
            let mut ended = Vec::with_capacity(2);
            for to_stderr in [false, true] {
                let (reader, writer) = std::io::pipe().map_err(|e| {
                    CliError::new(INTERNAL, format!("cannot make a pipe for the command: {e}"))
                })?;
                if to_stderr {
                    cmd.stderr(writer);
                } else {
                    cmd.stdout(writer);
                }
                ended.push(relay(reader, prefix.clone(), to_stderr, tail.clone())?);
            }
            output = Some(Output { tail, ended });
        }
        die_with_distlock(&mut cmd);
        let mut ours = ours();
        let spawned = cmd.spawn();
        // Our copies of the pipes' write ends close here: the relays see the end of the
        // output once the command and whatever inherited them are gone.
        drop(cmd);
        let child = spawned.map_err(|e| match e.kind() {
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
        ours.insert(pgid);
        drop(ours);
        Ok(Job {
            child,
            pgid,
            output,
            reaped: false,
        })
    }

    /// The id of the command's process group.
    pub fn pgid(&self) -> libc::pid_t {
        self.pgid
    }

    /// Waits for the command (the group's leader) to exit and reaps it.
    async fn reap(&mut self) -> Result<ExitStatus, CliError> {
        let status =
            self.child.wait().await.map_err(|e| {
                CliError::new(INTERNAL, format!("waiting for the command failed: {e}"))
            })?;
        // Once only: waiting again returns the kept status, and by then the pid may be
        // another command's.
        if !self.reaped {
            ours().remove(&self.pgid);
            self.reaped = true;
        }
        Ok(status)
    }

    /// Waits until the command exits.
    ///
    /// # Errors
    /// Waiting failed (distlock's own bug or resource exhaustion).
    pub async fn wait(&mut self) -> Result<ExitStatus, CliError> {
        self.reap().await
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
            status = self.reap() => Some(status),
            _ = tokio::time::sleep(grace) => None,
            _ = hurry => None,
        };
        let status = match exited {
            Some(status) => status?,
            None => {
                self.signal(libc::SIGKILL);
                self.reap().await?
            }
        };
        // The leader is reaped, so its pid could in principle be reused; pids cycle through
        // pid_max before reuse, so within these microseconds this reaches only the job's
        // own leftovers.
        send(self.pgid, libc::SIGKILL);
        Ok(status)
    }

    /// Whether any process of the command's group is left (zombies count until reaped).
    pub fn group_alive(&self) -> bool {
        group_alive(self.pgid)
    }

    /// Once the command (the leader) has exited: stops what is left of its process group
    /// (`sleep 25 &`), SIGTERM then SIGKILL after `grace`, or at once when `hurry`
    /// completes first. Returns whether anything was left. The group's id stays reserved
    /// while any member lives, so the signals reach only the command's leftovers.
    pub async fn end_group<F: Future>(&mut self, grace: Duration, hurry: F) -> bool {
        let pgid = self.pgid;
        if !group_alive(pgid) {
            return false;
        }
        self.signal(libc::SIGTERM);
        let gone = async {
            while group_alive(pgid) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::select! {
            () = gone => {}
            _ = tokio::time::sleep(grace) => {}
            _ = hurry => {}
        }
        send(pgid, libc::SIGKILL);
        true
    }

    /// The last [`TAIL_LEN`] bytes the command wrote (stdout and stderr, in the order the
    /// relays read them; the lines without their prefix), once its output ended or
    /// `limit` passed (a process that left the group may keep the pipe open: its lines are
    /// still relayed, after this). `None` when the output is not relayed.
    pub async fn output_tail(&mut self, limit: Duration) -> Option<String> {
        let output = self.output.as_mut()?;
        let _ = tokio::time::timeout(limit, output.ended()).await;
        Some(output.tail())
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // Not reaped (dropped before it exited): tokio's orphan queue or, at PID 1, the
        // orphan reaper takes it. (Once reaped, its pid may be another command's.)
        if !self.reaped {
            ours().remove(&self.pgid);
        }
    }
}

/// Sets the parent-death signal in the child, between fork and exec.
fn die_with_distlock(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getpid(2) is async-signal-safe and has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the closure runs in the forked child before exec and calls only
        // prctl(2), getppid(2) and kill(2), which are async-signal-safe, and allocates
        // nothing.
        unsafe {
            cmd.pre_exec(move || {
                let sig = libc::c_ulong::try_from(libc::SIGKILL).unwrap_or(9);
                let unused: libc::c_ulong = 0;
                if libc::prctl(libc::PR_SET_PDEATHSIG, sig, unused, unused, unused) == -1 {
                    return Err(io::Error::last_os_error());
                }
                // distlock died between the fork and the prctl: the signal will not come.
                if libc::getppid() != parent {
                    libc::kill(libc::getpid(), libc::SIGKILL);
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cmd;
}

/// Whether any process of group `pgid` is left (zombies count until reaped).
fn group_alive(pgid: libc::pid_t) -> bool {
    // SAFETY: kill(2) with signal 0 only checks; no memory-safety preconditions.
    unsafe { libc::kill(-pgid, 0) == 0 }
}

/// When distlock is PID 1 (a container's init), reaps the processes orphaned inside it
/// (a command's background children, reparented to PID 1), as init must, so they do not
/// stay zombies. The commands distlock started itself are left to their own wait: each
/// SIGCHLD, this peeks at a zombie child (`waitid` with `WNOWAIT`, which reaps nothing)
/// and reaps it only if it is not one of ours ([`OURS`], locked while it looks); a zombie
/// of ours in front is reaped by its [`Job`] within moments, and this looks again.
/// Does nothing when distlock is not PID 1.
///
/// # Errors
/// SIGCHLD cannot be caught.
pub fn reap_orphans_at_pid_1() -> Result<(), CliError> {
    // SAFETY: getpid(2) has no preconditions.
    if unsafe { libc::getpid() } != 1 {
        return Ok(());
    }
    let mut children = signal(SignalKind::child())
        .map_err(|e| CliError::new(INTERNAL, format!("cannot install the SIGCHLD handler: {e}")))?;
    tokio::spawn(async move {
        loop {
            let again = if reap_strangers() {
                Duration::from_millis(20)
            } else {
                Duration::from_secs(5)
            };
            tokio::select! {
                _ = children.recv() => {}
                () = tokio::time::sleep(again) => {}
            }
        }
    });
    Ok(())
}

/// Reaps every zombie child that is not a command of ours; true when one of ours was in
/// front (and may hide others).
fn reap_strangers() -> bool {
    let ours = ours();
    loop {
        // SAFETY: siginfo_t is plain data; zeroed is a valid value (si_pid 0: none).
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid(2) writes only into `info`, which outlives the call.
        let rc = unsafe {
            libc::waitid(
                libc::P_ALL,
                0,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        // SAFETY: waitid filled `info` (or left it zeroed when no child has exited).
        let pid = unsafe { info.si_pid() };
        if rc != 0 || pid == 0 {
            return false;
        }
        if ours.contains(&pid) {
            return true;
        }
        let mut status = 0;
        // SAFETY: waitpid(2) writes only into `status`.
        unsafe {
            libc::waitpid(pid, &mut status, libc::WNOHANG);
        }
    }
}

/// The relays of one command's output and what they keep.
struct Output {
    tail: Arc<std::sync::Mutex<Tail>>,
    /// One per stream, completed (its sender dropped) when the stream ended.
    ended: Vec<oneshot::Receiver<()>>,
}

impl Output {
    /// Completes when every stream has ended (cancel-safe: an ended stream is forgotten
    /// in the same poll that sees its end).
    async fn ended(&mut self) {
        while let Some(rx) = self.ended.last_mut() {
            let _ = rx.await;
            self.ended.pop();
        }
    }

    fn tail(&self) -> String {
        self.tail.lock().unwrap_or_else(|e| e.into_inner()).text()
    }
}

/// The last [`TAIL_LEN`] bytes of output.
#[derive(Default)]
struct Tail(VecDeque<u8>);

impl Tail {
    fn push(&mut self, line: &[u8]) {
        let line = &line[line.len().saturating_sub(TAIL_LEN)..];
        let excess = (self.0.len() + line.len()).saturating_sub(TAIL_LEN);
        self.0.drain(..excess);
        self.0.extend(line);
    }

    /// The kept bytes as text, from the first whole character.
    fn text(&self) -> String {
        let bytes: Vec<u8> = self.0.iter().copied().collect();
        // A character cut at the front: its continuation bytes are 0b10xx_xxxx.
        let start = bytes
            .iter()
            .take(3)
            .take_while(|&&b| b & 0xC0 == 0x80)
            .count();
        String::from_utf8_lossy(&bytes[start..]).into_owned()
    }
}

/// Starts a thread relaying `reader` line by line to distlock's stdout (or stderr), each
/// line after `prefix`, and keeping it in `tail`. A thread, not a task: writing to
/// distlock's own stdout blocks when its reader is slow, and each line is written whole
/// under the stream's lock, so lines of several commands and distlock's own never mix.
fn relay(
    reader: std::io::PipeReader,
    prefix: Arc<str>,
    to_stderr: bool,
    tail: Arc<std::sync::Mutex<Tail>>,
) -> Result<oneshot::Receiver<()>, CliError> {
    let (done, ended) = oneshot::channel();
    std::thread::Builder::new()
        .name("distlock-output".into())
        .spawn(move || {
            let mut reader = BufReader::with_capacity(8192, reader);
            let mut line = Vec::with_capacity(256);
            let mut out = Vec::with_capacity(256);
            loop {
                line.clear();
                let limit = u64::try_from(MAX_LINE).unwrap_or(u64::MAX);
                match (&mut reader).take(limit).read_until(b'\n', &mut line) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                }
                if !line.ends_with(b"\n") {
                    line.push(b'\n');
                }
                tail.lock().unwrap_or_else(|e| e.into_inner()).push(&line);
                out.clear();
                out.extend_from_slice(prefix.as_bytes());
                out.extend_from_slice(&line);
                // distlock's own stdout or stderr gone: the line is dropped, the command
                // goes on.
                let _ = if to_stderr {
                    std::io::stderr().lock().write_all(&out)
                } else {
                    let mut stdout = std::io::stdout().lock();
                    stdout.write_all(&out).and_then(|()| stdout.flush())
                };
            }
            drop(done);
        })
        .map_err(|e| CliError::new(INTERNAL, format!("cannot start an output relay: {e}")))?;
    Ok(ended)
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
