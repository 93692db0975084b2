//! Release notices: one watch over the whole key prefix, for delete events only.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
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

/// Deletions remembered to tell the two announcements of one release apart; past it the
/// memory is cleared (costing at most one extra wake per key).
const REMEMBERED: usize = 4096;

/// Release notices from two sources, each deletion announced once: a release of this
/// backend announces its deletion as soon as etcd confirms it, and the watch then reports
/// the same deletion (same revision) again. Announcing it twice would wake the next waiter
/// for a release it has already seen, and its attempt would be refused at the cost of an
/// etcd write.
pub(crate) struct Announcer {
    pub(crate) notices: Arc<ReleaseNotices>,
    /// The last deletion revision announced per key by one source and not yet by the other.
    once: Mutex<HashMap<Box<str>, i64>>,
}

impl Announcer {
    pub(crate) fn new(notices: Arc<ReleaseNotices>) -> Self {
        Announcer {
            notices,
            once: Mutex::default(),
        }
    }

    /// Wakes `key`'s listeners for its deletion at `revision`, unless that deletion was
    /// announced already.
    pub(crate) fn deleted(&self, key: &str, revision: i64) {
        {
            let mut once = self.once.lock().unwrap_or_else(|e| e.into_inner());
            if once.get(key) == Some(&revision) {
                once.remove(key);
                return;
            }
            if once.len() >= REMEMBERED {
                once.clear();
            }
            once.insert(key.into(), revision);
        }
        self.notices.notify(key);
    }

    /// Number of deletions remembered.
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.once.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

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
    announcer: Arc<Announcer>,
    timeout: Duration,
    first: Open,
) {
    let notices = &announcer.notices;
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
        follow(watcher, stream, prefix.as_bytes(), &announcer, timeout).await;
        tracing::debug!("the etcd release watch ended; opening a new one");
        members.suspect(member);
    }
}

/// Dispatches delete events until the stream fails, is cancelled, or stays silent too long.
async fn follow(
    mut watcher: Watcher,
    mut stream: WatchStream,
    prefix: &[u8],
    announcer: &Announcer,
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
                    let Some(kv) = event.kv() else { continue };
                    let key = kv.key().strip_prefix(prefix).map(std::str::from_utf8);
                    if let Some(Ok(key)) = key {
                        announcer.deleted(key, kv.mod_revision());
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The two announcements of one deletion wake a listener once; a later deletion of the
    /// same key wakes it again, and nothing stays remembered.
    #[tokio::test]
    async fn each_deletion_is_announced_once() {
        let notices = Arc::new(ReleaseNotices::new());
        let announcer = Announcer::new(notices.clone());
        let mut first = notices.listen("k");
        announcer.deleted("k", 10);
        tokio::time::timeout(Duration::from_secs(1), first.released())
            .await
            .expect("the first announcement wakes");
        let mut second = notices.listen("k");
        announcer.deleted("k", 10);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), second.released())
                .await
                .is_err(),
            "the same deletion from the other source must not wake again"
        );
        assert_eq!(announcer.remembered(), 0);
        announcer.deleted("k", 12);
        tokio::time::timeout(Duration::from_secs(1), second.released())
            .await
            .expect("a new deletion wakes");
    }
}
