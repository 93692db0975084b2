//! One run of a server in a container: started through `testcontainers` on the host
//! network, with the test kit's directories bind-mounted at the same paths; frozen and
//! thawed through `testcontainers`; killed (`SIGKILL`: testcontainers stops with `SIGTERM`
//! first), inspected and read through its re-export of the engine's API (bollard).

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use testcontainers::bollard::container::LogOutput;
use testcontainers::bollard::query_parameters::{
    InspectContainerOptions, KillContainerOptionsBuilder, LogsOptionsBuilder,
};
use testcontainers::core::logs::LogFrame;
use testcontainers::core::Mount;
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

use crate::engine::{self, engine};
use crate::images::Image;

/// Bound on creating and starting a container (the first start of an official image
/// includes its pull).
const START_TIMEOUT: Duration = Duration::from_secs(300);
/// Bound on a killed container being reported stopped.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);

/// What a container runs: the image, the program's path inside it and its arguments,
/// as whom, and what to mount.
#[derive(Clone, Debug)]
pub(crate) struct Spec {
    pub(crate) image: Image,
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<OsString>,
    pub(crate) log_path: PathBuf,
    /// The user and group ids to run as.
    pub(crate) user: (u32, u32),
    /// Host paths mounted at the same path inside the container.
    pub(crate) mounts: Vec<PathBuf>,
}

/// A started container (running or exited, not yet removed).
pub(crate) struct Container {
    id: String,
    name: String,
    /// Taken by [`remove`](Self::remove); shared with the engine runtime's tasks for the
    /// length of one call ([`engine::run`] waits for it).
    inner: Option<Arc<ContainerAsync<GenericImage>>>,
}

impl Container {
    /// Creates and starts a container for `spec` (pulling an official image on first
    /// use), appending its output to `spec.log_path`.
    ///
    /// # Errors
    ///
    /// If a local image is missing (the message names `scripts/local-images.sh`), or the
    /// engine refuses the container.
    pub(crate) fn start(spec: &Spec) -> io::Result<Container> {
        let name = engine::container_name();
        let request = build(spec, &name)?;
        let image = spec.image;
        let docker = engine().docker.clone();
        let started = engine::run(async move {
            if image.local && docker.inspect_image(&image.reference()).await.is_err() {
                return Err(io::Error::other(format!(
                    "the local image {} is missing: build the local images with \
                     scripts/local-images.sh (or use the official ones: unset \
                     DISTLOCK_TESTKIT_IMAGES)",
                    image.reference()
                )));
            }
            tokio::time::timeout(START_TIMEOUT, request.start())
                .await
                .map_err(|_| io::Error::other(format!("no start within {START_TIMEOUT:?}")))?
                .map_err(|e| io::Error::other(format!("{}: {e}", image.reference())))
        })?;
        Ok(Container {
            id: started.id().to_owned(),
            name,
            inner: Some(Arc::new(started)),
        })
    }

    /// The container's name (`distlock-testkit-<pid>-<run>-<n>`).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// `(running, host pid of its first process, exit code)`, `None` when the engine does
    /// not know it.
    fn state(&self) -> Option<(bool, Option<u32>, Option<i64>)> {
        let docker = engine().docker.clone();
        let id = self.id.clone();
        let inspect = engine::run(async move {
            docker
                .inspect_container(&id, None::<InspectContainerOptions>)
                .await
        })
        .ok()?;
        let state = inspect.state?;
        let running = state.running.unwrap_or(false);
        let pid = state.pid.filter(|&pid| pid > 0).map(|pid| pid as u32);
        Some((running, pid.filter(|_| running), state.exit_code))
    }

