//! The metrics of `run`, `bench` and `cron`: those recorded through the `metrics` facade
//! (the Locker's `distlock_lock_*`, the scheduler's `distlock_scheduler_*`, `run`'s own
//! `distlock_run_*`) in the Prometheus text format, served over HTTP (`--metrics-addr`),
//! written to a node_exporter textfile at exit (`run --metrics-textfile`), or read back for
//! the report (`bench --metrics`).
//!
//! Histograms are exported as Prometheus histograms (`_bucket{le=…}`, `_sum`, `_count`),
//! which aggregate across processes and replicas, never as summaries (quantiles per
//! process, which do not).

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics::Unit;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::exit::{CliError, INTERNAL, UNAVAILABLE, USAGE};

/// Bucket bounds, in seconds, of the latency histograms (acquisitions, waits): 0.5 ms to
/// 60 s, about three per decade.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// Bucket bounds, in seconds, of the histogram of how long a lock was held: 1 ms to a
/// day, for holds of any length.
pub const DURATION_BUCKETS: [f64; 15] = [
    0.001, 0.01, 0.1, 1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0,
    86400.0,
];

/// The histograms that do not take [`LATENCY_BUCKETS`], with their bounds: lock holds take
/// [`DURATION_BUCKETS`], scheduled runs the scheduler's own
/// ([`RUN_DURATION_BUCKETS`](distlock::scheduler::metric_names::RUN_DURATION_BUCKETS):
/// 0.1 s to 8 h).
const LONG_HISTOGRAMS: [(&str, &[f64]); 2] = [
    (distlock::metrics::names::HOLD_DURATION, &DURATION_BUCKETS),
    (
        distlock::scheduler::metric_names::RUN_DURATION,
        &distlock::scheduler::metric_names::RUN_DURATION_BUCKETS,
    ),
];

/// Resolves `HOST:PORT` (a name such as `localhost` or an address such as `0.0.0.0`) to the
/// address to listen on.
///
/// # Errors
/// Not `HOST:PORT`, or a host that does not resolve (exit 64).
pub fn resolve(addr: &str) -> Result<SocketAddr, CliError> {
    let bad = |why: String| {
        CliError::new(USAGE, format!("invalid --metrics-addr {addr:?}: {why}"))
            .hint("write HOST:PORT, like 127.0.0.1:9464 or 0.0.0.0:9464")
    };
    let mut addrs = addr.to_socket_addrs().map_err(|e| bad(e.to_string()))?;
    addrs
        .next()
        .ok_or_else(|| bad("the host has no address".to_owned()))
}

/// The exporter every subcommand uses: histograms with buckets, and `labels` on every
/// series.
fn builder(labels: &[(&str, &str)]) -> PrometheusBuilder {
    let mut builder = PrometheusBuilder::new()
        .set_buckets(&LATENCY_BUCKETS)
        .expect("the latency buckets are not empty");
    for (name, buckets) in LONG_HISTOGRAMS {
        builder = builder
            .set_buckets_for_metric(Matcher::Full(name.to_owned()), buckets)
            .expect("the duration buckets are not empty");
    }
    for (key, value) in labels {
        builder = builder.add_global_label(*key, *value);
    }
    builder
}

/// Installs the Prometheus recorder as the process's `metrics` recorder, serving it on
/// `listen` when given (any path answers with the metrics), with `labels` on every series.
/// Must run inside the tokio runtime. The lock and scheduler metrics are described to it
/// (help texts and units), so Lockers built before it are covered too.
///
/// # Errors
/// The address cannot be listened on (exit 69), or a recorder was already installed (a
/// bug: exit 70).
pub fn install(
    listen: Option<SocketAddr>,
    labels: &[(&str, &str)],
) -> Result<PrometheusHandle, CliError> {
    let handle = match listen {
        Some(addr) => {
            let cannot = |e: &dyn std::fmt::Display| {
                CliError::new(
                    UNAVAILABLE,
                    format!("cannot serve metrics on --metrics-addr {addr}: {e}"),
                )
            };
            let (recorder, exporter) = builder(labels)
                .with_http_listener(addr)
                .build()
                .map_err(|e| cannot(&e))?;
            let handle = recorder.handle();
            ::metrics::set_global_recorder(recorder).map_err(|e| cannot(&e))?;
            tokio::spawn(exporter);
            handle
        }
        None => {
            let recorder = builder(labels).build_recorder();
            let handle = recorder.handle();
            ::metrics::set_global_recorder(recorder)
                .map_err(|e| CliError::new(INTERNAL, format!("cannot record metrics: {e}")))?;
            handle
        }
    };
    distlock::metrics::describe();
    Ok(handle)
}

