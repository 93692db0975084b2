//! [`EtcdBackend`]: the handle a Locker holds, and its [`Backend`] implementation, which
//! hands each operation to the protocol modules below it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::sync::lock;
use lock_core::{
    Admin, Attempt, Backend, Capabilities, Error, HandOver, Holder, Lease, Owner, Permits,
    ReleaseListener, Result, Ttl,
};

use crate::detached::detached;
use crate::shared::Shared;

/// Locks, semaphores and reader-writer keys on an etcd cluster. Build a [`Locker`](lock_core::Locker) over it with
/// `Locker::new(EtcdBackend::connect(&url).await?)`, or configure it with
/// [`EtcdBackend::builder`].
///
/// Dropping it stops its release watch and revokes its leases in the background: the idle
/// ones, and those of locks it granted that were never released (a Locker keeps its backend
/// alive while any of its guards is held).
pub struct EtcdBackend {
    pub(crate) shared: Arc<Shared>,
    pub(crate) watch: tokio::task::AbortHandle,
    pub(crate) leaders_watch: tokio::task::AbortHandle,
}

impl EtcdBackend {
    /// The key prefix of every lock.
    pub fn prefix(&self) -> &str {
        &self.shared.prefix
    }

    /// The endpoints connected to.
    pub fn endpoints(&self) -> &[String] {
        &self.shared.endpoints
    }

    /// The bound on every operation.
    pub fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    /// Number of locks granted through this backend and not released yet.
    pub fn held_leases(&self) -> usize {
        lock(&self.shared.held).map.len()
    }

    /// Number of idle leases kept for reuse.
    pub fn idle_leases(&self) -> usize {
        lock(&self.shared.pool).len()
    }

    /// Number of keys that waiters listen on.
    pub fn listened_keys(&self) -> usize {
        self.shared.notices.listened_keys()
    }

    /// Whether the release watch is open: from a waiter's first refused attempt until a
    /// second or so after nobody listens any more.
    pub fn watching(&self) -> bool {
        self.shared.demand.is_running()
    }

    /// The etcd version the preferred member reported at connect (`unknown` when it did not
    /// say).
    pub fn server_version(&self) -> &str {
        self.shared.version.text()
    }

    /// Whether the server is a release that may free a held lock before its TTL after its
    /// leader stalls (paused, or stuck on a slow disk) for longer than the lock's TTL:
    /// etcd issue 15247, where the stalled leader revokes, on resuming, leases that clients
    /// kept alive on the new leader meanwhile. No client can prevent it; the lock's holder
    /// still believes it holds until its next renewal fails, and the fencing token is what
    /// protects the resource. etcd 3.4.30 and 3.5.12 are the first releases with the
    /// mitigation; an unreadable version counts as affected. [`EtcdBuilder::build`] logs
    /// a warning when this is true.
    ///
    /// [`EtcdBuilder::build`]: crate::EtcdBuilder::build
    pub fn revokes_live_leases_after_a_leader_stall(&self) -> bool {
        self.shared
            .version
            .revokes_live_leases_after_a_leader_stall()
    }
}

