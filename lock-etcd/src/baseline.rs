//! The raw baseline ([`Baseline`]): a plain put and a delete of a key outside the lock
//! prefix, on the client and within the timeout the lock's operations use.

use async_trait::async_trait;
use lock_core::{Baseline, Result, Ttl};

use crate::backend::EtcdBackend;
use crate::error::failed;
use crate::shared::Shared;

/// What one raw cycle sends ([`Baseline::description`]).
pub const BASELINE_CYCLE: &str = "put + delete";

/// The value the raw cycle puts: as long as an owner token, so the request is the size of
/// an acquisition's.
const RAW_VALUE: &str = "00000000000000000000000000000000";

impl Shared {
    /// The etcd key of the raw baseline of `key`: [`beside_prefix`](Self::beside_prefix)
    /// `("baseline")`, then `key`; `distlock.baseline/<key>` with the default prefix, never
    /// a lock key, and never seen by the release watch (over the prefix).
    pub(crate) fn baseline_key(&self, key: &str) -> String {
        let mut raw = self.beside_prefix("baseline");
        raw.push_str(key);
        raw
    }

    /// One raw cycle on [`baseline_key`](Self::baseline_key)`(key)`: a put without a lease,
    /// then a delete, each one request to the preferred member within the operation
    /// timeout, each a raft write as the lock's acquire and release transactions are (with a
    /// pooled lease, a lock cycle is two writes too). Unlike those they go alone, not
    /// grouped with others, and compare nothing.
    ///
    /// A cycle cut off between the two leaves the raw key (without a lease, so it stays)
    /// until the next raw cycle on the same key deletes it.
    async fn raw_cycle(&self, key: &str) -> Result<()> {
        let raw = self.baseline_key(key);
        let mut kv = self.client().kv_client();
        self.within("baseline put", async {
            kv.put(raw.as_str(), RAW_VALUE, None)
                .await
                .map_err(failed("baseline put"))
        })
        .await?;
        self.within("baseline delete", async {
            kv.delete(raw.as_str(), None)
                .await
                .map_err(failed("baseline delete"))
        })
        .await?;
        Ok(())
    }
}

/// A plain put, then a delete, of `<prefix minus its last character>.baseline/<key>`
/// (`distlock.baseline/<key>` with the default prefix, outside the lock prefix), each one
/// request within the operation timeout. `ttl` plays no part: the put carries no lease, so
/// a cycle cut off between the two leaves the raw key until the next raw cycle on the
/// same key deletes it.
#[async_trait]
impl Baseline for EtcdBackend {
    fn description(&self) -> &'static str {
        BASELINE_CYCLE
    }

    async fn raw_cycle(&self, key: &str, _ttl: Ttl) -> Result<()> {
        let (member, _) = self.shared.members.pick();
        let result = self.shared.raw_cycle(key).await;
        self.shared.members.note(member, result)
    }
}
