//! One node of the quorum: a [`RedisNode`] once connected, reconnected in the background
//! while it is not.

use lock_core::sync::lock;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use lock_core::{Error, ReleaseNotices, Result};
use lock_redis::{RedisBuilder, RedisNode, ReleaseWatch};

use crate::error::NAME;

/// Shortest pause between two background connection attempts to a node that is down.
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);

/// A node of the quorum. Operations never wait for a node to connect: a node that is not
/// connected fails the operation at once (as a down node would) and a connection attempt
/// starts in the background, so a node that was down when the backend was built joins
/// when it comes back.
pub(crate) struct Member {
    pub(crate) addr: String,
    builder: RedisBuilder,
    node: OnceLock<RedisNode>,
    reconnect: Mutex<Reconnect>,
    /// The node's release subscription, started by the first `listen` after it connected.
    watch: OnceLock<ReleaseWatch>,
}

#[derive(Default)]
struct Reconnect {
    running: bool,
    last_try: Option<Instant>,
    last_error: Option<String>,
}

impl Member {
    pub(crate) fn new(builder: RedisBuilder, addr: String) -> Arc<Member> {
        Arc::new(Member {
            addr,
            builder,
            node: OnceLock::new(),
            reconnect: Mutex::new(Reconnect::default()),
            watch: OnceLock::new(),
        })
    }

    /// Connects within the builder's timeout; on failure the node stays disconnected (to be
    /// retried in the background) and the error is returned.
    pub(crate) async fn connect(self: &Arc<Self>) -> Result<()> {
        {
            let mut state = lock(&self.reconnect);
            state.running = true;
            state.last_try = Some(Instant::now());
        }
        let result = self.builder.clone().build_node().await;
        let mut state = lock(&self.reconnect);
        state.running = false;
        match result {
            Ok(node) => {
                let _ = self.node.set(node);
                state.last_error = None;
                Ok(())
            }
            Err(e) => {
                state.last_error = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// The connected node with `timeout` on its requests, or a transient error (and a
    /// background connection attempt) when it is not connected yet.
    pub(crate) fn node(self: &Arc<Self>, timeout: Duration) -> Result<RedisNode> {
        if let Some(node) = self.node.get() {
            return Ok(node.with_timeout(timeout));
        }
        let last_error = {
            let mut state = lock(&self.reconnect);
            let due = state
                .last_try
                .is_none_or(|at| at.elapsed() >= RECONNECT_PAUSE);
            if !state.running && due {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    state.running = true;
                    let me = self.clone();
                    runtime.spawn(async move {
                        if let Err(e) = me.connect().await {
                            tracing::debug!(node = me.addr, error = %e.report(), "redlock node still down");
                        }
                    });
                }
            }
            state.last_error.clone()
        };
        Err(Error::unavailable(
            NAME,
            NotConnected {
                addr: self.addr.clone(),
                last_error,
            },
        ))
    }

    pub(crate) fn is_connected(&self) -> bool {
        self.node.get().is_some()
    }

    /// Starts this node's release subscription feeding `notices`, once it is connected;
    /// true when it runs.
    pub(crate) fn ensure_watch(&self, notices: &Arc<ReleaseNotices>) -> bool {
        if self.watch.get().is_some() {
            return true;
        }
        let Some(node) = self.node.get() else {
            return false;
        };
        match node.watch_releases(notices.clone()) {
            Some(watch) => {
                // A concurrent first `listen` may win the race; the loser's watch is dropped.
                let _ = self.watch.set(watch);
                true
            }
            None => false,
        }
    }
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("addr", &self.addr)
            .field("connected", &self.is_connected())
            .field("subscribed", &self.watch.get().is_some())
            .finish()
    }
}

/// A node that has not been connected yet (it was down when the backend was built).
#[derive(Debug)]
struct NotConnected {
    addr: String,
    last_error: Option<String>,
}

impl std::fmt::Display for NotConnected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "redis at {}: not connected (reconnecting)", self.addr)?;
        if let Some(e) = &self.last_error {
            write!(f, "; last attempt: {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for NotConnected {}
