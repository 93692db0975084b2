//! `distlock bench`: lock throughput and latency of one or more lock servers.
//!
//! A workload is N tasks sharing one [`Locker`] (as one service would), each repeating
//! cycles of acquire, hold, release until the workload's time is up, either each on its
//! own key (`distinct`: no contention, the cost of the protocol) or all on one key
//! (`one`: hand-off under contention).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use clap::Args;
use distlock::{Error, LockOptions, Locker};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::task::JoinSet;

use crate::common::{parse_duration, parse_positive_duration, print_stdout, Target};
use crate::exit::{CliError, Exit, BENCH_ERRORS, INTERNAL};
use crate::report::{self, describe, Keys, Latency, Settings, WorkloadResult};

pub const AFTER_HELP: &str = "\
Examples:
  # the in-process backend, as a baseline
  distlock bench
  # two servers side by side, contended and uncontended, 10 s per workload
  distlock bench --url redis://10.0.0.5:6379 --url etcd://10.0.0.6:2379 --duration 10s
  # 64 tasks on one key holding it 5 ms each, for a script
  distlock bench --tasks 64 --keys one --hold 5ms --json

What is measured, per URL and workload (tasks x keys):
  cycles/s      completed acquire + hold + release cycles per second
  acquire       time from calling acquire until the lock is granted, HDR histogram
                (with --keys one this includes waiting behind the other tasks)
  release       time of the release call
  worst wait    the longest any task waited for a grant, including a wait still
                pending when the time was up (a starved task shows here)
  fairness      Jain's index over the tasks' cycle counts (1 = perfectly even) and the
                smallest and largest per-task counts
  errors        acquire or release calls that failed
The tasks of one workload share one Locker, as the tasks of one service would; its local
queue lets one waiter per key reach the server. The watchdog is off unless --watchdog, so
that every backend does the same work. The keys are distlock-bench/0, distlock-bench/1, …
and distlock-bench/one. Bad input exits 64 and an unreachable server 69 before anything
is measured; afterwards the exit status is 1 when any operation failed (the count is
printed), 0 otherwise.";

/// `distlock bench` arguments.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Lock server to measure; repeat to compare several, run one after another
    /// [default: $DISTLOCK_URL, else memory://].
    #[arg(long = "url", value_name = "URL")]
    urls: Vec<String>,

    /// Numbers of concurrent tasks, one workload each.
    #[arg(long, value_name = "N,…", value_delimiter = ',', default_value = "1,16,64",
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    tasks: Vec<u32>,

    /// Key layouts, one workload each.
    #[arg(
        long,
        value_name = "distinct|one",
        value_delimiter = ',',
        default_value = "distinct,one"
    )]
    keys: Vec<Keys>,

    /// How long each cycle holds the lock.
    #[arg(long, value_name = "DUR", default_value = "0s", value_parser = parse_duration)]
    hold: Duration,

    /// How long each workload runs.
    #[arg(long, value_name = "DUR", default_value = "2s", value_parser = parse_positive_duration)]
    duration: Duration,

    /// Lock TTL; with the watchdog off it must exceed the hold time.
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = parse_duration)]
    ttl: Duration,

    /// Renew held locks every TTL/3, as `run` does.
    #[arg(long)]
    watchdog: bool,

    /// Print one JSON document instead of tables.
    #[arg(long)]
    json: bool,
}

/// One workload's shape.
#[derive(Clone, Copy, Debug)]
struct Workload {
    tasks: u32,
    keys: Keys,
}

/// What one task saw.
struct TaskStats {
    cycles: u64,
    acquire: Histogram<u64>,
    release: Histogram<u64>,
    worst_wait: Duration,
    acquire_errors: u64,
    release_errors: u64,
    error_samples: Vec<String>,
}

/// Latencies are recorded in nanoseconds up to an hour, with three significant digits.
fn histogram() -> Result<Histogram<u64>, CliError> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
        .map_err(|e| CliError::new(INTERNAL, format!("histogram: {e}")))
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Error messages kept per task for the report.
const ERROR_SAMPLES: usize = 3;

