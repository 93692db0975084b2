//! Extension: renew the grant's lease, or move its key (the lock key, or a holder key of
//! permits) onto a new lease for a new TTL.
//!
//! A move whose answer never came (cut off by the operation timeout, its future dropped,
//! the connection lost) may have been applied by etcd, or may still be, later: the key may
//! be on the old lease or on the new one. The held entry therefore names the new lease
//! (`moving`) from before it is granted until the move's outcome is known, and the next
//! operation on the lock (extension or release) first sends the same move again
//! ([`Shared::finish_move`]). A move only ever takes the key *from the old lease*, so
//! whichever copy lands first decides and every other does nothing: afterwards the key is
//! ours on the new lease, or the new lease does not exist (and a put on it can never
//! succeed), or the key is not ours. A lease that may carry the key is never revoked while
//! the guard may still believe it holds; a release, which ends the hold, revokes both.

use std::time::Instant;

use lock_core::sync::lock;
use lock_core::{Error, Lease, Owner, Result, Ttl};

use crate::error::{failed, is_lease_not_found, LEASE_RAN_OUT, NAME};
use crate::held::{Move, Outcome, Pending};
use crate::leases::{new_lease_id, EtcdLease, Renewal};
use crate::shared::Shared;
use crate::txn::{holder_in, move_txn, seen};

