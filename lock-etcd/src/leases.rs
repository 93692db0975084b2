//! etcd leases as this backend uses them: one per held lock, kept alive over its own
//! keep-alive stream, and recycled through a small pool once the lock is released.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use lock_core::Owner;

/// Idle leases kept for reuse, over all TTLs. Past it, released leases are revoked.
const POOL_CAP: usize = 256;

/// Seconds a lease outlives the lock on it: an idle lease reused within that time is still
/// alive for the lock's whole TTL without being renewed first.
pub(crate) const HEADROOM_SECS: i64 = 1;

/// One etcd lease of ours (an etcd lease, not a lock grant: those are [`lock_core::Lease`]).
pub(crate) struct EtcdLease {
    pub(crate) id: i64,
    /// The TTL of the locks it serves (its pool class); the lease's own TTL is this plus
    /// [`HEADROOM_SECS`].
    pub(crate) ttl_secs: i64,
    /// The lease lives at least until then: the instant before its last grant or renewal was
    /// sent, plus its TTL.
    pub(crate) alive_until: Instant,
    stream: Option<KeepAlive>,
}

/// An open `LeaseKeepAlive` stream: renewing over it is one message each way, instead of
/// opening a stream per renewal.
struct KeepAlive {
    keeper: LeaseKeeper,
    responses: LeaseKeepAliveStream,
    /// Set while a renewal waits for its answer. A renewal abandoned half-way (its future was
    /// dropped) leaves it set, and its late answer must not be read as the next one's, so the
    /// stream is then thrown away.
    in_flight: bool,
}

/// What a renewal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// Renewed for its full TTL from the moment the request was sent.
    Alive,
    /// The lease has expired or was revoked.
    Gone,
}

impl EtcdLease {
    /// A lease for locks of `ttl_secs`, just granted with `lease_secs`, the grant having been
    /// sent at `sent`.
    pub(crate) fn granted(id: i64, ttl_secs: i64, lease_secs: i64, sent: Instant) -> EtcdLease {
        EtcdLease {
            id,
            ttl_secs,
            alive_until: sent + secs(lease_secs),
            stream: None,
        }
    }

    /// A lease known only by its id, alive until `alive_until`.
    pub(crate) fn known(id: i64, ttl_secs: i64, alive_until: Instant) -> EtcdLease {
        EtcdLease {
            id,
            ttl_secs,
            alive_until,
            stream: None,
        }
    }

    /// Whether the lease is known to live at least until `until`.
    pub(crate) fn covers(&self, until: Instant) -> bool {
        self.alive_until >= until
    }

    /// Whether enough of the lease's life is left to be worth renewing for a new lock,
    /// rather than granting a new lease.
    fn fresh(&self, now: Instant) -> bool {
        self.alive_until > now + secs(self.ttl_secs) / 2
    }

    /// Renews the lease for its TTL: one round trip over the lease's open stream, or over a
    /// new one. Not bounded here: callers bound it with their operation's deadline.
    pub(crate) async fn keep_alive(
        &mut self,
        client: &Client,
    ) -> Result<Renewal, etcd_client::Error> {
        let sent = Instant::now();
        if let Some(open) = self.stream.as_mut().filter(|s| !s.in_flight) {
            open.in_flight = true;
            if open.keeper.keep_alive().await.is_ok() {
                if let Ok(Some(answer)) = open.responses.message().await {
                    open.in_flight = false;
                    return Ok(self.renewed(sent, answer.ttl()));
                }
            }
        }
        // No usable stream (none yet, broken, or abandoned mid-renewal): open a new one,
        // which renews once on the way.
        self.stream = None;
        match client.lease_client().keep_alive(self.id).await {
            Ok((keeper, responses)) => {
                self.stream = Some(KeepAlive {
                    keeper,
                    responses,
                    in_flight: false,
                });
                Ok(self.renewed(sent, self.ttl_secs + HEADROOM_SECS))
            }
            Err(etcd_client::Error::LeaseKeepAliveError(msg)) if msg.contains("not found") => {
                Ok(Renewal::Gone)
            }
            Err(e) => Err(e),
        }
    }

    fn renewed(&mut self, sent: Instant, ttl: i64) -> Renewal {
        if ttl > 0 {
            self.alive_until = sent + secs(ttl);
            Renewal::Alive
        } else {
            self.stream = None;
            Renewal::Gone
        }
    }
}

/// Idle leases by TTL, most recently used last.
#[derive(Default)]
pub(crate) struct Pool {
    idle: HashMap<i64, Vec<EtcdLease>>,
    count: usize,
}

impl Pool {
    /// A fresh idle lease of `ttl_secs`, if there is one. Stale ones met on the way are
    /// dropped: they hold no key and expire on the server by themselves.
    pub(crate) fn take(&mut self, ttl_secs: i64, now: Instant) -> Option<EtcdLease> {
        let list = self.idle.get_mut(&ttl_secs)?;
        while let Some(slot) = list.pop() {
            self.count -= 1;
            if slot.fresh(now) {
                return Some(slot);
            }
        }
        None
    }

    /// Keeps an idle lease (it must hold no key) for reuse. Returns it when the pool is full,
    /// for the caller to revoke.
    pub(crate) fn put(&mut self, slot: EtcdLease, now: Instant) -> Option<EtcdLease> {
        if !slot.fresh(now) {
            return None;
        }
        if self.count >= POOL_CAP {
            self.sweep(now);
            if self.count >= POOL_CAP {
                return Some(slot);
            }
        }
        self.count += 1;
        self.idle.entry(slot.ttl_secs).or_default().push(slot);
        None
    }

    /// Number of idle leases.
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// Empties the pool, returning the lease ids (to revoke them when the backend goes away).
    pub(crate) fn drain(&mut self) -> Vec<i64> {
        self.count = 0;
        self.idle
            .drain()
            .flat_map(|(_, list)| list.into_iter().map(|slot| slot.id))
            .collect()
    }

    fn sweep(&mut self, now: Instant) {
        for list in self.idle.values_mut() {
            list.retain(|slot| slot.fresh(now));
        }
        self.idle.retain(|_, list| !list.is_empty());
        self.count = self.idle.values().map(Vec::len).sum();
    }
}

pub(crate) fn secs(s: i64) -> Duration {
    Duration::from_secs(u64::try_from(s).unwrap_or(0))
}

/// A random lease id in `1..=i64::MAX`: chosen here rather than by etcd, so that an attempt
/// knows which lease to revoke even when the grant's answer never arrives.
pub(crate) fn new_lease_id() -> i64 {
    let bits = (Owner::random().as_u128() as u64) >> 1;
    i64::try_from(bits.max(1)).unwrap_or(1)
}