    /// The host pid of the container's first process (the server) while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.state().and_then(|(_, pid, _)| pid)
    }

    /// `Some(status)` once the container stopped; `None` while it runs (paused counts).
    pub(crate) fn exit_status(&self) -> Option<String> {
        match self.state() {
            None => Some("container gone".to_owned()),
            Some((true, _, _)) => None,
            Some((false, _, code)) => Some(match code {
                Some(code) => format!("exit status: {code}"),
                None => "stopped".to_owned(),
            }),
        }
    }

    /// `SIGKILL` to every process of the container (also when paused), then waits until
    /// the engine reports it stopped.
    pub(crate) fn kill(&self) {
        let docker = engine().docker.clone();
        let id = self.id.clone();
        engine::run(async move {
            let options = KillContainerOptionsBuilder::new().signal("SIGKILL").build();
            let _ = docker.kill_container(&id, Some(options)).await;
        });
        let started = Instant::now();
        while self.exit_status().is_none() && started.elapsed() < KILL_TIMEOUT {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Freezes every process of the container (the cgroup freezer: sockets stay open,
    /// nothing is answered).
    pub(crate) fn pause(&self) {
        if let Some(inner) = &self.inner {
            let container = Arc::clone(inner);
            engine::run(async move {
                let _ = container.pause().await;
            });
        }
    }

    /// Thaws a frozen container.
    pub(crate) fn resume(&self) {
        if let Some(inner) = &self.inner {
            let container = Arc::clone(inner);
            engine::run(async move {
                let _ = container.unpause().await;
            });
        }
    }

    /// Everything the container wrote (stdout and stderr, in order).
    pub(crate) fn logs(&self) -> String {
        let docker = engine().docker.clone();
        let id = self.id.clone();
        let bytes = engine::run(async move {
            let options = LogsOptionsBuilder::new().stdout(true).stderr(true).build();
            let mut stream = docker.logs(&id, Some(options));
            let mut bytes = Vec::new();
            while let Some(Ok(frame)) = stream.next().await {
                match frame {
                    LogOutput::StdOut { message }
                    | LogOutput::StdErr { message }
                    | LogOutput::Console { message } => bytes.extend_from_slice(&message),
                    LogOutput::StdIn { .. } => {}
                }
            }
            bytes
        });
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Removes the container (killing it if it runs) and waits until it is gone.
    pub(crate) fn remove(mut self) {
        self.rm();
    }

    fn rm(&mut self) {
        // Every call that shared the handle has returned (`engine::run` waits), so this is
        // its only owner.
        if let Some(inner) = self.inner.take().and_then(Arc::into_inner) {
            engine::run(async move {
                let _ = inner.rm().await;
            });
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        self.rm();
    }
}

/// The container request for `spec`: the program as the entry point (behind `setpriv`
/// for a non-root user), the host network, the mounts, and the output appended to the log
/// file.
fn build(spec: &Spec, name: &str) -> io::Result<testcontainers::ContainerRequest<GenericImage>> {
    let mut command: Vec<String> = Vec::new();
    let (uid, gid) = spec.user;
    // (host path, path inside): the same path, but for the generated `/etc/passwd`.
    let mut mounts: Vec<(PathBuf, PathBuf)> =
        spec.mounts.iter().map(|m| (m.clone(), m.clone())).collect();
    if uid != 0 {
        if let Some(setpriv) = spec.image.setpriv {
            command.extend([
                setpriv.to_owned(),
                format!("--reuid={uid}"),
                format!("--regid={gid}"),
                "--clear-groups".to_owned(),
                "--".to_owned(),
            ]);
            // Servers look their user up (PostgreSQL refuses one without a name).
            mounts.push((passwd_file(spec, uid, gid)?, PathBuf::from("/etc/passwd")));
        }
    }
    command.push(text(spec.program.as_os_str())?);
    for arg in &spec.args {
        command.push(text(arg)?);
    }
    let image =
        GenericImage::new(spec.image.repository, spec.image.tag).with_entrypoint(&command[0]);
    let log = Arc::new(Mutex::new(
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log_path)?,
    ));
    let mut request = image
        .with_cmd(command[1..].to_vec())
        .with_network("host")
        .with_container_name(name)
        .with_startup_timeout(START_TIMEOUT)
        .with_log_consumer(move |frame: &LogFrame| {
            let bytes = match frame {
                LogFrame::StdOut(bytes) | LogFrame::StdErr(bytes) => bytes,
            };
            let mut file = log.lock().unwrap_or_else(|p| p.into_inner());
            let _ = file.write_all(bytes);
        });
    for (host, inside) in mounts {
        request = request.with_mount(Mount::bind_mount(
            text(host.as_os_str())?,
            text(inside.as_os_str())?,
        ));
    }
    Ok(request)
}

/// A `/etc/passwd` naming `uid` (and root), next to the log file, mounted over the image's.
fn passwd_file(spec: &Spec, uid: u32, gid: u32) -> io::Result<PathBuf> {
    let dir = spec.log_path.parent().unwrap_or(Path::new("/tmp"));
    let path = dir.join(".lock-testkit.passwd");
    std::fs::write(
        &path,
        format!("root:x:0:0:root:/root:/bin/sh\ntestkit:x:{uid}:{gid}:lock-testkit:/tmp:/bin/sh\n"),
    )?;
    Ok(path)
}

fn text(value: &std::ffi::OsStr) -> io::Result<String> {
    value.to_str().map(str::to_owned).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{value:?} is not UTF-8 (a container's command line must be)"),
        )
    })
}

/// The host paths a launch mounts: the log file's directory, and every absolute path on
/// the command line (`/path` or `--flag=/path`) that exists, or else whose parent exists
/// (a file or directory the server creates), minus those inside another one.
pub(crate) fn mounts_for(args: &[OsString], log_path: &Path, extra: &[PathBuf]) -> Vec<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(dir) = log_path.parent() {
        candidates.push(dir.to_path_buf());
    }
    candidates.extend(extra.iter().cloned());
    for arg in args {
        let Some(arg) = arg.to_str() else { continue };
        let value = match arg.split_once('=') {
            Some((_, value)) if value.starts_with('/') => value,
            _ => arg,
        };
        if !value.starts_with('/') {
            continue;
        }
        let path = Path::new(value);
        if path.exists() {
            candidates.push(path.to_path_buf());
        } else if let Some(parent) = path.parent().filter(|p| p.exists() && *p != Path::new("/")) {
            candidates.push(parent.to_path_buf());
        }
    }
    candidates.sort_by_key(|p| p.components().count());
    let mut mounts: Vec<PathBuf> = Vec::new();
    for candidate in candidates {
        if !mounts.iter().any(|m| candidate.starts_with(m)) {
            mounts.push(candidate);
        }
    }
    mounts
}

/// This process's effective user and group ids.
pub(crate) fn current_user() -> (u32, u32) {
    // SAFETY: geteuid and getegid have no preconditions.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_are_the_log_dir_and_the_paths_of_the_command_line() {
        let dir = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let log = dir.path().join("server.log");
        let created = other.path().join("not-yet");
        let args: Vec<OsString> = vec![
            "--dir".into(),
            dir.path().join("data").into(),
            format!("--cert={}", other.path().display()).into(),
            created.clone().into(),
            "--port".into(),
            "6379".into(),
            "relative/path".into(),
        ];
        let mounts = mounts_for(&args, &log, &[]);
        // The data dir is inside the log dir; `not-yet` is mounted through its parent.
        assert_eq!(
            mounts,
            vec![dir.path().to_path_buf(), other.path().to_path_buf()]
        );
    }
}
