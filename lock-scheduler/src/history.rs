//! Reading the shared history: one line per fire time out of every replica's records.

use std::time::Duration;

use lock_core::records::{RunCause, RunOutcome, RunRecord};

/// One record per fire time, newest fire time first: the record that says what happened
/// to it across the replicas.
///
/// The journal keeps one record per fire time (the replica that claimed it writes it), but
/// a duplicate run has its own, and journals written by older versions have one per
/// replica. Of the records of a fire time this keeps the one of a run that started (the
/// newest, if more did: [`fire_times`] counts them); without one, a `failed` (the lock
/// server failed), then a `skipped-busy` (the lock was held: a run of an earlier fire time
/// still going), then another. Input in any order.
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

/// One fire time as the journal tells it ([`fire_times`]), with what an operator looks
/// for flagged.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FireTimeLine {
    /// The record that says what happened to the fire time (a run's, else the record of
    /// why it did not run).
    pub record: RunRecord,
    /// Its state: the record's outcome, except a `running` record whose lock is gone,
    /// which is abandoned (its replica died without writing the end).
    pub state: LineState,
    /// How many runs of this fire time started (one; more is a duplicate run, which
    /// fire-time claims exist to prevent).
    pub runs: usize,
    /// The run was still going (or ended) after the next fire time's run started: the job
    /// overran its period and two runs overlapped.
    pub overlaps_next: bool,
    /// The run started before its fire time on the lock server's clock (by more than the
    /// measuring error).
    pub early: bool,
}

/// The state of a fire time in the journal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineState {
    /// As its record's outcome says.
    Outcome(RunOutcome),
    /// A `running` record whose lock no longer holds its fence: the replica died (or lost
    /// the lock) without writing how the run ended.
    Abandoned,
}

impl LineState {
    /// The state's name as shown: the outcome's, or `"abandoned"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            LineState::Outcome(o) => o.as_str(),
            LineState::Abandoned => "abandoned",
        }
    }
}

/// How long runs took, over the records kept: what a timeout is set from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DurationStats {
    /// Runs measured: those that ended by themselves (`ok` or `failed`).
    pub samples: usize,
    /// Median.
    pub p50: Duration,
    /// 95th percentile (nearest rank).
    pub p95: Duration,
    /// 99th percentile (nearest rank).
    pub p99: Duration,
    /// Longest.
    pub max: Duration,
    /// A timeout these suggest: three times the p99, rounded up to a whole second (at
    /// least one), the upper end of the usual "P99 × 2–3".
    pub suggested_timeout: Duration,
}

/// The durations of the runs in `records` that ended by themselves (`ok` or `failed`);
/// `None` without one.
pub fn duration_stats(records: &[RunRecord]) -> Option<DurationStats> {
    let mut d: Vec<Duration> = records
        .iter()
        .filter(|r| matches!(r.outcome, RunOutcome::Ok | RunOutcome::Failed))
        .filter_map(RunRecord::duration)
        .collect();
    if d.is_empty() {
        return None;
    }
    d.sort();
    let rank = |p: f64| {
        let n = d.len();
        let i = ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
        d[i]
    };
    let p99 = rank(0.99);
    let suggested = Duration::from_secs((p99.as_secs_f64() * 3.0).ceil().max(1.0) as u64);
    Some(DurationStats {
        samples: d.len(),
        p50: rank(0.50),
        p95: rank(0.95),
        p99,
        max: *d.last().expect("not empty"),
        suggested_timeout: suggested,
    })
}

/// What the measuring of a start against its fire time may be off by (the clock offset is
/// measured to half a round trip).
const EARLY_TOLERANCE: Duration = Duration::from_millis(250);

