//! # lock-redis
//!
//! The single-Redis backend of distlock: locks on one Redis server (5.0 or newer; any server
//! speaking its protocol with Lua scripting and pub/sub).
//!
//! ```no_run
//! # async fn demo() -> lock_core::Result<()> {
//! use lock_core::{LockOptions, Locker};
//! use lock_redis::RedisBackend;
//!
//! let url = lock_core::LockUrl::parse("redis://127.0.0.1:6379/0?prefix=myapp:&timeout=500ms")?;
//! let locker = Locker::new(RedisBackend::connect(&url).await?);
//! let guard = locker.acquire("jobs/nightly", &LockOptions::new()).await?;
//! println!("fencing token {}", guard.fence());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## Configuration
//!
//! `redis://[user[:password]@]host[:port][/db][?prefix=…&timeout=…]`, or `rediss://…` for
//! TLS (feature `tls`, on by default: rustls with the ring provider and the system's root
//! certificates), or the typed [`RedisBuilder`] from [`RedisBackend::builder`].
//!
//! - `prefix`: the namespace of every key and of the release channel (default `distlock:`).
//! - `timeout`: the bound on every operation, connecting included (default `1s`). When it
//!   passes, the operation fails with the transient [`Error::Unavailable`], which the
//!   [`Locker`](lock_core::Locker) retries until its wait deadline.
//!
//! Any other parameter is refused with [`Error::InvalidUrl`]. `Debug` of every type here
//! hides the password.
//!
//! ## Protocol
//!
//! Each operation is one Lua script (see [`RedisNode`] for the key layout):
//!
//! - acquire: `SET lock owner NX PX ttl`; when granted, the fencing token is computed and
//!   stored in the key's fence counter; when taken, the holder's `PTTL` is returned, so a
//!   waiter wakes when the holder expires even if nobody announces a release;
//! - extend: `PEXPIRE` only if the value is still the caller's owner token;
//! - release: `DEL` only if the value is still the caller's owner token, then `PUBLISH` a
//!   release notice;
//! - hand-over (the Locker's next waiter takes over from a holder of the same Locker,
//!   [`Backend::hand_over`]): `SET lock next PX ttl` only if the value is still the
//!   holder's owner token, with the next fence; the key is never free in between, so no
//!   notice is published;
//! - abandon (clean-up after an attempt whose answer never came, [`Backend::abandon`]):
//!   `SET` a tombstone `<prefix>{name}:x:<owner>` for [`ABANDON_RETENTION`] (10 minutes),
//!   then `DEL` + `PUBLISH` if the lock holds that owner. Acquire and hand-over refuse an
//!   owner whose tombstone exists, so the abandoned request cannot grant even when it
//!   reaches the server after the clean-up (it may sit in the socket buffer of the
//!   discarded connection while the clean-up goes on a new one);
//! - neither extend, release, hand-over nor abandon ever touches another owner's lock.
//!
//! Acquires and releases are grouped under load ([`lock_core::group`]): while two calls
//! are on their way, further ones queue and then go as one call of the acquire (or the
//! release) script over several locks (up to 64, on distinct keys), each with its own
//! answer. A lone caller's call goes at once, and operations on one lock reach the server
//! in the order they were sent. The scripts then touch keys of several hash slots, so a
//! node is one Redis server, not a Redis Cluster.
//!
//! Scripts are sent with `EVALSHA` and re-sent with `EVAL` when the server answers
//! `NOSCRIPT` (a restarted server has an empty script cache); callers never see `NOSCRIPT`.
//!
//! ## Connections
//!
//! A backend keeps one multiplexed command connection, opened (and checked with `PING`) by
//! `connect`, and reopened by the next operation after it broke. Waiting uses one more
//! connection, subscribed to the release channel, started the first time someone waits; it
//! resubscribes by itself after a failure and then wakes every waiter, since releases may
//! have been missed meanwhile. A release made through a backend also wakes that backend's
//! own waiters directly, as soon as the release request is queued on the connection: their
//! next attempt follows it on the same connection, so a hand-off inside a process costs one
//! round trip instead of two.
//!
//! ## Fencing tokens
//!
//! Each key has a fence counter next to its lock. Every grant's token is
//! `max(counter + 1, server TIME in µs)`, and the token is written back to the counter,
//! which is then kept for the lock's TTL plus [`FENCE_RETENTION`] (10 minutes) from that
//! grant. The counter orders grants whatever the clock does; the clock orders them when the
//! counter is missing or stale. What this promises, for the grants of one key:
//!
//! - **Strictly increasing** from grant to grant (and across hand-overs), unless the
//!   server's clock goes back while the counter is lost or stale. In particular:
//!   - while the counter lives on the server, whatever the clock does;
//!   - across a restart or a failover that loses the counter (no persistence, the key
//!     expired, a replica that never got it) or brings back an OLDER one (an RDB
//!     snapshot, AOF with `appendfsync everysec`, an async replica promoted), as long as
//!     the clock of the server answering now (the new primary, after a failover) reads
//!     later than the clock that issued the previous tokens did when it issued them: every
//!     token is at most the server time of its grant (plus the grants of that key within
//!     one microsecond), so a later reading is above all of them.
//! - A holder asking again with its own owner token (a request re-sent after a lost reply)
//!   gets the counter's value back, its own token unless the counter was raised meanwhile
//!   (Redlock's write-back), or a new token if the counter is gone.
//! - Tokens stay below 2^53 (server time in µs reaches it in the year 2255).
//!
//! Nothing is promised across different keys, nor when the server clock steps back (NTP
//! stepping it, a failover to a replica whose clock is behind) by more than the time since
//! the key's last grant while the counter is lost or stale: tokens may then repeat or
//! decrease. Each grant costs a `TIME`, a `GET` and a `SET` inside the acquire script (and
//! every attempt an `EXISTS` of its tombstone, see abandon above).
//!
//! ## Capabilities
//!
//! [`CAPABILITIES`]: TTLs from 10 ms (shorter ones are rounded up: Redis expires keys with
//! about a millisecond of resolution, and a lease shorter than a few round trips is useless)
//! to 30 days in 1 ms steps; monotonic fencing, release notices, cross-process exclusion.
//!
//! ## Building on a single node
//!
//! [`RedisNode`] exposes the single-node protocol (acquire, extend, release, force-release,
//! inspect, raise a fence counter, subscribe to release notices) for backends that compose
//! several servers, such as Redlock.
#![deny(missing_docs)]

