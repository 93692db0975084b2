//! Programs run to their end (initdb), in the launch mode of the test kit.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::container::{self, Container};
use crate::images;
use crate::mode::{launch_mode, LaunchMode};
use std::io;

/// How a program run to its end ([`run_to_end`]) finished.
pub(crate) struct Finished {
    /// True on exit status 0.
    pub(crate) success: bool,
    /// The exit status, as text.
    pub(crate) status: String,
    /// What it wrote (stdout, then stderr; in a container, in order).
    pub(crate) output: String,
}

/// Runs `program args...` as `user` to its end, in the launch mode of the test kit (a
/// container of the program's image in container mode), within `timeout`; `log_path`'s
/// directory and the paths on the command line are mounted as for a server.
///
/// # Errors
///
/// If the program cannot start, or it runs longer than `timeout` (it is killed).
pub(crate) fn run_to_end(
    program: &Path,
    args: Vec<OsString>,
    log_path: &Path,
    user: Option<(u32, u32)>,
    timeout: Duration,
) -> io::Result<Finished> {
    let image = (launch_mode() == LaunchMode::Containers)
        .then(|| images::image_for_program(program))
        .flatten();
    if let Some((image, inside)) = image {
        let spec = container::Spec {
            image,
            program: inside,
            mounts: container::mounts_for(&args, log_path, &[]),
            args,
            log_path: log_path.to_path_buf(),
            user: user.unwrap_or_else(container::current_user),
        };
        let running = Container::start(&spec)?;
        let started = Instant::now();
        let status = loop {
            if let Some(status) = running.exit_status() {
                break status;
            }
            if started.elapsed() >= timeout {
                running.kill();
                return Err(io::Error::other(format!(
                    "{} ran longer than {timeout:?}; output:\n{}",
                    program.display(),
                    running.logs()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let output = running.logs();
        running.remove();
        return Ok(Finished {
            success: status == "exit status: 0",
            status,
            output,
        });
    }
    let mut command = Command::new(program);
    command.args(args).stdin(Stdio::null());
    if let Some((uid, gid)) = user {
        command.uid(uid).gid(gid);
    }
    // A host program (process mode) has no container to bound; initdb, the one user,
    // ends on its own.
    let output = command.output()?;
    Ok(Finished {
        success: output.status.success(),
        status: output.status.to_string(),
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    })
}
