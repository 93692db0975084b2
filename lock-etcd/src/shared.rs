//! The state every operation of one backend shares, and the lease steps operations are
//! built from (grant, revoke, recycle).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, LeaseGrantOptions};
use lock_core::sync::lock;
use lock_core::{Capabilities, Owner, Permits, ReleaseNotices, Result, Ttl};

use crate::batch::Batcher;
use crate::error::{failed, is_lease_not_found, timed_out, unexpected};
use crate::held::HeldTable;
use crate::leases::{new_lease_id, EtcdLease, Pool, HEADROOM_SECS};
use crate::members::Members;
use crate::running::Running;
use crate::version::ServerVersion;
use crate::watch;

/// What the backend handle, its operations and the tasks finishing detached operations
/// share.
pub(crate) struct Shared {
    pub(crate) members: Arc<Members>,
    pub(crate) endpoints: Vec<String>,
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    pub(crate) caps: Capabilities,
    pub(crate) notices: Arc<ReleaseNotices>,
    /// Announces each release once, from this backend's releases and from the watch.
    pub(crate) announcer: Arc<watch::Announcer>,
    /// Opens the watch when a refused attempt needs it.
    pub(crate) demand: Arc<watch::Demand>,
    /// Opens the leaders' watch when an election's leader is read (`leaders.rs`).
    pub(crate) leaders_demand: Arc<watch::Demand>,
    pub(crate) held: Mutex<HeldTable>,
    /// Attempts and hand-overs still on their way, for `abandon`.
    pub(crate) running: Running,
    pub(crate) pool: Mutex<Pool>,
    /// Acquire and release transactions go through it, grouped under load.
    pub(crate) batch: Arc<Batcher>,
    /// The server's version, as the preferred member reported it at connect.
    pub(crate) version: ServerVersion,
}

impl Shared {
    /// The client of the preferred member.
    pub(crate) fn client(&self) -> Arc<Client> {
        self.members.client()
    }

    pub(crate) fn full_key(&self, key: &str) -> String {
        let mut full = String::with_capacity(self.prefix.len() + key.len());
        full.push_str(&self.prefix);
        full.push_str(key);
        full
    }

    /// The etcd key where `owner`'s grant of `permits` of `name` lives: the lock key for a
    /// lock, its holder key otherwise (`permits.rs`). The claim recorded with a held grant
    /// wins over `permits`, which an abandoned attempt's clean-up does not know.
    pub(crate) fn grant_key(&self, name: &str, owner: Owner, permits: Permits) -> Vec<u8> {
        let permits = lock(&self.held)
            .map
            .get(&owner.as_u128())
            .map_or(permits, |entry| entry.permits);
        crate::permits::grant_key(&self.full_key(name), owner, permits)
    }

    /// The root of a key space of the backend's own beside the locks: the lock prefix with
    /// its last character replaced by `.<name>/` (`_<name>/` when that character is a `.`),
    /// e.g. `distlock.runs/` with the default prefix `distlock/`. It differs from the prefix
    /// at the prefix's last character, so no key under it is a lock key (whatever the lock's
    /// name) and the release watch, over the prefix, never sees it.
    pub(crate) fn beside_prefix(&self, name: &str) -> String {
        beside_prefix(&self.prefix, name)
    }

    /// The lease TTL for a lock TTL: the [`Ttl`] is whole seconds already, at least the
    /// server minimum, at most the capabilities' `max_ttl` (a year, which fits an `i64`).
    pub(crate) fn lease_secs(ttl: Ttl) -> i64 {
        i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX)
    }

    /// Runs `op` within the operation timeout.
    pub(crate) async fn within<T>(
        &self,
        doing: &str,
        op: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        tokio::time::timeout(self.timeout, op)
            .await
            .unwrap_or_else(|_| Err(timed_out(doing, self.timeout)))
    }

    /// Revokes a lease in the background (which deletes any key attached to it).
    pub(crate) fn revoke_later(&self, id: i64) {
        let mut leases = self.client().lease_client();
        let timeout = self.timeout;
        tokio::spawn(async move {
            let _ = tokio::time::timeout(timeout, leases.revoke(id)).await;
        });
    }

    /// Revokes a lease now; one already gone is fine.
    pub(crate) async fn revoke(&self, id: i64) -> Result<()> {
        match self.client().lease_client().revoke(id).await {
            Ok(_) => Ok(()),
            Err(e) if is_lease_not_found(&e) => Ok(()),
            Err(e) => Err(failed("revoking a lease")(e)),
        }
    }

    /// Keeps a lease that holds no key for the next acquisition.
    pub(crate) fn recycle(&self, slot: EtcdLease) {
        let overflow = lock(&self.pool).put(slot, Instant::now());
        if let Some(slot) = overflow {
            self.revoke_later(slot.id);
        }
    }

    /// Grants a lease for locks of `ttl_secs`.
    pub(crate) async fn grant(&self, ttl_secs: i64, used: &mut Vec<i64>) -> Result<EtcdLease> {
        let id = new_lease_id();
        used.push(id);
        self.grant_as(id, ttl_secs).await
    }

    /// Grants lease `id` (chosen by the caller, see [`new_lease_id`]) for locks of
    /// `ttl_secs`; revokes it when the grant fails.
    pub(crate) async fn grant_as(&self, id: i64, ttl_secs: i64) -> Result<EtcdLease> {
        let lease_secs = ttl_secs + HEADROOM_SECS;
        let sent = Instant::now();
        let options = LeaseGrantOptions::new().with_id(id);
        match self
            .client()
            .lease_client()
            .grant(lease_secs, Some(options))
            .await
        {
            Ok(granted) if granted.error().is_empty() && granted.ttl() >= lease_secs => {
                Ok(EtcdLease::granted(id, ttl_secs, granted.ttl(), sent))
            }
            Ok(_) => {
                self.revoke_later(id);
                Err(unexpected("a lease grant shorter than asked"))
            }
            Err(e) => {
                self.revoke_later(id);
                Err(failed("granting a lease")(e))
            }
        }
    }
}

/// [`Shared::beside_prefix`] of the lock prefix `prefix`.
pub(crate) fn beside_prefix(prefix: &str, name: &str) -> String {
    // The prefix is never empty (the builder refuses it).
    let (cut, last) = prefix.char_indices().next_back().unwrap_or((0, '/'));
    let mark = if last == '.' { '_' } else { '.' };
    let mut root = String::with_capacity(cut + name.len() + 2);
    root.push_str(&prefix[..cut]);
    root.push(mark);
    root.push_str(name);
    root.push('/');
    root
}