mod config;
mod node;
mod scripts;
mod watch;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::{
    Attempt, Backend, Capabilities, Holder, Lease, LockUrl, Owner, ReleaseListener, ReleaseNotices,
    Result,
};

pub use config::{database_path, url_database, DEFAULT_PORT};
pub use config::{RedisBuilder, DEFAULT_PREFIX, DEFAULT_TIMEOUT, URL_PARAMS};
pub use node::{RedisNode, ABANDON_RETENTION, FENCE_RETENTION, MAX_FENCE};
pub use watch::ReleaseWatch;

/// What the Redis backend promises (see the crate documentation).
pub const CAPABILITIES: Capabilities = Capabilities {
    name: "redis",
    min_ttl: Duration::from_millis(10),
    ttl_granularity: Duration::from_millis(1),
    max_ttl: Duration::from_secs(30 * 24 * 3600),
    monotonic_fencing: true,
    release_notices: true,
    cross_process: true,
    clock_drift: lock_core::ClockDrift::NONE,
    hand_over: true,
};

/// Locks on one Redis server: a [`Backend`] over one [`RedisNode`], with release notices
/// from one pub/sub subscription.
///
/// Build it with [`RedisBackend::connect`] from a URL or [`RedisBackend::builder`], then
/// hand it to a [`Locker`](lock_core::Locker). `Debug` hides the password.
pub struct RedisBackend {
    node: RedisNode,
    notices: Arc<ReleaseNotices>,
    /// The release subscription, started by the first `listen`.
    watch: OnceLock<ReleaseWatch>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("node", &self.node)
            .field("listened_keys", &self.notices.listened_keys())
            .field("subscribed", &self.watch.get().is_some())
            .finish()
    }
}

