//! Reading the shared history: one line per fire time out of every replica's records.

use lock_core::records::{RunOutcome, RunRecord};

/// One record per fire time, newest fire time first: the record that says what happened
/// to it across the replicas.
///
/// Every replica records each fire time it saw (see [`Scheduler`](crate::Scheduler)): the
/// winner how its run ended, the others `skipped-busy` (or `missed`). Of the records of a
/// fire time this keeps the one of a run that started (there is one at most, unless clocks
/// were out of step by more than the hold covers; then the newest of them); without one,
/// a `failed` (the lock server failed), then a `skipped-busy` (the lock was held: a run of
/// an earlier fire time still going), then a `missed`. Input in any order.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(scheduler: lock_scheduler::Scheduler) -> Result<(), lock_scheduler::Error> {
/// let records = scheduler.recent("reports/daily", 100).await?;
/// for run in lock_scheduler::per_fire_time(&records) {
///     println!("{:?}: {} on {}", run.scheduled_at, run.outcome, run.replica);
/// }
/// # Ok(()) }
/// ```
pub fn per_fire_time(records: &[RunRecord]) -> Vec<RunRecord> {
    let rank = |r: &RunRecord| match (r.started_at.is_some(), r.outcome) {
        (true, _) => 0,
        (false, RunOutcome::Failed) => 1,
        (false, RunOutcome::SkippedBusy) => 2,
        (false, _) => 3,
    };
    let mut sorted: Vec<&RunRecord> = records.iter().collect();
    // Newest fire time first; within one, the most telling record first, then the newest.
    sorted.sort_by(|a, b| {
        b.scheduled_at
            .cmp(&a.scheduled_at)
            .then(rank(a).cmp(&rank(b)))
            .then(b.ended_at.cmp(&a.ended_at))
    });
    sorted.dedup_by_key(|r| r.scheduled_at);
    sorted.into_iter().cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    fn at(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(s)
    }

    fn record(fire: u64, replica: &str, outcome: RunOutcome, ran: bool) -> RunRecord {
        RunRecord::new("j", at(fire), replica, at(fire + 1), outcome)
            .started_at(ran.then(|| at(fire)))
            .fence(ran.then_some(fire))
    }

    /// The run wins over the other replicas' skips; a fire time nobody ran shows its skip.
    #[test]
    fn one_line_per_fire_time() {
        let records = [
            record(10, "b", RunOutcome::SkippedBusy, false),
            record(10, "a", RunOutcome::Ok, true),
            record(20, "a", RunOutcome::Missed, false),
            record(20, "b", RunOutcome::SkippedBusy, false),
            record(30, "b", RunOutcome::Failed, true),
            record(30, "a", RunOutcome::SkippedBusy, false),
        ];
        let lines: Vec<(SystemTime, RunOutcome, String)> = per_fire_time(&records)
            .into_iter()
            .map(|r| (r.scheduled_at, r.outcome, r.replica))
            .collect();
        assert_eq!(
            lines,
            [
                (at(30), RunOutcome::Failed, "b".to_owned()),
                (at(20), RunOutcome::SkippedBusy, "b".to_owned()),
                (at(10), RunOutcome::Ok, "a".to_owned()),
            ]
        );
    }
}
