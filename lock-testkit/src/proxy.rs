//! A fault-injecting TCP proxy inside the test process.

use std::future::poll_fn;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use lock_core::sync::lock;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// Bound on connecting to the upstream for a new client connection.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Read buffer per direction.
const CHUNK: usize = 16 * 1024;
/// Chunks queued per direction (held back by `Delay` or `Blackhole`) before
/// the proxy stops reading.
const QUEUE_CHUNKS: usize = 64;

/// What a [`FaultProxy`] does with traffic. Switch with
/// [`FaultProxy::set_mode`]; the switch applies at once to new connections
/// and to connections already open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forward everything unchanged.
    Pass,
    /// Forward every chunk after the given delay, per direction (a latency,
    /// not a bandwidth limit: chunks read meanwhile are delayed from their
    /// own arrival time).
    Delay {
        /// Delay for bytes from the client to the server.
        to_server: Duration,
        /// Delay for bytes from the server to the client.
        to_client: Duration,
    },
    /// Accept connections and keep them open, but forward nothing in either
    /// direction, also on connections already open: the proxy stops reading
    /// from both sides, so peers see a silent partner (their writes fill the
    /// socket buffers). Bytes already read are held, not dropped, and are
    /// forwarded when the mode switches back to `Pass` or `Delay`.
    Blackhole,
    /// Abort every open connection with a TCP reset (`SO_LINGER` 0, then
    /// close) on both the client and the upstream side, and reset every new
    /// connection right after accepting it.
    Reset,
    /// Stop accepting: the listening socket is closed, so new connections
    /// get `ECONNREFUSED`. Switching to any other mode binds the same port
    /// again. Refuse only affects *new* connections: connections already
    /// open keep forwarding as in `Pass`.
    Refuse,
}

/// The watched state: the mode plus a counter of switches to `Reset`, so a
/// connection notices a reset even if the mode moved on before it looked.
#[derive(Clone, Copy, Debug)]
struct ModeState {
    mode: ProxyMode,
    reset_epoch: u64,
}

/// The listening socket, shared by `set_mode` (which closes and re-binds it
/// synchronously, so `Refuse` and its end take effect immediately) and the
/// accept loop.
enum ListenerSlot {
    /// `Refuse`: nothing listens.
    Closed,
    /// Re-bound by `set_mode` (outside the runtime perhaps); the accept loop
    /// registers it with tokio.
    Bound(std::net::TcpListener),
    /// Registered with tokio.
    Active(TcpListener),
}

/// A TCP proxy between a client and a server, running as tokio tasks inside
/// the test process, that injects network faults on demand ([`ProxyMode`]).
///
/// Listens on `127.0.0.1` and a free port; every accepted connection gets a
/// new upstream connection (if connecting upstream fails, the client
/// connection is reset). One accept-loop task; per connection, one task that
/// runs two pump tasks (client to server, server to client). The mode lives
/// in a `tokio::sync::watch` channel, so every pump sees a switch at once.
///
/// Dropping the proxy closes the listener and stops the accept loop and all
/// connection tasks (their sockets are closed).
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    state: watch::Sender<ModeState>,
    listener: Arc<Mutex<ListenerSlot>>,
    accept_task: JoinHandle<()>,
}

impl ListenerSlot {
    /// Stops listening now, then closes the socket.
    ///
    /// Dropping the listener alone is not enough: `close` only drops this
    /// process's descriptor, and a child forked meanwhile (every server the
    /// testkit starts is forked from the test process, often by a test
    /// running in parallel) holds a copy of it until it execs, so the socket
    /// would keep listening, and completing connections, for that long.
    /// `shutdown` acts on the socket itself, whoever else holds it: Linux
    /// takes a listening socket out of `LISTEN` at once (its backlog is
    /// reset), and new connections get `ECONNREFUSED`.
    fn close(&mut self) {
        let fd = match self {
            ListenerSlot::Closed => return,
            ListenerSlot::Bound(listener) => listener.as_raw_fd(),
            ListenerSlot::Active(listener) => listener.as_raw_fd(),
        };
        // SAFETY: shutdown on a socket we own; the descriptor stays open (and
        // ours) until the listener is dropped right after.
        unsafe {
            libc::shutdown(fd, libc::SHUT_RDWR);
        }
        *self = ListenerSlot::Closed;
    }
}

