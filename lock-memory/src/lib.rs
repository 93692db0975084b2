#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
// docs.rs marks each item with the Cargo features it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod claims;
mod coarse;
mod config;
mod leaders;
mod records;

use lock_core::sync::lock;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use hashbrown::HashTable;
use lock_core::{
    Admin, Attempt, Backend, Capabilities, Error, Holder, Immediate, Lease, Owner, Permits,
    ReleaseListener, ReleaseNotices, Result, Ttl,
};

/// Number of independently locked shards of the table (a power of two): tasks on different
/// keys rarely meet on one mutex.
const SHARDS: usize = 16;

const CAPABILITIES: Capabilities = Capabilities::new("memory")
    .min_ttl(Duration::from_millis(1))
    .ttl_granularity(Duration::from_millis(1))
    // Far beyond any sensible lease, and small enough that `Instant + ttl` never overflows.
    .max_ttl(Duration::from_secs(365 * 24 * 3600))
    .monotonic_fencing(true)
    .release_notices(true)
    .cross_process(false)
    .clock_drift(lock_core::ClockDrift::NONE)
    .max_permits(lock_core::MAX_PERMITS);

/// One grant on a key: its owner, the permits it takes, its fence and validity.
#[derive(Clone, Copy)]
struct Grant {
    owner: Owner,
    take: u32,
    fence: u64,
    valid_until: Instant,
}

/// A key's grants: one for a lock, up to its `of` permits' worth for a semaphore or a
/// reader-writer key.
struct Entry {
    /// Shared with the holder's lease: no second copy of the key per hold.
    key: Arc<str>,
    hash: u64,
    /// The key's permits ([`Permits::of`]), as its holders claim them.
    of: u32,
    /// The first grant (a lock's only one).
    first: Grant,
    /// The other grants of a key with several permits (empty, unallocated, for a lock).
    more: Vec<Grant>,
}

impl Entry {
    /// Drops the grants expired by `now`; false when none is left.
    fn keep_live(&mut self, now: Instant) -> bool {
        if !self.more.is_empty() {
            self.more.retain(|g| g.valid_until > now);
        }
        if self.first.valid_until <= now {
            match self.more.pop() {
                Some(next) => self.first = next,
                None => return false,
            }
        }
        true
    }

    /// Whether any grant is unexpired at `now`.
    fn any_live(&self, now: Instant) -> bool {
        self.first.valid_until > now || self.more.iter().any(|g| g.valid_until > now)
    }

    fn grants(&self) -> impl Iterator<Item = &Grant> {
        std::iter::once(&self.first).chain(self.more.iter())
    }

    fn grant_mut(&mut self, owner: Owner) -> Option<&mut Grant> {
        std::iter::once(&mut self.first)
            .chain(self.more.iter_mut())
            .find(|g| g.owner == owner)
    }
}

/// A shard on cache lines of its own, so threads working on two shards do not slow each
/// other down.
#[repr(align(128))]
struct Padded(Mutex<Shard>);

struct Shard {
    entries: HashTable<Entry>,
    /// Size after the last sweep of expired entries; the next sweep runs at twice that.
    swept_at: usize,
    /// The last fencing token this shard granted. A key always lives in the same shard, so
    /// a per-shard counter strictly increases across the successive holders of each key.
    last_fence: u64,
}

/// The in-process lock table. Build a [`Locker`](lock_core::Locker) over it with
/// `Locker::new(MemoryBackend::new())`.
pub struct MemoryBackend {
    shards: Box<[Padded]>,
    /// Seeded fast hashing: keys may come from users, so the seed stays random.
    hasher: foldhash::fast::RandomState,
    notices: ReleaseNotices,
    /// Answers "expired yet?" on release without a precise clock reading.
    clock: coarse::CoarseClock,
    /// The scheduler's run history, kept beside the locks.
    history: records::History,
    /// The scheduler's fire-time claims, kept beside the locks.
    claims: claims::Claims,
    leaders: leaders::Leaders,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("held_keys", &self.held_keys())
            .field("listened_keys", &self.notices.listened_keys())
            .finish()
    }
}

impl MemoryBackend {
    /// An empty lock table.
    pub fn new() -> Self {
        MemoryBackend {
            shards: (0..SHARDS)
                .map(|_| {
                    Padded(Mutex::new(Shard {
                        entries: HashTable::new(),
                        swept_at: 0,
                        last_fence: 0,
                    }))
                })
                .collect(),
            hasher: foldhash::fast::RandomState::default(),
            notices: ReleaseNotices::new(),
            clock: coarse::CoarseClock::new(),
            history: records::History::default(),
            claims: claims::Claims::default(),
            leaders: leaders::Leaders::default(),
        }
    }

