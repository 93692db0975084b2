//! Acquisition: transactions on a pooled or new lease (one for a free key), and what a
//! refused attempt learns about the holders.

use std::time::{Duration, Instant};

use etcd_client::Txn;
use lock_core::group::GroupKey;
use lock_core::sync::lock;
use lock_core::{Attempt, Error, Owner, Permits, Result};

use crate::batch::Answer;
use crate::error::{acquire_failed, is_lease_not_found, timed_out, unexpected, NAME};
use crate::held::Held;
use crate::leases::{secs, EtcdLease, Renewal};
use crate::permits::{Claim, Grants, Next, CONTENDED_ROUNDS};
use crate::shared::Shared;
use crate::txn::Seen;

/// How many leases of other processes' grants a refused attempt asks etcd about.
const ASKED_LEASES: usize = 4;

impl Shared {
    /// One attempt to take `permits` of `key`, cut off by the operation timeout.
    pub(crate) async fn attempt(
        &self,
        key: &str,
        owner: Owner,
        permits: Permits,
        ttl: Duration,
        ttl_secs: i64,
    ) -> Result<Attempt> {
        let started = Instant::now();
        let mut used = Vec::new();
        let attempt = self.attempt_within(key, owner, permits, ttl, ttl_secs, started, &mut used);
        match tokio::time::timeout(self.timeout, attempt).await {
            Ok(result) => result,
            Err(_) => {
                // The cut-off requests may have attached the key to one of these leases:
                // revoking them removes it.
                for id in used {
                    self.revoke_later(id);
                }
                Err(timed_out("acquiring", self.timeout))
            }
        }
    }

    /// The first transaction (for a free key) on a pooled or new lease, then as many as
    /// the refused ones' reads ask for, up to [`CONTENDED_ROUNDS`].
    #[allow(clippy::too_many_arguments)]
    async fn attempt_within(
        &self,
        key: &str,
        owner: Owner,
        permits: Permits,
        ttl: Duration,
        ttl_secs: i64,
        started: Instant,
        used: &mut Vec<i64>,
    ) -> Result<Attempt> {
        let valid_until = started + ttl;
        let full = self.full_key(key);
        let claim = Claim::new(&full, owner, permits);
        let spare = lock(&self.pool).take(ttl_secs, started);
        let reused = match spare {
            Some(slot) => {
                let txn = claim.first(slot.id);
                self.send_on_lease(slot, valid_until, &full, txn, used)
                    .await?
            }
            None => None,
        };
        let (slot, mut response) = match reused {
            Some(done) => done,
            None => self.acquire_with_new_lease(ttl_secs, &claim, used).await?,
        };
        let mut rounds = 1;
        loop {
            if response.succeeded() {
                return self.granted(owner, permits, slot, ttl_secs, valid_until, &response);
            }
            let grants = Grants::read(&response.response);
            // Grants of this backend past their validity that etcd has not expired yet:
            // their leases can go now.
            let stale: Vec<i64> = grants
                .all()
                .filter_map(|seen| self.expired_holder(seen))
                .collect();
            let txn = if stale.is_empty() {
                match claim.next(key, &grants, response.revision, slot.id) {
                    Next::Again(txn) => txn,
                    Next::Refused(e) => {
                        self.recycle(slot);
                        return Err(e);
                    }
                    Next::Taken => {
                        // Its waiter hears of the next delete from the watch, from right
                        // after this answer.
                        self.demand.ensure(key, response.revision.saturating_add(1));
                        let expires_in = self.earliest_expiry(&grants).await;
                        // Back to the pool only after the last await: an attempt cut off
                        // by its timeout revokes every lease it used, and a lease already
                        // in the pool may by then carry another grant.
                        self.recycle(slot);
                        return Ok(Attempt::Taken { expires_in });
                    }
                }
            } else {
                for id in stale {
                    if let Err(e) = self.revoke(id).await {
                        self.recycle(slot);
                        return Err(e);
                    }
                }
                claim.first(slot.id)
            };
            if rounds >= CONTENDED_ROUNDS {
                self.recycle(slot);
                return Err(Error::unavailable(
                    NAME,
                    format!(
                        "the grants of the key changed under {CONTENDED_ROUNDS} transactions \
                         in a row (contended); not granted"
                    ),
                ));
            }
            rounds += 1;
            response = self.send_or_revoke(&full, txn, slot.id).await?;
        }
    }

    /// Records a grant confirmed by `response` and answers it, its fence the revision of
    /// the transaction that wrote it; refused when the confirmation came after the
    /// validity (the Jepsen rule).
    fn granted(
        &self,
        owner: Owner,
        permits: Permits,
        slot: EtcdLease,
        ttl_secs: i64,
        valid_until: Instant,
        response: &Answer,
    ) -> Result<Attempt> {
        let fence = Some(response.revision)
            .filter(|&r| r > 0)
            .ok_or_else(|| unexpected("a transaction without a revision"))?;
        if Instant::now() >= valid_until {
            // Granted on a lease that may already have run out: never hand that out.
            self.revoke_later(slot.id);
            return Err(Error::unavailable(
                NAME,
                "etcd confirmed the grant only after the lock's TTL had passed; not granted",
            ));
        }
        lock(&self.held).hold(
            owner,
            Held {
                lease_id: slot.id,
                ttl_secs,
                valid_until,
                slot: Some(slot),
                value_fence: None,
                moving: None,
                permits,
            },
        );
        Ok(Attempt::Granted {
            fence: fence as u64,
            valid_until,
        })
    }

