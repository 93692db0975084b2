//! Run records on a quorum: each node keeps the history as one Redis server does
//! ([`RedisNode::append_run`](lock_redis::RedisNode::append_run)); an append counts when a
//! majority stored it, a read merges the answers of a majority.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use lock_core::records::{RunRecord, RunRecords};
use lock_core::Result;
use lock_redis::RedisNode;

use crate::backend::RedlockBackend;
use crate::nodes::Nodes;
use crate::quorum::{Stop, Tally};

/// Stores `record` on every node, trimming each node's history to `keep`: `Ok` once a
/// majority stored it (the others still get it, in the background), else the quorum error.
pub(crate) async fn append(nodes: &Nodes, record: &RunRecord, keep: usize) -> Result<()> {
    let n = nodes.members.len();
    let record = Arc::new(record.clone());
    let mut replies = nodes.fan_out(0..n, nodes.timeout_for(None), |node| {
        let record = record.clone();
        async move { node.append_run(&record, keep).await }
    });
    let tally = Tally::new(n, nodes.quorum, Stop::Unreachable)
        .count_successes(&mut replies)
        .await;
    // The minority still stores it, so that the nodes' histories stay alike.
    replies.finish_in_background(|_, _| {});
    if tally.reached() {
        Ok(())
    } else {
        Err(nodes.quorum_error(tally.yes.len(), tally.failed))
    }
}

/// The answers of the first majority of nodes to answer the read `op`, or the quorum error.
async fn read<T, F, Fut>(nodes: &Nodes, op: F) -> Result<Vec<T>>
where
    F: Fn(RedisNode) -> Fut,
    Fut: Future<Output = Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let n = nodes.members.len();
    let mut replies = nodes.fan_out(0..n, nodes.timeout_for(None), op);
    let mut tally: Tally<T> = Tally::new(n, nodes.quorum, Stop::Unreachable);
    while let Some((i, reply)) = replies.next().await {
        match reply {
            Ok(answer) => tally.yes(i, answer),
            Err(e) => tally.fail(i, e),
        }
        if tally.decided() {
            break;
        }
    }
    if tally.reached() {
        Ok(tally.yes.into_iter().map(|(_, answer)| answer).collect())
    } else {
        Err(nodes.quorum_error(tally.yes.len(), tally.failed))
    }
}

/// Newest first: by end, then by fire time.
fn age(record: &RunRecord) -> (SystemTime, SystemTime) {
    (record.ended_at, record.scheduled_at)
}

/// The newest `limit` records of a majority's answers (each newest first), each once.
///
/// Every record stored by a majority is in one of them. A node that missed an append
/// (down then) still holds an older record the others' trims dropped, so the union can
/// exceed the retention: it is cut to the longest single answer, which each node's own trim
/// keeps within `keep`.
pub(crate) fn merge(answers: Vec<Vec<RunRecord>>, limit: usize) -> Vec<RunRecord> {
    let longest = answers.iter().map(Vec::len).max().unwrap_or(0);
    let mut all: Vec<RunRecord> = answers.into_iter().flatten().collect();
    // Stable: records of equal times keep the order the first answer gave them.
    all.sort_by_key(|r| std::cmp::Reverse(age(r)));
    let mut seen = HashSet::new();
    all.retain(|r| seen.insert(r.encode()));
    all.truncate(longest.min(limit));
    all
}

/// The history of scheduled runs on the nodes, each keeping it as a single Redis server
/// does (`<prefix>runs:{job}` and `<prefix>runs:{job}:ok`, see
/// [`RedisNode`](lock_redis::RedisNode)), every request bounded by the per-node timeout of
/// the requests without a TTL ([`RedlockBackend::timeout_for`]`(None)`):
///
/// - an append goes to every node at once and is `Ok` once a majority stored it (the rest
///   finish in the background); with fewer, the quorum error
///   ([`Error::QuorumNotReached`](lock_core::Error::QuorumNotReached), or a node's own
///   error when every node could refuse it, e.g. a foreign value);
/// - a read asks every node and uses the first majority to answer, so every record a
///   majority stored is seen: `recent` merges the answers, each record once, newest first
///   by its end then its fire time (the nodes may have stored them in different orders),
///   at most as many as the longest answer (a node that missed appends keeps records the
///   others' retention dropped); `last_success` is the newest of the answers.
///
/// Nodes that missed an append (down, or slow past the timeout) keep a shorter history
/// until they catch up with later appends; nothing repairs them otherwise.
#[async_trait]
impl RunRecords for RedlockBackend {
    async fn append(&self, record: &RunRecord, keep: usize) -> Result<()> {
        append(&self.nodes, record, keep).await
    }

    async fn recent(&self, job: &str, limit: usize) -> Result<Vec<RunRecord>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let job: Arc<str> = Arc::from(job);
        let answers = read(&self.nodes, |node| {
            let job = job.clone();
            async move { node.recent_runs(&job, limit).await }
        })
        .await?;
        Ok(merge(answers, limit))
    }

    async fn last_success(&self, job: &str) -> Result<Option<RunRecord>> {
        let job: Arc<str> = Arc::from(job);
        let answers = read(&self.nodes, |node| {
            let job = job.clone();
            async move { node.last_success(&job).await }
        })
        .await?;
        Ok(answers.into_iter().flatten().max_by_key(age))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::records::RunOutcome;
    use std::time::{Duration, UNIX_EPOCH};

    fn run(n: u64) -> RunRecord {
        let at = UNIX_EPOCH + Duration::from_secs(1_800_000_000 + n);
        RunRecord::new("j", at, "r", at + Duration::from_millis(10), RunOutcome::Ok)
            .started_at(Some(at))
            .fence(Some(n))
    }

    #[test]
    fn answers_merge_newest_first_each_record_once() {
        let merged = merge(vec![vec![run(4), run(3), run(2)], vec![run(4), run(2)]], 10);
        assert_eq!(merged, [run(4), run(3), run(2)]);
        assert_eq!(merge(vec![vec![run(4), run(3)]], 1), [run(4)]);
        assert!(merge(vec![vec![], vec![]], 10).is_empty());
    }

    #[test]
    fn a_node_that_missed_an_append_adds_nothing_past_the_retention() {
        // keep 3: record 2 missed the last node, which still holds record 0.
        let merged = merge(
            vec![vec![run(3), run(2), run(1)], vec![run(3), run(1), run(0)]],
            10,
        );
        assert_eq!(merged, [run(3), run(2), run(1)]);
    }

    #[test]
    fn equal_times_are_ordered_by_fire_time() {
        let mut late = run(1);
        late.ended_at = run(5).ended_at;
        let merged = merge(vec![vec![run(5), late.clone()], vec![run(5)]], 10);
        assert_eq!(merged, [run(5), late]);
    }
}