/// Runs `distlock bench`.
///
/// # Errors
/// Bad input or an unreachable server (before anything is measured).
pub async fn run(args: BenchArgs) -> Result<Exit, CliError> {
    let targets = if args.urls.is_empty() {
        vec![Target::choose(None)?]
    } else {
        args.urls.iter().cloned().map(Target::flag).collect()
    };
    let opts = LockOptions::new().ttl(args.ttl).watchdog(args.watchdog);
    // Connect to every server first, so that a typo in the last URL is not found out
    // after minutes of measuring the first.
    let mut lockers = Vec::with_capacity(targets.len());
    for target in &targets {
        let locker = target.connect().await?;
        locker
            .capabilities()
            .effective_ttl(args.ttl)
            .map_err(|e| target.error(e))?;
        lockers.push(locker);
    }
    let mut workloads = Vec::new();
    for &keys in &args.keys {
        for &tasks in &args.tasks {
            workloads.push(Workload { tasks, keys });
        }
    }

    let progress = progress_bar(&args, targets.len() * workloads.len());
    let measured = async {
        let mut results = Vec::new();
        for (target, locker) in targets.iter().zip(&lockers) {
            for &workload in &workloads {
                if let Some(pb) = &progress {
                    pb.set_message(format!(
                        "{}: {}",
                        target.shown(),
                        describe(workload.tasks, workload.keys)
                    ));
                }
                let result = measure(
                    locker,
                    target,
                    workload,
                    &opts,
                    args.hold,
                    args.duration,
                    progress.as_ref(),
                )
                .await?;
                results.push(result);
            }
        }
        Ok::<_, CliError>(results)
    };
    let results = tokio::select! {
        results = measured => results?,
        _ = tokio::signal::ctrl_c() => {
            // Dropping the workloads aborted their tasks; their guards release in the
            // background, which shutdown waits for.
            if let Some(pb) = &progress {
                pb.finish_and_clear();
            }
            for locker in &lockers {
                locker.shutdown().await;
            }
            return Ok(Exit::Signal(libc::SIGINT));
        }
    };
    if let Some(pb) = &progress {
        pb.finish_and_clear();
    }

    let settings = Settings {
        duration_ms: millis(args.duration),
        hold_ms: millis(args.hold),
        ttl_ms: millis(args.ttl),
        watchdog: args.watchdog,
    };
    if args.json {
        print_stdout(&format!("{}\n", report::json(&settings, &results)?));
    } else {
        print_stdout(&report::tables(&settings, &results));
    }
    let errors: u64 = results.iter().map(|r| r.errors).sum();
    if errors > 0 {
        let sample = results
            .iter()
            .flat_map(|r| r.error_samples.first())
            .next()
            .map(|s| format!(" (first: {s})"))
            .unwrap_or_default();
        eprintln!("distlock: {errors} lock operation(s) failed during the benchmark{sample}");
        return Ok(Exit::Code(BENCH_ERRORS));
    }
    Ok(Exit::Code(0))
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A bar over the whole run's time, on a terminal only.
fn progress_bar(args: &BenchArgs, runs: usize) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let total = args.duration.as_millis() as u64 * runs as u64;
    let pb = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {msg}")
    {
        pb.set_style(style);
    }
    Some(pb)
}

/// Runs one workload on one server.
async fn measure(
    locker: &Locker,
    target: &Target,
    workload: Workload,
    opts: &LockOptions,
    hold: Duration,
    duration: Duration,
    progress: Option<&ProgressBar>,
) -> Result<WorkloadResult, CliError> {
    let started = Instant::now();
    let deadline = started + duration;
    let mut set = JoinSet::new();
    for task in 0..workload.tasks {
        // Fixed names, so that repeated runs do not leave a trail of keys behind on the
        // server (backends may keep a fencing counter per key).
        let key = match workload.keys {
            Keys::Distinct => format!("distlock-bench/{task}"),
            Keys::One => "distlock-bench/one".to_owned(),
        };
        let locker = locker.clone();
        let opts = opts.clone();
        let stats = TaskStats {
            cycles: 0,
            acquire: histogram()?,
            release: histogram()?,
            worst_wait: Duration::ZERO,
            acquire_errors: 0,
            release_errors: 0,
            error_samples: Vec::new(),
        };
        set.spawn(async move { cycle(locker, key, opts, hold, deadline, stats).await });
    }

    let base = progress.map_or(0, |pb| pb.position());
    let mut per_task = Vec::with_capacity(workload.tasks as usize);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            joined = set.join_next() => match joined {
                Some(Ok(stats)) => per_task.push(stats),
                Some(Err(e)) => {
                    return Err(CliError::new(INTERNAL, format!("a benchmark task failed: {e}")))
                }
                None => break,
            },
            _ = tick.tick(), if progress.is_some() => {
                if let Some(pb) = progress {
                    let done = started.elapsed().min(duration).as_millis() as u64;
                    pb.set_position(base + done);
                }
            }
        }
    }
    let elapsed = started.elapsed();
    if let Some(pb) = progress {
        pb.set_position(base + duration.as_millis() as u64);
    }
    // Nothing of this workload is left in flight when the next one starts.
    locker.settle().await;
    summarize(target, locker, workload, elapsed, per_task)
}

