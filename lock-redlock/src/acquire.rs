//! One attempt to take a lock on a quorum: the requests, the fence write-back, and the
//! clean-up after an attempt that was not granted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{Attempt, Error, Owner, Result, Ttl};
use lock_redis::RedisNode;

use crate::error::validity_passed;
use crate::nodes::Nodes;
use crate::quorum::{Stop, Tally};

/// One attempt of `owner` on `key` for `ttl`, of which `usable` is left after the drift
/// allowance, the fence written back to a majority when `fencing` (see the crate
/// documentation for the outcomes).
pub(crate) async fn try_acquire(
    nodes: &Nodes,
    key: &str,
    owner: Owner,
    ttl: Ttl,
    usable: Duration,
    fencing: bool,
) -> Result<Attempt> {
    let (n, q) = (nodes.members.len(), nodes.quorum);
    let key: Arc<str> = Arc::from(key);
    let start = Instant::now();
    let valid_until = start + usable;
    let timeout = nodes.timeout_for(Some(ttl.get()));
    let mut replies = nodes.fan_out(0..n, timeout, |node| {
        let key = key.clone();
        async move { node.try_acquire(&key, owner, ttl).await }
    });
    // Granted with the node's fence, taken with the holder's remaining time, or failed.
    let mut tally: Tally<u64, Option<Duration>> = Tally::new(n, q, Stop::Unreachable);
    while let Some((i, reply)) = replies.next().await {
        match reply {
            Ok(Attempt::Granted { fence, .. }) => tally.yes(i, fence),
            Ok(Attempt::Taken { expires_in }) => tally.no(i, expires_in),
            Err(e) => tally.fail(i, e),
        }
        if tally.decided() {
            break;
        }
    }
    // Requests still in flight were handed to their connections: dropping their futures
    // does not recall them (a late grant is refused or deleted by `give_up`'s abandon, or
    // deleted by our release).
    drop(replies);
    let (quorum_granted, quorum_refused) = (tally.reached(), tally.refused());
    let Tally {
        yes: granted,
        no: taken,
        failed,
        ..
    } = tally;

    let mut failure = None;
    if quorum_granted {
        let reached = Instant::now();
        if reached < valid_until {
            let fence = granted.iter().map(|(_, f)| *f).max().unwrap_or(0);
            let written = if fencing {
                write_back(nodes, &key, fence, ttl, &granted, valid_until).await
            } else {
                Ok(())
            };
            match written {
                Ok(()) if Instant::now() < valid_until => {
                    return Ok(Attempt::Granted { fence, valid_until });
                }
                Ok(()) => failure = Some(validity_passed(start, ttl.get(), usable)),
                Err(e) => failure = Some(e),
            }
        } else {
            failure = Some(validity_passed(start, ttl.get(), usable));
        }
    }

    // Not granted: nodes that answered "taken" hold nothing of ours; every other node may
    // (a failed request may have been applied, an unanswered one may still be).
    let now: Vec<usize> = granted.iter().map(|(i, _)| *i).collect();
    let errored: Vec<usize> = failed.iter().map(|(i, _)| *i).collect();
    let unanswered: Vec<usize> = (0..n)
        .filter(|i| !now.contains(i) && !errored.contains(i) && !taken.iter().any(|(t, _)| t == i))
        .collect();
    give_up(nodes, &key, owner, timeout, now, errored, unanswered).await;

    if let Some(e) = failure {
        return Err(e);
    }
    if quorum_refused {
        // Winning some nodes means contenders may have split the nodes between them, and
        // their keys go away at once: no expiry hint, so the Locker retries after its
        // jittered backoff (contenders desynchronise) or at the first release notice.
        let expires_in = if granted.is_empty() {
            wake_hint(
                nodes,
                &mut taken.into_iter().map(|(_, e)| e).collect::<Vec<_>>(),
            )
        } else {
            None
        };
        return Ok(Attempt::Taken { expires_in });
    }
    Err(nodes.quorum_error(granted.len(), failed))
}