    /// Number of entries in the table (holders, including expired ones not yet swept).
    pub fn held_keys(&self) -> usize {
        self.shards.iter().map(|s| lock(&s.0).entries.len()).sum()
    }

    /// Number of keys that waiters listen on.
    pub fn listened_keys(&self) -> usize {
        self.notices.listened_keys()
    }

    /// The key's hash and its shard, locked.
    fn shard(&self, key: &str) -> (u64, MutexGuard<'_, Shard>) {
        let hash = self.hasher.hash_one(key);
        // The top bits pick the shard; the table uses the low bits and the control bytes.
        let shard = (hash >> 60) as usize % SHARDS;
        (hash, lock(&self.shards[shard].0))
    }
}

impl Shard {
    fn sweep_if_due(&mut self, now: Instant) {
        if self.entries.len() >= 64 && self.entries.len() >= self.swept_at * 2 {
            self.entries.retain(|e| e.any_live(now));
            self.swept_at = self.entries.len();
        }
    }

    fn find_mut(&mut self, hash: u64, key: &str) -> Option<&mut Entry> {
        self.entries.find_mut(hash, |e| *e.key == *key)
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn capabilities(&self) -> &Capabilities {
        &CAPABILITIES
    }

    async fn try_acquire(
        &self,
        key: &str,
        owner: Owner,
        permits: Permits,
        ttl: Ttl,
    ) -> Result<Attempt> {
        self.acquire_in_table(key, owner, permits, ttl, || Arc::from(key))
    }

    async fn extend(&self, lease: &Lease, ttl: Ttl) -> Result<Instant> {
        let now = Instant::now();
        let (hash, mut shard) = self.shard(lease.key());
        let grant = shard
            .find_mut(hash, lease.key())
            .and_then(|e| e.grant_mut(lease.owner()));
        match grant {
            Some(g) if g.valid_until > now => {
                g.valid_until = now + ttl.get();
                Ok(g.valid_until)
            }
            _ => Err(lease.not_held()),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.release_in_table(lease)
    }

    fn listen(&self, key: &str) -> Option<ReleaseListener> {
        Some(self.notices.listen(key))
    }

    fn admin(&self) -> Option<&dyn Admin> {
        Some(self)
    }

    fn immediate(&self) -> Option<&dyn Immediate> {
        Some(self)
    }

    fn run_records(&self) -> Option<&dyn lock_core::records::RunRecords> {
        Some(&self.history)
    }

    fn fire_claims(&self) -> Option<&dyn lock_core::claims::FireClaims> {
        Some(&self.claims)
    }

    fn leader_values(&self) -> Option<&dyn lock_core::election::LeaderValues> {
        Some(self)
    }
}

impl Immediate for MemoryBackend {
    fn try_acquire(
        &self,
        key: &Arc<str>,
        owner: Owner,
        permits: Permits,
        ttl: Ttl,
    ) -> Result<Attempt> {
        self.acquire_in_table(key, owner, permits, ttl, || key.clone())
    }

    fn release(&self, lease: &Lease) -> Result<()> {
        self.release_in_table(lease)
    }
}

#[async_trait]
impl Admin for MemoryBackend {
    async fn inspect(&self, key: &str) -> Result<Vec<Holder>> {
        let now = Instant::now();
        let (hash, shard) = self.shard(key);
        let Some(e) = shard.entries.find(hash, |e| *e.key == *key) else {
            return Ok(Vec::new());
        };
        Ok(e.grants()
            .filter(|g| g.valid_until > now)
            .map(|g| {
                // Every grant in the table passed `Permits::new` when it was made.
                let permits = Permits::new(g.take, e.of).unwrap_or(Permits::LOCK);
                Holder::new(Some(g.owner), Some(g.fence), Some(g.valid_until - now))
                    .permits(permits)
            })
            .collect())
    }

    async fn force_release(&self, key: &str) -> Result<bool> {
        let now = Instant::now();
        let (hash, mut shard) = self.shard(key);
        let removed = shard
            .entries
            .find_entry(hash, |e| *e.key == *key)
            .ok()
            .map(|found| found.remove().0);
        drop(shard);
        self.notices.notify(key);
        Ok(removed.is_some_and(|e| e.any_live(now)))
    }
}

/// Leaders' values: the value is kept beside the table only while the lease's owner holds
/// the key (the shard stays locked meanwhile), and read back only for the key's holder.
#[async_trait]
impl lock_core::election::LeaderValues for MemoryBackend {
    async fn publish(&self, lease: &Lease, value: &[u8]) -> Result<()> {
        let now = Instant::now();
        let kept = {
            // The table's shard stays locked until the value is kept: no release between.
            let (hash, shard) = self.shard(lease.key());
            let holds = shard
                .entries
                .find(hash, |e| *e.key == *lease.key())
                .is_some_and(|e| {
                    e.grants()
                        .any(|g| g.owner == lease.owner() && g.valid_until > now)
                });
            if !holds {
                return Err(lease.not_held());
            }
            self.leaders
                .keep(lease.key(), lease.owner(), lease.fence(), value)
        };
        if kept > leaders::PRUNE_AT {
            self.leaders
                .prune(|key, owner| self.holder(key, now).is_some_and(|(o, _)| o == owner));
        }
        self.notices.notify(lease.key());
        Ok(())
    }

    async fn leader(&self, key: &str) -> Result<Option<lock_core::election::Leader>> {
        let now = Instant::now();
        let Some((owner, valid_until)) = self.holder(key, now) else {
            return Ok(None);
        };
        Ok(self.leaders.of(key, owner).map(|(term, value)| {
            lock_core::election::Leader::new(value, term, owner, Some(valid_until - now))
        }))
    }

    async fn announce(&self, key: &str) -> Result<()> {
        self.notices.notify(key);
        Ok(())
    }
}

impl MemoryBackend {
    /// The owner and validity of `key`'s first live grant (a leadership's, for a lock).
    fn holder(&self, key: &str, now: Instant) -> Option<(Owner, Instant)> {
        let (hash, shard) = self.shard(key);
        let entry = shard.entries.find(hash, |e| *e.key == *key)?;
        let g = entry.grants().find(|g| g.valid_until > now)?;
        Some((g.owner, g.valid_until))
    }
}

/// The table operations, synchronous: the async trait methods and [`Immediate`] both call
/// them.
impl MemoryBackend {
    /// `shared_key` gives the key as stored in a new entry (the caller's own `Arc` when it
    /// has one).
    fn acquire_in_table(
        &self,
        key: &str,
        owner: Owner,
        permits: Permits,
        ttl: Ttl,
        shared_key: impl FnOnce() -> Arc<str>,
    ) -> Result<Attempt> {
        let now = Instant::now();
        // A `Ttl` is at most `max_ttl` (a year): `now + ttl` cannot overflow.
        let valid_until = now + ttl.get();
        let (hash, mut guard) = self.shard(key);
        let shard = &mut *guard;
        let take = permits.take();
        match shard.entries.find_mut(hash, |e| *e.key == *key) {
            Some(held) => {
                let grant = |fence| Grant {
                    owner,
                    take,
                    fence,
                    valid_until,
                };
                if !held.keep_live(now) {
                    // Every grant expired: the key starts over with this claim.
                    shard.last_fence += 1;
                    let fence = shard.last_fence;
                    held.of = permits.of();
                    held.first = grant(fence);
                    return Ok(Attempt::Granted { fence, valid_until });
                }
                if held.of != permits.of() {
                    return Err(Error::InvalidPermits {
                        reason: format!(
                            "key {key:?} is held with {} permits, not {}",
                            held.of,
                            permits.of()
                        ),
                    });
                }
                let taken: u64 = held.grants().map(|g| u64::from(g.take)).sum();
                if taken + u64::from(take) > u64::from(held.of) {
                    let first_free = held.grants().map(|g| g.valid_until).min();
                    return Ok(Attempt::Taken {
                        expires_in: first_free.map(|at| at - now),
                    });
                }
                shard.last_fence += 1;
                let fence = shard.last_fence;
                held.more.push(grant(fence));
                Ok(Attempt::Granted { fence, valid_until })
            }
            None => {
                shard.sweep_if_due(now);
                shard.last_fence += 1;
                let fence = shard.last_fence;
                shard.entries.insert_unique(
                    hash,
                    Entry {
                        key: shared_key(),
                        hash,
                        of: permits.of(),
                        first: Grant {
                            owner,
                            take,
                            fence,
                            valid_until,
                        },
                        more: Vec::new(),
                    },
                    |e| e.hash,
                );
                Ok(Attempt::Granted { fence, valid_until })
            }
        }
    }

    fn release_in_table(&self, lease: &Lease) -> Result<()> {
        let (hash, mut shard) = self.shard(lease.key());
        let Ok(mut found) = shard.entries.find_entry(hash, |e| *e.key == *lease.key()) else {
            return Err(lease.not_held());
        };
        let entry = found.get_mut();
        let owner = lease.owner();
        let released = if entry.first.owner == owner {
            let grant = entry.first;
            match entry.more.pop() {
                Some(next) => entry.first = next,
                None => drop(found.remove()),
            }
            grant
        } else {
            match entry.more.iter().position(|g| g.owner == owner) {
                Some(i) => entry.more.swap_remove(i),
                None => return Err(lease.not_held()),
            }
        };
        drop(shard);
        self.notices.notify(lease.key());
        if self.clock.ahead(released.valid_until) {
            Ok(())
        } else {
            Err(lease.not_held())
        }
    }
}
