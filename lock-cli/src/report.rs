//! The benchmark's results: their JSON form and their side-by-side tables.

use std::fmt::Write as _;
use std::time::Duration;

use clap::ValueEnum;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::exit::{CliError, INTERNAL};
use crate::units::{fmt_duration, fmt_nanos};

/// The run's settings, as given on the command line.
#[derive(Clone, Debug, Serialize)]
pub struct Settings {
    /// How long each workload ran, in milliseconds.
    pub duration_ms: f64,
    /// How long each cycle held the lock, in milliseconds.
    pub hold_ms: f64,
    /// The lock TTL, in milliseconds.
    pub ttl_ms: f64,
    /// Whether held locks were renewed.
    pub watchdog: bool,
    /// Whether the servers' raw round trips were measured (`--no-baseline` turns it off).
    pub baseline: bool,
    /// What each cycle claimed of its key: `lock`, or `1 of N permits` (`--permits N`).
    pub claim: String,
}

/// A latency distribution in nanoseconds.
#[derive(Clone, Debug, Serialize)]
pub struct Latency {
    /// Number of recorded operations.
    pub count: u64,
    /// Median.
    pub p50_ns: u64,
    /// 90th percentile.
    pub p90_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// Largest.
    pub max_ns: u64,
    /// Mean.
    pub mean_ns: f64,
}

/// Latencies are recorded in nanoseconds up to an hour, with three significant digits.
///
/// # Errors
/// The bounds are refused (a bug).
pub fn histogram() -> Result<Histogram<u64>, CliError> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
        .map_err(|e| CliError::new(INTERNAL, format!("histogram: {e}")))
}

/// Error messages kept per task and per result for the report.
pub const ERROR_SAMPLES: usize = 3;

/// Keeps `text` among `samples` unless it is there already or there are enough.
pub fn keep_sample(samples: &mut Vec<String>, text: String) {
    if samples.len() < ERROR_SAMPLES && !samples.contains(&text) {
        samples.push(text);
    }
}

impl From<&Histogram<u64>> for Latency {
    fn from(h: &Histogram<u64>) -> Self {
        Latency {
            count: h.len(),
            p50_ns: h.value_at_quantile(0.50),
            p90_ns: h.value_at_quantile(0.90),
            p99_ns: h.value_at_quantile(0.99),
            max_ns: h.max(),
            mean_ns: h.mean(),
        }
    }
}

/// One workload on one server. Counts add up: `cycles` is the sum of `per_task_cycles`;
/// `acquire.count` is `cycles + release_errors` (every grant is released once);
/// `release.count` is `cycles`; `errors` is `acquire_errors + release_errors`.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadResult {
    /// The server's URL, password hidden.
    pub url: String,
    /// The backend's name.
    pub backend: &'static str,
    /// Concurrent tasks.
    pub tasks: u32,
    /// Key layout.
    pub keys: Keys,
    /// Measured wall time, from the start until every task stopped.
    pub elapsed_s: f64,
    /// Completed acquire + hold + release cycles.
    pub cycles: u64,
    /// `cycles / elapsed_s`.
    pub cycles_per_sec: f64,
    /// Time from calling acquire until the grant.
    pub acquire: Latency,
    /// Time of the release call.
    pub release: Latency,
    /// The longest any task waited for a grant, including a wait cut off at the end.
    pub worst_wait_ns: u64,
    /// Completed cycles of each task.
    pub per_task_cycles: Vec<u64>,
    /// Smallest per-task count.
    pub min_task_cycles: u64,
    /// Largest per-task count.
    pub max_task_cycles: u64,
    /// Jain's index over `per_task_cycles`; null when no cycle completed.
    pub fairness_jain: Option<f64>,
    /// Failed acquire calls (other than a wait cut off at the end).
    pub acquire_errors: u64,
    /// Failed release calls.
    pub release_errors: u64,
    /// All failed calls.
    pub errors: u64,
    /// A few distinct error messages.
    pub error_samples: Vec<String>,
    /// The raw baseline's cycles/s with as many tasks on the same server divided by this
    /// workload's: how many raw cycles one lock cycle costs. Null without a baseline, or
    /// when either completed no cycle.
    pub lock_over_raw: Option<f64>,
    /// Which of the run's servers (in `--url` order) this was measured on.
    #[serde(skip)]
    pub server: usize,
}

