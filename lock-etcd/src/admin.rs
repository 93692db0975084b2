//! Administration ([`Admin::inspect`](lock_core::Admin::inspect),
//! [`Admin::force_release`](lock_core::Admin::force_release)): read or delete a key's
//! grants (its lock, or every holder of its permits) whoever holds them.

use etcd_client::{DeleteOptions, Txn, TxnOp, TxnOpResponse};
use lock_core::sync::lock;
use lock_core::{Holder, Permits, Result};

use crate::error::failed;
use crate::permits::{holders_of, read_grants, Grants};
use crate::shared::Shared;
use crate::txn::{seen, Seen};

impl Shared {
    /// Every grant of `key`, read in one transaction: its lock's holder, or the holders of
    /// its permits, each with its owner, fence, time left and claim.
    pub(crate) async fn inspect(&self, key: &str) -> Result<Vec<Holder>> {
        let full = self.full_key(key);
        self.within("inspecting", async {
            let current = self
                .client()
                .kv_client()
                .txn(Txn::new().and_then(read_grants(&full)))
                .await
                .map_err(failed("inspecting"))?;
            let grants = Grants::read(&current);
            let claims = grants.lock.iter().map(|seen| (seen, Permits::LOCK)).chain(
                grants.holders.iter().map(|h| {
                    // A key of the range that is not one of ours is shown as holding it all.
                    let claim = h.permits.unwrap_or(Permits::LOCK);
                    (&h.seen, claim)
                }),
            );
            let mut holders = Vec::new();
            for (seen, permits) in claims {
                let holder = Holder::new(
                    seen.owner,
                    u64::try_from(seen.fence).ok(),
                    self.expires_in(Some(seen)).await,
                );
                holders.push(holder.permits(permits));
            }
            Ok(holders)
        })
        .await
    }

    /// Deletes every grant of `key` (the lock key and the holder keys, in one
    /// transaction) whoever holds them, and revokes the holders' leases.
    pub(crate) async fn force_release(&self, key: &str) -> Result<bool> {
        let full = self.full_key(key);
        let removed = self
            .within("force-releasing", async {
                let with_prev = DeleteOptions::new().with_prev_key();
                let txn = Txn::new().and_then([
                    TxnOp::delete(full.as_str(), Some(with_prev.clone())),
                    TxnOp::delete(holders_of(&full), Some(with_prev.with_prefix())),
                ]);
                let deleted = self
                    .client()
                    .kv_client()
                    .txn(txn)
                    .await
                    .map_err(failed("force-releasing"))?;
                let gone: Vec<Seen> = deleted
                    .op_responses()
                    .into_iter()
                    .flat_map(|op| match op {
                        TxnOpResponse::Delete(d) => d.prev_kvs().iter().map(seen).collect(),
                        _ => Vec::new(),
                    })
                    .collect();
                for seen in &gone {
                    self.forget_forced(seen).await;
                }
                Ok(!gone.is_empty())
            })
            .await?;
        self.notices.notify(key);
        Ok(removed)
    }

    /// Forgets a grant a force-release deleted, and revokes its lease so that its holder's
    /// next renewal fails at once.
    async fn forget_forced(&self, seen: &Seen) {
        let entry = seen
            .owner
            .and_then(|owner| lock(&self.held).map.remove(&owner.as_u128()));
        // The other lease of an unanswered move holds nothing any more.
        for id in entry.iter().flat_map(|e| e.leases()) {
            if id != seen.lease {
                self.revoke_later(id);
            }
        }
        if seen.lease != 0 {
            if let Err(e) = self.revoke(seen.lease).await {
                tracing::debug!(error = %e.report(), "revoking a force-released grant's lease");
            }
        }
    }
}
