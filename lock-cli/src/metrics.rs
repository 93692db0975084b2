//! `--metrics-addr` of `run`, `bench` and `cron`: the metrics recorded through the
//! `metrics` facade (the Locker's `distlock_lock_*`, the scheduler's
//! `distlock_scheduler_*`) served over HTTP in the Prometheus text format; and, for
//! `bench --metrics`, the same recorder without the listener, read back for the report.

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::exit::{CliError, INTERNAL, UNAVAILABLE, USAGE};

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

/// Installs the Prometheus recorder as the process's `metrics` recorder and starts serving
/// it on `addr` (any path answers with the metrics). Must run inside the tokio runtime.
/// The lock metrics are described to it (help texts and units), so Lockers built before it
/// are covered too.
///
/// # Errors
/// The address cannot be listened on (exit 69), or a recorder was already installed.
pub fn serve(addr: SocketAddr) -> Result<PrometheusHandle, CliError> {
    let cannot = |e: &dyn std::fmt::Display| {
        CliError::new(
            UNAVAILABLE,
            format!("cannot serve metrics on --metrics-addr {addr}: {e}"),
        )
    };
    let (recorder, exporter) = PrometheusBuilder::new()
        .with_http_listener(addr)
        .build()
        .map_err(|e| cannot(&e))?;
    let handle = recorder.handle();
    ::metrics::set_global_recorder(recorder).map_err(|e| cannot(&e))?;
    tokio::spawn(exporter);
    distlock::metrics::describe();
    Ok(handle)
}

/// Installs the Prometheus recorder without a listener, for reading the metrics back.
///
/// # Errors
/// A recorder was already installed (a bug: exit 70).
pub fn record() -> Result<PrometheusHandle, CliError> {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| CliError::new(INTERNAL, format!("cannot record metrics: {e}")))?;
    distlock::metrics::describe();
    Ok(handle)
}

/// The lock's series in `handle`'s Prometheus text, keyed by `name{labels}`: every counter,
/// and each histogram's `_count` and `_sum` (not its quantiles).
pub fn lock_series(handle: &PrometheusHandle) -> BTreeMap<String, f64> {
    handle
        .render()
        .lines()
        .filter(|l| l.starts_with("distlock_lock") && !l.contains("quantile="))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}
