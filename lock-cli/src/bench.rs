//! `distlock bench`: lock throughput and latency of one or more lock servers.
//!
//! A workload is N tasks sharing one [`Locker`] (as one service would), each repeating
//! cycles of acquire, hold, release until the workload's time is up, either each on its
//! own key (`distinct`: no contention, the cost of the protocol) or all on one key
//! (`one`: hand-off under contention). Before the workloads, each server's raw baseline
//! (its own round trips without the lock, `baseline.rs`) runs with the same numbers of
//! tasks.

use std::time::{Duration, Instant};

use clap::Args;
use distlock::{Error, LockOptions, Locker};
use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use tokio::task::JoinSet;

use crate::baseline::measure_baseline;
use crate::common::{parse_duration, parse_positive_duration, print_stdout, Target};
use crate::exit::{CliError, Exit, BENCH_ERRORS, INTERNAL};
use crate::progress::{join_tasks, progress_bar};
use crate::report::{
    self, describe, histogram, keep_sample, Keys, Latency, Server, Settings, WorkloadResult,
};
use crate::units::nanos;

pub const AFTER_HELP: &str = "\
Examples:
  # the in-process backend, as a baseline
  distlock bench
  # two servers side by side, contended and uncontended, 10 s per workload
  distlock bench --url redis://10.0.0.5:6379 --url etcd://10.0.0.6:2379 --duration 10s
  # 64 tasks on one key holding it 5 ms each, for a script
  distlock bench --tasks 64 --keys one --hold 5ms --json
  # the lock's own metrics in the report, and served to Prometheus while it runs
  distlock bench --url redis://10.0.0.5:6379 --duration 1m --metrics-addr 0.0.0.0:9464

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
  raw cycles/s  the server's own round trips without the lock protocol (the raw
                baseline): cycles of a plain write and a delete, on the lock's
                connection and timeouts, with as many tasks as the workload, each task
                on its own key; redis: SET NX PX + DEL; redlock: SET NX PX on every
                node, then DEL on every node, each step done at a majority as the
                lock's are; etcd: put + delete (two raft writes, as a lock cycle on a
                pooled lease); memory has no server, so no baseline
  raw cycle     time of one raw cycle (both round trips), HDR histogram
  lock metrics  with --metrics or --metrics-addr: the series the Locker records (those
                of `distlock run --help`), summed over the run: every counter and each
                histogram's _count and _sum (seconds), labelled backend=NAME and
                key_label=distinct or key_label=one (the workload's keys)
  raw errors    raw cycles that failed (they count towards the exit status)
  lock cycle / raw
                raw cycles/s over lock cycles/s with the same tasks: how many raw
                cycles one lock cycle costs (the lock groups requests under load and
                the baseline does not, so with many tasks this can fall below 1)
The tasks of one workload share one Locker, as the tasks of one service would; its local
queue lets one waiter per key reach the server. The watchdog is off unless --watchdog, so
that every backend does the same work. The keys are distlock-bench/0, distlock-bench/1, …
and distlock-bench/one. The raw baseline runs on each server before its workloads, once
per --tasks value, for --duration each (--no-baseline skips it); its tasks use the same
names, which each backend maps to keys of its own beside the locks (redis
distlock:{distlock-bench/0}:baseline, etcd distlock.baseline/distlock-bench/0), never a
lock's keys. Bad input exits 64 and an unreachable server 69 before anything
is measured; afterwards the exit status is 1 when any operation failed (the count is
printed), 0 otherwise.";

/// `distlock bench` arguments.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Lock server to measure; repeat to compare several, run one after another
    /// [default: memory://].
    #[arg(
        short = 'u',
        long,
        value_name = "URL",
        env = "DISTLOCK_URL",
        hide_env_values = true
    )]
    url: Vec<String>,

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

    /// Each cycle takes one of N permits of its key instead of the whole key (a
    /// semaphore): with more tasks than N on one key, N hold at once.
    #[arg(short = 'p', long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(distlock::MAX_PERMITS)))]
    permits: Option<u32>,

    /// Do not measure the servers' raw round trips (the baseline beside the lock cycle).
    #[arg(long)]
    no_baseline: bool,

    /// Print one JSON document instead of tables.
    #[arg(long)]
    json: bool,

    /// Record the lock's metrics and show them after the tables (in `metrics` with
    /// --json). Off by default: the recorder's cost is then part of what is measured.
    #[arg(long)]
    metrics: bool,

    /// Also serve them in the Prometheus text format on HOST:PORT while the bench runs
    /// (implies --metrics).
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<String>,
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

