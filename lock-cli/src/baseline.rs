//! The raw baseline of `distlock bench`: tasks repeating a server's own round trips
//! ([`distlock::Baseline::raw_cycle`]) for a workload's time, each on its own key, with
//! no Locker in between.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{Backend, Locker, Ttl};
use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use tokio::task::JoinSet;

use crate::common::Target;
use crate::exit::{CliError, INTERNAL};
use crate::progress::join_tasks;
use crate::report::{histogram, keep_sample, task_count, Latency, RawBaseline, RawRun};
use crate::units::nanos;

/// The raw baseline of one server: one run per number of tasks in `tasks`, each task
/// repeating raw cycles on its own key for `duration`.
///
/// # Errors
/// A task panicked, or the histograms could not be made (bugs).
pub async fn measure_baseline(
    locker: &Locker,
    target: &Target,
    ttl: Ttl,
    tasks: &[u32],
    duration: Duration,
    progress: Option<&ProgressBar>,
) -> Result<RawBaseline, CliError> {
    let backend = locker.backend();
    let measured = backend.baseline().map_or("", |b| b.description());
    let mut runs = Vec::with_capacity(tasks.len());
    for &n in tasks {
        if let Some(pb) = progress {
            pb.set_message(format!(
                "{}: raw baseline, {}",
                target.shown(),
                task_count(n)
            ));
        }
        let started = Instant::now();
        let deadline = started + duration;
        let mut set = JoinSet::new();
        for task in 0..n {
            // The lock workloads' names: the backend maps them to raw keys of its own.
            let key = format!("distlock-bench/{task}");
            let stats = RawStats::new()?;
            set.spawn(raw_task(backend.clone(), key, ttl, deadline, stats));
        }
        let per_task = join_tasks(set, started, duration, progress).await?;
        runs.push(summarize(n, started.elapsed(), per_task)?);
    }
    Ok(RawBaseline { measured, runs })
}

/// What one raw task saw.
struct RawStats {
    cycles: u64,
    cycle: Histogram<u64>,
    errors: u64,
    error_samples: Vec<String>,
}

impl RawStats {
    /// Nothing seen yet.
    ///
    /// # Errors
    /// The histogram could not be made (a bug).
    fn new() -> Result<RawStats, CliError> {
        Ok(RawStats {
            cycles: 0,
            cycle: histogram()?,
            errors: 0,
            error_samples: Vec::new(),
        })
    }
}

/// One task: raw cycles on `key` until `deadline` (a cycle in flight then finishes, within
/// the backend's timeouts). Does nothing for a backend without a baseline.
async fn raw_task(
    backend: Arc<dyn Backend>,
    key: String,
    ttl: Ttl,
    deadline: Instant,
    mut stats: RawStats,
) -> RawStats {
    // As for the lock's cycles: a dead server is not hammered in a tight loop.
    const AFTER_ERROR: Duration = Duration::from_millis(10);
    let Some(raw) = backend.baseline() else {
        return stats;
    };
    while Instant::now() < deadline {
        let started = Instant::now();
        match raw.raw_cycle(&key, ttl).await {
            Ok(()) => {
                stats.cycle.saturating_record(nanos(started.elapsed()));
                stats.cycles += 1;
            }
            Err(e) => {
                stats.errors += 1;
                keep_sample(&mut stats.error_samples, e.report().to_string());
                tokio::time::sleep(AFTER_ERROR).await;
            }
        }
        tokio::task::coop::consume_budget().await;
    }
    stats
}

/// The run of `tasks` tasks that took `elapsed`.
///
/// # Errors
/// The histograms could not be merged (a bug).
fn summarize(tasks: u32, elapsed: Duration, per_task: Vec<RawStats>) -> Result<RawRun, CliError> {
    let mut cycle = histogram()?;
    let (mut cycles, mut errors) = (0, 0);
    let mut error_samples = Vec::new();
    for task in per_task {
        cycle
            .add(&task.cycle)
            .map_err(|e| CliError::new(INTERNAL, format!("{e:?}")))?;
        cycles += task.cycles;
        errors += task.errors;
        for s in task.error_samples {
            keep_sample(&mut error_samples, s);
        }
    }
    Ok(RawRun {
        tasks,
        elapsed_s: elapsed.as_secs_f64(),
        cycles,
        cycles_per_sec: cycles as f64 / elapsed.as_secs_f64(),
        cycle: Latency::from(&cycle),
        errors,
        error_samples,
    })
}