/// One server of the run (one `--url`), and its raw baseline.
#[derive(Clone, Debug, Serialize)]
pub struct Server {
    /// The server's URL, password hidden.
    pub url: String,
    /// The backend's name.
    pub backend: &'static str,
    /// The server's own round trips without the lock protocol; `None` for a backend
    /// without a server (memory) or with `--no-baseline`.
    pub baseline: Option<RawBaseline>,
}

/// A server's raw baseline ([`distlock::Baseline`]): cycles of its own plain operations
/// (a write and a delete) on the lock's connection settings, with no lock protocol.
#[derive(Clone, Debug, Serialize)]
pub struct RawBaseline {
    /// What one raw cycle sends, as the backend says (`"SET NX PX + DEL"`).
    pub measured: &'static str,
    /// One run per number of tasks (those of `--tasks`).
    pub runs: Vec<RawRun>,
}

impl RawBaseline {
    /// The run with `tasks` tasks.
    pub fn with_tasks(&self, tasks: u32) -> Option<&RawRun> {
        self.runs.iter().find(|run| run.tasks == tasks)
    }
}

/// One run of the raw baseline: `tasks` tasks, each on its own key, repeating raw cycles
/// for the workloads' duration. Counts add up as a workload's do: `cycle.count` is
/// `cycles`.
#[derive(Clone, Debug, Serialize)]
pub struct RawRun {
    /// Concurrent tasks.
    pub tasks: u32,
    /// Measured wall time, from the start until every task stopped.
    pub elapsed_s: f64,
    /// Completed raw cycles.
    pub cycles: u64,
    /// `cycles / elapsed_s`.
    pub cycles_per_sec: f64,
    /// Time of one raw cycle (both round trips).
    pub cycle: Latency,
    /// Failed raw cycles.
    pub errors: u64,
    /// A few distinct error messages.
    pub error_samples: Vec<String>,
}

/// The ratio [`WorkloadResult::lock_over_raw`] of a workload with `lock_cps` cycles/s
/// beside a raw run.
pub fn lock_over_raw(raw: &RawRun, lock_cps: f64) -> Option<f64> {
    (raw.cycles_per_sec > 0.0 && lock_cps > 0.0).then(|| raw.cycles_per_sec / lock_cps)
}

#[derive(Serialize)]
struct Document<'a> {
    settings: &'a Settings,
    measures: Measures,
    servers: &'a [Server],
    results: &'a [WorkloadResult],
    errors: u64,
    baseline_errors: u64,
    /// Only with `--metrics`: the lock's series, see [`LockSeries`].
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics: Option<&'a LockSeries>,
}

/// The lock's metrics recorded during the run (`--metrics`), by `name{labels}` as in the
/// Prometheus text format: every counter, each histogram's `_count` and `_sum` (seconds).
pub type LockSeries = std::collections::BTreeMap<String, f64>;

#[derive(Serialize)]
struct Measures {
    acquire: &'static str,
    release: &'static str,
    worst_wait: &'static str,
    fairness_jain: &'static str,
    baseline: &'static str,
    lock_over_raw: &'static str,
}

const MEASURES: Measures = Measures {
    acquire: "time from calling acquire until the lock is granted (with keys=one it includes waiting behind other tasks)",
    release: "time of the release call",
    worst_wait: "the longest any task waited for a grant, including a wait still pending when the time was up",
    fairness_jain: "Jain's index over per-task cycle counts: 1 = even, 1/tasks = one task did all",
    baseline: "the server's own round trips without the lock protocol (a plain write and a delete, on the same connection and timeouts), with as many tasks as each workload, each task on its own key",
    lock_over_raw: "raw cycles/s over lock cycles/s with the same number of tasks on the same server: how many raw round-trip cycles one lock cycle costs",
};

/// The sum of the errors of every raw run.
pub fn baseline_errors(servers: &[Server]) -> u64 {
    servers
        .iter()
        .filter_map(|s| s.baseline.as_ref())
        .flat_map(|b| &b.runs)
        .map(|run| run.errors)
        .sum()
}