/// Runs `distlock bench`.
///
/// # Errors
/// Bad input or an unreachable server (before anything is measured).
pub async fn run(args: BenchArgs) -> Result<Exit, CliError> {
    let targets = if args.url.is_empty() {
        vec![Target::choose(None)]
    } else {
        args.url
            .iter()
            .cloned()
            .map(Some)
            .map(Target::choose)
            .collect()
    };
    let claim = match args.permits {
        Some(n) => distlock::Permits::new(1, n)
            .map_err(|e| CliError::new(crate::exit::USAGE, e.to_string()))?,
        None => distlock::Permits::LOCK,
    };
    let opts = LockOptions::new()
        .ttl(args.ttl)
        .watchdog(args.watchdog)
        .permits(claim);
    let metrics_addr = args
        .metrics_addr
        .as_deref()
        .map(crate::metrics::resolve)
        .transpose()?;
    let recorded = match metrics_addr {
        Some(addr) => Some(crate::metrics::install(Some(addr), &[])?),
        None if args.metrics => Some(crate::metrics::install(None, &[])?),
        None => None,
    };
    // Connect to every server first, so that a typo in the last URL is not found out
    // after minutes of measuring the first.
    let mut lockers = Vec::with_capacity(targets.len());
    let mut ttls = Vec::with_capacity(targets.len());
    for target in &targets {
        let locker = target.connect().await?;
        let ttl = locker
            .capabilities()
            .effective_ttl(args.ttl)
            .map_err(|e| target.error(e))?;
        lockers.push(locker);
        ttls.push(ttl);
    }
    let mut workloads = Vec::new();
    for &keys in &args.keys {
        for &tasks in &args.tasks {
            workloads.push(Workload { tasks, keys });
        }
    }
    // The raw baseline: once per number of tasks, on every server that has one.
    let mut raw_tasks: Vec<u32> = Vec::new();
    for &tasks in &args.tasks {
        if !raw_tasks.contains(&tasks) {
            raw_tasks.push(tasks);
        }
    }
    let with_baseline: Vec<bool> = lockers
        .iter()
        .map(|l| !args.no_baseline && l.backend().baseline().is_some())
        .collect();
    let raw_runs = with_baseline.iter().filter(|&&b| b).count() * raw_tasks.len();

    let runs = targets.len() * workloads.len() + raw_runs;
    let progress = progress_bar(args.duration, runs);
    let measured = async {
        let mut servers = Vec::with_capacity(targets.len());
        let mut results = Vec::new();
        for (i, (target, locker)) in targets.iter().zip(&lockers).enumerate() {
            let baseline = if with_baseline[i] {
                Some(
                    measure_baseline(
                        locker,
                        target,
                        ttls[i],
                        &raw_tasks,
                        args.duration,
                        progress.as_ref(),
                    )
                    .await?,
                )
            } else {
                None
            };
            for &workload in &workloads {
                if let Some(pb) = &progress {
                    pb.set_message(format!(
                        "{}: {}",
                        target.shown(),
                        describe(workload.tasks, workload.keys)
                    ));
                }
                // The workload's series apart from the others of the server.
                let opts = if recorded.is_some() {
                    opts.clone().metrics_label(workload.keys.label())
                } else {
                    opts.clone()
                };
                let mut result = measure(
                    locker,
                    target,
                    workload,
                    &opts,
                    args.hold,
                    args.duration,
                    progress.as_ref(),
                )
                .await?;
                result.server = i;
                result.lock_over_raw = baseline
                    .as_ref()
                    .and_then(|b| b.with_tasks(workload.tasks))
                    .and_then(|run| report::lock_over_raw(run, result.cycles_per_sec));
                results.push(result);
            }
            servers.push(Server {
                url: target.shown(),
                backend: locker.capabilities().name,
                baseline,
            });
        }
        Ok::<_, CliError>((servers, results))
    };
    let (servers, results) = tokio::select! {
        measured = measured => measured?,
        _ = tokio::signal::ctrl_c() => {
            // Dropping the workloads aborted their tasks; their guards release in the
            // background, which shutdown waits for. An aborted raw cycle leaves at most
            // its raw key, never a lock.
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
        baseline: !args.no_baseline,
        claim: claim.to_string(),
    };
    let metrics = recorded.as_ref().map(crate::metrics::lock_series);
    if args.json {
        print_stdout(&format!(
            "{}\n",
            report::json(&settings, &servers, &results, metrics.as_ref())?
        ));
    } else {
        print_stdout(&report::tables(
            &settings,
            &servers,
            &results,
            metrics.as_ref(),
        ));
    }
    let errors: u64 = results.iter().map(|r| r.errors).sum();
    if errors > 0 {
        let sample = first_sample(results.iter().map(|r| &r.error_samples));
        eprintln!("distlock: {errors} lock operation(s) failed during the benchmark{sample}");
    }
    let raw_errors = report::baseline_errors(&servers);
    if raw_errors > 0 {
        let runs = servers
            .iter()
            .filter_map(|s| s.baseline.as_ref())
            .flat_map(|b| &b.runs);
        let sample = first_sample(runs.map(|run| &run.error_samples));
        eprintln!("distlock: {raw_errors} raw baseline cycle(s) failed{sample}");
    }
    if errors + raw_errors > 0 {
        return Ok(Exit::Code(BENCH_ERRORS));
    }
    Ok(Exit::Code(0))
}

/// ` (first: …)` with the first of the error samples, or nothing.
fn first_sample<'a>(samples: impl Iterator<Item = &'a Vec<String>>) -> String {
    samples
        .flat_map(|s| s.first())
        .next()
        .map(|s| format!(" (first: {s})"))
        .unwrap_or_default()
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
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

    let per_task = join_tasks(set, started, duration, progress).await?;
    let elapsed = started.elapsed();
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
    keep_sample(&mut stats.error_samples, e.report().to_string());
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
            keep_sample(&mut error_samples, s);
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
        lock_over_raw: None,
        server: 0,
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
