//! What a Locker tells an [`Observer`]: contention and retries as they happen, for logs,
//! metrics and progress messages.

use std::time::Duration;

use crate::error::Error;

/// Something that happened while a [`Locker`](crate::Locker) acquired a lock.
#[derive(Debug)]
#[non_exhaustive]
pub enum Event<'a> {
    /// The key is held by another owner and the caller waits (once per acquisition, when
    /// its wait begins; never with [`WaitStrategy::Skip`](crate::WaitStrategy::Skip), which
    /// does not wait).
    Waiting {
        /// The key.
        key: &'a str,
    },
    /// An attempt failed with a transient error (server unreachable, timed out); the
    /// Locker retries after a backoff until the wait's deadline. Not told with
    /// [`WaitStrategy::Skip`](crate::WaitStrategy::Skip): the error is returned instead.
    Retrying {
        /// The key.
        key: &'a str,
        /// The failure.
        error: &'a Error,
    },
    /// The lock was granted.
    Granted {
        /// The key.
        key: &'a str,
        /// The grant's fencing token.
        fence: u64,
        /// How long the acquisition took.
        waited: Duration,
    },
}

/// Receives a Locker's [`Event`]s, on the task that acquires, as they happen.
///
/// Rule: `on_event` must return quickly and never block (it runs inside `acquire`); hand
/// slow work to a channel or a task.
pub trait Observer: Send + Sync + 'static {
    /// Called for each event.
    fn on_event(&self, event: &Event<'_>);
}

impl<F> Observer for F
where
    F: Fn(&Event<'_>) + Send + Sync + 'static,
{
    fn on_event(&self, event: &Event<'_>) {
        self(event)
    }
}
