//! The set of guards a Locker holds, for `shutdown` and `stats`: a slab per thread shard, so
//! registering and unregistering a guard is a push or a slot write on a mutex that tasks on
//! other threads rarely touch.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Number of shards (a power of two); threads pick theirs once.
const SHARDS: usize = 8;

/// Where an entry lives: its shard, slot and insertion number. A stale slot (its entry
/// removed or drained, the slot since reused) never reaches the newer entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    shard: u32,
    index: u32,
    generation: u64,
}

/// Entries of type `T`, each at a [`Slot`] handed out at insertion.
pub(crate) struct Registry<T> {
    shards: Box<[Padded<T>]>,
}

/// A shard on cache lines of its own.
#[repr(align(128))]
struct Padded<T>(Mutex<Slab<T>>);

struct Slab<T> {
    slots: Vec<Option<(u64, T)>>,
    free: Vec<u32>,
    len: usize,
    /// Insertions so far, never reset: the generation of the next entry.
    inserted: u64,
}

fn this_threads_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    SHARD.try_with(|s| *s).unwrap_or(0)
}

impl<T> Registry<T> {
    pub(crate) fn new() -> Self {
        Registry {
            shards: (0..SHARDS)
                .map(|_| {
                    Padded(Mutex::new(Slab {
                        slots: Vec::new(),
                        free: Vec::new(),
                        len: 0,
                        inserted: 0,
                    }))
                })
                .collect(),
        }
    }

    fn shard(&self, i: usize) -> MutexGuard<'_, Slab<T>> {
        crate::sync::lock(&self.shards[i].0)
    }

    /// Stores the entry `make` builds from its slot; returns what `make` returned besides.
    // Once per grant, from `GuardShared::start`: inlined there.
    #[inline]
    pub(crate) fn insert<R>(&self, make: impl FnOnce(Slot) -> (T, R)) -> R {
        let shard = this_threads_shard();
        let mut slab = self.shard(shard);
        let index = match slab.free.pop() {
            Some(i) => i,
            None => {
                slab.slots.push(None);
                // Slabs never hold 2^32 guards: memory runs out long before.
                u32::try_from(slab.slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        slab.inserted += 1;
        let generation = slab.inserted;
        let (entry, ret) = make(Slot {
            shard: shard as u32,
            index,
            generation,
        });
        slab.slots[index as usize] = Some((generation, entry));
        slab.len += 1;
        ret
    }

    /// Takes the entry at `slot` out; `None` if it was already removed (or drained).
    pub(crate) fn remove(&self, slot: Slot) -> Option<T> {
        let mut slab = self.shard(slot.shard as usize);
        let place = slab.slots.get_mut(slot.index as usize)?;
        if !matches!(place, Some((g, _)) if *g == slot.generation) {
            return None;
        }
        let (_, taken) = place.take()?;
        slab.len -= 1;
        if slab.len == 0 {
            // Back to baseline: no memory kept for guards long gone.
            slab.slots.clear();
            slab.free.clear();
            if slab.slots.capacity() > 64 {
                slab.slots.shrink_to(64);
                slab.free.shrink_to(64);
            }
        } else {
            slab.free.push(slot.index);
        }
        Some(taken)
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        (0..self.shards.len()).map(|i| self.shard(i).len).sum()
    }

    /// Takes every entry out.
    pub(crate) fn drain(&self) -> Vec<T> {
        let mut all = Vec::new();
        for i in 0..self.shards.len() {
            let mut slab = self.shard(i);
            all.extend(slab.slots.drain(..).flatten().map(|(_, entry)| entry));
            slab.free.clear();
            slab.len = 0;
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_and_removal_is_once() {
        let r = Registry::new();
        let a = r.insert(|s| ("a", s));
        let b = r.insert(|s| ("b", s));
        assert_ne!(a, b);
        assert_eq!(r.len(), 2);
        assert_eq!(r.remove(a), Some("a"));
        assert_eq!(r.remove(a), None, "a slot is removed once");
        let c = r.insert(|s| ("c", s));
        assert_eq!(c.index, a.index, "a freed slot is reused");
        assert_eq!(
            r.remove(a),
            None,
            "a stale slot never removes the newer entry"
        );
        assert_eq!(r.remove(b), Some("b"));
        assert_eq!(r.remove(c), Some("c"));
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn drain_empties_every_shard_and_stale_slots_stay_harmless() {
        let r = std::sync::Arc::new(Registry::new());
        let slots: Vec<Slot> = (0..4)
            .map(|t| {
                let r = r.clone();
                std::thread::spawn(move || r.insert(|s| (t, s)))
                    .join()
                    .unwrap()
            })
            .collect();
        assert_eq!(r.len(), 4);
        let mut drained = r.drain();
        drained.sort_unstable();
        assert_eq!(drained, vec![0, 1, 2, 3]);
        assert_eq!(r.len(), 0);
        let fresh = r.insert(|s| (9, s));
        for s in slots {
            assert_eq!(r.remove(s), None);
        }
        assert_eq!(r.len(), 1, "stale slots left the new entry alone");
        assert_eq!(r.remove(fresh), Some(9));
    }
}
