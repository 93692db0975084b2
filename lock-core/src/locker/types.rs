//! The Locker's small public types: key checks, what `run` did, and its memory counts.

use crate::error::{Error, Result};

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// Checks a key: not empty, at most [`MAX_KEY_LEN`] bytes.
pub fn validate_key(key: &str) -> Result<()> {
    let reason = if key.is_empty() {
        "a lock key must not be empty"
    } else if key.len() > MAX_KEY_LEN {
        "a lock key must be at most 1024 bytes"
    } else {
        return Ok(());
    };
    let mut shown = key.to_owned();
    if shown.len() > 64 {
        let mut cut = 64;
        while !shown.is_char_boundary(cut) {
            cut -= 1;
        }
        shown.truncate(cut);
        shown.push('…');
    }
    Err(Error::InvalidKey { key: shown, reason })
}

/// What [`Locker::run`](super::Locker::run) did with the job.
#[derive(Debug, PartialEq, Eq)]
#[must_use]
#[non_exhaustive]
pub enum Outcome<T> {
    /// The lock was won and the job ran to completion with this result.
    Ran(T),
    /// The lock was not won (taken, or the wait timed out); the job did not run.
    Skipped,
    /// The job's hard timeout passed; the job was cancelled and the lock released.
    TimedOut,
    /// The lock was lost while the job ran; the job was cancelled.
    LockLost,
    /// The fire time given to [`Locker::run_scheduled`](super::Locker::run_scheduled) was
    /// already claimed (another process runs it, or ran it); the job did not run.
    ClaimedElsewhere,
}

/// Counts of what a [`Locker`](super::Locker) holds in memory, for monitoring and leak tests.
///
/// `#[non_exhaustive]`: it may count more later; read the fields, compare with
/// `LockerStats::default()` (nothing outstanding).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockerStats {
    /// Guards currently held through this Locker.
    pub held: usize,
    /// Keys with local waiters queued.
    pub queued_keys: usize,
    /// Background tasks (releases, cleanups) still running.
    pub background_tasks: usize,
    /// Guards in the watchdog's schedule (held guards with the watchdog on).
    pub renewals_scheduled: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_validated() {
        assert!(matches!(validate_key(""), Err(Error::InvalidKey { .. })));
        assert!(validate_key(&"k".repeat(MAX_KEY_LEN)).is_ok());
        let err = validate_key(&"é".repeat(MAX_KEY_LEN)).unwrap_err();
        match err {
            Error::InvalidKey { key, .. } => assert!(key.len() <= 64 + '…'.len_utf8()),
            other => panic!("unexpected {other:?}"),
        }
    }
}