impl std::fmt::Debug for ListenerSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ListenerSlot::Closed => "Closed",
            ListenerSlot::Bound(_) => "Bound",
            ListenerSlot::Active(_) => "Active",
        })
    }
}

impl FaultProxy {
    /// Starts a proxy in [`ProxyMode::Pass`] to `upstream`, listening on
    /// `127.0.0.1` and a free port. Must be called inside a tokio runtime.
    ///
    /// # Panics
    ///
    /// If no loopback port can be bound.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap_or_else(|e| panic!("lock-testkit: proxy cannot bind 127.0.0.1:0: {e}"));
        let addr = listener
            .local_addr()
            .expect("local_addr of a bound listener");
        let (state, rx) = watch::channel(ModeState {
            mode: ProxyMode::Pass,
            reset_epoch: 0,
        });
        let listener = Arc::new(Mutex::new(ListenerSlot::Active(listener)));
        let accept_task = tokio::spawn(accept_loop(Arc::clone(&listener), rx, upstream));
        FaultProxy {
            addr,
            upstream,
            state,
            listener,
            accept_task,
        }
    }

    /// The address clients should connect to (`127.0.0.1:port`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The server the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Switches the mode; takes effect immediately, also on connections
    /// already open. Entering [`ProxyMode::Refuse`] closes the listening
    /// socket before returning; leaving it re-binds the same port before
    /// returning. Can be called from any thread.
    ///
    /// # Panics
    ///
    /// When leaving `Refuse`, if the port cannot be bound again within about
    /// a second (someone else took it).
    pub fn set_mode(&self, mode: ProxyMode) {
        {
            let mut slot = lock(&self.listener);
            if mode == ProxyMode::Refuse {
                slot.close();
            } else if matches!(*slot, ListenerSlot::Closed) {
                *slot = ListenerSlot::Bound(rebind(self.addr));
            }
        }
        self.state.send_modify(|state| {
            if mode == ProxyMode::Reset {
                state.reset_epoch += 1;
            }
            state.mode = mode;
        });
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        self.state.borrow().mode
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every
        // connection task and, through their JoinSets, every pump. Closing
        // the watch channel (when `state` drops) stops them too.
        self.accept_task.abort();
        lock(&self.listener).close();
    }
}

/// Binds `addr` again after `Refuse` (SO_REUSEADDR is set by std).
fn rebind(addr: SocketAddr) -> std::net::TcpListener {
    let mut last_error = None;
    for _ in 0..100 {
        match std::net::TcpListener::bind(addr).and_then(|l| l.set_nonblocking(true).map(|()| l)) {
            Ok(listener) => return listener,
            Err(e) => last_error = Some(e),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!(
        "lock-testkit: proxy cannot re-bind {addr} after Refuse: {}",
        last_error.expect("at least one attempt")
    )
}

/// Polls the shared listener; `Pending` (without waker) while closed: the
/// accept loop also waits for mode changes, which is when the slot changes.
fn poll_accept(
    slot: &Mutex<ListenerSlot>,
    cx: &mut Context<'_>,
) -> Poll<io::Result<(TcpStream, SocketAddr)>> {
    let mut slot = lock(slot);
    if matches!(*slot, ListenerSlot::Bound(_)) {
        let ListenerSlot::Bound(std_listener) = std::mem::replace(&mut *slot, ListenerSlot::Closed)
        else {
            unreachable!()
        };
        match TcpListener::from_std(std_listener) {
            Ok(listener) => *slot = ListenerSlot::Active(listener),
            Err(e) => return Poll::Ready(Err(e)),
        }
    }
    match &*slot {
        ListenerSlot::Active(listener) => listener.poll_accept(cx),
        _ => Poll::Pending,
    }
}

async fn accept_loop(
    listener: Arc<Mutex<ListenerSlot>>,
    mut rx: watch::Receiver<ModeState>,
    upstream: SocketAddr,
) {
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let accepted = tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    return; // the proxy was dropped
                }
                continue;
            }
            accepted = poll_fn(|cx| poll_accept(&listener, cx)) => accepted,
        };
        let client = match accepted {
            Ok((client, _)) => client,
            Err(_) => {
                // E.g. EMFILE: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let state = *rx.borrow();
        match state.mode {
            ProxyMode::Reset | ProxyMode::Refuse => abort_close(&client),
            _ => {
                connections.spawn(connection(client, upstream, rx.clone(), state.reset_epoch));
            }
        }
    }
}