impl RedisBackend {
    /// A builder for the server at `addr` (`host` or `host:port`); see [`RedisBuilder`].
    pub fn builder(addr: impl Into<String>) -> RedisBuilder {
        RedisBuilder::new(addr)
    }

    /// Connects to the server a `redis://` or `rediss://` URL names and checks it answers
    /// like Redis (this is what `distlock::connect` calls).
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for another scheme, unknown parameters or bad values;
    /// [`Error::Unavailable`] when the server cannot be reached within the timeout;
    /// [`Error::Backend`] for refused credentials or a peer that is not a Redis server.
    pub async fn connect(url: &LockUrl) -> Result<RedisBackend> {
        RedisBuilder::from_url(url)?.build().await
    }

    /// A backend over an already connected node.
    pub fn from_node(node: RedisNode) -> RedisBackend {
        RedisBackend {
            node,
            notices: Arc::new(ReleaseNotices::new()),
            watch: OnceLock::new(),
        }
    }

    /// The node this backend runs the protocol on.
    pub fn node(&self) -> &RedisNode {
        &self.node
    }
}

#[async_trait]
impl Backend for RedisBackend {
    fn capabilities(&self) -> &Capabilities {
        &CAPABILITIES
    }

    async fn try_acquire(&self, key: &str, owner: Owner, ttl: Duration) -> Result<Attempt> {
        self.node.try_acquire(key, owner, ttl).await
    }

    async fn hand_over(&self, from: &Lease, to: Owner, ttl: Duration) -> Result<Attempt> {
        self.node.hand_over(from.key(), from.owner(), to, ttl).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Instant> {
        match self.node.extend(lease.key(), lease.owner(), ttl).await? {
            Some(valid_until) => Ok(valid_until),
            None => Err(lease.not_held()),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let key = lease.key();
        // Our own waiters are woken as soon as the release is queued: their attempt goes out
        // on the same connection behind it, so the server runs it after the release. The
        // second notice, once the release is confirmed, covers an attempt that still came
        // too early (e.g. the release had to be re-sent).
        let (notices, name) = (self.notices.clone(), key.to_owned());
        let woke: node::Queued = Arc::new(move || notices.notify(&name));
        if self
            .node
            .release_queued(key, lease.owner(), Some(woke))
            .await?
        {
            self.notices.notify(key);
            Ok(())
        } else {
            Err(lease.not_held())
        }
    }

    /// A tombstone refuses the attempt should it still arrive, and a grant it got already
    /// is deleted and announced ([`RedisNode::abandon`]).
    async fn abandon(&self, key: &str, owner: Owner) -> Result<()> {
        if self.node.abandon(key, owner).await? {
            self.notices.notify(key);
        }
        Ok(())
    }

    fn listen(&self, key: &str) -> Option<ReleaseListener> {
        // Registered before the subscription starts: its first `notify_all` covers the gap.
        let listener = self.notices.listen(key);
        if self.watch.get().is_none() {
            if let Some(watch) = self.node.watch_releases(self.notices.clone()) {
                // A concurrent first `listen` may win the race; the loser's watch is dropped.
                let _ = self.watch.set(watch);
            }
        }
        Some(listener)
    }

    async fn inspect(&self, key: &str) -> Result<Option<Holder>> {
        self.node.inspect(key).await
    }

    async fn force_release(&self, key: &str) -> Result<bool> {
        let removed = self.node.force_release(key).await?;
        self.notices.notify(key);
        Ok(removed)
    }
}
