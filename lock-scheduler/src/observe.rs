//! What a fire time tells the outside: the record in the lock server, metrics through the
//! `metrics` facade, and a tracing event.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_core::records::{RunOutcome, RunRecord};

use crate::state::Inner;

/// The names of the metrics the scheduler emits through the [`metrics`] facade; install a
/// recorder (a Prometheus exporter, …) to collect them.
///
/// Every series but [`CLOCK_OFFSET`] has the label [`JOB_LABEL`], `distlock_job` (the
/// job's name); [`RUNS`] and [`RUN_DURATION`] also `outcome` ([`outcome_label`]:
/// snake_case, as the lock's own `outcome` and `kind` labels). Each replica emits its own
/// view: aggregate across replicas with `sum` for the counters and [`RUNNING`], `max` for
/// [`LAST_SUCCESS`] and [`PERIOD`] (a replica that keeps losing the race to others never
/// succeeds itself), `min` for [`STARTED`].
///
/// # Alerting on a job that stopped succeeding
///
/// The rule the README gives: a job fires when its newest success across replicas is older
/// than two of its periods, or when it never succeeded and the replica that has been
/// running it the longest started two periods ago. `by (distlock_job)` drops the target
/// labels Prometheus adds (`job`, `instance`), so it works under the default
/// `honor_labels: false`:
///
/// ```text
/// (
///   time() - max by (distlock_job) (distlock_scheduler_last_success_timestamp_seconds)
///     > 2 * max by (distlock_job) (distlock_scheduler_period_seconds)
/// )
/// or
/// (
///   time() - min by (distlock_job) (distlock_scheduler_started_timestamp_seconds)
///     > 2 * max by (distlock_job) (distlock_scheduler_period_seconds)
///   unless max by (distlock_job) (distlock_scheduler_last_success_timestamp_seconds)
/// )
/// ```
pub mod metric_names {
    use lock_core::records::RunOutcome;

    /// The label naming the job on every scheduler series: `distlock_job`. Not `job`:
    /// Prometheus gives every scraped series a `job` label of its own (the scrape job), and
    /// under its default `honor_labels: false` renames the exporter's `job` to
    /// `exported_job`, so rules written with `job` would match nothing.
    pub const JOB_LABEL: &str = "distlock_job";

