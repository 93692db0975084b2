//! The release subscription: one pub/sub connection feeding a [`ReleaseNotices`] hub,
//! opened through the node's `Endpoint` (so through sentinels it follows the master).

use futures::FutureExt as _;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lock_core::ReleaseNotices;
use tokio::task::AbortHandle;

use crate::error::Failure;
use crate::sentinel::Endpoint;

/// First pause before resubscribing after a failure; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How often a quiet subscription is checked with `PING`: a connection that died without
/// closing (network partition, paused server) would otherwise go unnoticed.
const KEEPALIVE: Duration = Duration::from_secs(5);

/// A running release subscription (see
/// `RedisNode::watch_releases`); dropping it stops the
/// subscription and closes its connection.
#[derive(Debug)]
pub struct ReleaseWatch {
    task: AbortHandle,
}

impl Drop for ReleaseWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ReleaseWatch {
    /// Subscribes through `endpoints[0]`, and after each failure through the next one (the
    /// seed nodes of a cluster, where a `PUBLISH` on any node reaches every node).
    pub(crate) fn start(
        endpoints: Vec<Endpoint>,
        channel: String,
        origin: String,
        timeout: Duration,
        notices: Arc<ReleaseNotices>,
    ) -> Option<ReleaseWatch> {
        let handle = tokio::runtime::Handle::try_current().ok()?;
        if endpoints.is_empty() {
            return None;
        }
        let task = handle.spawn(run(endpoints, channel, origin, timeout, notices));
        Some(ReleaseWatch {
            task: task.abort_handle(),
        })
    }
}

async fn run(
    endpoints: Vec<Endpoint>,
    channel: String,
    origin: String,
    timeout: Duration,
    notices: Arc<ReleaseNotices>,
) {
    let mut backoff = lock_core::Backoff::new(MIN_BACKOFF, MAX_BACKOFF);
    for turn in 0.. {
        let endpoint = &endpoints[turn % endpoints.len()];
        let deadline = tokio::time::Instant::now() + timeout;
        let subscribed = tokio::time::timeout_at(deadline, async {
            let client = endpoint.client(deadline).await?;
            let (mut sink, stream) = client
                .get_async_pubsub()
                .await
                .map_err(Failure::Redis)?
                .split();
            sink.subscribe(&channel).await.map_err(Failure::Redis)?;
            Ok::<_, Failure>((sink, stream))
        })
        .await;
        match subscribed {
            Ok(Ok((mut sink, mut stream))) => {
                backoff.reset();
                // Releases between the last notice and this subscription were not heard.
                notices.notify_all();
                tracing::debug!(channel, "release subscription active");
                let mut keepalive = tokio::time::interval(KEEPALIVE);
                keepalive.reset();
                loop {
                    futures::select! {
                        msg = stream.next().fuse() => match msg {
                            Some(msg) => dispatch(&notices, &origin, msg.get_payload_bytes()),
                            None => break,
                        },
                        _ = keepalive.tick().fuse() => {
                            let pong = tokio::time::timeout(timeout, sink.ping::<redis::Value>());
                            if !matches!(pong.await, Ok(Ok(_))) {
                                break;
                            }
                        }
                    }
                }
                tracing::debug!(channel, "release subscription lost; resubscribing");
            }
            Ok(Err(e)) => tracing::debug!(channel, error = ?e, "release subscription failed"),
            Err(_) => tracing::debug!(channel, "release subscription timed out"),
        }
        // Only after trying every node in a row is there a pause.
        if (turn + 1) % endpoints.len() == 0 {
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }
}

/// A notice is `<origin> <name>`; notices of our own origin were delivered locally already.
fn dispatch(notices: &ReleaseNotices, origin: &str, payload: &[u8]) {
    if payload.starts_with(origin.as_bytes()) {
        return;
    }
    let Some(space) = payload.iter().position(|&b| b == b' ') else {
        return;
    };
    if let Ok(name) = std::str::from_utf8(&payload[space + 1..]) {
        notices.notify(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn notices_of_other_origins_wake_listeners() {
        let hub = ReleaseNotices::new();
        let mut mine = hub.listen("a b");
        dispatch(&hub, "me ", b"me a b");
        assert!(
            tokio::time::timeout(Duration::from_millis(20), mine.released())
                .await
                .is_err(),
            "own notices are skipped"
        );
        dispatch(&hub, "me ", b"garbage");
        dispatch(&hub, "me ", b"other a b");
        tokio::time::timeout(Duration::from_secs(1), mine.released())
            .await
            .expect("a notice of another origin wakes the listener of the name");
    }
}