impl Shared {
    /// Extends `lease` to `ttl` from now: renews its etcd lease, or moves the key onto a
    /// new one when the TTL changes, after finishing a move an earlier extension left
    /// unanswered.
    pub(crate) async fn extend(&self, lease: &Lease, ttl: Ttl) -> Result<Instant> {
        let ttl_secs = Shared::lease_secs(ttl);
        let ttl = ttl.get();
        if lease.is_expired() {
            return Err(lease.not_held());
        }
        let owner = lease.owner().as_u128();
        let started = Instant::now();
        self.within("extending", async {
            self.settle(lease).await?;
            let (lease_id, held_secs, slot, value_fence) =
                match lock(&self.held).map.get_mut(&owner) {
                    Some(entry) => (
                        entry.lease_id,
                        entry.ttl_secs,
                        entry.slot.take(),
                        entry.value_fence,
                    ),
                    None => return Err(lease.not_held()),
                };
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

    /// Finishes the move an earlier extension of `lease` left unanswered, if any: the
    /// held entry then names the one lease the key can be on, and the lease that lost is
    /// revoked.
    async fn settle(&self, lease: &Lease) -> Result<()> {
        let owner = lease.owner();
        let pending = match lock(&self.held).map.get(&owner.as_u128()) {
            Some(entry) => entry.pending(),
            None => return Err(lease.not_held()),
        };
        let Some(pending) = pending else {
            return Ok(());
        };
        let full = self.grant_key(lease.key(), owner, lease.permits());
        let outcome = self.finish_move(&full, owner, pending).await?;
        let mut held = lock(&self.held);
        let Some(entry) = held.map.get_mut(&owner.as_u128()) else {
            // Released or reaped meanwhile: neither lease may keep the key.
            drop(held);
            self.revoke_later(pending.from);
            self.revoke_later(pending.to.lease_id);
            return Err(lease.not_held());
        };
        if entry.pending() != Some(pending) {
            // Settled meanwhile by another operation, which found what this one did.
            return Ok(());
        }
        if outcome == Outcome::Lost {
            held.map.remove(&owner.as_u128());
            drop(held);
            self.revoke_later(pending.from);
            self.revoke_later(pending.to.lease_id);
            return Err(lease.not_held());
        }
        let loser = entry.settle(outcome);
        drop(held);
        if let Some(loser) = loser {
            self.revoke_later(loser);
        }
        Ok(())
    }

    /// Sends `pending`'s move again and tells where the key is now. The transaction is the
    /// one first sent: it moves the key only while it is ours on the old lease, so it does
    /// nothing when the first copy landed, and a first copy landing after it does nothing.
    pub(crate) async fn finish_move(
        &self,
        full: &[u8],
        owner: Owner,
        pending: Pending,
    ) -> Result<Outcome> {
        let to = pending.to;
        let txn = move_txn(
            full,
            owner,
            pending.value_fence,
            pending.from,
            to.fence,
            to.lease_id,
        );
        match self.client().kv_client().txn(txn).await {
            Ok(answer) if answer.succeeded() => Ok(Outcome::Moved),
            Ok(answer) => {
                let ours_on_new = holder_in(&answer)
                    .is_some_and(|seen| seen.owner == Some(owner) && seen.lease == to.lease_id);
                Ok(if ours_on_new {
                    Outcome::Moved
                } else {
                    Outcome::Lost
                })
            }
            // Never granted, or gone (and the key with it, if it was on it).
            Err(e) if is_lease_not_found(&e) => Ok(Outcome::Stayed),
            Err(e) => Err(failed("finishing a move to a new lease")(e)),
        }
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
        let full = self.grant_key(lease.key(), lease.owner(), lease.permits());
        let client = self.client();
        let mut kv = client.kv_client();
        let (renewal, current) = futures::join!(slot.keep_alive(&client), kv.get(full, None));
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
    /// no longer tells. The new lease is in the held entry (`moving`) before it is granted,
    /// and stays there until the move's answer tells where the key is: a move cut off
    /// half-way is finished by the next operation ([`Shared::finish_move`]).
    async fn move_to_new_lease(
        &self,
        lease: &Lease,
        old: EtcdLease,
        value_fence: Option<u64>,
        ttl_secs: i64,
        valid_until: Instant,
    ) -> Result<Instant> {
        let owner = lease.owner();
        let to = Move {
            lease_id: new_lease_id(),
            ttl_secs,
            fence: lease.fence(),
        };
        let pending = Pending {
            from: old.id,
            value_fence,
            to,
        };
        match lock(&self.held).map.get_mut(&owner.as_u128()) {
            Some(entry) if entry.lease_id == old.id && entry.moving.is_none() => {
                entry.moving = Some(to);
            }
            _ => return Err(lease.not_held()),
        }
        let slot = match self.grant_as(to.lease_id, ttl_secs).await {
            Ok(slot) => slot,
            Err(e) => {
                // Nothing was moved (the transaction was not sent), and `grant_as` revokes
                // the lease.
                self.stayed(owner, pending);
                return Err(e);
            }
        };
        let full = self.grant_key(lease.key(), owner, lease.permits());
        let txn = move_txn(&full, owner, value_fence, old.id, to.fence, to.lease_id);
        let response = match self.client().kv_client().txn(txn).await {
            Ok(response) => response,
            Err(e) if is_lease_not_found(&e) => {
                self.stayed(owner, pending);
                return Err(Error::unavailable(NAME, LEASE_RAN_OUT));
            }
            // It may have been applied, or may be later: the entry keeps both leases, and
            // the next operation finishes the move.
            Err(e) => return Err(failed("moving the lock to a new lease")(e)),
        };
        if !response.succeeded() {
            lock(&self.held).map.remove(&owner.as_u128());
            // Not applied, and sent once: the new lease holds nothing.
            self.recycle(slot);
            self.revoke_later(old.id);
            return Err(lease.not_held());
        }
        let mut held = lock(&self.held);
        match held.map.get_mut(&owner.as_u128()) {
            Some(entry) if entry.pending() == Some(pending) => {
                entry.moved(to, Some(slot));
                entry.valid_until = valid_until;
                drop(held);
                self.recycle(old);
                Ok(valid_until)
            }
            _ => {
                // Released or reaped meanwhile: the key must not outlive that on the new lease.
                drop(held);
                self.revoke_later(to.lease_id);
                self.revoke_later(old.id);
                Err(lease.not_held())
            }
        }
    }

    /// `pending`'s move is known not to have happened: the entry forgets its new lease.
    fn stayed(&self, owner: Owner, pending: Pending) {
        if let Some(entry) = lock(&self.held).map.get_mut(&owner.as_u128()) {
            if entry.pending() == Some(pending) {
                entry.moving = None;
            }
        }
    }
}