/// The whole run as one JSON document.
///
/// # Errors
/// Serialization failed (a bug).
pub fn json(
    settings: &Settings,
    servers: &[Server],
    results: &[WorkloadResult],
    metrics: Option<&LockSeries>,
) -> Result<String, CliError> {
    let doc = Document {
        settings,
        measures: MEASURES,
        servers,
        results,
        errors: results.iter().map(|r| r.errors).sum(),
        baseline_errors: baseline_errors(servers),
        metrics,
    };
    serde_json::to_string_pretty(&doc)
        .map_err(|e| CliError::new(INTERNAL, format!("cannot write JSON: {e}")))
}

/// One table per workload, one column per server; then the lock's metrics when recorded.
pub fn tables(
    settings: &Settings,
    servers: &[Server],
    results: &[WorkloadResult],
    metrics: Option<&LockSeries>,
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "distlock bench: {}", describe_settings(settings));
    let mut workloads: Vec<(u32, Keys)> = Vec::new();
    for r in results {
        if !workloads.contains(&(r.tasks, r.keys)) {
            workloads.push((r.tasks, r.keys));
        }
    }
    for (tasks, keys) in workloads {
        let columns: Vec<&WorkloadResult> = results
            .iter()
            .filter(|r| r.tasks == tasks && r.keys == keys)
            .collect();
        let _ = writeln!(out, "\n{}", describe(tasks, keys));
        out.push_str(&table(servers, &columns));
    }
    let _ = writeln!(
        out,
        "\nacquire: {}.\nrelease: {}.\nworst wait: {}.\nfairness: {}.",
        MEASURES.acquire, MEASURES.release, MEASURES.worst_wait, MEASURES.fairness_jain
    );
    if servers.iter().any(|s| s.baseline.is_some()) {
        let _ = writeln!(
            out,
            "raw: {}.\nlock cycle / raw: {}.\nraw server round trips:",
            MEASURES.baseline, MEASURES.lock_over_raw
        );
        for server in servers {
            let measured = server
                .baseline
                .as_ref()
                .map_or("none (no server to measure)", |b| b.measured);
            let _ = writeln!(out, "  {}: {measured}", server.url);
        }
    }
    if let Some(series) = metrics {
        let _ = writeln!(
            out,
            "\nlock metrics recorded during the run (counters, and each histogram's _count and \
             _sum in seconds; key_label is the workload's keys):"
        );
        let width = series.keys().map(|k| k.len()).max().unwrap_or(0);
        for (name, value) in series {
            let _ = writeln!(out, "  {name:<width$}  {}", fmt_value(*value));
        }
        if series.is_empty() {
            let _ = writeln!(out, "  none");
        }
    }
    out
}

/// A count as an integer, a sum of seconds to the microsecond.
fn fmt_value(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.6}")
    }
}

