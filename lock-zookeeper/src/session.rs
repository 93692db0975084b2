//! The backend's ZooKeeper session: connecting, telling when a disconnection or an expiry
//! ends the grants made in it, and making a new session when the old one is over.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::sync::lock;
use lock_core::{ReleaseNotices, Result};
use zookeeper_client as zk;

use crate::config::ZooKeeperBuilder;
use crate::error::{failed, timed_out};

/// One ZooKeeper session and what the backend knows of its state.
pub(crate) struct Session {
    pub(crate) client: zk::Client,
    /// The session id, the `ephemeralOwner` of the nodes made in it.
    pub(crate) id: i64,
    /// The session timeout the ensemble granted.
    pub(crate) timeout: Duration,
    /// Bumped at every disconnection: grants made before one are lost (Curator's
    /// SUSPENDED-is-lost policy), even if the client reconnects within the session.
    epoch: AtomicU64,
    /// Set when the session expired or was closed: every grant made in it is gone.
    over: AtomicBool,
    /// Dropped with the session: ends its state-watching task.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Session {
    /// The disconnection count now, to record with a grant.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Whether a grant made at `epoch` of this session may still be held: the session is
    /// not over and has not been disconnected since.
    pub(crate) fn keeps(&self, epoch: u64) -> bool {
        !self.over.load(Ordering::SeqCst) && self.epoch() == epoch
    }

    fn is_over(&self) -> bool {
        self.over.load(Ordering::SeqCst)
    }

    /// Marks the session over (an operation answered that it expired or was closed).
    pub(crate) fn end(&self) {
        self.over.store(true, Ordering::SeqCst);
    }
}

/// The current session, replaced by a new one when it is over.
pub(crate) struct Sessions {
    config: ZooKeeperBuilder,
    current: Mutex<Option<Arc<Session>>>,
    /// One connection attempt at a time.
    connecting: tokio::sync::Mutex<()>,
    notices: Arc<ReleaseNotices>,
}

impl Sessions {
    /// Connects the first session: a failure is the backend's build error.
    pub(crate) async fn connect(
        config: ZooKeeperBuilder,
        notices: Arc<ReleaseNotices>,
    ) -> Result<Sessions> {
        let first = open(&config, &notices).await?;
        Ok(Sessions {
            config,
            current: Mutex::new(Some(first)),
            connecting: tokio::sync::Mutex::new(()),
            notices,
        })
    }

    /// The configuration the sessions are made with.
    pub(crate) fn config(&self) -> &ZooKeeperBuilder {
        &self.config
    }

    /// The current session if it is not over, without connecting.
    pub(crate) fn peek(&self) -> Option<Arc<Session>> {
        lock(&self.current).clone().filter(|s| !s.is_over())
    }

    /// The current session, or a new one when it is over (bounded by the timeout).
    pub(crate) async fn get(&self) -> Result<Arc<Session>> {
        if let Some(session) = self.peek() {
            return Ok(session);
        }
        let _one = self.connecting.lock().await;
        if let Some(session) = self.peek() {
            return Ok(session);
        }
        let session = open(&self.config, &self.notices).await?;
        *lock(&self.current) = Some(session.clone());
        // Watches of the old session are gone: every waiter looks again.
        self.notices.notify_all();
        Ok(session)
    }
}

/// A new session, with a task following its state.
async fn open(config: &ZooKeeperBuilder, notices: &Arc<ReleaseNotices>) -> Result<Arc<Session>> {
    let timeout = config.get_timeout();
    let hosts = config.connect_string();
    let connect = zk::Client::connector()
        .with_session_timeout(config.get_session_timeout())
        .with_connection_timeout(timeout)
        .connect(&hosts);
    let client = match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(client)) => client,
        Ok(Err(e)) => return Err(failed("connect to the ensemble", e)),
        Err(_) => return Err(timed_out("connect to the ensemble", timeout)),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let session = Arc::new(Session {
        id: client.session_id().0,
        timeout: client.session_timeout(),
        client,
        epoch: AtomicU64::new(0),
        over: AtomicBool::new(false),
        _stop: stop,
    });
    tokio::spawn(follow(
        Arc::downgrade(&session),
        session.client.state_watcher(),
        stopped,
        notices.clone(),
    ));
    Ok(session)
}

/// Follows a session's state until it ends or the session is dropped: a disconnection
/// bumps the epoch, an expiry or close ends the session; either wakes every waiter (their
/// watches may be gone).
async fn follow(
    session: std::sync::Weak<Session>,
    mut states: zk::StateWatcher,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
    notices: Arc<ReleaseNotices>,
) {
    loop {
        let state = tokio::select! {
            state = states.changed() => state,
            _ = &mut stopped => return,
        };
        let Some(session) = session.upgrade() else {
            return;
        };
        match state {
            zk::SessionState::Disconnected => {
                session.epoch.fetch_add(1, Ordering::SeqCst);
                tracing::debug!(
                    session = session.id,
                    "zookeeper: disconnected; grants made so far are lost"
                );
            }
            zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed => {
                session.end();
                tracing::debug!(session = session.id, ?state, "zookeeper: session over");
                notices.notify_all();
                return;
            }
            _ => {}
        }
        notices.notify_all();
    }
}
