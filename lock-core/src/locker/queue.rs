//! The per-key FIFO queues of a Locker: only the waiter holding a key's turn attempts on
//! the backend, and the queue remembers which local guards hold the key, so the head waiter
//! waits for one of them to end instead of spending attempts the server is certain to
//! refuse ([`QueueEntry::blocking`]).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::capabilities::Ttl;
use crate::lease::{Lease, Owner};
use crate::permits::Permits;
use crate::sync::lock;

/// Local holders of one key: few (at most its permits' worth held at once, in practice).
type Holders = Vec<Weak<dyn LocalHolder>>;

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

/// A key's local queue: the turn its waiters take in order, and the guards of this Locker
/// known to hold the key (those that won it through the queue, and dropped guards whose
/// release is on its way).
#[derive(Default)]
pub(crate) struct QueueEntry {
    pub(crate) turn: tokio::sync::Mutex<()>,
    /// Each recorded holder once; pruned of ended and not-live ones when one is added or
    /// ends.
    holders: Mutex<Holders>,
    /// The head waiter's request to be handed the key by one of those holders (backends
    /// that hand over, see [`handover`](super::handover)).
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
    /// The live local holders that make a claim of `permits` certain to be refused, or none
    /// when the server is to decide.
    ///
    /// A refusal is certain when one holder's claim and ours cannot be held together
    /// ([`Permits::excludes`]: any holder, for a lock; a reader for a writer and the other
    /// way round), or when the takes of the holders of a key of the same `of` as ours,
    /// with our take, come to more than `of` (a semaphore whose permits the Locker's own
    /// guards hold). The holders returned are those that rule counts: any one of them
    /// ending may free what we claim. Only live holders count: one whose validity passed
    /// blocks nobody, and the server tells when the key is free.
    pub(crate) fn blocking(&self, permits: Permits) -> Vec<Arc<dyn LocalHolder>> {
        let holders = lock(&self.holders);
        let live = || {
            holders
                .iter()
                .filter_map(Weak::upgrade)
                .filter(|h| h.is_live())
        };
        // Decided first without allocating: most turns find the server to decide.
        let (mut alone, mut taken) = (false, u64::from(permits.take()));
        for held in live().map(|h| h.permits()) {
            alone |= held.excludes(permits);
            if held.of() == permits.of() {
                taken += u64::from(held.take());
            }
        }
        if !alone && taken <= u64::from(permits.of()) {
            return Vec::new();
        }
        live()
            .filter(|h| {
                let held = h.permits();
                held.excludes(permits) || held.of() == permits.of()
            })
            .collect()
    }

    /// Whether a recorded holder is live (then the entry stays, for the waiters to come).
    fn has_live_holder(&self) -> bool {
        lock(&self.holders)
            .iter()
            .filter_map(Weak::upgrade)
            .any(|h| h.is_live())
    }

    /// Records a guard of this Locker holding the key: one that won it through this queue,
    /// or a dropped one whose release is on its way. A guard recorded twice (won through
    /// the queue, then dropped) is kept once; ended and not-live holders are let go.
    pub(crate) fn add_holder(&self, holder: Weak<dyn LocalHolder>) {
        let mut holders = lock(&self.holders);
        forget(&mut holders, holder.as_ptr() as *const ());
        holders.push(holder);
    }

    /// Forgets `holder`, which has ended (and any other holder found ended meanwhile).
    fn remove_holder(&self, holder: &dyn LocalHolder) {
        forget(&mut lock(&self.holders), holder_id(holder));
    }

    /// Whether `holder` is one of the guards recorded as holding this key.
    pub(crate) fn is_holder(&self, holder: &dyn LocalHolder) -> bool {
        let id = holder_id(holder);
        lock(&self.holders)
            .iter()
            .any(|h| h.as_ptr() as *const () == id)
    }
}

/// Drops the holder whose address is `id` from `holders`, and every holder ended or no
/// longer live.
fn forget(holders: &mut Holders, id: *const ()) {
    holders.retain(|h| h.as_ptr() as *const () != id && h.upgrade().is_some_and(|h| h.is_live()));
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

    /// Records `holder` as a local guard holding `key` (a dropped guard whose release is on
    /// its way), making the key's entry if it has none; the entry goes when no recorded
    /// holder is live any more ([`holder_ended`](Self::holder_ended)) and nobody is queued.
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
        entry.add_holder(holder);
    }

    /// Runs `f` on `key`'s entry, if the key has one.
    pub(crate) fn with_entry<R>(&self, key: &str, f: impl FnOnce(&QueueEntry) -> R) -> Option<R> {
        if self.queued.load(Ordering::SeqCst) == 0 {
            return None;
        }
        lock(&self.map).get(key).map(|entry| f(entry))
    }

    /// Forgets `holder`, one of `key`'s local holders, which has ended; removes the key's
    /// entry when nobody is queued and no live holder is left.
    pub(crate) fn holder_ended(&self, holder: &dyn LocalHolder, key: &str) {
        if self.queued.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut map = lock(&self.map);
        let Some(entry) = map.get(key) else {
            return;
        };
        entry.remove_holder(holder);
        if Arc::strong_count(entry) == 1 && !entry.has_live_holder() {
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
        // The map holds one reference and we hold one: nobody else is queued. A key with a
        // live local holder keeps its entry until the last one ends
        // ([`Queues::holder_ended`]), so that the next waiter queues behind them.
        if Arc::strong_count(&self.turn) == 2 && !self.turn.has_live_holder() {
            map.remove(self.key);
            self.queues.queued.fetch_sub(1, Ordering::SeqCst);
        }
    }
}
