//! Deadlines of a wait: running a future until one, and the error when it passes.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::error::Error;

/// A deadline so far away it never comes (for waits whose length overflows `Instant`).
pub(crate) fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86400 * 365 * 30)
}

/// The error of a wait for `key` that began at `started` and ran out.
pub(crate) fn timeout_error(key: &str, started: Option<Instant>) -> Error {
    Error::Timeout {
        key: key.to_owned(),
        waited: started.map(|s| s.elapsed()).unwrap_or_default(),
    }
}

/// Sleeps until `deadline`, forever without one.
pub(crate) async fn sleep_until_deadline(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

/// Runs `fut` until `deadline`; `None` when the deadline passed first.
pub(crate) async fn within<F: Future>(deadline: Option<Instant>, fut: F) -> Option<F::Output> {
    match deadline {
        None => Some(fut.await),
        Some(d) => tokio::time::timeout_at(d.into(), fut).await.ok(),
    }
}
