//! The metrics every [`Locker`](crate::Locker) records through the [`metrics`] facade, the
//! same on every backend: install a recorder (a Prometheus exporter, …) to collect them.
//! Without one they allocate nothing and cost a few nanoseconds per operation plus one
//! clock reading per hold (at its end, for its duration); with one, each record costs
//! the recorder's lookup of a key built once per Locker (no label is built per call).
//!
//! # Series
//!
//! | name | type | labels |
//! |---|---|---|
//! | [`ACQUIRE_DURATION`](names::ACQUIRE_DURATION) | histogram, seconds | `backend`, `outcome` |
//! | [`WAIT_DURATION`](names::WAIT_DURATION) | histogram, seconds | `backend`, `outcome` |
//! | [`HOLD_DURATION`](names::HOLD_DURATION) | histogram, seconds | `backend` |
//! | [`LOST`](names::LOST) | counter | `backend` |
//! | [`RENEWALS_FAILED`](names::RENEWALS_FAILED) | counter | `backend` |
//! | [`HAND_OVERS`](names::HAND_OVERS) | counter | `backend` |
//! | [`ERRORS`](names::ERRORS) | counter | `backend`, `kind` |
//!
//! `backend` is the backend's name ([`Capabilities::name`](crate::Capabilities::name):
//! `memory`, `redis`, …); `outcome` one of [`OUTCOMES`]; `kind` one of
//! [`Error::KINDS`](crate::Error::KINDS).
//!
//! # The key label
//!
//! Rule: the lock's key is never a label. Keys may be unbounded (one per order, per user)
//! and sensitive, and each distinct label value is a series of its own in the recorder. An
//! application that wants series per kind of lock names the kind with
//! [`LockOptions::metrics_label`](crate::LockOptions::metrics_label) (a `&'static str`, so
//! the set of values is fixed by the program): every series of that acquisition and of
//! its guard then also has the label [`KEY_LABEL`] (`key_label="jobs"`). Without it the
//! series have no such label.
//!
//! # Descriptions
//!
//! Each [`Locker`](crate::Locker) describes the series (help text and unit) to the recorder
//! installed when it is built; [`describe`] does it again, for a recorder installed later.

use metrics::Unit;

/// The names of the series, prefixed `distlock_`, with their unit in the name.
pub mod names {
    /// Histogram, seconds: from the call of
    /// [`Locker::acquire`](crate::Locker::acquire) (and so `lock`, `try_acquire`, `run`,
    /// `acquire_many` per key) to its answer, by `outcome`. An acquisition dropped before
    /// its answer is not recorded. One answered at once by an in-process backend (the
    /// memory backend's first attempt) is recorded as taking no time: the clock is not
    /// read for it, so the uncontended cycle costs no extra reading.
    pub const ACQUIRE_DURATION: &str = "distlock_lock_acquire_duration_seconds";
    /// Histogram, seconds: the same time, only for the acquisitions that waited (the first
    /// attempt was refused or failed, or other waiters of the Locker were queued before
    /// them): from the call to the grant or the give-up, by `outcome`.
    pub const WAIT_DURATION: &str = "distlock_lock_wait_duration_seconds";
    /// Histogram, seconds: how long a guard held its lock, from the grant to its release,
    /// its drop or its loss, whichever came first.
    pub const HOLD_DURATION: &str = "distlock_lock_hold_duration_seconds";
    /// Counter: locks lost while held: a renewal or
    /// [`extend`](crate::LockGuard::extend) found the lock gone, or its validity passed
    /// while the server did not answer (the guard's [`lost`](crate::LockGuard::lost)
    /// resolved). Not counted: locks ended by their release, drop or a shutdown.
    pub const LOST: &str = "distlock_lock_lost_total";
    /// Counter: renewals (the watchdog's and [`extend`](crate::LockGuard::extend)) whose
    /// server call failed or did not answer before the lock's validity passed.
    pub const RENEWALS_FAILED: &str = "distlock_lock_renewals_failed_total";
    /// Counter: releases that handed the key straight to the next waiter of the same
    /// Locker (one server step; backends with [`HandOver`](crate::HandOver)).
    pub const HAND_OVERS: &str = "distlock_lock_handovers_total";
    /// Counter: errors by `kind` ([`Error::kind`](crate::Error::kind)): every failed
    /// server call of a Locker (attempts, including those retried while waiting;
    /// renewals and extends; releases and hand-overs; background clean-ups) and every
    /// acquisition refused before any I/O (invalid key or TTL, shut down). A lock taken
    /// or a wait that timed out is not an error here: it is the acquisition's `outcome`.
    pub const ERRORS: &str = "distlock_lock_errors_total";
}

/// The label with the application's name for the kind of lock, when it gave one
/// ([`LockOptions::metrics_label`](crate::LockOptions::metrics_label)).
pub const KEY_LABEL: &str = "key_label";

/// The values of the `outcome` label: `granted`; `refused` (taken, with
/// [`WaitStrategy::Skip`](crate::WaitStrategy::Skip): `Error::Locked`); `timed_out` (the
/// wait's deadline passed: `Error::Timeout`); `error` (any other error).
pub const OUTCOMES: [&str; 4] = ["granted", "refused", "timed_out", "error"];

/// Describes every series (help text and unit) to the recorder in use now. Each Locker
/// does it when built; call it after installing a recorder if Lockers were built before.
pub fn describe() {
    use names::*;
    metrics::describe_histogram!(
        ACQUIRE_DURATION,
        Unit::Seconds,
        "Time from the call of acquire to its answer, by outcome"
    );
    metrics::describe_histogram!(
        WAIT_DURATION,
        Unit::Seconds,
        "Time from the call of acquire to the grant or give-up, for acquisitions that waited"
    );
    metrics::describe_histogram!(
        HOLD_DURATION,
        Unit::Seconds,
        "Time from the grant to the release, drop or loss of the lock"
    );
    metrics::describe_counter!(
        LOST,
        "Locks lost while held (renewal refused, validity passed)"
    );
    metrics::describe_counter!(
        RENEWALS_FAILED,
        "Renewals and extends whose server call failed or did not answer in time"
    );
    metrics::describe_counter!(
        HAND_OVERS,
        "Releases that handed the key straight to the next local waiter"
    );
    metrics::describe_counter!(
        ERRORS,
        "Errors of the Locker's server calls and inputs, by kind"
    );
}
