//! Child processes of the test binary: forked by one long-lived thread with a death
//! signal, in their own process group.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

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
pub(crate) fn spawn_child(mut command: Command) -> io::Result<Child> {
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

/// Reaps `child` if it exited; true while it runs.
pub(crate) fn is_running(child: &mut Child) -> bool {
    matches!(child.try_wait(), Ok(None))
}

/// `SIGKILL` to the child's process group, then reaps it.
pub(crate) fn kill(mut child: Child) {
    if is_running(&mut child) {
        // SAFETY: plain kill(2) on our own, not yet reaped, child's group.
        unsafe {
            libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
        }
        let _ = child.kill();
    }
    let _ = child.wait();
}

/// How long [`wait_stopped`] waits for a stop to take hold.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Waits until every thread of process `pid` is stopped (or the process is gone): `kill`
/// returns before a `SIGSTOP` takes hold, and on a loaded machine a thread of a
/// multi-threaded server can still answer a request meanwhile. Bounded by
/// [`STOP_TIMEOUT`]; returns whether the process stopped.
pub(crate) fn wait_stopped(pid: u32) -> bool {
    let started = Instant::now();
    loop {
        match all_threads_stopped(pid) {
            Some(false) if started.elapsed() < STOP_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Some(stopped) => return stopped,
            // No /proc entry: the process is gone (or /proc is not there to tell).
            None => return true,
        }
    }
}

/// Whether every thread of `pid` is stopped (state `T` or `t`, dead ones count too);
/// `None` when the process cannot be read.
fn all_threads_stopped(pid: u32) -> Option<bool> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    for task in tasks.flatten() {
        // A thread that cannot be read exited meanwhile.
        let Some(stat) = ProcStat::read(&task.path().join("stat")) else {
            continue;
        };
        if !matches!(stat.state, 'T' | 't' | 'Z' | 'X' | 'x') {
            return Some(false);
        }
    }
    Some(true)
}

/// The fields of a `/proc/…/stat` file the test kit reads.
pub(crate) struct ProcStat {
    /// The state letter (`R`, `S`, `T`, `Z`, …).
    pub(crate) state: char,
    /// The parent's pid.
    pub(crate) ppid: u32,
}

impl ProcStat {
    /// Reads and parses `path`; `None` when it cannot be read (the process is gone) or
    /// parsed.
    pub(crate) fn read(path: &std::path::Path) -> Option<ProcStat> {
        let stat = std::fs::read_to_string(path).ok()?;
        // `pid (comm) state ppid …`: comm may hold spaces and parentheses.
        let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
        let state = fields.next()?.chars().next()?;
        let ppid = fields.next()?.parse().ok()?;
        Some(ProcStat { state, ppid })
    }
}

/// `signal` to the (not yet reaped) child's process group.
pub(crate) fn signal_group(child: &Child, signal: libc::c_int) {
    // The child is not reaped, so its pid (= its process group id) cannot have been
    // reused.
    // SAFETY: plain kill(2) on our own child's process group.
    unsafe {
        libc::kill(-(child.id() as libc::pid_t), signal);
    }
}
