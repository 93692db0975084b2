//! Free loopback ports.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::Mutex;

/// How many times a server start is retried with fresh ports when the port
/// was taken between picking it and the server binding it.
pub(crate) const START_ATTEMPTS: usize = 5;

/// Returns `n` distinct ports on 127.0.0.1 that were free a moment ago and that no other
/// live test-kit process has picked.
///
/// All listeners are held open until every port is picked, so the ports are distinct
/// from each other. Test binaries run side by side (`scripts/run-tests.py`), and the
/// kernel may hand a port one of them just released to another: the two servers would
/// then race for it, and the loser's readiness check could be answered by the winner. So
/// every picked port is claimed in a file of the machine's temp directory
/// (`lock-testkit-ports/<port>`, holding the claimer's pid) created with `create_new`; a
/// port claimed by a live process is skipped, a dead process's claim is taken over.
/// Another program may still grab a port before the server binds it; callers detect that
/// (the server exits with "address already in use") and retry with new ports.
pub(crate) fn free_ports(n: usize) -> Vec<u16> {
    let mut listeners = Vec::with_capacity(n);
    let mut ports = Vec::with_capacity(n);
    while ports.len() < n {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("lock-testkit: cannot bind 127.0.0.1:0: {e}"));
        let port = listener
            .local_addr()
            .expect("local_addr of a bound listener")
            .port();
        // Held open (unclaimed too) so that the next bind returns another port.
        listeners.push(listener);
        if claim(port) {
            ports.push(port);
        }
    }
    ports
}

/// Ports this process has handed out: never handed out again while it lives. Tests of
/// one binary run side by side too, and a port a server of one of them let go of (killed,
/// about to be restarted on it) or never bound (its start failed) could otherwise go to
/// another's server; the process's own claim files cannot tell them apart.
static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// Claims `port` for this process: `false` when this process handed it out before, or a
/// live process claimed it already.
fn claim(port: u16) -> bool {
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if given.contains(&port) || !claim_file(port) {
        return false;
    }
    given.insert(port);
    true
}

/// Claims `port` in the machine's claim directory: `false` when a live process other than
/// this one claimed it already.
fn claim_file(port: u16) -> bool {
    let dir = std::env::temp_dir().join("lock-testkit-ports");
    if std::fs::create_dir_all(&dir).is_err() {
        return true; // no shared directory: fall back on the retry after a failed bind
    }
    let path = dir.join(port.to_string());
    let me = std::process::id();
    // The claim appears whole or not at all: written aside, then hard-linked into place
    // (which fails when the claim exists).
    let mine = dir.join(format!(".{port}.{me}"));
    if std::fs::write(&mine, me.to_string()).is_err() {
        return true;
    }
    let mut claimed = false;
    for _ in 0..2 {
        match std::fs::hard_link(&mine, &path) {
            Ok(()) => {
                claimed = true;
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let owner = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|text| text.trim().parse::<u32>().ok());
                match owner {
                    Some(pid) if pid == me => {
                        claimed = true;
                        break;
                    }
                    // `kill(pid, 0)` tells whether the process exists.
                    Some(pid) if unsafe { libc::kill(pid as libc::pid_t, 0) } == 0 => break,
                    // A dead claimer's claim: take it over.
                    _ => {
                        let _ = std::fs::remove_file(&path);
                    }
                }
            }
            Err(_) => {
                claimed = true;
                break;
            }
        }
    }
    let _ = std::fs::remove_file(&mine);
    claimed
}

/// Returns one free port on 127.0.0.1 (see [`free_ports`]).
pub(crate) fn free_port() -> u16 {
    free_ports(1)[0]
}

/// A loopback port that was free a moment ago and that no server of the test kit (in this
/// process or another live one) will be given while this process lives: for a test that
/// needs a port nobody listens on, or for a listener of its own (bound at once).
pub fn unused_port() -> u16 {
    free_port()
}

/// A loopback port where nothing listens, for as long as this value lives: a socket is
/// bound to it without listening, so every connection to it is refused at once, and no
/// other socket of this machine (a listener bound to port 0 by another test binary, a
/// client's own end connecting to itself) can be given it meanwhile. [`unused_port`] only
/// keeps the test kit's own servers off its port.
#[derive(Debug)]
pub struct ClosedPort {
    port: u16,
    _socket: tokio::net::TcpSocket,
}

impl ClosedPort {
    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

/// A new [`ClosedPort`].
///
/// # Panics
///
/// If no socket can be created or bound (the message says why).
pub fn closed_port() -> ClosedPort {
    // A `TcpSocket` sets no `SO_REUSEADDR` (a listener would) and, never told to listen,
    // refuses every connection.
    let bound = tokio::net::TcpSocket::new_v4().and_then(|socket| {
        socket.bind(loopback(0))?;
        let port = socket.local_addr()?.port();
        Ok(ClosedPort {
            port,
            _socket: socket,
        })
    });
    bound.unwrap_or_else(|e| panic!("lock-testkit: cannot bind a loopback socket: {e}"))
}

/// `127.0.0.1:port`.
pub(crate) fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port nobody claimed yet (bound and released here, not through `free_ports`).
    fn unclaimed_port() -> u16 {
        loop {
            let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let file = std::env::temp_dir()
                .join("lock-testkit-ports")
                .join(port.to_string());
            if !GIVEN.lock().unwrap().contains(&port) && !file.exists() {
                return port;
            }
        }
    }

    /// Connections to a closed port are refused, and nobody else can bind it while it
    /// lives; afterwards it can be bound again.
    #[test]
    fn a_closed_port_refuses_connections_and_cannot_be_taken() {
        let closed = closed_port();
        let addr = loopback(closed.port());
        for _ in 0..20 {
            let e = std::net::TcpStream::connect(addr).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
        }
        assert!(TcpListener::bind(addr).is_err(), "the port is taken");
        drop(closed);
        TcpListener::bind(addr).expect("free again");
    }

    #[test]
    fn a_port_claimed_by_a_live_process_is_skipped_and_a_dead_ones_is_taken_over() {
        let dir = std::env::temp_dir().join("lock-testkit-ports");
        std::fs::create_dir_all(&dir).unwrap();
        let port = unclaimed_port();
        // pid 1 lives as long as the machine.
        std::fs::write(dir.join(port.to_string()), "1").unwrap();
        assert!(!claim(port), "a live process's claim is respected");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        std::fs::write(dir.join(port.to_string()), dead.to_string()).unwrap();
        assert!(claim(port), "a dead process's claim is taken over");
        assert_eq!(
            std::fs::read_to_string(dir.join(port.to_string())).unwrap(),
            std::process::id().to_string()
        );
        let ports = free_ports(8);
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 8, "{ports:?}");
    }

    /// Two tests of one binary: a port one of them was given is never given to the other,
    /// even once it is free again (its server killed, to be restarted on it).
    #[test]
    fn a_port_this_process_was_given_is_never_given_again() {
        // A port handed out and free again. The kernel may give a port just handed out to
        // another bind meanwhile (the other test here binds ephemeral ports side by side):
        // that one proves nothing, so take the next.
        let port = (0..20)
            .map(|_| free_port())
            .find(|&port| TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok())
            .expect("one of 20 ports handed out is free again");
        assert!(!claim(port), "but not handed out twice");
        let more = free_ports(64);
        assert!(!more.contains(&port), "{port} in {more:?}");
    }
}
