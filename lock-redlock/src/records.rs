//! Run records on a quorum: each node keeps the history as one Redis server does
//! ([`RedisNode::append_run`](lock_redis::RedisNode::append_run)); an append (or a job
//! control's change) counts when a majority stored it, a read merges the answers of a
//! majority.

use std::cmp::Reverse;
use std::collections::hash_map::{Entry, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use lock_core::records::{JobControl, Retention, RunOutcome, RunRecord, RunRecords};
use lock_core::Result;
use lock_redis::RedisNode;

use crate::backend::RedlockBackend;
use crate::nodes::Nodes;
use crate::quorum::{Stop, Tally};

/// Runs the write `op` on every node: `Ok` once a majority did it (the others still do, in
/// the background), else the quorum error.
async fn write<F, Fut>(nodes: &Nodes, op: F) -> Result<()>
where
    F: Fn(RedisNode) -> Fut,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    let n = nodes.members.len();
    let mut replies = nodes.fan_out(0..n, nodes.timeout_for(None), op);
    let tally = Tally::new(n, nodes.quorum, Stop::Unreachable)
        .count_successes(&mut replies)
        .await;
    // The minority still writes, so that the nodes stay alike.
    replies.finish_in_background(|_, _| {});
    if tally.reached() {
        Ok(())
    } else {
        Err(nodes.quorum_error(tally.yes.len(), tally.failed))
    }
}