/// One line per fire time, newest fire time first, out of the journal's records (in any
/// order): the record of a run where one started, else the most telling of the others
/// ([`per_fire_time`]'s order), flagged.
///
/// `live_fences` are the fences of the job's lock holders now (from `inspect`): a
/// `running` record whose fence is not among them is [`LineState::Abandoned`]. `None`
/// (the holders are unknown) shows running records as running.
pub fn fire_times(records: &[RunRecord], live_fences: Option<&[u64]>) -> Vec<FireTimeLine> {
    let lines = per_fire_time(records);
    let now = std::time::SystemTime::now();
    // The start of each fire time's run, oldest first, for the overlap check.
    let mut starts: Vec<(std::time::SystemTime, std::time::SystemTime)> = lines
        .iter()
        .filter_map(|l| l.started_at.map(|s| (l.scheduled_at, s)))
        .collect();
    starts.sort();
    // Runs that started, per fire time (more than one: a duplicate).
    let mut started: std::collections::HashMap<std::time::SystemTime, usize> =
        std::collections::HashMap::new();
    for r in records.iter().filter(|r| r.started_at.is_some()) {
        *started.entry(r.scheduled_at).or_default() += 1;
    }
    lines
        .into_iter()
        .map(|record| {
            let runs = started.get(&record.scheduled_at).copied().unwrap_or(0);
            let state = match (record.outcome, record.fence, live_fences) {
                (RunOutcome::Running, Some(fence), Some(live)) if !live.contains(&fence) => {
                    LineState::Abandoned
                }
                (o, _, _) => LineState::Outcome(o),
            };
            let end = match state {
                LineState::Outcome(RunOutcome::Running) => Some(now),
                LineState::Abandoned => None,
                _ => record.started_at.map(|_| record.ended_at),
            };
            let next = starts.partition_point(|(at, _)| *at <= record.scheduled_at);
            let next_start = starts.get(next).map(|(_, s)| *s);
            let overlaps_next = matches!((end, next_start), (Some(e), Some(n)) if e > n);
            let early = record.cause != RunCause::Trigger
                && record.started_at.is_some_and(|s| {
                    let offset = record.clock_offset_ms.unwrap_or(0);
                    let on_server = if offset >= 0 {
                        s.checked_sub(Duration::from_millis(offset.unsigned_abs()))
                    } else {
                        s.checked_add(Duration::from_millis(offset.unsigned_abs()))
                    };
                    on_server.is_some_and(|t| t + EARLY_TOLERANCE < record.scheduled_at)
                });
            FireTimeLine {
                record,
                state,
                runs,
                overlaps_next,
                early,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::records::RunCause;
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

    /// A duplicate run, an overlap with the next run, an early start and an abandoned run
    /// are each flagged.
    #[test]
    fn the_lines_flag_what_an_operator_looks_for() {
        let run = |fire: u64, start: u64, end: u64, fence: u64, outcome: RunOutcome| {
            RunRecord::new("j", at(fire), "a", at(end), outcome)
                .started_at(Some(at(start)))
                .fence(Some(fence))
        };
        let records = [
            run(100, 100, 105, 1, RunOutcome::Ok),
            run(110, 110, 125, 2, RunOutcome::Ok), // ran past 120's start
            run(120, 121, 122, 3, RunOutcome::Ok),
            run(120, 121, 123, 4, RunOutcome::Ok), // a second run of 120
            run(130, 128, 131, 5, RunOutcome::Ok), // started 2 s early
            run(140, 140, 140, 6, RunOutcome::Running), // its lock is gone
            run(150, 150, 150, 7, RunOutcome::Running), // still held
            run(160, 158, 161, 8, RunOutcome::Ok).cause(RunCause::Trigger),
        ];
        let lines = fire_times(&records, Some(&[7]));
        let by_fire = |f: u64| {
            lines
                .iter()
                .find(|l| l.record.scheduled_at == at(f))
                .unwrap()
        };
        assert_eq!(lines.len(), 7);
        assert!(!by_fire(100).overlaps_next && by_fire(100).runs == 1);
        assert!(by_fire(110).overlaps_next);
        assert_eq!(by_fire(120).runs, 2);
        assert!(by_fire(130).early && !by_fire(120).early);
        assert!(!by_fire(160).early, "a trigger's instant is no fire time");
        assert_eq!(by_fire(140).state, LineState::Abandoned);
        assert_eq!(by_fire(150).state, LineState::Outcome(RunOutcome::Running));
        assert_eq!(
            fire_times(&records, None)
                .iter()
                .filter(|l| l.state == LineState::Abandoned)
                .count(),
            0,
            "unknown holders: nothing is called abandoned"
        );
    }

    #[test]
    fn durations_give_percentiles_and_a_timeout() {
        let records: Vec<RunRecord> = (1..=100u64)
            .map(|n| {
                RunRecord::new("j", at(n * 1000), "a", at(n * 1000 + n), RunOutcome::Ok)
                    .started_at(Some(at(n * 1000)))
            })
            .chain([
                RunRecord::new("j", at(7), "a", at(9999), RunOutcome::TimedOut)
                    .started_at(Some(at(7))),
            ])
            .collect();
        let stats = duration_stats(&records).unwrap();
        assert_eq!(
            stats.samples, 100,
            "a timed-out run is not a duration sample"
        );
        assert_eq!(stats.p50, Duration::from_secs(50));
        assert_eq!(stats.p95, Duration::from_secs(95));
        assert_eq!(stats.p99, Duration::from_secs(99));
        assert_eq!(stats.max, Duration::from_secs(100));
        assert_eq!(stats.suggested_timeout, Duration::from_secs(297));
        assert_eq!(duration_stats(&[]), None);
    }
}