/// Cleans up after an attempt of `owner` that was not granted, on every node that may
/// hold it: `now` (those that granted) released before returning; `failed` (an error, e.g.
/// a timeout that discarded the node's connection) and `unanswered` (still on their way)
/// abandoned with a tombstone ([`RedisNode::abandon`]) in the background. A plain release
/// would do for an unanswered node only if it ran after the attempt, which one connection
/// keeps but a replaced one does not: a timeout of another request may discard the
/// connection the attempt sits on (or the attempt may have been re-sent), the release then
/// goes on a new one, overtakes it, and the attempt's late grant stays for its TTL. The
/// tombstone refuses the attempt whenever, and over whichever connection, it arrives.
async fn give_up(
    nodes: &Nodes,
    key: &Arc<str>,
    owner: Owner,
    timeout: Duration,
    now: Vec<usize>,
    mut failed: Vec<usize>,
    unanswered: Vec<usize>,
) {
    let release = |node: RedisNode| {
        let key = key.clone();
        async move { node.release(&key, owner).await }
    };
    let abandon = |node: RedisNode| {
        let key = key.clone();
        async move { node.abandon(&key, owner).await }
    };
    // No local notice for these: the keys never blocked a quorum, and a notice would wake
    // this very attempt's waiter at once.
    failed.extend(unanswered);
    nodes
        .fan_out(failed, nodes.timeout_for(None), abandon)
        .finish_in_background(|_, _| {});
    let mut replies = nodes.fan_out(now, timeout, release);
    while let Some((i, reply)) = replies.next().await {
        if let Err(e) = reply {
            tracing::debug!(node = nodes.members[i].addr, error = %e.report(), "release of an abandoned attempt failed; the key expires at its TTL");
        }
    }
}

/// Raises the key's fence counter to `fence` on enough granted nodes that a majority
/// has it (the nodes that issued `fence` have it already).
async fn write_back(
    nodes: &Nodes,
    key: &Arc<str>,
    fence: u64,
    ttl: Ttl,
    granted: &[(usize, u64)],
    valid_until: Instant,
) -> Result<()> {
    let have = granted.iter().filter(|(_, f)| *f == fence).count();
    let need = nodes.quorum.saturating_sub(have);
    if need == 0 {
        return Ok(());
    }
    let targets: Vec<usize> = granted
        .iter()
        .filter(|(_, f)| *f < fence)
        .map(|(i, _)| *i)
        .collect();
    let left = valid_until.saturating_duration_since(Instant::now());
    let timeout = nodes.timeout_for(Some(ttl.get())).min(left);
    let mut replies = nodes.fan_out(targets.iter().copied(), timeout, |node| {
        let key = key.clone();
        async move { node.raise_fence(&key, fence, ttl).await }
    });
    // Raised (or already at least `fence`) on `need` of the targets, or out of reach.
    let tally = Tally::new(targets.len(), need, Stop::Unreachable)
        .count_successes(&mut replies)
        .await;
    if tally.reached() {
        Ok(())
    } else {
        Err(Error::QuorumNotReached {
            granted: have + tally.yes.len(),
            needed: nodes.quorum,
            node_errors: tally.failed.into_iter().map(|(_, e)| e).collect(),
        })
    }
}

/// When a refused attempt may succeed without a release notice: when enough of the
/// holders' keys have expired for a quorum of nodes to be free, counting every node
/// that did not answer "taken" as free. `None` when that needs a key without expiry.
fn wake_hint(nodes: &Nodes, taken: &mut [Option<Duration>]) -> Option<Duration> {
    let free = nodes.members.len() - taken.len();
    let need = nodes.quorum.saturating_sub(free).max(1);
    // Soonest expiry first, keys without expiry last.
    taken.sort_unstable_by_key(|t| (t.is_none(), *t));
    taken.get(need - 1).copied().flatten()
}