/// One task: cycles until the deadline. A wait still pending at the deadline ends the
/// task; it counts towards the worst wait, not as an error.
async fn cycle(
    locker: Locker,
    key: String,
    opts: LockOptions,
    hold: Duration,
    deadline: Instant,
    mut stats: TaskStats,
) -> TaskStats {
    // Failing operations are retried after this pause, so that a dead server is not
    // hammered in a tight loop.
    const AFTER_ERROR: Duration = Duration::from_millis(10);
    loop {
        let asked = Instant::now();
        let Some(left) = deadline
            .checked_duration_since(asked)
            .filter(|d| !d.is_zero())
        else {
            break;
        };
        match locker.acquire(&key, &opts.clone().wait_for(left)).await {
            Ok(guard) => {
                let waited = asked.elapsed();
                stats.acquire.saturating_record(nanos(waited));
                stats.worst_wait = stats.worst_wait.max(waited);
                if !hold.is_zero() {
                    tokio::time::sleep(hold).await;
                }
                let releasing = Instant::now();
                match guard.release().await {
                    Ok(()) => {
                        stats.release.saturating_record(nanos(releasing.elapsed()));
                        stats.cycles += 1;
                    }
                    Err(e) => {
                        stats.release_errors += 1;
                        sample(&mut stats, &e);
                        tokio::time::sleep(AFTER_ERROR).await;
                    }
                }
            }
            Err(Error::Timeout { .. }) => {
                stats.worst_wait = stats.worst_wait.max(asked.elapsed());
                break;
            }
            Err(e) => {
                stats.acquire_errors += 1;
                sample(&mut stats, &e);
                tokio::time::sleep(AFTER_ERROR).await;
            }
        }
        // A backend that never waits (memory, uncontended) would otherwise let a task keep
        // its worker thread until the deadline and starve the others.
        tokio::task::coop::consume_budget().await;
    }
    stats
}

fn sample(stats: &mut TaskStats, e: &Error) {
    let text = e.to_string();
    if stats.error_samples.len() < ERROR_SAMPLES && !stats.error_samples.contains(&text) {
        stats.error_samples.push(text);
    }
}

fn summarize(
    target: &Target,
    locker: &Locker,
    workload: Workload,
    elapsed: Duration,
    per_task: Vec<TaskStats>,
) -> Result<WorkloadResult, CliError> {
    let mut acquire = histogram()?;
    let mut release = histogram()?;
    let mut worst_wait = Duration::ZERO;
    let (mut acquire_errors, mut release_errors) = (0, 0);
    let mut error_samples: Vec<String> = Vec::new();
    let mut cycles_per_task = Vec::with_capacity(per_task.len());
    for task in per_task {
        let merge_failed =
            |e: hdrhistogram::errors::AdditionError| CliError::new(INTERNAL, format!("{e:?}"));
        acquire.add(&task.acquire).map_err(merge_failed)?;
        release.add(&task.release).map_err(merge_failed)?;
        worst_wait = worst_wait.max(task.worst_wait);
        acquire_errors += task.acquire_errors;
        release_errors += task.release_errors;
        for s in task.error_samples {
            if error_samples.len() < ERROR_SAMPLES && !error_samples.contains(&s) {
                error_samples.push(s);
            }
        }
        cycles_per_task.push(task.cycles);
    }
    let cycles: u64 = cycles_per_task.iter().sum();
    Ok(WorkloadResult {
        url: target.shown(),
        backend: locker.capabilities().name,
        tasks: workload.tasks,
        keys: workload.keys,
        elapsed_s: elapsed.as_secs_f64(),
        cycles,
        cycles_per_sec: cycles as f64 / elapsed.as_secs_f64(),
        acquire: Latency::from(&acquire),
        release: Latency::from(&release),
        worst_wait_ns: nanos(worst_wait),
        fairness_jain: jain(&cycles_per_task),
        min_task_cycles: cycles_per_task.iter().copied().min().unwrap_or(0),
        max_task_cycles: cycles_per_task.iter().copied().max().unwrap_or(0),
        per_task_cycles: cycles_per_task,
        acquire_errors,
        release_errors,
        errors: acquire_errors + release_errors,
        error_samples,
    })
}

/// Jain's fairness index `(Σx)² / (n·Σx²)`: 1 when every task did the same number of
/// cycles, 1/n when one task did them all; `None` when nobody completed a cycle.
fn jain(counts: &[u64]) -> Option<f64> {
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let squares: f64 = counts.iter().map(|&c| (c as f64).powi(2)).sum();
    if squares == 0.0 {
        return None;
    }
    Some(sum * sum / (counts.len() as f64 * squares))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_index_bounds() {
        assert_eq!(jain(&[5, 5, 5]), Some(1.0));
        let skewed = jain(&[10, 0, 0, 0]).unwrap();
        assert!((skewed - 0.25).abs() < 1e-12);
        assert_eq!(jain(&[0, 0]), None);
    }
}
