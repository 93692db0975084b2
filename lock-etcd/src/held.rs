//! The grants (locks and permits) this backend made and has not released yet: their lease,
//! TTL, validity, value fence and claim, by owner token, and the move to a new lease an extension may have left
//! unanswered.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use lock_core::{Owner, Permits};

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
    /// The lease the key is on (or was last known on).
    pub(crate) lease_id: i64,
    pub(crate) ttl_secs: i64,
    pub(crate) valid_until: Instant,
    /// The lease with its keep-alive stream; out while an extension uses it.
    pub(crate) slot: Option<EtcdLease>,
    /// The fence written into the key's value, once the key was moved to a new lease (see
    /// [`stored_value`](crate::txn::stored_value)).
    pub(crate) value_fence: Option<u64>,
    /// A move of the key from `lease_id` to a new lease that was (or may have been) sent
    /// and whose answer never came: the key may be on either lease. Recorded before the
    /// new lease is granted; cleared once the outcome is known (see
    /// [`Shared::finish_move`](crate::shared::Shared::finish_move)).
    pub(crate) moving: Option<Move>,
    /// What the grant claims: [`Permits::LOCK`] (its key is the lock key) or permits (its
    /// key is a holder key, see `permits.rs`). Recorded here because an abandoned
    /// attempt's clean-up knows only the owner.
    pub(crate) permits: Permits,
}

/// The target of a move to a new lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Move {
    pub(crate) lease_id: i64,
    pub(crate) ttl_secs: i64,
    /// The fence the moved key's value carries: the grant's.
    pub(crate) fence: u64,
}

/// A move whose outcome is unknown, with what the key looked like before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pending {
    pub(crate) from: i64,
    pub(crate) value_fence: Option<u64>,
    pub(crate) to: Move,
}

/// What sending a pending move again found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The key is ours on the new lease: moved now, or by the first copy.
    Moved,
    /// The new lease does not exist (never granted, or gone): the key is not on it and
    /// never will be.
    Stayed,
    /// The key is not ours any more.
    Lost,
}

impl Held {
    /// Every lease that may carry the key.
    pub(crate) fn leases(&self) -> impl Iterator<Item = i64> {
        std::iter::once(self.lease_id).chain(self.moving.map(|to| to.lease_id))
    }

    /// Whether the key may be on lease `id`.
    pub(crate) fn carries(&self, id: i64) -> bool {
        self.leases().any(|lease| lease == id)
    }

    /// The move whose outcome is unknown, if any.
    pub(crate) fn pending(&self) -> Option<Pending> {
        self.moving.map(|to| Pending {
            from: self.lease_id,
            value_fence: self.value_fence,
            to,
        })
    }

    /// The key is on `to`'s lease, with `to`'s fence in its value.
    pub(crate) fn moved(&mut self, to: Move, slot: Option<EtcdLease>) {
        self.lease_id = to.lease_id;
        self.ttl_secs = to.ttl_secs;
        self.value_fence = Some(to.fence);
        self.slot = slot;
        self.moving = None;
    }

    /// Applies what finishing the pending move found, and returns the lease that can no
    /// longer carry the key, for the caller to revoke (after `Lost` the caller drops the
    /// entry and revokes both).
    pub(crate) fn settle(&mut self, outcome: Outcome) -> Option<i64> {
        let to = self.moving?;
        match outcome {
            Outcome::Moved => {
                let from = self.lease_id;
                self.moved(to, None);
                Some(from)
            }
            Outcome::Stayed | Outcome::Lost => {
                self.moving = None;
                Some(to.lease_id)
            }
        }
    }
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
