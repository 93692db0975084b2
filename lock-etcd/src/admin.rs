//! Administration ([`Admin::inspect`](lock_core::Admin::inspect),
//! [`Admin::force_release`](lock_core::Admin::force_release)): read or delete a lock
//! whoever holds it.

use etcd_client::DeleteOptions;
use lock_core::sync::lock;
use lock_core::{Holder, Result};

use crate::error::failed;
use crate::shared::Shared;
use crate::txn::seen;

impl Shared {
    /// Who holds `key`, with its fence and time left.
    pub(crate) async fn inspect(&self, key: &str) -> Result<Option<Holder>> {
        let full = self.full_key(key);
        self.within("inspecting", async {
            let current = self
                .client()
                .kv_client()
                .get(full, None)
                .await
                .map_err(failed("inspecting"))?;
            let Some(seen) = current.kvs().first().map(seen) else {
                return Ok(None);
            };
            Ok(Some(Holder::new(
                seen.owner,
                u64::try_from(seen.fence).ok(),
                self.expires_in(Some(&seen)).await,
            )))
        })
        .await
    }

    /// Deletes `key` whoever holds it, and revokes the holder's lease.
    pub(crate) async fn force_release(&self, key: &str) -> Result<bool> {
        let full = self.full_key(key);
        let removed = self
            .within("force-releasing", async {
                let deleted = self
                    .client()
                    .kv_client()
                    .delete(full, Some(DeleteOptions::new().with_prev_key()))
                    .await
                    .map_err(failed("force-releasing"))?;
                let Some(seen) = deleted.prev_kvs().first().map(seen) else {
                    return Ok(false);
                };
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
                    // The holder's next renewal then fails at once.
                    if let Err(e) = self.revoke(seen.lease).await {
                        tracing::debug!(error = %e.report(), "revoking a force-released lock's lease");
                    }
                }
                Ok(true)
            })
            .await?;
        self.notices.notify(key);
        Ok(removed)
    }
}