    /// Counter: fire times ended, by `distlock_job` and `outcome` — one per record written.
    pub const RUNS: &str = "distlock_scheduler_runs_total";
    /// Histogram, seconds: how long runs took from start to end, by `distlock_job` and
    /// `outcome` (only fire times that ran: `ok`, `failed`, `timed_out`, `lock_lost`,
    /// `cut`). Export it with the bounds [`RUN_DURATION_BUCKETS`] (the `distlock` command
    /// does): a Prometheus histogram aggregates across replicas and over any range, where
    /// a summary's quantiles (the exporter's default without buckets, over a 60 s window)
    /// do neither.
    pub const RUN_DURATION: &str = "distlock_scheduler_run_duration_seconds";
    /// The bucket upper bounds, in seconds, of [`RUN_DURATION`]: 0.1 s to 8 h, for jobs
    /// from a quick clean-up to a nightly batch (longer runs land in `+Inf`). A timeout of
    /// "P99 × 2–3" is read from them with `histogram_quantile(0.99, sum by (distlock_job,
    /// le) (rate(distlock_scheduler_run_duration_seconds_bucket[1d])))`.
    pub const RUN_DURATION_BUCKETS: [f64; 14] = [
        0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0,
        28800.0,
    ];
    /// Gauge, seconds: how long the job's last run on this replica took (any outcome that
    /// ran, as [`RUN_DURATION`]), by `distlock_job`; absent until this replica ran it.
    pub const LAST_RUN_DURATION: &str = "distlock_scheduler_last_run_duration_seconds";
    /// Gauge: the job's runs under way on this replica now (0 or 1: runs of a job never
    /// overlap), by `distlock_job`; present, at 0, from the job's start.
    pub const RUNNING: &str = "distlock_scheduler_running";
    /// Gauge, seconds: the job's period, by `distlock_job`: for an `every` schedule its
    /// interval; for a cron schedule the gap from the latest fire time to the next one,
    /// set when the job starts on this replica and again at each fire time (an hourly job
    /// reads 3600; `0 0 9 * * MON-FRI` reads 3 days from Friday's fire time to Monday's).
    /// Present from the job's start, before it ever ran.
    pub const PERIOD: &str = "distlock_scheduler_period_seconds";
    /// Gauge, Unix seconds: when this replica started the job (its timer began), by
    /// `distlock_job`: what a job that never succeeded is measured from.
    pub const STARTED: &str = "distlock_scheduler_started_timestamp_seconds";
    /// Counter: fire times this replica claimed but did not run because an earlier run
    /// still held the job's lock (the run overran its period), by `distlock_job`. Another
    /// replica's run of the same fire time is not a skip: see [`CLAIMED_ELSEWHERE`].
    pub const SKIPS: &str = "distlock_scheduler_skips_total";
    /// Counter: fire times another replica had already claimed when this one asked (it
    /// runs them; nothing is recorded here), by `distlock_job`. With N healthy replicas
    /// this grows by N − 1 per fire time.
    pub const CLAIMED_ELSEWHERE: &str = "distlock_scheduler_claimed_elsewhere_total";
    /// Gauge, seconds: this replica's clock minus the lock server's, as last measured by a
    /// claim (the server's time against the middle of the round trip). Absent on a server
    /// without a clock to read (etcd, the in-process backend). No label.
    pub const CLOCK_OFFSET: &str = "distlock_scheduler_clock_offset_seconds";
    /// Gauge, Unix seconds: when the job last ended `ok`, by `distlock_job`, seeded from
    /// the lock server's history when the job starts. Alert on
    /// `time() - max by (distlock_job) (…) > 2 × PERIOD` (the rule in
    /// [`metric_names`](crate::metric_names) also catches a job that never succeeded).
    pub const LAST_SUCCESS: &str = "distlock_scheduler_last_success_timestamp_seconds";
    /// Counter: records the lock server did not take at first (the outcome is still in
    /// the other metrics and the log; end records are kept and written later), by
    /// `distlock_job`.
    pub const RECORD_ERRORS: &str = "distlock_scheduler_record_errors_total";
    /// Gauge: 1 while this replica finds the job paused at its fire times
    /// (`distlock cron pause`), 0 once it runs again; by `distlock_job`. Alert rules on
    /// the last success can `unless` it.
    pub const PAUSED: &str = "distlock_scheduler_paused";

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
            RunOutcome::Running => "running",
            RunOutcome::Unavailable => "unavailable",
        }
    }
}

use metric_names::{
    outcome_label, CLAIMED_ELSEWHERE, CLOCK_OFFSET, JOB_LABEL, LAST_RUN_DURATION, LAST_SUCCESS,
    PAUSED, PERIOD, RECORD_ERRORS, RUNNING, RUNS, RUN_DURATION, SKIPS, STARTED,
};

