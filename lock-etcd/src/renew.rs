//! Extension: renew the lock's lease, or move the key onto a new lease for a new TTL.

use std::time::Instant;

use lock_core::sync::lock;
use lock_core::{Error, Lease, Result, Ttl};

use crate::error::{failed, is_lease_not_found, LEASE_RAN_OUT, NAME};
use crate::leases::{EtcdLease, Renewal};
use crate::shared::Shared;
use crate::txn::{move_txn, seen};

impl Shared {
    /// Extends `lease` to `ttl` from now: renews its etcd lease, or moves the key onto a
    /// new one when the TTL changes.
    pub(crate) async fn extend(&self, lease: &Lease, ttl: Ttl) -> Result<Instant> {
        let ttl_secs = Shared::lease_secs(ttl);
        let ttl = ttl.get();
        if lease.is_expired() {
            return Err(lease.not_held());
        }
        let owner = lease.owner().as_u128();
        let (lease_id, held_secs, slot, value_fence) = match lock(&self.held).map.get_mut(&owner) {
            Some(entry) => (
                entry.lease_id,
                entry.ttl_secs,
                entry.slot.take(),
                entry.value_fence,
            ),
            None => return Err(lease.not_held()),
        };
        let started = Instant::now();
        self.within("extending", async {
            if held_secs == ttl_secs {
                self.renew(lease, lease_id, held_secs, slot, started + ttl)
                    .await
            } else {
                let slot = slot
                    .unwrap_or_else(|| EtcdLease::known(lease_id, held_secs, lease.valid_until()));
                self.move_to_new_lease(lease, slot, value_fence, ttl_secs, started + ttl)
                    .await
            }
        })
        .await
    }

    /// Renews the lock's lease and checks that the key is still ours on it.
    async fn renew(
        &self,
        lease: &Lease,
        lease_id: i64,
        ttl_secs: i64,
        slot: Option<EtcdLease>,
        valid_until: Instant,
    ) -> Result<Instant> {
        let mut slot =
            slot.unwrap_or_else(|| EtcdLease::known(lease_id, ttl_secs, lease.valid_until()));
        let full = self.full_key(lease.key());
        let client = self.client();
        let mut kv = client.kv_client();
        let (renewal, current) = tokio::join!(slot.keep_alive(&client), kv.get(full, None));
        let renewal = renewal.map_err(failed("renewing the lock's lease"))?;
        let current = current.map_err(failed("checking the lock"))?;
        let ours = current
            .kvs()
            .first()
            .is_some_and(|kv| kv.lease() == lease_id && seen(kv).owner == Some(lease.owner()));
        let owner = lease.owner().as_u128();
        if renewal == Renewal::Gone || !ours {
            lock(&self.held).map.remove(&owner);
            if renewal == Renewal::Alive {
                // Ours, but it holds no key of ours any more.
                self.revoke_later(lease_id);
            }
            return Err(lease.not_held());
        }
        match lock(&self.held).map.get_mut(&owner) {
            Some(entry) if entry.lease_id == lease_id => {
                entry.valid_until = valid_until;
                entry.slot = Some(slot);
                Ok(valid_until)
            }
            // Reaped or released while the renewal was in flight.
            _ => Err(lease.not_held()),
        }
    }

    /// A new TTL needs a new lease (etcd leases keep their TTL): move the key onto one. The
    /// key is rewritten in place, its value now carrying the fence, which the put's revision
    /// no longer tells.
    async fn move_to_new_lease(
        &self,
        lease: &Lease,
        old: EtcdLease,
        value_fence: Option<u64>,
        ttl_secs: i64,
        valid_until: Instant,
    ) -> Result<Instant> {
        let owner = lease.owner();
        let mut used = Vec::new();
        let slot = self.grant(ttl_secs, &mut used).await?;
        let full = self.full_key(lease.key());
        let txn = move_txn(&full, owner, value_fence, old.id, lease.fence(), slot.id);
        let response = match self.client().kv_client().txn(txn).await {
            Ok(response) => response,
            Err(e) if is_lease_not_found(&e) => {
                self.revoke_later(slot.id);
                return Err(Error::unavailable(NAME, LEASE_RAN_OUT));
            }
            Err(e) => {
                self.revoke_later(slot.id);
                return Err(failed("moving the lock to a new lease")(e));
            }
        };
        if !response.succeeded() {
            lock(&self.held).map.remove(&owner.as_u128());
            self.recycle(slot);
            self.revoke_later(old.id);
            return Err(lease.not_held());
        }
        let mut held = lock(&self.held);
        match held.map.get_mut(&owner.as_u128()) {
            Some(entry) if entry.lease_id == old.id => {
                entry.lease_id = slot.id;
                entry.ttl_secs = ttl_secs;
                entry.valid_until = valid_until;
                entry.slot = Some(slot);
                entry.value_fence = Some(lease.fence());
                drop(held);
                self.recycle(old);
                Ok(valid_until)
            }
            _ => {
                // Released or reaped meanwhile: the key must not outlive that on the new lease.
                drop(held);
                self.revoke_later(slot.id);
                self.revoke_later(old.id);
                Err(lease.not_held())
            }
        }
    }
}
