//! Release notices: one watch over the whole key prefix, for delete events only, open
//! while some waiter of this backend listens; and the leaders' watch over the key space of
//! leaders' values (`leaders.rs`), for every event, open while some observer listens.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, EventType, GetOptions, WatchFilterType, WatchOptions, WatchRequestSender,
    WatchResponseStream,
};
use tokio::sync::Notify;

use crate::members::Members;
use crate::permits::name_of;
use futures::FutureExt;
use lock_core::sync::lock;
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
            let mut once = lock(&self.once);
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

    /// A deletion by this backend at `revision`: its listeners are woken now, and the watch
    /// event for it, if a watch runs, wakes nobody again.
    pub(crate) fn deleted_here(&self, key: &str, revision: i64, watched: bool) {
        if watched {
            self.deleted(key, revision);
        } else {
            self.notices.notify(key);
        }
    }

    /// Number of deletions remembered.
    #[cfg(test)]
    fn remembered(&self) -> usize {
        lock(&self.once).len()
    }
}

/// What a watch covers and whom its events wake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Deletes under the lock prefix (releases, expiries, forced releases): each wakes the
    /// listeners of the lock it frees, once (the [`Announcer`]).
    Releases,
    /// Every event under the leaders' root: a published value or an announcement wakes
    /// the listeners of its election.
    Leaders,
}

/// An open watch: its id, the handle to send requests on and the stream of responses.
#[derive(Debug)]
pub(crate) struct Open {
    pub(crate) id: i64,
    pub(crate) requests: WatchRequestSender,
    pub(crate) responses: WatchResponseStream,
}

/// Opens the watch: every delete under `prefix` (releases, expiries, forced releases), or
/// every event for [`Kind::Leaders`], from revision `from` on.
pub(crate) async fn open(
    client: &Client,
    prefix: &str,
    from: i64,
    kind: Kind,
) -> Result<Open, etcd_client::Error> {
    let mut options = WatchOptions::new().with_prefix().with_start_revision(from);
    if kind == Kind::Releases {
        options = options.with_filters([WatchFilterType::NoPut]);
    }
    // The first answer says whether etcd created the watch; a panic in the client must not
    // take the watch task down with it.
    let opening = async {
        let stream = client.watch_client().watch(prefix, Some(options)).await?;
        let (requests, mut responses) = stream.split();
        let first = responses.message().await?.ok_or_else(|| {
            etcd_client::Error::WatchError("the watch stream closed before it was created".into())
        })?;
        if !first.created() || first.canceled() {
            return Err(etcd_client::Error::WatchError(format!(
                "the watch was not created: {}",
                first.cancel_reason()
            )));
        }
        Ok(Open {
            id: first.watch_id(),
            requests,
            responses,
        })
    };
    match AssertUnwindSafe(opening).catch_unwind().await {
        Ok(opened) => opened,
        Err(_) => Err(etcd_client::Error::WatchError(
            "the watch was not created".into(),
        )),
    }
}

/// When the watch is needed: it runs only while some waiter of this backend listens, so
/// that a backend whose locks are not contended costs etcd no watch event per release.
///
/// A refused attempt asks for deletes from the revision after the one it saw
/// ([`ensure`](Self::ensure)). Its waiter listens from before that attempt until it is
/// woken, and the watch closes only when nobody listens, so it cannot close between the
/// request and the delete.
pub(crate) struct Demand {
    state: Mutex<DemandState>,
    wake: Notify,
    notices: Arc<ReleaseNotices>,
}

#[derive(Default)]
struct DemandState {
    /// A watch is open (or opening) that reports every delete from `covered_from` on.
    running: bool,
    covered_from: i64,
    /// The earliest revision asked for while no watch ran.
    wanted_from: Option<i64>,
}

impl Demand {
    pub(crate) fn new(notices: Arc<ReleaseNotices>) -> Self {
        Demand {
            state: Mutex::default(),
            wake: Notify::new(),
            notices,
        }
    }

    /// Makes sure deletes of `key` from revision `from` on are announced: starts the watch
    /// from there when none runs; when the running one started later, wakes the key's
    /// listeners at once (their next attempt sees a revision the watch covers).
    pub(crate) fn ensure(&self, key: &str, from: i64) {
        let mut state = lock(&self.state);
        if state.running {
            if from < state.covered_from {
                drop(state);
                self.notices.notify(key);
            }
            return;
        }
        state.wanted_from = Some(state.wanted_from.map_or(from, |w| w.min(from)));
        drop(state);
        self.wake.notify_one();
    }

    /// Whether a watch runs (or is being opened).
    pub(crate) fn is_running(&self) -> bool {
        lock(&self.state).running
    }

