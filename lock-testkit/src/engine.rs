//! The container engine behind the container mode: which mode runs, the Docker client,
//! the runtime that drives it, and the reaper that removes a dead test binary's
//! containers.

use std::future::Future;
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, OnceLock};
use std::time::Duration;

use testcontainers::bollard::Docker;

/// Every container of this test kit is named `PREFIX-<test binary pid>-<run id>-<n>`.
pub(crate) const NAME_PREFIX: &str = "distlock-testkit";
/// Bound on reaching the engine at first use.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The engine connection, shared by every container of this test binary.
pub(crate) struct Engine {
    /// Drives every engine call: the test kit's handles are synchronous (and dropped from
    /// any runtime, or none), so their container work runs here and they wait for it.
    runtime: tokio::runtime::Runtime,
    /// The engine's API (testcontainers' re-export of bollard), for what testcontainers
    /// does not offer: ping, image and container inspection, logs on demand, `SIGKILL`.
    pub(crate) docker: Docker,
    /// `NAME_PREFIX-<pid>-<run id>-`: the start of every container name of this binary.
    pub(crate) names: String,
    /// The reaper and the write end of its pipe: never closed before this process ends.
    _reaper: (Child, ChildStdin),
}

/// The engine, connected and with its reaper running, on first use.
///
/// # Panics
///
/// If no engine answers (the message says how to start one), or the reaper cannot start.
pub(crate) fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("lock-testkit-engine")
            .enable_all()
            .build()
            .expect("lock-testkit: cannot start the engine runtime");
        let docker = Docker::connect_with_defaults().unwrap_or_else(|e| no_engine(&e));
        let ping = {
            // Not `block_on`: the caller may be inside a runtime already.
            let docker = docker.clone();
            let (reply, result) = mpsc::channel();
            runtime.spawn(async move {
                let _ = reply.send(tokio::time::timeout(CONNECT_TIMEOUT, docker.ping()).await);
            });
            result
                .recv()
                .expect("lock-testkit: the engine ping panicked")
        };
        match ping {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => no_engine(&e),
            Err(_) => no_engine(&format!("no answer within {CONNECT_TIMEOUT:?}")),
        }
        let names = format!("{NAME_PREFIX}-{}-{}-", std::process::id(), run_id());
        let reaper = start_reaper(&names);
        Engine {
            runtime,
            docker,
            names,
            _reaper: reaper,
        }
    })
}

fn no_engine(error: &dyn std::fmt::Display) -> ! {
    use crate::mode::MODE_ENV;
    panic!(
        "lock-testkit: {MODE_ENV}=containers needs a running Docker engine (DOCKER_HOST, \
         else /var/run/docker.sock): {error}. Start one (scripts/test.sh starts its own \
         dockerd), or run the tests as processes ({MODE_ENV}=processes)"
    )
}

/// Runs `work` on the engine runtime and waits for its result, from any thread (inside a
/// runtime or not).
pub(crate) fn run<F>(work: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (reply, result) = mpsc::channel();
    engine().runtime.spawn(async move {
        let _ = reply.send(work.await);
    });
    result
        .recv()
        .expect("lock-testkit: an engine call panicked (see its message above)")
}

/// A new container name of this binary: `NAME_PREFIX-<pid>-<run id>-<n>`.
pub(crate) fn container_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}{}",
        engine().names,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Distinguishes two binaries that got the same pid (one after the other).
fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{:x}", nanos & 0xffff_ffff_ffff)
}

/// Starts the reaper: a shell in its own process group (out of reach of a Ctrl-C to the
/// test binary, and without a death signal: it must outlive it) that reads a pipe whose
/// only write end this process holds. When this process ends in any way (normal exit
/// with servers in statics, `std::process::exit`, abort, a signal), the kernel closes
/// the write end, the read returns end-of-file, and the reaper removes every container
/// whose name starts with `names`. The pipe's ends are close-on-exec, so no server
/// inherits the write end.
///
/// # Panics
///
/// If the `docker` command (which the reaper calls) is missing or the shell cannot start.
fn start_reaper(names: &str) -> (Child, ChildStdin) {
    let docker = crate::binary::find_host_binary("docker", "docker.io");
    let script = r#"cat >/dev/null
ids=$("$0" ps -aq --filter "name=$1")
[ -z "$ids" ] || "$0" rm -f $ids >/dev/null 2>&1"#;
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(docker)
        .arg(names)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("lock-testkit: cannot start the container reaper: {e}"));
    let stdin = child.stdin.take().expect("piped stdin");
    (child, stdin)
}