/// Stores `record` on every node, trimming each node's history to `keep`: `Ok` once a
/// majority stored it (the others still get it, in the background), else the quorum error.
pub(crate) async fn append(nodes: &Nodes, record: &RunRecord, keep: Retention) -> Result<()> {
    let record = Arc::new(record.clone());
    write(nodes, |node| {
        let record = record.clone();
        async move { node.append_run(&record, keep).await }
    })
    .await
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

/// Newest first for the last success and failure: by end, then by fire time.
fn age(record: &RunRecord) -> (SystemTime, SystemTime) {
    (record.ended_at, record.scheduled_at)
}

/// Where a record stands in a node's history, which keeps each slot where it was first
/// stored: when its slot was first written, as near as the record tells (a run's start:
/// its running record was stored then, and its end replaced it in place; else its end: a
/// record of a fire time that did not run is stored when that was decided), then its fire
/// time.
fn position(record: &RunRecord) -> (SystemTime, SystemTime) {
    (
        record.started_at.unwrap_or(record.ended_at),
        record.scheduled_at,
    )
}

/// Of two records of one slot, which one was stored later (and so replaced the other on
/// the nodes that have it): the end of a run over its running record, else the later end.
fn written_later(record: &RunRecord, than: &RunRecord) -> bool {
    let last = |r: &RunRecord| (r.outcome != RunOutcome::Running, r.ended_at);
    last(record) > last(than)
}

/// The newest `limit` records of a majority's answers (each newest first), one per slot.
///
/// Every record stored by a majority is in one of them. A node that missed an append
/// (down then) may still hold the slot's earlier record (a run's running record), which
/// the later one replaces here as it did on the other nodes; and it may hold older records
/// that the others' trims dropped, so the union can exceed the retention: each class
/// (successes, others) is cut to the most records of that class in a single answer, which
/// each node's own trim keeps within its retention.
pub(crate) fn merge(answers: Vec<Vec<RunRecord>>, limit: usize) -> Vec<RunRecord> {
    let most = |success: bool| {
        answers
            .iter()
            .map(|a| {
                a.iter()
                    .filter(|r| (r.outcome == RunOutcome::Ok) == success)
                    .count()
            })
            .max()
            .unwrap_or(0)
    };
    let (most_successes, most_others) = (most(true), most(false));
    let mut slots: HashMap<String, usize> = HashMap::new();
    let mut all: Vec<RunRecord> = Vec::new();
    for record in answers.into_iter().flatten() {
        match slots.entry(record.slot()) {
            Entry::Occupied(kept) => {
                let kept = &mut all[*kept.get()];
                if written_later(&record, kept) {
                    *kept = record;
                }
            }
            Entry::Vacant(slot) => {
                slot.insert(all.len());
                all.push(record);
            }
        }
    }
    // Stable: records of equal positions keep the order the first answer gave them.
    all.sort_by_key(|r| Reverse(position(r)));
    let (mut successes, mut others) = (0, 0);
    all.retain(|r| {
        let (count, most) = if r.outcome == RunOutcome::Ok {
            (&mut successes, most_successes)
        } else {
            (&mut others, most_others)
        };
        *count += 1;
        *count <= most
    });
    all.truncate(limit);
    all
}

/// The history of scheduled runs on the nodes, each keeping it as a single Redis server
/// does (`<prefix>runs:{job}`, `<prefix>runs:{job}:ok`, `<prefix>runs:{job}:failed` and
/// the job's control at `<prefix>runs:{job}:control`, see
/// [`RedisNode`](lock_redis::RedisNode)), every request bounded by the per-node timeout of
/// the requests without a TTL ([`RedlockBackend::timeout_for`]`(None)`):
///
/// - an append, or a change of a job's control, goes to every node at once and is `Ok`
///   once a majority stored it (the rest finish in the background); with fewer, the
///   quorum error ([`Error::QuorumNotReached`](lock_core::Error::QuorumNotReached), or a
///   node's own error when every node could refuse it, e.g. a foreign value);
/// - a read asks every node and uses the first majority to answer, so every record (and
///   control) a majority stored is seen: `recent` merges the answers, one record per slot
///   (the one stored last: a run's end over its running record), newest first by where
///   the record stands on a node (when its slot was first stored: the run's start, else
///   the record's end; then its fire time), each class at most as many as one answer
///   holds (a node that missed appends keeps records the others' retention dropped);
///   `last_success` and `last_failure` are the newest of the answers by end, `control`
///   the answers' latest change (`JobControl::changed_at`).
///
/// Nodes that missed an append (down, or slow past the timeout) keep a shorter history
/// until they catch up with later appends; nothing repairs them otherwise.
#[async_trait]
impl RunRecords for RedlockBackend {
    async fn append(&self, record: &RunRecord, keep: Retention) -> Result<()> {
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

    async fn last_failure(&self, job: &str) -> Result<Option<RunRecord>> {
        let job: Arc<str> = Arc::from(job);
        let answers = read(&self.nodes, |node| {
            let job = job.clone();
            async move { node.last_failure(&job).await }
        })
        .await?;
        Ok(answers.into_iter().flatten().max_by_key(age))
    }

    async fn set_control(&self, job: &str, control: &JobControl) -> Result<()> {
        let (job, control): (Arc<str>, _) = (Arc::from(job), Arc::new(control.clone()));
        write(&self.nodes, |node| {
            let (job, control) = (job.clone(), control.clone());
            async move { node.set_control(&job, &control).await }
        })
        .await
    }

    async fn control(&self, job: &str) -> Result<Option<JobControl>> {
        let job: Arc<str> = Arc::from(job);
        let answers = read(&self.nodes, |node| {
            let job = job.clone();
            async move { node.control(&job).await }
        })
        .await?;
        Ok(answers
            .into_iter()
            .flatten()
            .max_by_key(|control| control.changed_at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn at(n: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + n)
    }

    fn run(n: u64) -> RunRecord {
        RunRecord::new(
            "j",
            at(n),
            "r",
            at(n) + Duration::from_millis(10),
            RunOutcome::Ok,
        )
        .started_at(Some(at(n)))
        .fence(Some(n))
    }

    fn ended(n: u64, outcome: RunOutcome) -> RunRecord {
        let mut record = run(n);
        record.outcome = outcome;
        record
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
    fn each_class_is_cut_to_the_most_one_answer_holds() {
        // keep 1 of each: failure 5 missed the last node, which still holds failure 4.
        let failed = |n| ended(n, RunOutcome::Failed);
        let merged = merge(vec![vec![failed(5), run(0)], vec![failed(4), run(0)]], 10);
        assert_eq!(
            merged,
            [failed(5), run(0)],
            "the success a majority kept stays"
        );
    }

    #[test]
    fn equal_starts_are_ordered_by_fire_time() {
        let mut late = run(1);
        late.started_at = run(5).started_at;
        let merged = merge(vec![vec![run(5), late.clone()], vec![run(5)]], 10);
        assert_eq!(merged, [run(5), late]);
    }

    #[test]
    fn a_runs_end_replaces_its_running_record_in_its_place() {
        // Run 1 started, fire time 2 was skipped while it ran, then run 1 ended (after
        // fire time 2's record) on every node but the last, which missed the end.
        let mut end = ended(1, RunOutcome::Failed);
        end.ended_at = at(3);
        let mut skipped = RunRecord::new("j", at(2), "r2", at(2), RunOutcome::SkippedBusy);
        skipped.ended_at = at(2) + Duration::from_millis(5);
        let mut running = ended(1, RunOutcome::Running);
        running.ended_at = at(1);
        for answers in [
            vec![
                vec![skipped.clone(), end.clone()],
                vec![skipped.clone(), running.clone()],
            ],
            vec![
                vec![skipped.clone(), running.clone()],
                vec![skipped.clone(), end.clone()],
            ],
        ] {
            assert_eq!(merge(answers, 10), [skipped.clone(), end.clone()]);
        }
    }
}
