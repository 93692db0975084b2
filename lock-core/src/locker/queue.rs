//! The per-key FIFO queues of a Locker: only the waiter holding a key's turn attempts on
//! the backend, and the queue remembers which local guard holds the key, so the head waiter
//! waits for that guard's end instead of spending refused attempts on the server.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::capabilities::Ttl;
use crate::lease::{Lease, Owner};
use crate::permits::Permits;
use crate::sync::lock;

/// What the queue knows of the local guard holding a key.
pub(crate) trait LocalHolder: Send + Sync {
    /// Whether the guard still holds: not known gone and its validity not passed. A holder
    /// whose validity passed (not renewed, not yet dropped) is not one: the waiter then
    /// tries the server, which tells when the key is free.
    fn is_live(&self) -> bool;

    /// Resolves as soon as the hold is known ended (released, lost, validity passed).
    fn ended(self: Arc<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>>;

    /// The permits the guard holds of its key.
    fn permits(&self) -> Permits;
}

/// The address of a holder, to compare holders without comparing vtables.
pub(crate) fn holder_id(holder: &dyn LocalHolder) -> *const () {
    holder as *const dyn LocalHolder as *const ()
}

/// A key's local queue: the turn its waiters take in order, and the guard of the waiter
/// that last won it through the queue.
#[derive(Default)]
pub(crate) struct QueueEntry {
    pub(crate) turn: tokio::sync::Mutex<()>,
    holder: Mutex<Option<Weak<dyn LocalHolder>>>,
    /// The head waiter's request to be handed the key by that holder (backends that hand
    /// over, see [`handover`](super::handover)).
    pub(crate) hand_over: Mutex<Option<HandOverRequest>>,
    /// Hand-overs in a row since a waiter last won the key through the server.
    pub(crate) handed: AtomicU32,
}

/// A waiter's request to receive the key straight from its holder.
pub(crate) struct HandOverRequest {
    pub(crate) owner: Owner,
    /// What the waiter claims: handed over only by a holder of the same claim.
    pub(crate) permits: Permits,
    pub(crate) ttl: Ttl,
    /// Where the holder sends the new lease; dropped unsent when the hand-over did not happen.
    pub(crate) reply: Option<tokio::sync::oneshot::Sender<Lease>>,
}

impl QueueEntry {
    /// The guard of this Locker that holds the key, if one does and it is live.
    pub(crate) fn local_holder(&self) -> Option<Arc<dyn LocalHolder>> {
        lock(&self.holder)
            .as_ref()
            .and_then(Weak::upgrade)
            .filter(|g| g.is_live())
    }

    /// Records the guard that won the key through this queue.
    pub(crate) fn set_holder(&self, holder: Weak<dyn LocalHolder>) {
        *lock(&self.holder) = Some(holder);
    }

    /// Whether `holder` is the guard recorded as this key's holder.
    pub(crate) fn is_holder(&self, holder: &dyn LocalHolder) -> bool {
        lock(&self.holder)
            .as_ref()
            .is_some_and(|h| h.as_ptr() as *const () == holder_id(holder))
    }
}

/// A shared handle on a key's queue entry.
pub(crate) type Turn = Arc<QueueEntry>;

/// The queues of one Locker, by key.
#[derive(Default)]
pub(crate) struct Queues {
    map: Mutex<HashMap<Arc<str>, Turn>>,
    /// Number of keys in `map`, so the uncontended path skips the map.
    queued: AtomicUsize,
}

impl Queues {
    /// Number of keys with a queue.
    pub(crate) fn len(&self) -> usize {
        lock(&self.map).len()
    }

    /// Whether nobody of this Locker is queued on `key` (then trying first is fair).
    pub(crate) fn is_free(&self, key: &str) -> bool {
        self.queued.load(Ordering::SeqCst) == 0 || !lock(&self.map).contains_key(key)
    }

    /// Joins `key`'s queue; the membership ends when the slot is dropped.
    pub(crate) fn join<'a>(&'a self, key: &'a str) -> QueueSlot<'a> {
        let mut map = lock(&self.map);
        let turn = match map.get(key) {
            Some(turn) => turn.clone(),
            None => {
                let turn = Turn::default();
                map.insert(Arc::from(key), turn.clone());
                self.queued.fetch_add(1, Ordering::SeqCst);
                turn
            }
        };
        QueueSlot {
            queues: self,
            key,
            turn,
        }
    }

    /// Records `holder` as the local guard holding `key` (a dropped guard whose release is
    /// on its way), making the key's entry if it has none; the entry goes when the holder
    /// ends ([`holder_ended`](Self::holder_ended)) and nobody is queued.
    pub(crate) fn hold(&self, key: &Arc<str>, holder: Weak<dyn LocalHolder>) {
        let mut map = lock(&self.map);
        let entry = match map.get(&**key) {
            Some(entry) => entry.clone(),
            None => {
                let entry = Turn::default();
                map.insert(key.clone(), entry.clone());
                self.queued.fetch_add(1, Ordering::SeqCst);
                entry
            }
        };
        entry.set_holder(holder);
    }

    /// Runs `f` on `key`'s entry, if the key has one.
    pub(crate) fn with_entry<R>(&self, key: &str, f: impl FnOnce(&QueueEntry) -> R) -> Option<R> {
        if self.queued.load(Ordering::SeqCst) == 0 {
            return None;
        }
        lock(&self.map).get(key).map(|entry| f(entry))
    }

    /// Removes `key`'s queue entry when `holder`, the guard it was kept for, has ended and
    /// nobody is queued.
    pub(crate) fn holder_ended(&self, holder: &dyn LocalHolder, key: &str) {
        if self.queued.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut map = lock(&self.map);
        let Some(entry) = map.get(key) else {
            return;
        };
        if Arc::strong_count(entry) == 1 && entry.is_holder(holder) {
            map.remove(key);
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A waiter's membership of a key's queue; removes the key's queue when the last member
/// leaves.
pub(crate) struct QueueSlot<'a> {
    queues: &'a Queues,
    key: &'a str,
    pub(crate) turn: Turn,
}

impl Drop for QueueSlot<'_> {
    fn drop(&mut self) {
        let mut map = lock(&self.queues.map);
        // The map holds one reference and we hold one: nobody else is queued. A key whose
        // holder won it through the queue keeps its entry until that guard ends
        // ([`Queues::holder_ended`]), so that the next waiter queues behind it.
        if Arc::strong_count(&self.turn) == 2 && self.turn.local_holder().is_none() {
            map.remove(self.key);
            self.queues.queued.fetch_sub(1, Ordering::SeqCst);
        }
    }
}
