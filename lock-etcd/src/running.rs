//! The operations that may grant a lock still on their way, for `abandon` to wait for.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use lock_core::sync::lock;
use lock_core::Owner;
use tokio::sync::watch;

/// The operations still running, by the owner token they may grant to.
#[derive(Default)]
pub(crate) struct Running {
    by_owner: Mutex<HashMap<u128, watch::Receiver<bool>>>,
}

impl Running {
    /// Records an operation that may grant to `owner`; `done` turns true when it finished.
    pub(crate) fn insert(&self, owner: Owner, done: watch::Receiver<bool>) {
        lock(&self.by_owner).insert(owner.as_u128(), done);
    }

    /// Forgets the operation of `owner` (it finished).
    pub(crate) fn remove(&self, owner: Owner) {
        lock(&self.by_owner).remove(&owner.as_u128());
    }

    /// Waits, at most `limit`, until the operation that may grant to `owner` (if one still
    /// runs) has finished; its grant, if any, is then in the held table.
    pub(crate) async fn settled(&self, owner: Owner, limit: Duration) {
        let done = lock(&self.by_owner).get(&owner.as_u128()).cloned();
        if let Some(mut done) = done {
            let _ = tokio::time::timeout(limit, done.wait_for(|finished| *finished)).await;
        }
    }
}