/// One proxied connection: connect upstream, then run the two pumps.
async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    rx: watch::Receiver<ModeState>,
    reset_epoch: u64,
) {
    let server =
        match tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, TcpStream::connect(upstream)).await {
            Ok(Ok(server)) => server,
            _ => {
                abort_close(&client);
                return;
            }
        };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let mut pumps = JoinSet::new();
    pumps.spawn(pump(
        client_read,
        server_write,
        Direction::ToServer,
        rx.clone(),
        reset_epoch,
    ));
    pumps.spawn(pump(
        server_read,
        client_write,
        Direction::ToClient,
        rx,
        reset_epoch,
    ));
    while pumps.join_next().await.is_some() {}
}

#[derive(Clone, Copy, Debug)]
enum Direction {
    ToServer,
    ToClient,
}

impl Direction {
    fn delay(self, mode: ProxyMode) -> Duration {
        match (self, mode) {
            (Direction::ToServer, ProxyMode::Delay { to_server, .. }) => to_server,
            (Direction::ToClient, ProxyMode::Delay { to_client, .. }) => to_client,
            _ => Duration::ZERO,
        }
    }
}

/// Forwards one direction until EOF, a reset, or the proxy going away.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    direction: Direction,
    rx: watch::Receiver<ModeState>,
    reset_epoch: u64,
) {
    let reset = tokio::select! {
        () = forward(&mut from, &mut to, direction, rx.clone()) => false,
        reset = wait_for_reset(rx, reset_epoch) => reset,
    };
    if reset {
        // Both sockets: whichever pump drops the last half of a socket
        // closes it, and then with RST.
        abort_close(from.as_ref());
        abort_close(to.as_ref());
        // Dropping a write half would shut it down first (FIN), and the peer
        // would read a clean EOF before the RST.
        to.forget();
    }
}

/// Resolves with `true` once the proxy is switched to `Reset` after the
/// connection was accepted, or `false` when the proxy is dropped.
async fn wait_for_reset(mut rx: watch::Receiver<ModeState>, reset_epoch: u64) -> bool {
    loop {
        if rx.borrow_and_update().reset_epoch != reset_epoch {
            return true;
        }
        if rx.changed().await.is_err() {
            return false;
        }
    }
}

/// Reads from `from` and writes to `to`, honouring `Delay` and `Blackhole`.
///
/// A reader and a writer joined by a bounded queue of `(arrival time,
/// chunk)`: `Delay` holds each chunk until its arrival time plus the delay;
/// `Blackhole` stops the reader and holds the writer. On EOF the write side
/// is shut down (half-close), like a transparent proxy.
async fn forward(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    direction: Direction,
    rx: watch::Receiver<ModeState>,
) {
    let (tx, mut queue) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUE_CHUNKS);
    let mut read_rx = rx.clone();
    let reader = async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            if read_rx.borrow_and_update().mode == ProxyMode::Blackhole {
                if read_rx.changed().await.is_err() {
                    return;
                }
                continue;
            }
            tokio::select! {
                changed = read_rx.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                read = from.read(&mut buf) => match read {
                    Ok(0) | Err(_) => return, // dropping `tx` ends the writer
                    Ok(n) => {
                        if tx.send((Instant::now(), buf[..n].to_vec())).await.is_err() {
                            return;
                        }
                    }
                },
            }
        }
    };
    let mut write_rx = rx;
    let writer = async move {
        while let Some((arrived, chunk)) = queue.recv().await {
            loop {
                let mode = write_rx.borrow_and_update().mode;
                let due = match mode {
                    ProxyMode::Blackhole => None,
                    _ => {
                        let due = arrived + direction.delay(mode);
                        if due <= Instant::now() {
                            break;
                        }
                        Some(due)
                    }
                };
                let changed = match due {
                    None => write_rx.changed().await,
                    Some(due) => tokio::select! {
                        () = tokio::time::sleep_until(due) => Ok(()),
                        changed = write_rx.changed() => changed,
                    },
                };
                if changed.is_err() {
                    return;
                }
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

/// Closes with RST: `SO_LINGER` {on, 0 s}. The socket is closed when its
/// last handle is dropped.
fn abort_close(stream: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on a socket we own, with a correctly sized value.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}
