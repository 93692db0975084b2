//! What a fire time tells the outside: the record in the lock server, metrics through the
//! `metrics` facade, and a tracing event.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_core::records::{RunOutcome, RunRecord};

use crate::state::Inner;

/// The names of the metrics the scheduler emits through the [`metrics`] facade; install a
/// recorder (a Prometheus exporter, …) to collect them.
///
/// Every metric has the label `job` (the job's name); [`RUNS`] and [`RUN_DURATION`] also
/// `outcome` ([`outcome_label`]: snake_case, as the lock's own `outcome` and `kind`
/// labels). Each replica emits its own view: aggregate across
/// replicas with `sum` for the counters and `max` for [`LAST_SUCCESS`] (a replica that
/// keeps losing the race to others never succeeds itself).
pub mod metric_names {
    use lock_core::records::RunOutcome;

    /// Counter: fire times ended, by `job` and `outcome` — one per record written.
    pub const RUNS: &str = "distlock_scheduler_runs_total";
    /// Histogram, seconds: how long runs took from start to end, by `job` and `outcome`
    /// (only fire times that ran: `ok`, `failed`, `timed_out`, `lock_lost`, `cut`).
    pub const RUN_DURATION: &str = "distlock_scheduler_run_duration_seconds";
    /// Counter: fire times this replica claimed but did not run because an earlier run
    /// still held the job's lock (the run overran its period), by `job`. Another
    /// replica's run of the same fire time is not a skip: see [`CLAIMED_ELSEWHERE`].
    pub const SKIPS: &str = "distlock_scheduler_skips_total";
    /// Counter: fire times another replica had already claimed when this one asked (it
    /// runs them; nothing is recorded here), by `job`. With N healthy replicas this grows
    /// by N − 1 per fire time.
    pub const CLAIMED_ELSEWHERE: &str = "distlock_scheduler_claimed_elsewhere_total";
    /// Gauge, seconds: this replica's clock minus the lock server's, as last measured by a
    /// claim (the server's time against the middle of the round trip). Absent on a server
    /// without a clock to read (etcd, the in-process backend).
    pub const CLOCK_OFFSET: &str = "distlock_scheduler_clock_offset_seconds";
    /// Gauge, Unix seconds: when the job last ended `ok`, by `job`. Alert on
    /// `time() - max by (job) (…) > 2 × period`: no success for two periods.
    pub const LAST_SUCCESS: &str = "distlock_scheduler_last_success_timestamp_seconds";
    /// Counter: records the lock server did not take (the outcome is still in the other
    /// metrics and the log), by `job`.
    pub const RECORD_ERRORS: &str = "distlock_scheduler_record_errors_total";

    /// The `outcome` label of a run: its [`RunOutcome::as_str`] in snake_case (`ok`,
    /// `failed`, `skipped_busy`, `timed_out`, `lock_lost`, `missed`, `cut`), the casing of
    /// every label value distlock emits. The run records keep the names they always had.
    pub const fn outcome_label(outcome: RunOutcome) -> &'static str {
        match outcome {
            RunOutcome::Ok => "ok",
            RunOutcome::Failed => "failed",
            RunOutcome::SkippedBusy => "skipped_busy",
            RunOutcome::TimedOut => "timed_out",
            RunOutcome::LockLost => "lock_lost",
            RunOutcome::Missed => "missed",
            RunOutcome::Cut => "cut",
        }
    }
}

use metric_names::{
    outcome_label, CLAIMED_ELSEWHERE, CLOCK_OFFSET, LAST_SUCCESS, RECORD_ERRORS, RUNS,
    RUN_DURATION, SKIPS,
};

