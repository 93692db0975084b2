//! Release notices: how a waiter learns at once that a key was released.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::sync::lock;

/// A per-key hub of release notices, shared by a backend's notification source (its own
/// release path, a Redis subscription, an etcd watch) and the waiters of its keys.
///
/// A waiter calls [`listen`](Self::listen) *before* its attempt, so a release that happens
/// between a refused attempt and the wait is not missed. Entries exist only while someone
/// listens on the key.
#[derive(Default)]
pub struct ReleaseNotices {
    inner: Arc<Hub>,
}

#[derive(Default)]
struct Hub {
    map: Mutex<HashMap<Arc<str>, watch::Sender<u64>>>,
    /// Number of keys in `map`, so a release with no waiters skips the lock.
    keys: std::sync::atomic::AtomicUsize,
}

impl ReleaseNotices {
    /// An empty hub.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts listening for the next release of `key`.
    pub fn listen(&self, key: &str) -> ReleaseListener {
        let mut map = lock(&self.inner.map);
        let rx = match map.get(key) {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = watch::channel(0);
                map.insert(Arc::from(key), tx);
                self.inner.keys.fetch_add(1, Ordering::SeqCst);
                rx
            }
        };
        ReleaseListener {
            rx: Some(rx),
            key: Arc::from(key),
            hub: self.inner.clone(),
        }
    }

    /// Wakes every listener of `key`; a no-op when nobody listens.
    pub fn notify(&self, key: &str) {
        if self.inner.keys.load(Ordering::SeqCst) == 0 {
            return;
        }
        let map = lock(&self.inner.map);
        if let Some(tx) = map.get(key) {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Wakes every listener of every key (after a reconnect, when notices may have been lost).
    pub fn notify_all(&self) {
        let map = lock(&self.inner.map);
        for tx in map.values() {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Number of keys with at least one listener.
    pub fn listened_keys(&self) -> usize {
        self.inner.keys.load(Ordering::SeqCst)
    }
}

impl std::fmt::Debug for ReleaseNotices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseNotices")
            .field("listened_keys", &self.listened_keys())
            .finish()
    }
}

/// One waiter's registration for the next release of a key; dropping it unregisters.
pub struct ReleaseListener {
    rx: Option<watch::Receiver<u64>>,
    key: Arc<str>,
    hub: Arc<Hub>,
}

impl ReleaseListener {
    /// Resolves at the first release notice for the key after this listener was created.
    pub async fn released(&mut self) {
        match self.rx.as_mut() {
            Some(rx) => {
                if rx.changed().await.is_err() {
                    // The hub is gone (backend dropped): nothing will ever notify.
                    std::future::pending::<()>().await
                }
            }
            None => std::future::pending::<()>().await,
        }
    }
}

impl Drop for ReleaseListener {
    fn drop(&mut self) {
        let mut map = lock(&self.hub.map);
        drop(self.rx.take());
        if let Some(tx) = map.get(&*self.key) {
            if tx.receiver_count() == 0 {
                map.remove(&*self.key);
                self.hub.keys.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

impl std::fmt::Debug for ReleaseListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseListener")
            .field("key", &self.key)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_notice_after_listen_wakes_and_entries_go_away() {
        let hub = ReleaseNotices::new();
        let mut l = hub.listen("k");
        hub.notify("other");
        hub.notify("k");
        tokio::time::timeout(Duration::from_secs(1), l.released())
            .await
            .expect("notice delivered");
        let mut l2 = hub.listen("k");
        assert!(
            tokio::time::timeout(Duration::from_millis(20), l2.released())
                .await
                .is_err(),
            "an older notice must not wake a newer listener"
        );
        drop(l);
        assert_eq!(hub.listened_keys(), 1);
        drop(l2);
        assert_eq!(hub.listened_keys(), 0);
    }
}
