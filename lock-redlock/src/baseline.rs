//! The raw baseline of a Redlock ([`Baseline`]): each node's `SET NX PX`, then each node's
//! `DEL` ([`RedisNode::raw_set`], [`RedisNode::raw_del`]), fanned out and decided at a
//! majority as the lock's acquisitions and releases are.

use std::sync::Arc;

use async_trait::async_trait;
use lock_core::{Baseline, Result, Ttl};
use lock_redis::RedisNode;

use crate::backend::RedlockBackend;
use crate::fanout::Fanout;
use crate::nodes::Nodes;
use crate::quorum::{Stop, Tally};

/// What one raw cycle sends ([`Baseline::description`]).
pub const BASELINE_CYCLE: &str = "SET NX PX on every node, then DEL on every node";

/// One raw cycle on every node: the `SET`s with the per-node timeout of an acquisition of
/// `ttl`, done once a majority answered (as an acquisition returns at its quorum); then the
/// `DEL`s with the per-node timeout of a release, done once a majority answered, the rest
/// finishing in the background. A node whose `SET` is still on its way gets its `DEL`
/// behind it on the same connection.
///
/// Fewer than a majority answering either step is the quorum error, as for the lock; after
/// a failed `SET` step the `DEL`s still go out, in the background, as a failed
/// acquisition's clean-up does.
pub(crate) async fn raw_cycle(nodes: &Nodes, key: &str, ttl: Ttl) -> Result<()> {
    let n = nodes.members.len();
    let name: Arc<str> = Arc::from(key);
    let del = |node: RedisNode| {
        let name = name.clone();
        async move { node.raw_del(&name).await }
    };
    let mut sets = nodes.fan_out(0..n, nodes.timeout_for(Some(ttl.get())), |node| {
        let name = name.clone();
        async move { node.raw_set(&name, ttl).await }
    });
    let written = to_majority(nodes, &mut sets).await;
    // Requests handed to their connections are not recalled by dropping the rest.
    drop(sets);
    let mut dels = nodes.fan_out(0..n, nodes.timeout_for(None), del);
    if let Err(e) = written {
        dels.finish_in_background(|_, _| {});
        return Err(e);
    }
    let deleted = to_majority(nodes, &mut dels).await;
    dels.finish_in_background(|_, _| {});
    deleted
}

/// Waits until a majority of `replies` succeeded (`Ok`) or no majority can any more (the
/// quorum error).
async fn to_majority(nodes: &Nodes, replies: &mut Fanout<()>) -> Result<()> {
    let tally = Tally::new(nodes.members.len(), nodes.quorum, Stop::Unreachable)
        .count_successes(replies)
        .await;
    if tally.reached() {
        Ok(())
    } else {
        Err(nodes.quorum_error(tally.yes.len(), tally.failed))
    }
}

/// `SET NX PX` on every node, then `DEL` on every node, each step decided at a majority as
/// the lock's acquisitions and releases are; a step that misses the majority is
/// [`Error::QuorumNotReached`](lock_core::Error::QuorumNotReached). Cut off (an error, a
/// dropped future), it leaves at most the raw key `<prefix>{<name>}:baseline` on some
/// nodes, which expires after the TTL.
#[async_trait]
impl Baseline for RedlockBackend {
    fn description(&self) -> &'static str {
        BASELINE_CYCLE
    }

    async fn raw_cycle(&self, key: &str, ttl: Ttl) -> Result<()> {
        raw_cycle(&self.nodes, key, ttl).await
    }
}
