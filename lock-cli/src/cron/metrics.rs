//! `--metrics-addr`: the scheduler's metrics (recorded through the `metrics` facade)
//! served over HTTP in the Prometheus text format.

use std::net::{SocketAddr, ToSocketAddrs};

use metrics_exporter_prometheus::PrometheusBuilder;

use crate::exit::{CliError, UNAVAILABLE, USAGE};

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
///
/// # Errors
/// The address cannot be listened on (exit 69), or a recorder was already installed.
pub fn serve(addr: SocketAddr) -> Result<(), CliError> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .map_err(|e| {
            CliError::new(
                UNAVAILABLE,
                format!("cannot serve metrics on --metrics-addr {addr}: {e}"),
            )
        })
}
