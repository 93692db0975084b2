//! Release notices: one watch over the whole key prefix, for delete events only.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, EventType, WatchFilterType, WatchOptions, WatchStream, Watcher};

use crate::members::Members;
use futures::FutureExt;
use lock_core::ReleaseNotices;

/// How often the stream is asked for a progress report when nothing else arrives: a stream
/// that stays silent for this plus the operation timeout is dead (a paused member, a
/// blackholed connection) and is replaced.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// Bounds of the pause between attempts to open a new watch.
const RETRY_MIN: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// An open watch: the handle to send requests on and the stream of responses.
pub(crate) type Open = (Watcher, WatchStream);

/// Opens the watch: every delete under `prefix` (releases, expiries, forced releases).
pub(crate) async fn open(client: &Client, prefix: &str) -> Result<Open, etcd_client::Error> {
    let options = WatchOptions::new()
        .with_prefix()
        .with_filters([WatchFilterType::NoPut]);
    // etcd-client asserts that the first answer is the creation; a panic there must not
    // take the watch task down with it.
    match AssertUnwindSafe(client.watch_client().watch(prefix, Some(options)))
        .catch_unwind()
        .await
    {
        Ok(opened) => opened,
        Err(_) => Err(etcd_client::Error::WatchError(
            "the watch was not created".into(),
        )),
    }
}

/// Follows the watch for the life of the backend: every delete under the prefix wakes the
/// listeners of that key. When the stream fails or falls silent, a new one is opened and
/// every listener is woken, since deletes in between were not seen.
pub(crate) async fn run(
    members: Arc<Members>,
    prefix: String,
    notices: Arc<ReleaseNotices>,
    timeout: Duration,
    first: Open,
) {
    let mut current = Some((members.pick().0, first));
    let mut retry = lock_core::Backoff::new(RETRY_MIN, RETRY_MAX);
    loop {
        let (member, (watcher, stream)) = match current.take() {
            Some(open_watch) => open_watch,
            None => {
                let (member, client) = members.pick();
                match tokio::time::timeout(timeout, open(&client, &prefix)).await {
                    Ok(Ok(open_watch)) => {
                        notices.notify_all();
                        retry.reset();
                        (member, open_watch)
                    }
                    failed => {
                        tracing::debug!(?failed, "cannot open the etcd release watch; retrying");
                        members.suspect(member);
                        tokio::time::sleep(retry.next_delay()).await;
                        continue;
                    }
                }
            }
        };
        follow(watcher, stream, prefix.as_bytes(), &notices, timeout).await;
        tracing::debug!("the etcd release watch ended; opening a new one");
        members.suspect(member);
    }
}

/// Dispatches delete events until the stream fails, is cancelled, or stays silent too long.
async fn follow(
    mut watcher: Watcher,
    mut stream: WatchStream,
    prefix: &[u8],
    notices: &ReleaseNotices,
    timeout: Duration,
) {
    let mut heard = Instant::now();
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            message = stream.message() => {
                let Ok(Some(response)) = message else { return };
                heard = Instant::now();
                if response.canceled() {
                    return;
                }
                for event in response.events() {
                    if event.event_type() != EventType::Delete {
                        continue;
                    }
                    let key = event.kv().and_then(|kv| kv.key().strip_prefix(prefix));
                    if let Some(Ok(key)) = key.map(std::str::from_utf8) {
                        notices.notify(key);
                    }
                }
            }
            _ = tick.tick() => {
                if heard.elapsed() > PROGRESS_EVERY + timeout {
                    return;
                }
                let asked = tokio::time::timeout(timeout, watcher.request_progress()).await;
                if !matches!(asked, Ok(Ok(()))) {
                    return;
                }
            }
        }
    }
}
