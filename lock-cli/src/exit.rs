//! Exit statuses and the one-or-two-line error messages of the `distlock` command.
//!
//! The numbers follow `sysexits.h` where one fits (64, 69, 70, 75) and `timeout(1)` for
//! the job's own fate (124, 126, 127); 76 is distlock's own "lock lost".

use std::fmt;
use std::time::Duration;

use distlock::Error;

use crate::units::fmt_duration;

/// Bad command line, key, TTL, duration or URL (`EX_USAGE`).
pub const USAGE: i32 = 64;
/// The lock server is unreachable, refused the request, cannot do what was asked, or its
/// backend is not compiled in (`EX_UNAVAILABLE`).
pub const UNAVAILABLE: i32 = 69;
/// A bug or an unexpected state in distlock itself (`EX_SOFTWARE`).
pub const INTERNAL: i32 = 70;
/// The lock was not acquired: held elsewhere with `--no-wait`, or the `--wait` time passed
/// (`EX_TEMPFAIL`: try again later).
pub const NOT_ACQUIRED: i32 = 75;
/// The lock was lost while the command ran; the command was stopped.
pub const LOCK_LOST: i32 = 76;
/// `--timeout` passed; the command was stopped (as `timeout(1)`).
pub const TIMED_OUT: i32 = 124;
/// The command was found but could not be executed (as `timeout(1)` and shells).
pub const CANNOT_EXECUTE: i32 = 126;
/// The command was not found (as `timeout(1)` and shells).
pub const NOT_FOUND: i32 = 127;
/// `bench` finished but some lock operations failed.
pub const BENCH_ERRORS: i32 = 1;

/// How the process ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Exit with this status.
    Code(i32),
    /// Die of this signal (after cleaning up), so that the parent sees what the user did.
    Signal(i32),
}

/// A failure reported to the user: what failed, and optionally what to do about it.
#[derive(Debug)]
pub struct CliError {
    /// The exit status.
    pub code: i32,
    /// One line: what failed.
    pub message: String,
    /// One optional line: what to do.
    pub hint: Option<String>,
}

impl CliError {
    /// A failure with exit status `code`.
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        CliError {
            code,
            message: message.into(),
            hint: None,
        }
    }

    /// Adds what the user can do about it.
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// Maps a library error to a message and exit status. `url` is the redacted URL in use
    /// and `origin` says where it came from, both for the message.
    pub fn from_lock(err: Error, url: &str, origin: &str) -> Self {
        match err {
            Error::InvalidUrl { url, reason } => {
                let e = CliError::new(
                    USAGE,
                    format!("invalid lock URL `{url}` ({origin}): {reason}"),
                );
                if reason.contains("scheme") {
                    e.hint(
                        "use memory://, file:///DIR, redis://HOST:PORT[/DB], rediss://…, \
                         redis+sentinel://H1:P1,…/MASTER, redis+cluster://H1:P1,…, \
                         redlock://H1:P1,H2:P2,…, etcd://HOST:PORT[,…], \
                         postgres://USER@HOST:PORT/DB, mysql://USER@HOST:PORT/DB or \
                         zookeeper://H1:P1,H2:P2,…[/ROOT] (all in `distlock --help`)",
                    )
                } else {
                    e
                }
            }
            Error::FeatureDisabled { scheme, feature } => CliError::new(
                UNAVAILABLE,
                format!("this distlock was built without the {scheme}:// backend ({origin})"),
            )
            .hint(format!(
                "rebuild lock-cli with `--features {feature}` (the default build has every backend)"
            )),
            Error::InvalidKey { key, reason } => {
                CliError::new(USAGE, format!("invalid key {key:?}: {reason}"))
            }
            Error::InvalidTtl {
                ttl,
                backend,
                reason,
            } => CliError::new(
                USAGE,
                format!(
                    "invalid --ttl {} for the {backend} backend: {reason}",
                    fmt_duration(ttl)
                ),
            ),
            Error::InvalidPermits { reason } => CliError::new(USAGE, reason).hint(
                "every run on one KEY claims it the same way: a plain lock, the same \
                 --permits N, or --read/--write",
            ),
            Error::Locked { key } => CliError::new(
                NOT_ACQUIRED,
                format!("lock {key:?} is held by another owner"),
            ),
            Error::Timeout { key, waited } => not_acquired_after(&key, waited),
            Error::Unavailable { .. } => CliError::new(UNAVAILABLE, transient_message(&err, url))
            .hint(format!(
                "check that the server is running and reachable (URL {origin})"
            )),
            Error::Backend { backend, source } => CliError::new(
                UNAVAILABLE,
                format!("the {backend} server at {url} refused: {source}"),
            )
            .hint(format!(
                "check the URL's credentials and that it points at a {backend} server (URL {origin})"
            )),
            Error::QuorumNotReached {
                ref node_errors, ..
            } => {
                let mut e = CliError::new(UNAVAILABLE, transient_message(&err, url));
                if let Some(first) = node_errors.first() {
                    e = e.hint(format!(
                        "{} node(s) failed, first: {}",
                        node_errors.len(),
                        first.report()
                    ));
                }
                e
            }
            Error::Unsupported { backend, operation } => CliError::new(
                UNAVAILABLE,
                format!("the {backend} backend does not support {operation}"),
            ),
            other => CliError::new(INTERNAL, format!("internal error: {}", other.report()))
                .hint("please report this at https://github.com/distlock/distlock/issues"),
        }
    }
}

/// The message for a wait that ended with the lock still taken.
pub fn not_acquired_after(key: &str, waited: Duration) -> CliError {
    CliError::new(
        NOT_ACQUIRED,
        format!(
            "gave up waiting for lock {key:?} after {}: it is still held by another owner",
            fmt_duration(waited)
        ),
    )
}

impl fmt::Display for CliError {
    /// `distlock: message` and, when there is one, an indented `hint:` line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "distlock: {}", self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, "\n  hint: {hint}")?;
        }
        Ok(())
    }
}

/// What a transient failure of the server at `url` says to a person: the same words for
/// the final error and for the "still trying" notes while distlock waits.
pub fn transient_message(err: &Error, url: &str) -> String {
    match err {
        Error::Unavailable { backend, source } => {
            format!("cannot reach the {backend} server at {url}: {source}")
        }
        Error::QuorumNotReached {
            granted, needed, ..
        } => format!("only {granted} of the {needed} needed nodes of {url} granted the lock"),
        other => other.report().to_string(),
    }
}