impl Drop for EtcdBackend {
    fn drop(&mut self) {
        self.watch.abort();
        self.leaders_watch.abort();
        let mut leases = lock(&self.shared.pool).drain();
        leases.extend(
            lock(&self.shared.held)
                .map
                .drain()
                .flat_map(|(_, h)| h.leases()),
        );
        if leases.is_empty() {
            return;
        }
        // Outside a runtime they simply expire at their TTL.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let mut client = self.shared.client().lease_client();
            let timeout = self.shared.timeout;
            runtime.spawn(async move {
                for id in leases {
                    let _ = tokio::time::timeout(timeout, client.revoke(id)).await;
                }
            });
        }
    }
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.shared.endpoints)
            .field("prefix", &self.shared.prefix)
            .field("timeout", &self.shared.timeout)
            .field("min_ttl", &self.shared.caps.min_ttl)
            .field("held_leases", &self.held_leases())
            .field("idle_leases", &self.idle_leases())
            .field("listened_keys", &self.listened_keys())
            .field("watching", &self.watching())
            .finish()
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.shared.caps
    }

    /// Runs on a task of its own, so that an attempt dropped half-way (its caller
    /// cancelled) still finishes; [`abandon`](Self::abandon) then gives back what it was
    /// granted.
    ///
    /// A lock is the lock key; other claims are holder keys beside it, granted by
    /// optimistic transactions (see the design notes, "Permits"): a key that keeps
    /// gaining holders under the attempt ends it with the transient `Unavailable` after a few
    /// transactions.
    async fn try_acquire(
        &self,
        key: &str,
        owner: Owner,
        permits: Permits,
        ttl: Ttl,
    ) -> Result<Attempt> {
        let ttl_secs = Shared::lease_secs(ttl);
        let ttl = ttl.get();
        let key: Arc<str> = Arc::from(key);
        detached(&self.shared, owner, move |shared| async move {
            shared.attempt(&key, owner, permits, ttl, ttl_secs).await
        })
        .await
    }

    /// Waits until the attempt of `owner` still on its way (if any) has finished, then
    /// releases what it was granted: the release's transaction deletes the key only while
    /// it holds `owner`'s token, so it also cleans up a grant whose answer was lost.
    async fn abandon(&self, key: &str, owner: Owner) -> Result<()> {
        let limit = self.shared.timeout * 2;
        self.shared.running.settled(owner, limit).await;
        match self
            .release(&Lease::new(key, owner, 0, Instant::now()))
            .await
        {
            Ok(()) | Err(Error::NotHeld { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn extend(&self, lease: &Lease, ttl: Ttl) -> Result<Instant> {
        let (member, _) = self.shared.members.pick();
        let result = self.shared.extend(lease, ttl).await;
        self.shared.members.note(member, result)
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let (member, _) = self.shared.members.pick();
        let result = self.shared.release(lease).await;
        self.shared.members.note(member, result)
    }

    fn listen(&self, key: &str) -> Option<ReleaseListener> {
        Some(self.shared.notices.listen(key))
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

    /// Keys of their own beside the lock prefix (see the design notes, "Run records").
    fn run_records(&self) -> Option<&dyn lock_core::records::RunRecords> {
        Some(self)
    }

    /// Keys of their own beside the lock prefix, without a clock (see the design notes,
    /// "Fire-time claims").
    fn fire_claims(&self) -> Option<&dyn lock_core::claims::FireClaims> {
        Some(self)
    }

    /// A value key per election beside the lock prefix, put only while the lock key holds
    /// the publisher (see the design notes, "Leaders' values").
    fn leader_values(&self) -> Option<&dyn lock_core::election::LeaderValues> {
        Some(self)
    }
}

#[async_trait]
impl HandOver for EtcdBackend {
    /// One transaction: if the key still holds `from`'s value, put it with `to`'s, on
    /// `from`'s lease when the TTL is the same (renewed alongside when needed), on another
    /// otherwise. `to`'s fence is that put's revision. Runs on a task of its own, like
    /// `try_acquire`.
    async fn hand_over(&self, from: &Lease, to: Owner, ttl: Ttl) -> Result<Attempt> {
        let ttl_secs = Shared::lease_secs(ttl);
        let ttl = ttl.get();
        let from = from.clone();
        detached(&self.shared, to, move |shared| async move {
            shared.hand_over(&from, to, ttl, ttl_secs).await
        })
        .await
    }
}

#[async_trait]
impl Admin for EtcdBackend {
    async fn inspect(&self, key: &str) -> Result<Vec<Holder>> {
        let (member, _) = self.shared.members.pick();
        let result = self.shared.inspect(key).await;
        self.shared.members.note(member, result)
    }

    async fn force_release(&self, key: &str) -> Result<bool> {
        let (member, _) = self.shared.members.pick();
        let result = self.shared.force_release(key).await;
        self.shared.members.note(member, result)
    }
}
