//! Free loopback ports.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};

/// How many times a server start is retried with fresh ports when the port
/// was taken between picking it and the server binding it.
pub(crate) const START_ATTEMPTS: usize = 5;

/// Returns `n` distinct ports on 127.0.0.1 that were free a moment ago.
///
/// All listeners are held open until every port is picked, so the ports are
/// distinct from each other. Another process may still grab one before the
/// server binds it; callers detect that (the server exits with "address
/// already in use") and retry with new ports.
pub(crate) fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| {
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .unwrap_or_else(|e| panic!("lock-testkit: cannot bind 127.0.0.1:0: {e}"))
        })
        .collect();
    listeners
        .iter()
        .map(|l| {
            l.local_addr()
                .expect("local_addr of a bound listener")
                .port()
        })
        .collect()
}

/// Returns one free port on 127.0.0.1 (see [`free_ports`]).
pub(crate) fn free_port() -> u16 {
    free_ports(1)[0]
}

/// `127.0.0.1:port`.
pub(crate) fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}
