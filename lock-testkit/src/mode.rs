//! Which way the test kit launches servers.

/// The variable choosing how servers are launched.
pub(crate) const MODE_ENV: &str = "DISTLOCK_TESTKIT";
/// How the test kit launches servers, chosen by `DISTLOCK_TESTKIT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchMode {
    /// `processes` (the default): child processes of the test binary.
    Processes,
    /// `containers`: containers of a Docker engine (`DOCKER_HOST`, else
    /// `/var/run/docker.sock`), through `testcontainers`, on the host network.
    Containers,
}

/// The launch mode `DISTLOCK_TESTKIT` selects: unset, empty or `processes` for child
/// processes, `containers` for containers.
///
/// # Panics
///
/// On any other value, naming the accepted ones.
pub fn launch_mode() -> LaunchMode {
    match std::env::var(MODE_ENV).as_deref() {
        Err(_) | Ok("") | Ok("processes") => LaunchMode::Processes,
        Ok("containers") => LaunchMode::Containers,
        Ok(other) => panic!(
            "lock-testkit: {MODE_ENV}={other:?} is not a launch mode: use `processes` \
             (the default) or `containers`"
        ),
    }
}
