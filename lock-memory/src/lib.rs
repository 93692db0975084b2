//! # lock-memory
//!
//! The embedded default backend of distlock: an in-process keyed async mutex with TTLs and
//! fencing tokens. It excludes tasks of one process only (its capabilities say
//! `cross_process: false`); use it for single-instance services, tests, and to try the API.
//!
//! - A release wakes the waiters of that key at once through release notices; with one
//!   [`Locker`](lock_core::Locker) per backend (what `memory://` builds) exactly one
//!   waiter is woken, the head of the Locker's FIFO queue.
//! - A holder that neither renews nor releases loses the lock at its TTL; the waiter wakes
//!   at that instant by a timer set from the holder's remaining time, not by polling.
//! - Fencing tokens come from one counter for the whole backend, so they strictly increase
//!   across the successive holders of every key.
//! - An entry exists only while a key has a holder (expired entries are swept
//!   incrementally), and listeners only while a key has a waiter.
#![deny(missing_docs)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::{
    Attempt, Backend, Capabilities, Error, Holder, Lease, Owner, ReleaseListener, ReleaseNotices,
    Result,
};

const CAPABILITIES: Capabilities = Capabilities {
    name: "memory",
    min_ttl: Duration::from_millis(1),
    ttl_granularity: Duration::from_millis(1),
    // Far beyond any sensible lease, and small enough that `Instant + ttl` never overflows.
    max_ttl: Duration::from_secs(365 * 24 * 3600),
    monotonic_fencing: true,
    release_notices: true,
    cross_process: false,
};

struct Entry {
    owner: Owner,
    fence: u64,
    valid_until: Instant,
}

struct Table {
    /// Seeded fast hashing: keys may come from users, so the seed stays random.
    entries: HashMap<Box<str>, Entry, foldhash::fast::RandomState>,
    /// Size after the last sweep of expired entries; the next sweep runs at twice that.
    swept_at: usize,
}

/// The in-process lock table. Build a [`Locker`](lock_core::Locker) over it with
/// `Locker::new(MemoryBackend::new())`.
pub struct MemoryBackend {
    table: Mutex<Table>,
    next_fence: AtomicU64,
    notices: ReleaseNotices,
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
            table: Mutex::new(Table {
                entries: HashMap::default(),
                swept_at: 0,
            }),
            next_fence: AtomicU64::new(1),
            notices: ReleaseNotices::new(),
        }
    }

    /// Number of entries in the table (holders, including expired ones not yet swept).
    pub fn held_keys(&self) -> usize {
        self.table().entries.len()
    }

    /// Number of keys that waiters listen on.
    pub fn listened_keys(&self) -> usize {
        self.notices.listened_keys()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Table {
    fn sweep_if_due(&mut self, now: Instant) {
        if self.entries.len() >= 64 && self.entries.len() >= self.swept_at * 2 {
            self.entries.retain(|_, e| e.valid_until > now);
            self.swept_at = self.entries.len();
        }
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn capabilities(&self) -> &Capabilities {
        &CAPABILITIES
    }

    async fn try_acquire(&self, key: &str, owner: Owner, ttl: Duration) -> Result<Attempt> {
        self.acquire_in_table(key, owner, ttl)
    }

    fn try_acquire_now(&self, key: &str, owner: Owner, ttl: Duration) -> Option<Result<Attempt>> {
        Some(self.acquire_in_table(key, owner, ttl))
    }

    fn release_now(&self, lease: &Lease) -> Option<Result<()>> {
        Some(self.release_in_table(lease))
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.release_in_table(lease)
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Instant> {
        let now = Instant::now();
        let mut table = self.table();
        match table.entries.get_mut(lease.key()) {
            Some(e) if e.owner == lease.owner() && e.valid_until > now => {
                e.valid_until = now.checked_add(ttl).ok_or_else(|| Error::InvalidTtl {
                    ttl,
                    backend: CAPABILITIES.name,
                    reason: "does not fit the monotonic clock".into(),
                })?;
                Ok(e.valid_until)
            }
            _ => Err(not_held(lease)),
        }
    }

    fn listen(&self, key: &str) -> Option<ReleaseListener> {
        Some(self.notices.listen(key))
    }

    async fn inspect(&self, key: &str) -> Result<Option<Holder>> {
        let now = Instant::now();
        Ok(self
            .table()
            .entries
            .get(key)
            .filter(|e| e.valid_until > now)
            .map(|e| Holder {
                owner: Some(e.owner),
                fence: Some(e.fence),
                expires_in: Some(e.valid_until - now),
            }))
    }

    async fn force_release(&self, key: &str) -> Result<bool> {
        let now = Instant::now();
        let removed = self.table().entries.remove(key);
        self.notices.notify(key);
        Ok(removed.is_some_and(|e| e.valid_until > now))
    }
}

/// The table operations, synchronous: the async trait methods and their `_now` variants
/// both call them.
impl MemoryBackend {
    fn acquire_in_table(&self, key: &str, owner: Owner, ttl: Duration) -> Result<Attempt> {
        let now = Instant::now();
        let valid_until = now.checked_add(ttl).ok_or_else(|| Error::InvalidTtl {
            ttl,
            backend: CAPABILITIES.name,
            reason: "does not fit the monotonic clock".into(),
        })?;
        let mut table = self.table();
        match table.entries.get_mut(key) {
            Some(held) if held.valid_until > now => Ok(Attempt::Taken {
                expires_in: Some(held.valid_until - now),
            }),
            Some(expired) => {
                let fence = self.next_fence();
                *expired = Entry {
                    owner,
                    fence,
                    valid_until,
                };
                Ok(Attempt::Granted { fence, valid_until })
            }
            None => {
                table.sweep_if_due(now);
                let fence = self.next_fence();
                table.entries.insert(
                    Box::from(key),
                    Entry {
                        owner,
                        fence,
                        valid_until,
                    },
                );
                Ok(Attempt::Granted { fence, valid_until })
            }
        }
    }

    fn release_in_table(&self, lease: &Lease) -> Result<()> {
        let now = Instant::now();
        let mut table = self.table();
        // One hash lookup on the common path: take the entry out, put it back if foreign.
        match table.entries.remove_entry(lease.key()) {
            Some((_, e)) if e.owner == lease.owner() => {
                drop(table);
                self.notices.notify(lease.key());
                if e.valid_until > now {
                    Ok(())
                } else {
                    Err(not_held(lease))
                }
            }
            Some((key, foreign)) => {
                table.entries.insert(key, foreign);
                Err(not_held(lease))
            }
            None => Err(not_held(lease)),
        }
    }

    fn next_fence(&self) -> u64 {
        self.next_fence.fetch_add(1, Ordering::Relaxed)
    }
}

fn not_held(lease: &Lease) -> Error {
    Error::NotHeld {
        key: lease.key().to_owned(),
    }
}