    /// Waits until a watch is asked for; returns the revision to start it from.
    async fn wanted(&self) -> i64 {
        loop {
            let woken = self.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            {
                let mut state = lock(&self.state);
                if let Some(from) = state.wanted_from.take() {
                    state.running = true;
                    state.covered_from = from;
                    return from;
                }
            }
            woken.await;
        }
    }

    /// The watch is reopened from revision `from`, everything before it announced.
    fn covered_from(&self, from: i64) {
        lock(&self.state).covered_from = from;
    }

    /// Ends the running watch's term when nobody listens; true if it did.
    fn idle(&self) -> bool {
        let mut state = lock(&self.state);
        if self.notices.listened_keys() > 0 || state.wanted_from.is_some() {
            return false;
        }
        state.running = false;
        true
    }
}

/// Follows the watch for the life of the backend, while it is needed ([`Demand`]): every
/// delete under the prefix wakes the listeners of that key. When the stream cannot be
/// opened, fails or falls silent, a new one is opened from the current revision and every
/// listener is woken, since deletes in between were not seen.
pub(crate) async fn run(
    members: Arc<Members>,
    prefix: String,
    announcer: Arc<Announcer>,
    timeout: Duration,
    demand: Arc<Demand>,
    kind: Kind,
) {
    let notices = &announcer.notices;
    let mut retry = lock_core::Backoff::new(RETRY_MIN, RETRY_MAX);
    loop {
        let mut from = demand.wanted().await;
        loop {
            let (member, client) = members.pick();
            let opened = tokio::time::timeout(timeout, open(&client, &prefix, from, kind)).await;
            if let Ok(Ok(open)) = opened {
                retry.reset();
                let prefix = prefix.as_bytes();
                if follow(open, prefix, &announcer, timeout, &demand, kind).await {
                    break;
                }
                tracing::debug!("the etcd release watch ended; opening a new one");
            } else {
                tracing::debug!(?opened, "cannot open the etcd release watch; retrying");
            }
            members.suspect(member);
            tokio::time::sleep(retry.next_delay()).await;
            // Start over from now (a revision may have been compacted meanwhile), waking
            // every listener for the deletes that were not seen.
            let (_, client) = members.pick();
            let now = tokio::time::timeout(timeout, current_revision(&client, &prefix)).await;
            if let Ok(Ok(now)) = now {
                from = now + 1;
                demand.covered_from(from);
                notices.notify_all();
            }
        }
    }
}

/// The store's current revision, from the header of a one-key read under `prefix`.
pub(crate) async fn current_revision(
    client: &Client,
    prefix: &str,
) -> Result<i64, etcd_client::Error> {
    let one_key = GetOptions::new()
        .with_prefix()
        .with_keys_only()
        .with_limit(1);
    let answer = client.kv_client().get(prefix, Some(one_key)).await?;
    answer
        .header()
        .map(|h| h.revision())
        .ok_or_else(|| etcd_client::Error::InvalidArgs("a read without a header".into()))
}

/// Wakes the listeners `event` is for: a delete under the lock prefix wakes its lock's
/// (a holder key of permits its name's), any event under the leaders' root its election's.
fn dispatch(event: &etcd_client::Event, prefix: &[u8], announcer: &Announcer, kind: Kind) {
    let Some(kv) = event.kv() else { return };
    let Some(rest) = kv.key().strip_prefix(prefix) else {
        return;
    };
    match kind {
        Kind::Releases => {
            if event.event_type() != EventType::Delete {
                return;
            }
            if let Ok(key) = std::str::from_utf8(name_of(rest)) {
                announcer.deleted(key, kv.mod_revision());
            }
        }
        Kind::Leaders => {
            if let Some(key) = crate::leader_keys::election_of(rest) {
                announcer.notices.notify(key);
            }
        }
    }
}

/// Dispatches events until nobody listens (true), or the stream fails, is
/// cancelled, or stays silent too long (false).
async fn follow(
    open: Open,
    prefix: &[u8],
    announcer: &Announcer,
    timeout: Duration,
    demand: &Demand,
    kind: Kind,
) -> bool {
    let Open {
        id,
        mut requests,
        mut responses,
    } = open;
    let mut heard = Instant::now();
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.reset();
    loop {
        futures::select! {
            message = responses.message().fuse() => {
                let Ok(Some(response)) = message else { return false };
                heard = Instant::now();
                if response.canceled() {
                    return false;
                }
                for event in response.events() {
                    dispatch(event, prefix, announcer, kind);
                }
            }
            _ = tick.tick().fuse() => {
                if demand.idle() {
                    let _ = tokio::time::timeout(timeout, requests.cancel(id)).await;
                    return true;
                }
                if heard.elapsed() > PROGRESS_EVERY + timeout {
                    return false;
                }
                let asked = tokio::time::timeout(timeout, requests.request_progress()).await;
                if !matches!(asked, Ok(Ok(()))) {
                    return false;
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