fn table(servers: &[Server], columns: &[&WorkloadResult]) -> String {
    // The raw run beside each column: same server, same number of tasks.
    let raw: Vec<Option<&RawRun>> = columns
        .iter()
        .map(|r| {
            servers
                .get(r.server)
                .and_then(|s| s.baseline.as_ref())
                .and_then(|b| b.with_tasks(r.tasks))
        })
        .collect();
    let with_raw = raw.iter().any(Option::is_some);
    let raw_cells = |f: &dyn Fn(&RawRun) -> String| -> Vec<String> {
        raw.iter()
            .map(|run| run.map_or_else(|| "-".to_owned(), f))
            .collect()
    };
    let raw_lat = |f: fn(&Latency) -> u64| {
        raw_cells(&|run: &RawRun| {
            if run.cycle.count == 0 {
                "-".to_owned()
            } else {
                fmt_nanos(f(&run.cycle))
            }
        })
    };

    let mut rows: Vec<(&str, Vec<String>)> = vec![
        ("", columns.iter().map(|r| r.url.clone()).collect()),
        (
            "cycles/s",
            columns
                .iter()
                .map(|r| format!("{:.0}", r.cycles_per_sec))
                .collect(),
        ),
    ];
    if with_raw {
        rows.push((
            "raw cycles/s",
            raw_cells(&|run: &RawRun| format!("{:.0}", run.cycles_per_sec)),
        ));
        rows.push((
            "lock cycle / raw",
            columns
                .iter()
                .map(|r| match r.lock_over_raw {
                    Some(ratio) => format!("{ratio:.2}x"),
                    None => "-".to_owned(),
                })
                .collect(),
        ));
    }
    rows.extend([
        (
            "cycles",
            columns.iter().map(|r| r.cycles.to_string()).collect(),
        ),
        ("acquire p50", lat(columns, |r| r.acquire.p50_ns)),
        ("acquire p90", lat(columns, |r| r.acquire.p90_ns)),
        ("acquire p99", lat(columns, |r| r.acquire.p99_ns)),
        ("acquire max", lat(columns, |r| r.acquire.max_ns)),
        ("release p50", lat(columns, |r| r.release.p50_ns)),
        ("release p99", lat(columns, |r| r.release.p99_ns)),
    ]);
    if with_raw {
        rows.push(("raw cycle p50", raw_lat(|l| l.p50_ns)));
        rows.push(("raw cycle p99", raw_lat(|l| l.p99_ns)));
    }
    rows.extend([
        (
            "worst wait",
            columns.iter().map(|r| fmt_nanos(r.worst_wait_ns)).collect(),
        ),
        (
            "fairness",
            columns
                .iter()
                .map(|r| match r.fairness_jain {
                    Some(j) => format!("{j:.3}"),
                    None => "n/a".to_owned(),
                })
                .collect(),
        ),
        (
            "per task",
            columns
                .iter()
                .map(|r| format!("{}..{}", r.min_task_cycles, r.max_task_cycles))
                .collect(),
        ),
        (
            "errors",
            columns.iter().map(|r| r.errors.to_string()).collect(),
        ),
    ]);
    if with_raw {
        rows.push((
            "raw errors",
            raw_cells(&|run: &RawRun| run.errors.to_string()),
        ));
    }
    let label_width = rows.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns.len())
        .map(|i| {
            rows.iter()
                .map(|(_, cells)| cells[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for (label, cells) in &rows {
        let _ = write!(out, "  {label:<label_width$}");
        for (cell, width) in cells.iter().zip(&widths) {
            let _ = write!(out, "  {cell:>width$}");
        }
        out.push('\n');
    }
    out
}

fn lat(columns: &[&WorkloadResult], f: impl Fn(&WorkloadResult) -> u64) -> Vec<String> {
    columns
        .iter()
        .map(|r| {
            if r.acquire.count == 0 {
                "-".to_owned()
            } else {
                fmt_nanos(f(r))
            }
        })
        .collect()
}

/// Which keys the tasks of a workload lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Keys {
    /// Each task its own key: no contention.
    Distinct,
    /// All tasks one key: contention and hand-off.
    One,
}

impl Keys {
    /// The workload's `key_label` in the lock's metrics: `distinct` or `one`.
    pub fn label(self) -> &'static str {
        match self {
            Keys::Distinct => "distinct",
            Keys::One => "one",
        }
    }
}

/// `1 task`, `16 tasks`.
pub fn task_count(tasks: u32) -> String {
    let task_word = if tasks == 1 { "task" } else { "tasks" };
    format!("{tasks} {task_word}")
}

/// The text a workload is announced with in tables.
pub fn describe(tasks: u32, keys: Keys) -> String {
    let tasks = task_count(tasks);
    match keys {
        Keys::Distinct => format!("{tasks}, each on its own key"),
        Keys::One => format!("{tasks}, all on one key"),
    }
}

/// The settings line of the tables.
pub fn describe_settings(settings: &Settings) -> String {
    let d = |ms: f64| fmt_duration(Duration::from_secs_f64(ms / 1e3));
    format!(
        "{} per workload, {}, hold {}, ttl {}, watchdog {}, raw baseline {}",
        d(settings.duration_ms),
        settings.claim,
        d(settings.hold_ms),
        d(settings.ttl_ms),
        if settings.watchdog { "on" } else { "off" },
        if settings.baseline { "on" } else { "off" }
    )
}
