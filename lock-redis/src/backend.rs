//! [`RedisBackend`]: the [`Backend`] over one `RedisNode`, with release notices from one
//! pub/sub subscription.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use async_trait::async_trait;
use lock_core::{
    Admin, Attempt, Backend, Capabilities, HandOver, Holder, Lease, LockUrl, Owner, Permits,
    ReleaseListener, ReleaseNotices, Result, Ttl,
};

use crate::config::RedisBuilder;
use crate::handle::RedisNode;
use crate::node::CAPABILITIES;
use crate::ops::Queued;
use crate::watch::ReleaseWatch;

/// Locks on one Redis server: a [`Backend`] over one `RedisNode`, with release notices
/// from one pub/sub subscription.
///
/// Build it with [`RedisBackend::connect`] from a URL or [`RedisBackend::builder`], then
/// hand it to a [`Locker`](lock_core::Locker). `Debug` hides the password.
///
#[doc = include_str!("design.md")]
pub struct RedisBackend {
    pub(crate) node: RedisNode,
    pub(crate) notices: Arc<ReleaseNotices>,
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

    /// A builder for the master named `master` that the sentinels at `sentinels` monitor;
    /// see [`RedisBuilder::sentinel`].
    pub fn sentinel_builder(
        sentinels: impl IntoIterator<Item = impl Into<String>>,
        master: impl Into<String>,
    ) -> RedisBuilder {
        RedisBuilder::sentinel(sentinels, master)
    }

    /// A builder for the Redis Cluster reached through `seeds` (`host:port` each; see
    /// [`RedisBuilder::cluster`]); its locks are spread over the cluster's masters by the
    /// hash tag of their name.
    pub fn cluster_builder<S: Into<String>>(seeds: impl IntoIterator<Item = S>) -> RedisBuilder {
        RedisBuilder::cluster(seeds)
    }

    /// Connects to the server a `redis://` or `rediss://` URL names, to the master a
    /// `redis+sentinel://` URL's sentinels name, or to the cluster a `redis+cluster://`
    /// URL's seed nodes belong to, and checks it answers like Redis (this is what
    /// `distlock::connect` calls).
    ///
    /// # Errors
    /// [`Error::InvalidUrl`](lock_core::Error::InvalidUrl) for another scheme, unknown
    /// parameters or bad values; [`Error::Unavailable`](lock_core::Error::Unavailable) when
    /// the server cannot be reached within the timeout;
    /// [`Error::Backend`](lock_core::Error::Backend) for refused credentials or a peer that
    /// is not a Redis server.
    pub async fn connect(url: &LockUrl) -> Result<RedisBackend> {
        RedisBuilder::from_url(url)?.build().await
    }

    /// A backend over an already connected node. It announces its releases under an origin
    /// of its own (`RedisNode::with_own_origin`), so several backends over one node (or
    /// its clones) wake each other's waiters.
    #[cfg(feature = "internals")]
    #[doc(hidden)]
    pub fn from_node(node: RedisNode) -> RedisBackend {
        RedisBackend::over(node)
    }

    /// A backend over `node` (see [`from_node`](Self::from_node)).
    pub(crate) fn over(node: RedisNode) -> RedisBackend {
        RedisBackend {
            node: node.with_own_origin(),
            notices: Arc::new(ReleaseNotices::new()),
            watch: OnceLock::new(),
        }
    }

    /// The node this backend runs the protocol on.
    #[cfg(feature = "internals")]
    #[doc(hidden)]
    pub fn node(&self) -> &RedisNode {
        &self.node
    }
}

#[async_trait]
impl Backend for RedisBackend {
    fn capabilities(&self) -> &Capabilities {
        &CAPABILITIES
    }

    /// A lock is one string (`node.rs`); other claims keep their holders in a sorted set
    /// and a hash beside it (`permits.rs`).
    async fn try_acquire(
        &self,
        key: &str,
        owner: Owner,
        permits: Permits,
        ttl: Ttl,
    ) -> Result<Attempt> {
        if permits == Permits::LOCK {
            self.node.try_acquire(key, owner, ttl).await
        } else {
            self.node
                .try_acquire_permits(key, owner, permits, ttl)
                .await
        }
    }

