//! The locks this backend granted and has not released yet: their lease, TTL, validity
//! and value fence, by owner token.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use lock_core::Owner;

use crate::leases::EtcdLease;

/// How long past its validity a held-lock record of a guard that never released is kept.
const HELD_GRACE: Duration = Duration::from_secs(60);

/// A lock granted through this backend and not yet released, by owner token.
#[derive(Default)]
pub(crate) struct HeldTable {
    pub(crate) map: HashMap<u128, Held>,
    /// Size after the last sweep of long-expired records; the next sweep runs at twice that.
    swept_at: usize,
}

pub(crate) struct Held {
    pub(crate) lease_id: i64,
    pub(crate) ttl_secs: i64,
    pub(crate) valid_until: Instant,
    /// The lease with its keep-alive stream; out while an extension uses it.
    pub(crate) slot: Option<EtcdLease>,
    /// The fence written into the key's value, once the key was moved to a new lease (see
    /// [`stored_value`](crate::txn::stored_value)).
    pub(crate) value_fence: Option<u64>,
}

impl HeldTable {
    /// Records `owner`'s lock, first sweeping out records long past their validity when
    /// the table has doubled since the last sweep.
    pub(crate) fn hold(&mut self, owner: Owner, entry: Held) {
        let now = Instant::now();
        if self.map.len() >= 64 && self.map.len() >= self.swept_at * 2 {
            self.map.retain(|_, h| h.valid_until + HELD_GRACE > now);
            self.swept_at = self.map.len();
        }
        self.map.insert(owner.as_u128(), entry);
    }
}
