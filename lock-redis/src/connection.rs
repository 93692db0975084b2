//! The shared multiplexed connection to one server, reopened on demand after it broke
//! ([`Connector`]) at the address its [`Endpoint`] gives (fixed, or the master the sentinels
//! name), or the cluster connection to a Redis Cluster (see `cluster.rs`), and how a script
//! call goes over it (`EVALSHA`, then `EVAL`).

use lock_core::sync::lock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, ErrorKind, ServerErrorKind, Value};

use crate::cluster::{ClusterLink, Target};
use crate::error::Failure;
use crate::scripts::Script;

/// The shared multiplexed connection, reopened on demand after it broke.
pub(crate) struct Connector {
    target: Target,
    config: AsyncConnectionConfig,
    current: Mutex<Option<Link>>,
    /// Serialises reconnects, so concurrent operations share one new connection.
    connecting: tokio::sync::Mutex<()>,
    generation: AtomicU64,
}

#[derive(Clone)]
struct Link {
    conn: Conn,
    generation: u64,
}

/// One server's connection, or a cluster's.
#[derive(Clone)]
enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterLink),
}

impl Connector {
    /// The connector of `target` (one server, directly or through sentinels, or a
    /// cluster).
    pub(crate) fn new(target: Target) -> Self {
        Connector {
            target,
            // Our own deadline bounds connecting and every request, so that a timeout
            // always reads the same and counts from the start of the operation.
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(None)
                .set_response_timeout(None),
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
        }
    }

    fn cached(&self) -> Option<Link> {
        lock(&self.current).clone()
    }

    /// The current connection, or a new one; `true` when it was opened by this call.
    async fn link(
        &self,
        deadline: tokio::time::Instant,
    ) -> std::result::Result<(Link, bool), Failure> {
        if let Some(link) = self.cached() {
            return Ok((link, false));
        }
        let _turn = self.connecting.lock().await;
        if let Some(link) = self.cached() {
            return Ok((link, false));
        }
        let conn = match &self.target {
            Target::Endpoint(endpoint) => {
                Conn::Single(endpoint.connect(&self.config, deadline).await?)
            }
            Target::Cluster(client) => {
                Conn::Cluster(ClusterLink::open(client).await.map_err(Failure::Redis)?)
            }
        };
        let link = Link {
            conn,
            generation: self.generation.fetch_add(1, Ordering::Relaxed) + 1,
        };
        *lock(&self.current) = Some(link.clone());
        Ok((link, true))
    }

    /// Forgets connection `generation` (if still current) so the next request reconnects.
    fn discard(&self, generation: u64) {
        let mut current = lock(&self.current);
        if current.as_ref().is_some_and(|l| l.generation == generation) {
            *current = None;
        }
    }

    /// Forgets the current connection, whichever it is: its server answered as a replica
    /// (`READONLY` inside a script's reply), so the next request looks for the master.
    pub(crate) fn forget(&self) {
        *lock(&self.current) = None;
    }

    /// Sends `cmd` and reads its reply before `deadline`, calling `queued` once the request
    /// is queued on the connection.
    pub(crate) async fn send(
        &self,
        cmd: &Cmd,
        deadline: tokio::time::Instant,
        queued: &(dyn Fn() + Sync),
    ) -> std::result::Result<Value, Failure> {
        let mut resent = false;
        loop {
            let (mut link, fresh) = match self.cached() {
                Some(link) => (link, false),
                None => match tokio::time::timeout_at(deadline, self.link(deadline)).await {
                    Err(_) => return Err(Failure::Timeout),
                    Ok(Err(failure)) => return Err(failure),
                    Ok(Ok(link)) => link,
                },
            };
            let sent = match &mut link.conn {
                Conn::Single(conn) => {
                    let mut request = std::pin::pin!(conn.send_packed_command(cmd));
                    // The first poll queues the request on the connection, whose driver
                    // writes requests in queue order; only then may `queued` let others
                    // queue behind it.
                    match futures::poll!(request.as_mut()) {
                        std::task::Poll::Ready(reply) => Ok(reply),
                        std::task::Poll::Pending => {
                            queued();
                            tokio::time::timeout_at(deadline, request).await
                        }
                    }
                }
                // A cluster connection may reorder requests (redirections, reconnections,
                // one connection per node): nothing counts as queued before its answer.
                Conn::Cluster(conn) => tokio::time::timeout_at(deadline, conn.send(cmd)).await,
            };
            // Error replies arrive as values; the protocol treats them as errors.
            match sent.map(|reply| reply.and_then(Value::extract_error)) {
                Ok(Ok(value)) => return Ok(value),
                Err(_) => {
                    // A connection that stays silent may be half-open: do not reuse it.
                    self.discard(link.generation);
                    return Err(Failure::Timeout);
                }
                Ok(Err(e)) => {
                    // READONLY: a demoted master; the next request looks for the master.
                    let demoted = e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly);
                    if e.is_io_error() || e.is_unrecoverable_error() || demoted {
                        self.discard(link.generation);
                    }
                    // The connection we kept had closed while idle (server restart, idle
                    // timeout): send once more on a new one. The scripts make a repeated
                    // request harmless in the rare case the first one did arrive.
                    if !fresh && !resent && e.is_connection_dropped() {
                        resent = true;
                        continue;
                    }
                    return Err(Failure::Redis(e));
                }
            }
        }
    }

    /// Runs `script` with the arguments `fill` adds after the script: `EVALSHA`, and `EVAL`
    /// when the server does not know the script (empty cache after a restart or a
    /// `SCRIPT FLUSH`), both before `deadline`; `queued` is called whenever a request of it
    /// is queued on the connection.
    pub(crate) async fn eval<F>(
        &self,
        script: &Script,
        deadline: tokio::time::Instant,
        queued: &(dyn Fn() + Sync),
        fill: F,
    ) -> std::result::Result<Value, Failure>
    where
        F: Fn(&mut Cmd),
    {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.sha());
        fill(&mut cmd);
        match self.send(&cmd, deadline, queued).await {
            Err(Failure::Redis(e)) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(script.source);
                fill(&mut cmd);
                self.send(&cmd, deadline, queued).await
            }
            other => other,
        }
    }
}