/// Describes the metrics to the installed recorder (units and help texts).
pub(crate) fn describe() {
    metrics::describe_counter!(RUNS, "Fire times ended, by distlock_job and outcome");
    metrics::describe_histogram!(
        RUN_DURATION,
        metrics::Unit::Seconds,
        "Duration of the runs, by distlock_job and outcome"
    );
    metrics::describe_gauge!(
        LAST_RUN_DURATION,
        metrics::Unit::Seconds,
        "Duration of the job's last run on this replica"
    );
    metrics::describe_gauge!(RUNNING, "Runs of the job under way on this replica");
    metrics::describe_gauge!(
        PERIOD,
        metrics::Unit::Seconds,
        "The job's period: its interval, or the gap from its latest fire time to the next"
    );
    metrics::describe_gauge!(
        STARTED,
        metrics::Unit::Seconds,
        "Unix time at which this replica started the job"
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
    metrics::describe_gauge!(PAUSED, "1 while the job is paused across its replicas");
}

/// Notes that `job` was found paused at a fire time.
pub(crate) fn paused(job: &str) {
    metrics::gauge!(PAUSED, JOB_LABEL => job.to_owned()).set(1.0);
}

/// Notes that this replica started `job`'s timer at `at`, with `period` (see
/// [`PERIOD`]) when the schedule has one: the started and period gauges are set, and the
/// running gauge is there (at 0 until a run starts), so a job that never ran still has
/// every series an alert reads.
pub(crate) fn job_started(job: &str, at: SystemTime, period: Option<Duration>) {
    metrics::gauge!(STARTED, JOB_LABEL => job.to_owned()).set(unix_seconds(at));
    if let Some(period) = period {
        self::period(job, period);
    }
    // Not `set(0)`: another scheduler of this process may be running a job of that name.
    metrics::gauge!(RUNNING, JOB_LABEL => job.to_owned()).increment(0.0);
}

/// Sets the period gauge of `job`.
pub(crate) fn period(job: &str, period: Duration) {
    metrics::gauge!(PERIOD, JOB_LABEL => job.to_owned()).set(period.as_secs_f64());
}

/// A run under way on this replica: counted in the running gauge from [`start`](Self::start)
/// until dropped (however the run ends, its task cancelled included).
pub(crate) struct InProgress(metrics::Gauge);

impl InProgress {
    /// Counts a run of `job` starting.
    pub(crate) fn start(job: &str) -> InProgress {
        let gauge = metrics::gauge!(RUNNING, JOB_LABEL => job.to_owned());
        gauge.increment(1.0);
        InProgress(gauge)
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// Counts a fire time of `job` that another replica claimed.
pub(crate) fn claimed_elsewhere(job: &str, at: SystemTime, by: &str) {
    metrics::counter!(CLAIMED_ELSEWHERE, JOB_LABEL => job.to_owned()).increment(1);
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
    metrics::gauge!(LAST_SUCCESS, JOB_LABEL => job.to_owned()).set(unix_seconds(at));
}

/// Tells metrics and the log how a fire time ended, then writes its record (errors are
/// logged and counted, not returned: the run is over either way). `elapsed` is the run's
/// monotonic duration, for fire times that ran.
pub(crate) async fn finish(inner: &Inner, record: &RunRecord, elapsed: Option<Duration>) {
    let job = record.job.clone();
    metrics::gauge!(PAUSED, JOB_LABEL => job.clone()).set(0.0);
    let outcome = outcome_label(record.outcome);
    metrics::counter!(RUNS, JOB_LABEL => job.clone(), "outcome" => outcome).increment(1);
    if let Some(elapsed) = elapsed {
        metrics::histogram!(RUN_DURATION, JOB_LABEL => job.clone(), "outcome" => outcome)
            .record(elapsed.as_secs_f64());
        metrics::gauge!(LAST_RUN_DURATION, JOB_LABEL => job.clone()).set(elapsed.as_secs_f64());
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
            metrics::counter!(SKIPS, JOB_LABEL => job.clone()).increment(1);
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
    store(inner, record, true).await;
}

/// Most end records kept for a lock server that did not take them.
const MAX_PENDING: usize = 1000;

/// Writes `record` to the lock server's journal, with the job's retention; then the
/// records it did not take earlier, oldest first. An end record (`queue`) it does not take
/// is kept for later (at most [`MAX_PENDING`], the oldest dropped first), so an outage
/// loses no record; a running record is not (its end replaces it anyway).
pub(crate) async fn store(inner: &Inner, record: &RunRecord, queue: bool) {
    let Some(records) = inner.locker.backend().run_records() else {
        return;
    };
    let keep = |r: &RunRecord| {
        lock_core::sync::lock(&inner.jobs)
            .get(&r.job)
            .and_then(|j| j.history)
            .unwrap_or(inner.keep)
    };
    let job = record.job.clone();
    if let Err(e) = records.append(record, keep(record)).await {
        metrics::counter!(RECORD_ERRORS, JOB_LABEL => job.clone()).increment(1);
        tracing::warn!(job, outcome = %record.outcome, error = %e.report(), "the run record was not stored (kept to write later)");
        if queue {
            let mut pending = lock_core::sync::lock(&inner.pending);
            if pending.len() >= MAX_PENDING {
                pending.pop_front();
            }
            pending.push_back(record.clone());
        }
        return;
    }
    loop {
        let Some(next) = lock_core::sync::lock(&inner.pending).pop_front() else {
            return;
        };
        if let Err(e) = records.append(&next, keep(&next)).await {
            tracing::debug!(job = next.job, error = %e.report(), "a kept run record was not stored yet");
            lock_core::sync::lock(&inner.pending).push_front(next);
            return;
        }
    }
}

fn unix_seconds(t: SystemTime) -> f64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}
