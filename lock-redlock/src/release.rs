//! Releasing a lease on every node.

use std::sync::Arc;

use lock_core::{Lease, ReleaseNotices, Result};

use crate::nodes::Nodes;
use crate::quorum::{Stop, Tally};

/// Deletes `lease`'s key on every node where it is still ours (also after returning), waking
/// the local waiters through `notices`: `Ok` when a quorum still held it, `NotHeld` when a
/// majority did not, else the quorum error.
pub(crate) async fn release(
    nodes: &Nodes,
    notices: &Arc<ReleaseNotices>,
    lease: &Lease,
) -> Result<()> {
    let n = nodes.members.len();
    let key = lease.key_arc().clone();
    let owner = lease.owner();
    let mut replies = nodes.fan_out(0..n, nodes.timeout_for(None), |node| {
        let key = key.clone();
        async move { node.release(&key, owner).await }
    });
    // Hand the requests to the node connections, then wake the local waiters at once:
    // their attempts usually go out on the same connections behind the releases, so
    // every node sees the release first, and a hand-off inside a process saves a round
    // trip. (A notice that turns out early only costs the waiter one refused attempt;
    // the notice after the quorum wakes it again.)
    let early = replies.ready();
    notices.notify(&key);
    let mut tally = Tally::new(n, nodes.quorum, Stop::Refused);
    for (i, reply) in early {
        tally.add(i, reply);
    }
    // Decided: held by a quorum, or not ours on a majority. Otherwise wait for every
    // answer, to tell "not held" from "nodes unreachable".
    while !tally.decided() {
        let Some((i, reply)) = replies.next().await else {
            break;
        };
        tally.add(i, reply);
    }
    for (i, reply) in replies.ready() {
        tally.add(i, reply);
    }
    // The early notice may have come before a release reached its connection (a node
    // whose releases were queued for a group): a waiter that attempted at once was
    // refused and listens again, so tell it once more now that a quorum released.
    if tally.reached() {
        notices.notify(&key);
    }
    // The rest finish in the background, so that the lock is deleted wherever it is still
    // ours; without a quorum yet, each late release announces itself.
    let notify_late = !tally.reached();
    let (notices, name) = (notices.clone(), key.clone());
    replies.finish_in_background(move |_, reply| {
        if notify_late && matches!(reply, Ok(true)) {
            notices.notify(&name);
        }
    });
    if tally.reached() {
        Ok(())
    } else if tally.refused() {
        Err(lease.not_held())
    } else {
        Err(nodes.quorum_error(tally.yes.len(), tally.failed))
    }
}