    async fn extend(&self, lease: &Lease, ttl: Ttl) -> Result<Instant> {
        let (key, owner) = (lease.key(), lease.owner());
        let extended = if lease.permits() == Permits::LOCK {
            self.node.extend(key, owner, ttl).await?
        } else {
            self.node.extend_permits(key, owner, ttl).await?
        };
        extended.ok_or_else(|| lease.not_held())
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let key = lease.key();
        if lease.permits() != Permits::LOCK {
            return if self.node.release_permits(key, lease.owner()).await? {
                self.notices.notify(key);
                Ok(())
            } else {
                Err(lease.not_held())
            };
        }
        // Our own waiters are woken as soon as the release is queued: their attempt goes out
        // on the same connection behind it, so the server runs it after the release. The
        // second notice, once the release is confirmed, covers an attempt that still came
        // too early (e.g. the release had to be re-sent).
        let (notices, name) = (self.notices.clone(), key.to_owned());
        let woke: Queued = Arc::new(move || notices.notify(&name));
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
    /// (a lock or permits) is deleted and announced (`RedisNode::abandon`).
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

    fn hand_over(&self) -> Option<&dyn HandOver> {
        Some(self)
    }

    fn admin(&self) -> Option<&dyn Admin> {
        Some(self)
    }

    fn baseline(&self) -> Option<&dyn lock_core::Baseline> {
        Some(self)
    }

    /// A list per job and its last success, beside the locks (see `records.rs`).
    fn run_records(&self) -> Option<&dyn lock_core::records::RunRecords> {
        Some(self)
    }

    /// A hash per job, beside the locks, claimed by one script on the server's clock (see
    /// `claims.rs`).
    fn fire_claims(&self) -> Option<&dyn lock_core::claims::FireClaims> {
        Some(self)
    }

    /// A hash per election beside its lock, written only by the lock's holder in one
    /// script that also announces it (see `leaders.rs`).
    fn leader_values(&self) -> Option<&dyn lock_core::election::LeaderValues> {
        Some(self)
    }
}

#[async_trait]
impl HandOver for RedisBackend {
    /// One script: the grant passes from `from` to `to` with the key's next fence, never
    /// free in between: a lock (`RedisNode::hand_over`) or permits of a semaphore or a
    /// reader-writer key, `to` taking exactly what `from` held (`hand_over_permits` in
    /// `permits.rs`).
    ///
    /// Rules kept: nothing changes hands unless the server still holds the grant for
    /// `from` (unexpired, and for permits the same `take` of the same `of`); otherwise the
    /// answer is `Taken` and no grant changes. Fences strictly increase: `to`'s is above
    /// every earlier grant's on the key, `from`'s included. No release is announced, since
    /// nothing was freed. `to`'s validity counts from before the request, its expiry on the
    /// server's clock.
    ///
    /// # Cancel safety
    /// A dropped call may still hand the grant over (the script runs whole or not at
    /// all): `to` then holds it and `from` does not. The Locker abandons `to` then, whose
    /// tombstone also refuses this hand-over should it reach the server later.
    async fn hand_over(&self, from: &Lease, to: Owner, ttl: Ttl) -> Result<Attempt> {
        let (key, permits) = (from.key(), from.permits());
        if permits == Permits::LOCK {
            self.node.hand_over(key, from.owner(), to, ttl).await
        } else {
            self.node
                .hand_over_permits(key, from.owner(), to, permits, ttl)
                .await
        }
    }
}

#[async_trait]
impl Admin for RedisBackend {
    /// The lock's holder, or every holder of the key's permits, in one script.
    async fn inspect(&self, key: &str) -> Result<Vec<Holder>> {
        self.node.holders(key).await
    }

    async fn force_release(&self, key: &str) -> Result<bool> {
        let removed = self.node.force_release(key).await?;
        self.notices.notify(key);
        Ok(removed)
    }
}

impl RedisBuilder {
    /// Connects, checks that the server answers `PING` like Redis, and returns the backend.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`](lock_core::Error::InvalidUrl) for a malformed address or a zero timeout;
    /// [`Error::Unavailable`](lock_core::Error::Unavailable) when the server cannot be reached within the timeout;
    /// [`Error::Backend`](lock_core::Error::Backend) when it refuses the credentials or the database, or does not speak
    /// the Redis protocol.
    pub async fn build(self) -> Result<RedisBackend> {
        self.check()?;
        Ok(RedisBackend::over(RedisNode::connect(self).await?))
    }
}
