//! The rslock 0.10 peer of the redis and redlock benches (one node or several alike), kept
//! apart from `common` so that benches built without the redis features do not carry it.

use std::sync::Arc;
use std::time::Duration;

use crate::common::Subject;

/// Lease the peer asks for: longer than any round, so nothing expires mid-run.
const TTL: Duration = Duration::from_secs(30);

/// rslock's `LockManager` over the bench's nodes, waiting with its own retry loop.
pub struct Rslock {
    manager: rslock::LockManager,
}

impl Rslock {
    /// A manager over the nodes at `urls`.
    pub fn new(urls: Vec<String>) -> Arc<Self> {
        Arc::new(Rslock {
            manager: rslock::LockManager::new(urls),
        })
    }
}

impl Subject for Rslock {
    type Guard = rslock::Lock;
    async fn lock(&self, key: Arc<str>) -> rslock::Lock {
        self.manager
            .acquire_no_guard(&*key, TTL)
            .await
            .expect("rslock acquire")
    }
    async fn unlock(&self, lock: rslock::Lock) {
        self.manager.unlock(&lock).await;
    }
}
