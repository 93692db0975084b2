//! The release subscription: one more connection, `LISTEN`ing on the table's release
//! channel, feeding a [`ReleaseNotices`] hub.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lock_core::ReleaseNotices;
use tokio::task::AbortHandle;
use tokio_postgres::{AsyncMessage, NoTls};

/// First pause before listening again after a failure; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How often a quiet subscription is checked: a connection that died without closing
/// (network partition, paused server) would otherwise go unnoticed, and its notices lost.
const KEEPALIVE: Duration = Duration::from_secs(2);

/// A running release subscription; dropping it stops it and closes its connection.
#[derive(Debug)]
pub(crate) struct ReleaseWatch {
    task: AbortHandle,
}

impl Drop for ReleaseWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ReleaseWatch {
    /// Starts listening on `channel`; `None` outside a tokio runtime.
    pub(crate) fn start(
        config: tokio_postgres::Config,
        channel: String,
        timeout: Duration,
        notices: Arc<ReleaseNotices>,
    ) -> Option<ReleaseWatch> {
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let task = handle.spawn(run(config, channel, timeout, notices));
        Some(ReleaseWatch {
            task: task.abort_handle(),
        })
    }
}

async fn run(
    config: tokio_postgres::Config,
    channel: String,
    timeout: Duration,
    notices: Arc<ReleaseNotices>,
) {
    let mut backoff = lock_core::Backoff::new(MIN_BACKOFF, MAX_BACKOFF);
    loop {
        match tokio::time::timeout(timeout, config.connect(NoTls)).await {
            Ok(Ok((client, mut connection))) => {
                let hub = notices.clone();
                // The connection's own messages carry the notifications.
                let driver = tokio::spawn(async move {
                    let mut messages = futures::stream::poll_fn(|cx| connection.poll_message(cx));
                    while let Some(Ok(message)) = messages.next().await {
                        if let AsyncMessage::Notification(n) = message {
                            dispatch(&hub, n.payload());
                        }
                    }
                });
                // The channel is a validated name: quoting it is enough.
                let statement = format!("LISTEN \"{channel}\"");
                let listen = client.batch_execute(&statement);
                if matches!(tokio::time::timeout(timeout, listen).await, Ok(Ok(()))) {
                    backoff.reset();
                    // Releases between the last notice and this LISTEN were not heard.
                    notices.notify_all();
                    tracing::debug!(channel, "release subscription active");
                    let mut keepalive = tokio::time::interval(KEEPALIVE);
                    keepalive.reset();
                    loop {
                        keepalive.tick().await;
                        let ping = tokio::time::timeout(timeout, client.simple_query(""));
                        if !matches!(ping.await, Ok(Ok(_))) || driver.is_finished() {
                            break;
                        }
                    }
                }
                driver.abort();
                tracing::debug!(channel, "release subscription lost; listening again");
            }
            Ok(Err(e)) => tracing::debug!(channel, error = %e, "release subscription failed"),
            Err(_) => tracing::debug!(channel, "release subscription timed out"),
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// A notice's payload is the released key in hex (`encode(key, 'hex')`): keys may hold
/// bytes a payload cannot (NUL).
fn dispatch(notices: &ReleaseNotices, payload: &str) {
    if let Some(key) = decode_hex(payload).and_then(|b| String::from_utf8(b).ok()) {
        notices.notify(&key);
    }
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn hex_payloads_wake_the_listeners_of_their_key() {
        let hub = ReleaseNotices::new();
        let mut l = hub.listen("a\0b");
        dispatch(&hub, "zz");
        dispatch(&hub, "610");
        assert!(
            tokio::time::timeout(Duration::from_millis(20), l.released())
                .await
                .is_err(),
            "garbage wakes nobody"
        );
        dispatch(&hub, "610062");
        tokio::time::timeout(Duration::from_secs(1), l.released())
            .await
            .expect("the key's notice wakes its listener");
    }
}