/// The lock's series in `handle`'s Prometheus text, keyed by `name{labels}`: every counter,
/// and each histogram's `_count` and `_sum` (not its buckets).
pub fn lock_series(handle: &PrometheusHandle) -> BTreeMap<String, f64> {
    handle.run_upkeep();
    handle
        .render()
        .lines()
        .filter(|l| l.starts_with("distlock_lock") && !l.contains("_bucket{"))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The series `distlock run` adds about its own run, as Prometheus advises for batch
/// jobs: each run replaces the last one's values, and the time of the last success is the
/// one to alert on (`time() - distlock_run_last_success_timestamp_seconds > …`).
pub mod run_series {
    /// Gauge: the exit status of the last `distlock run`: CMD's own, or distlock's (75 not
    /// acquired, 76 lock lost, 124 timed out, 128+N killed by signal N, …).
    pub const LAST_EXIT_CODE: &str = "distlock_run_last_exit_code";
    /// Gauge, Unix seconds: when the last `distlock run` ended.
    pub const LAST_END: &str = "distlock_run_last_end_timestamp_seconds";
    /// Gauge, seconds: how long CMD ran in the last `distlock run`; absent when it did not
    /// run (another holder, an error before it started).
    pub const LAST_DURATION: &str = "distlock_run_last_duration_seconds";
    /// Gauge, Unix seconds: when CMD last ran to completion with status 0 (here, as this
    /// job: a run that did not succeed keeps the previous file's value); absent until it
    /// first did.
    pub const LAST_SUCCESS: &str = "distlock_run_last_success_timestamp_seconds";
}

/// Checks `--metrics-textfile PATH` before anything runs: a file name in a directory that
/// exists.
///
/// # Errors
/// No file name, or no such directory (exit 64).
pub fn check_textfile(path: &Path) -> Result<&Path, CliError> {
    let bad = |why: &str| {
        CliError::new(
            USAGE,
            format!("invalid --metrics-textfile {}: {why}", path.display()),
        )
    };
    if path.file_name().is_none() {
        return Err(bad("it names no file"));
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(bad("its directory does not exist")
            .hint("point it into node_exporter's --collector.textfile.directory"));
    }
    Ok(path)
}

/// Sets the [`run_series`] of a run that ended with `code`, during which CMD ran for
/// `ran` (if it ran); `succeeded` makes now the last success, else the last success of the
/// textfile at `previous` (if any) is kept.
pub fn record_run(code: i32, ran: Option<Duration>, succeeded: bool, previous: Option<&Path>) {
    use run_series::*;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    ::metrics::describe_gauge!(
        LAST_EXIT_CODE,
        "Exit status of the last distlock run (CMD's, or distlock's own)"
    );
    ::metrics::describe_gauge!(
        LAST_END,
        Unit::Seconds,
        "Unix time at which the last distlock run ended"
    );
    ::metrics::describe_gauge!(
        LAST_DURATION,
        Unit::Seconds,
        "How long CMD ran in the last distlock run"
    );
    ::metrics::describe_gauge!(
        LAST_SUCCESS,
        Unit::Seconds,
        "Unix time at which CMD last ran to completion with status 0"
    );
    ::metrics::gauge!(LAST_EXIT_CODE).set(f64::from(code));
    ::metrics::gauge!(LAST_END).set(now);
    if let Some(ran) = ran {
        ::metrics::gauge!(LAST_DURATION).set(ran.as_secs_f64());
    }
    let last_success = if succeeded {
        Some(now)
    } else {
        previous.and_then(|path| read_sample(path, LAST_SUCCESS))
    };
    if let Some(at) = last_success {
        ::metrics::gauge!(LAST_SUCCESS).set(at);
    }
}

/// `handle`'s metrics in the Prometheus text format, every pending histogram sample
/// included.
pub fn render(handle: &PrometheusHandle) -> String {
    handle.run_upkeep();
    handle.render()
}

/// Writes `handle`'s exposition to `path` for node_exporter's textfile collector: first to
/// a hidden temporary file in the same directory (node_exporter reads only `*.prom`), then
/// renamed over `path`, so a reader sees the old file or the new one, never half of one.
///
/// # Errors
/// The directory cannot be written (exit 69: like a metrics address that cannot be
/// listened on).
pub fn write_textfile(handle: &PrometheusHandle, path: &Path) -> Result<(), CliError> {
    let text = render(handle);
    let cannot = |e: std::io::Error| {
        CliError::new(
            UNAVAILABLE,
            format!("cannot write --metrics-textfile {}: {e}", path.display()),
        )
    };
    let name = path
        .file_name()
        .ok_or_else(|| cannot(std::io::Error::other("not a file name")))?;
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(".{}.tmp", std::process::id()));
    let temp = path.with_file_name(temp_name);
    let written = std::fs::File::create(&temp).and_then(|mut file| {
        file.write_all(text.as_bytes())?;
        file.sync_all()
    });
    if let Err(e) = written.and_then(|()| std::fs::rename(&temp, path)) {
        let _ = std::fs::remove_file(&temp);
        return Err(cannot(e));
    }
    Ok(())
}

/// The value of the first sample of `name` (any labels) in the Prometheus text at `path`,
/// if the file exists and has one.
pub fn read_sample(path: &Path, name: &str) -> Option<f64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, value)| value.parse().ok())
}
