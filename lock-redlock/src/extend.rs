//! Extending a lease on a quorum.

use std::time::{Duration, Instant};

use lock_core::{Lease, Result, Ttl};

use crate::nodes::Nodes;
use crate::quorum::{Stop, Tally};

/// Pushes `lease`'s expiry to `ttl` on every node, of which `usable` is left after the drift
/// allowance: the new `valid_until` when a quorum extended it before the lease's current
/// validity passed, `NotHeld` when a majority answered "not ours" (or the quorum came too
/// late), else the quorum error.
pub(crate) async fn extend(
    nodes: &Nodes,
    lease: &Lease,
    ttl: Ttl,
    usable: Duration,
) -> Result<Instant> {
    let n = nodes.members.len();
    let start = Instant::now();
    let current = lease.valid_until();
    if start >= current {
        return Err(lease.not_held());
    }
    let key = lease.key_arc().clone();
    let owner = lease.owner();
    let timeout = nodes.timeout_for(Some(ttl.get())).min(current - start);
    let mut replies = nodes.fan_out(0..n, timeout, |node| {
        let key = key.clone();
        async move { node.extend(&key, owner, ttl).await }
    });
    let mut tally = Tally::new(n, nodes.quorum, Stop::Refused);
    while let Some((i, reply)) = replies.next().await {
        tally.add(i, reply.map(|extended| extended.is_some()));
        // As for release: a refusal by a majority is NotHeld (the guard is lost at once),
        // anything less certain is transient (the watchdog retries within the validity).
        if tally.decided() {
            break;
        }
    }
    if tally.reached() {
        let now = Instant::now();
        let valid_until = start + usable;
        // A quorum that answered after the lease's validity cannot vouch for the gap.
        return if now < current && now < valid_until {
            Ok(valid_until)
        } else {
            Err(lease.not_held())
        };
    }
    if tally.refused() {
        return Err(lease.not_held());
    }
    Err(nodes.quorum_error(tally.yes.len(), tally.failed))
}