/// Describes the metrics to the installed recorder (units and help texts).
pub(crate) fn describe() {
    metrics::describe_counter!(RUNS, "Fire times ended, by job and outcome");
    metrics::describe_histogram!(
        RUN_DURATION,
        metrics::Unit::Seconds,
        "Duration of the runs, by job and outcome"
    );
    metrics::describe_counter!(
        SKIPS,
        "Fire times claimed but skipped: an earlier run still held the job"
    );
    metrics::describe_counter!(
        CLAIMED_ELSEWHERE,
        "Fire times another replica had claimed (and runs)"
    );
    metrics::describe_gauge!(
        CLOCK_OFFSET,
        metrics::Unit::Seconds,
        "This replica's clock minus the lock server's"
    );
    metrics::describe_gauge!(
        LAST_SUCCESS,
        metrics::Unit::Seconds,
        "Unix time of the job's last successful run"
    );
    metrics::describe_counter!(RECORD_ERRORS, "Run records the lock server did not take");
}

/// Counts a fire time of `job` that another replica claimed.
pub(crate) fn claimed_elsewhere(job: &str, at: SystemTime, by: &str) {
    metrics::counter!(CLAIMED_ELSEWHERE, "job" => job.to_owned()).increment(1);
    let scheduled = jiff::Timestamp::try_from(at)
        .map(|t| t.to_string())
        .unwrap_or_default();
    tracing::debug!(job, scheduled, by, "fire time claimed by another replica");
}

/// Notes this replica's clock reading `ours` when the lock server's read `server`: the
/// offset the job loops go by, and the gauge.
pub(crate) fn clock_offset(inner: &Inner, ours: SystemTime, server: SystemTime) {
    let offset = match ours.duration_since(server) {
        Ok(ahead) => jiff::SignedDuration::try_from(ahead).unwrap_or(jiff::SignedDuration::MAX),
        Err(behind) => jiff::SignedDuration::try_from(behind.duration())
            .map(|d| jiff::SignedDuration::ZERO.saturating_sub(d))
            .unwrap_or(jiff::SignedDuration::MIN),
    };
    *lock_core::sync::lock(&inner.offset) = Some(offset);
    metrics::gauge!(CLOCK_OFFSET).set(offset.as_secs_f64());
}

/// Sets the last-success gauge of `job` to `at`.
pub(crate) fn last_success(job: &str, at: SystemTime) {
    metrics::gauge!(LAST_SUCCESS, "job" => job.to_owned()).set(unix_seconds(at));
}

/// Tells metrics and the log how a fire time ended, then writes its record (errors are
/// logged and counted, not returned: the run is over either way). `elapsed` is the run's
/// monotonic duration, for fire times that ran.
pub(crate) async fn finish(inner: &Inner, record: &RunRecord, elapsed: Option<Duration>) {
    let job = record.job.clone();
    let outcome = outcome_label(record.outcome);
    metrics::counter!(RUNS, "job" => job.clone(), "outcome" => outcome).increment(1);
    if let Some(elapsed) = elapsed {
        metrics::histogram!(RUN_DURATION, "job" => job.clone(), "outcome" => outcome)
            .record(elapsed.as_secs_f64());
    }
    let scheduled = jiff::Timestamp::try_from(record.scheduled_at)
        .map(|t| t.to_string())
        .unwrap_or_default();
    let detail = record.detail.as_deref().unwrap_or("");
    match record.outcome {
        RunOutcome::Ok => {
            last_success(&job, record.ended_at);
            tracing::info!(
                job,
                scheduled,
                outcome,
                ?elapsed,
                fence = record.fence,
                "run ended"
            );
        }
        RunOutcome::SkippedBusy => {
            metrics::counter!(SKIPS, "job" => job.clone()).increment(1);
            tracing::debug!(job, scheduled, outcome, detail, "fire time skipped");
        }
        _ => {
            tracing::warn!(
                job,
                scheduled,
                outcome,
                ?elapsed,
                fence = record.fence,
                detail,
                "run did not succeed"
            );
        }
    }
    let Some(records) = inner.locker.backend().run_records() else {
        return;
    };
    if let Err(e) = records.append(record, inner.keep).await {
        metrics::counter!(RECORD_ERRORS, "job" => job.clone()).increment(1);
        tracing::warn!(job, scheduled, outcome, error = %e.report(), "the run record was not stored");
    }
}

fn unix_seconds(t: SystemTime) -> f64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}
