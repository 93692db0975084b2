//! Starting a server on a free port and restarting it until it answers: the loop the
//! SQL servers share.

use super::*;

/// How long a server may take to answer after a start or a restart, and how often it is
/// asked meanwhile.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Readiness {
    pub(crate) timeout: Duration,
    pub(crate) poll: Duration,
}

/// Starts a server on a free loopback port: `spawn` makes its process for a port, `probe`
/// tells when it answers there. A port another process took meanwhile is given up for
/// another, up to [`START_ATTEMPTS`] times; the port and the process that answered.
///
/// # Panics
///
/// If the process cannot be spawned (the message names `what`) or does not answer within
/// `ready.timeout` (the message includes its log).
pub(crate) async fn start_on_free_port<S, P, Fut>(
    what: &str,
    ready: Readiness,
    spawn: S,
    probe: P,
) -> (u16, ManagedProcess)
where
    S: Fn(u16) -> io::Result<ManagedProcess>,
    P: Fn(u16) -> Fut,
    Fut: Future<Output = bool>,
{
    for attempt in 1..=START_ATTEMPTS {
        let port = free_port();
        let process =
            spawn(port).unwrap_or_else(|e| panic!("lock-testkit: cannot spawn {what}: {e}"));
        match process
            .wait_ready(ready.timeout, ready.poll, || probe(port))
            .await
        {
            Ok(()) => return (port, process),
            Err(e) if e.is_addr_in_use() && attempt < START_ATTEMPTS => continue,
            Err(e) => panic!("lock-testkit: {e}"),
        }
    }
    unreachable!("the last start attempt returns or panics")
}

/// The client `connect` makes to the server `what` at `addr`, for tests to look behind a
/// backend's back.
///
/// # Panics
///
/// If connecting fails or takes more than 10 s.
pub(crate) async fn client_within<T, E: fmt::Display>(
    what: &str,
    addr: std::net::SocketAddr,
    connect: impl Future<Output = Result<T, E>>,
) -> T {
    match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(client)) => client,
        Ok(Err(e)) => panic!("lock-testkit: cannot connect to {what} at {addr}: {e}"),
        Err(_) => panic!("lock-testkit: connecting to {what} at {addr} timed out"),
    }
}

impl ManagedProcess {
    /// Spawns the process again (the caller killed it: same command line, so the same
    /// port) until `probe` says it answers; a port the killed process still holds is tried
    /// again 100 ms later, up to [`START_ATTEMPTS`] times.
    ///
    /// # Panics
    ///
    /// If it cannot be respawned (the message names `what`) or does not come back within
    /// `ready.timeout` (the message includes its log).
    pub(crate) async fn restart_until_ready<P, Fut>(&self, what: &str, ready: Readiness, probe: P)
    where
        P: Fn() -> Fut,
        Fut: Future<Output = bool>,
    {
        for attempt in 1..=START_ATTEMPTS {
            self.respawn()
                .unwrap_or_else(|e| panic!("lock-testkit: cannot respawn {what}: {e}"));
            match self.wait_ready(ready.timeout, ready.poll, &probe).await {
                Ok(()) => return,
                Err(e) if e.is_addr_in_use() && attempt < START_ATTEMPTS => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("lock-testkit: restart failed: {e}"),
            }
        }
    }
}
