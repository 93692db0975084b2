//! Who holds a lock on a quorum, as far as the nodes can tell.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{Holder, Result};

use crate::nodes::Nodes;

/// The holder of `key` that [`RedlockBackend::inspect`](crate::RedlockBackend) reports (see
/// there); the fence only when `fencing` (the write-back) is on.
pub(crate) async fn holder(nodes: &Nodes, fencing: bool, key: &str) -> Result<Option<Holder>> {
    let q = nodes.quorum;
    let name: Arc<str> = Arc::from(key);
    let (answers, unknown) = nodes
        .ask_all(|node| {
            let name = name.clone();
            async move { node.inspect(&name).await }
        })
        .await?;
    let holders: Vec<Holder> = answers.into_iter().flatten().collect();
    // The holder is the owner whose key is (or, counting the nodes that did not answer,
    // may be) on a majority; a key on a minority is a leftover that expires by itself.
    let mut best: Option<(usize, Holder)> = None;
    for candidate in &holders {
        let same: Vec<&Holder> = holders
            .iter()
            .filter(|h| h.owner == candidate.owner)
            .collect();
        let count = same.len();
        if count + unknown < q || best.as_ref().is_some_and(|(c, _)| *c >= count) {
            continue;
        }
        let mut expiries: Vec<Option<Duration>> = same.iter().map(|h| h.expires_in).collect();
        // Longest first, `None` (no expiry) longest of all: a quorum holds it until the
        // q-th longest expires (with fewer keys seen, until the shortest does).
        expiries.sort_unstable_by_key(|e| std::cmp::Reverse((e.is_none(), *e)));
        // With the write-back a majority of the holder's nodes carry exactly its token (late
        // grants and nodes not raised carry others), so a value on a quorum of the answers
        // is the token. Without the write-back, or with too few answers, it is unknown.
        let fence = if fencing {
            same.iter()
                .filter_map(|h| h.fence)
                .find(|f| same.iter().filter(|h| h.fence == Some(*f)).count() >= q)
        } else {
            None
        };
        best = Some((
            count,
            Holder::new(candidate.owner, fence, expiries[q.min(count) - 1]),
        ));
    }
    Ok(best.map(|(_, holder)| holder))
}