    /// `txn` (an acquisition or a hand-over on `slot`'s lease): as is when the lease is
    /// known to live past `valid_until`, with a renewal of the lease at the same time
    /// otherwise. `None` when the lease turned out to have expired.
    pub(crate) async fn send_on_lease(
        &self,
        mut slot: EtcdLease,
        valid_until: Instant,
        full: &str,
        txn: Txn,
        used: &mut Vec<i64>,
    ) -> Result<Option<(EtcdLease, Answer)>> {
        used.push(slot.id);
        let client = self.client();
        if slot.covers(valid_until) {
            let response = self.send_or_revoke(full, txn, slot.id).await?;
            return Ok(Some((slot, response)));
        }
        let (renewal, txn) = futures::join!(
            slot.keep_alive(&client),
            self.batch.send(GroupKey::of(full), txn, self.timeout)
        );
        match (renewal, txn) {
            (Ok(Renewal::Alive), Ok(response)) => Ok(Some((slot, response))),
            (Ok(Renewal::Gone), Ok(response)) => {
                if response.succeeded() {
                    // The key went onto a lease that is about to be revoked: take it back
                    // before trying again with a new lease.
                    self.revoke(slot.id).await?;
                }
                Ok(None)
            }
            (Ok(Renewal::Gone), Err(e)) if is_lease_not_found(&e) => Ok(None),
            (Err(e), _) | (_, Err(e)) => {
                self.revoke_later(slot.id);
                Err(acquire_failed(e))
            }
        }
    }

    /// Grants a new lease, then runs the claim's first transaction on it.
    async fn acquire_with_new_lease(
        &self,
        ttl_secs: i64,
        claim: &Claim<'_>,
        used: &mut Vec<i64>,
    ) -> Result<(EtcdLease, Answer)> {
        let slot = self.grant(ttl_secs, used).await?;
        let response = self
            .send_or_revoke(claim.full, claim.first(slot.id), slot.id)
            .await?;
        Ok((slot, response))
    }

    /// Sends `txn`, which puts a grant of lock key `full` on lease `lease_id` (grouped by
    /// `full`: a group's comparisons are all made before its writes, so two transactions
    /// of one key never share a group); when that fails, revokes the
    /// lease, which removes the key should etcd have applied the transaction after all.
    async fn send_or_revoke(&self, full: &str, txn: Txn, lease_id: i64) -> Result<Answer> {
        match self.batch.send(GroupKey::of(full), txn, self.timeout).await {
            Ok(response) => Ok(response),
            Err(e) => {
                self.revoke_later(lease_id);
                Err(acquire_failed(e))
            }
        }
    }

    /// The lease of a lock of this backend whose validity has passed, taken out of the
    /// held table; `None` for a valid lock or another process's.
    fn expired_holder(&self, seen: &Seen) -> Option<i64> {
        let owner = seen.owner?.as_u128();
        let mut held = lock(&self.held);
        let entry = held.map.get(&owner)?;
        if !entry.carries(seen.lease) || Instant::now() < entry.valid_until {
            return None;
        }
        let entry = held.map.remove(&owner)?;
        drop(held);
        // The other lease of an unanswered move holds nothing of ours either.
        for id in entry.leases().filter(|&id| id != seen.lease) {
            self.revoke_later(id);
        }
        Some(seen.lease)
    }

    /// How long the holder has left: exactly for a lock of this backend, from its lease's
    /// remaining whole seconds (rounded up) for another process's.
    pub(crate) async fn expires_in(&self, seen: Option<&Seen>) -> Option<Duration> {
        let seen = seen?;
        if let Some(owner) = seen.owner {
            if let Some(entry) = lock(&self.held).map.get(&owner.as_u128()) {
                if entry.carries(seen.lease) {
                    return Some(entry.valid_until.saturating_duration_since(Instant::now()));
                }
            }
        }
        if seen.lease == 0 {
            return None;
        }
        match self
            .client()
            .lease_client()
            .time_to_live(seen.lease, None)
            .await
        {
            Ok(answer) if answer.ttl() >= 0 => Some(secs(answer.ttl() + 1)),
            _ => None,
        }
    }

    /// How long until the earliest of `grants` expires: [`expires_in`](Self::expires_in)
    /// of each (asking etcd about the leases of at most [`ASKED_LEASES`] grants of other
    /// processes, together), the least of those known.
    async fn earliest_expiry(&self, grants: &Grants) -> Option<Duration> {
        let mut asked = 0;
        let mut known: Vec<_> = Vec::new();
        for seen in grants.all() {
            let ours = seen.owner.is_some_and(|o| {
                lock(&self.held)
                    .map
                    .get(&o.as_u128())
                    .is_some_and(|e| e.carries(seen.lease))
            });
            if !ours {
                if asked == ASKED_LEASES {
                    continue;
                }
                asked += 1;
            }
            known.push(self.expires_in(Some(seen)));
        }
        futures::future::join_all(known)
            .await
            .into_iter()
            .flatten()
            .min()
    }
}
