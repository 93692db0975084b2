//! The end of a hold: the release transaction, or the one-step hand-over to the next
//! waiter of the same Locker.

use std::time::{Duration, Instant};

use lock_core::group::GroupKey;
use lock_core::sync::lock;
use lock_core::{Attempt, Error, Lease, Owner, Permits, Result};

use crate::error::{failed, unexpected, NAME};
use crate::held::{Held, Outcome};
use crate::leases::EtcdLease;
use crate::permits::grant_key;
use crate::shared::Shared;
use crate::txn::{hand_over_txn, release_txn};

impl Shared {
    /// Hands `from`'s lock to `to` in one transaction, on the same lease.
    pub(crate) async fn hand_over(
        &self,
        from: &Lease,
        to: Owner,
        ttl: Duration,
        ttl_secs: i64,
    ) -> Result<Attempt> {
        let started = Instant::now();
        let valid_until = started + ttl;
        let permits_refused = Error::Unsupported {
            backend: NAME,
            operation: "hand_over of permits (a semaphore or a reader-writer key)",
        };
        if from.permits() != Permits::LOCK {
            return Err(permits_refused);
        }
        let entry = {
            let mut held = lock(&self.held);
            let owner = from.owner().as_u128();
            match held.map.get(&owner) {
                None => return Ok(Attempt::Taken { expires_in: None }),
                // Holder keys name their owner: the next holder's grant is a key of its
                // own, so it goes the long way.
                Some(entry) if entry.permits != Permits::LOCK => return Err(permits_refused),
                // The new holder keeps the lease, which serves one TTL only: another TTL
                // goes the long way (release, then acquisition).
                Some(entry) if entry.ttl_secs != ttl_secs => {
                    return Err(Error::Unsupported {
                        backend: NAME,
                        operation: "hand_over to another TTL",
                    })
                }
                // An extension left a move unanswered: the release settles it first.
                Some(entry) if entry.moving.is_some() => {
                    return Err(Error::Unsupported {
                        backend: NAME,
                        operation: "hand_over while a move to a new lease is unanswered",
                    })
                }
                Some(_) => held.map.remove(&owner),
            }
        };
        let Some(mut entry) = entry else {
            return Ok(Attempt::Taken { expires_in: None });
        };
        let slot = entry.slot.take().unwrap_or_else(|| {
            EtcdLease::known(entry.lease_id, entry.ttl_secs, from.valid_until())
        });
        let full = self.full_key(from.key());
        let txn = hand_over_txn(&full, from.owner(), entry.value_fence, to, slot.id);
        let lease_id = slot.id;
        let mut used = Vec::new();
        // On failure the lease is revoked, and the key with it, whoever it was handed to.
        let sent = self
            .within(
                "handing over",
                self.send_on_lease(slot, valid_until, &full, txn, &mut used),
            )
            .await;
        let (slot, answer) = match sent {
            Ok(Some(done)) => done,
            // The lease had run out, and the key on it.
            Ok(None) => return Ok(Attempt::Taken { expires_in: None }),
            Err(e) => {
                self.revoke_later(lease_id);
                return Err(e);
            }
        };
        if !answer.succeeded() {
            // Not ours any more: the lease holds nothing of ours.
            self.revoke_later(lease_id);
            return Ok(Attempt::Taken { expires_in: None });
        }
        let fence = Some(answer.revision)
            .filter(|&r| r > 0)
            .ok_or_else(|| unexpected("a transaction without a revision"))?;
        if Instant::now() >= valid_until {
            // The Jepsen rule, as for an acquisition.
            self.revoke_later(lease_id);
            return Err(Error::unavailable(
                NAME,
                "etcd confirmed the hand-over only after the lock's TTL had passed; not granted",
            ));
        }
        entry.valid_until = valid_until;
        entry.slot = Some(slot);
        entry.value_fence = None;
        lock(&self.held).hold(to, entry);
        Ok(Attempt::Granted {
            fence: fence as u64,
            valid_until,
        })
    }

    /// Deletes the grant's key (the lock key, or its holder key) while it is still
    /// `lease`'s, then frees or revokes its etcd lease.
    /// A move an extension left unanswered is finished first, so the key's lease and value
    /// are known.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<()> {
        let sent = Instant::now();
        let mut entry = lock(&self.held).map.remove(&lease.owner().as_u128());
        let full = self.full_key(lease.key());
        // An abandoned attempt's lease does not know its claim; its held entry does.
        let permits = entry.as_ref().map_or(lease.permits(), |e| e.permits);
        let at = grant_key(&full, lease.owner(), permits);
        let deleted = self
            .within("releasing", async {
                if let Some(pending) = entry.as_ref().and_then(Held::pending) {
                    let outcome = self.finish_move(&at, lease.owner(), pending).await?;
                    if outcome == Outcome::Lost {
                        return Ok((false, 0));
                    }
                    if let Some(loser) = entry.as_mut().and_then(|e| e.settle(outcome)) {
                        self.revoke_later(loser);
                    }
                }
                let value_fence = entry.as_ref().and_then(|e| e.value_fence);
                let txn = release_txn(&at, lease.owner(), value_fence);
                self.batch
                    .send(GroupKey::of(full.as_str()), txn, self.timeout)
                    .await
                    .map(|answer| (answer.succeeded(), answer.revision))
                    .map_err(failed("releasing"))
            })
            .await;
        if let Ok((true, revision)) = deleted {
            // Waiters in this process need not wait for the watch event of this deletion,
            // which then wakes nobody again.
            self.announcer
                .deleted_here(lease.key(), revision, self.demand.is_running());
        }
        let deleted = deleted.map(|(succeeded, _)| succeeded);
        if let Some(entry) = entry {
            let leases: Vec<i64> = entry.leases().collect();
            match (&deleted, entry.slot) {
                // The key was on this lease (an operation cut off half-way would have kept
                // its slot): the lease is free for the next lock.
                (Ok(true), Some(slot)) => self.recycle(slot),
                // Otherwise revoke it (both leases of a move still unanswered), which
                // deletes the key if it is still on one, and nothing else.
                _ => {
                    for id in leases {
                        self.revoke_later(id);
                    }
                }
            }
        }
        match deleted {
            Ok(true) if lease.valid_until() > sent => Ok(()),
            // Deleted, but its validity had passed: the hold was not ours to the end.
            Ok(_) => Err(lease.not_held()),
            Err(e) => Err(e),
        }
    }
}
