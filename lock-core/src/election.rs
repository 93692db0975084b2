//! Leader values: the optional ability of a lock server to publish, beside a lock, the
//! value of its holder as the leader of an election ([`LeaderValues`]).
//!
//! Leadership is a lock with a published value: the leader of election `name` is the holder
//! of the lock `name`, its term is the fence of that grant (so terms strictly increase as
//! fences do), and its value is what it last published. The waiting, renewal, `lost()` and
//! release of a leadership are a lock's (see [`Election`](crate::Election)); a backend adds
//! only the value, conditioned on still holding, and the notices observers wake on.

use std::time::Duration;

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::lease::{Lease, Owner};

/// Longest value a leader can publish, in bytes.
pub const MAX_LEADER_VALUE: usize = 64 * 1024;

/// The leader of an election as the lock server sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The value the leader last published.
    pub value: Vec<u8>,
    /// The leader's term: the fence of its grant, strictly greater than every earlier
    /// leader's of the election.
    pub term: u64,
    /// The grant's owner (each campaign draws a new one).
    pub owner: Owner,
    /// How long the leadership lasts unless renewed, as the server counts it; `None` when
    /// the server cannot tell.
    pub expires_in: Option<Duration>,
}

impl Leader {
    /// A leader of `term`, owned by `owner`, that published `value`.
    pub fn new(value: Vec<u8>, term: u64, owner: Owner, expires_in: Option<Duration>) -> Self {
        Leader {
            value,
            term,
            owner,
            expires_in,
        }
    }

    /// The value as text, when it is UTF-8.
    pub fn value_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.value).ok()
    }

    /// Whether `other` is the same leadership with the same value (the time left aside).
    pub fn same_as(&self, other: &Leader) -> bool {
        self.term == other.term && self.owner == other.owner && self.value == other.value
    }
}

/// A lock server publishing leaders' values beside their locks.
///
/// Rules an implementation keeps (the conformance rules in `lock-conformance`'s `election`
/// module check them):
/// - [`publish`](Self::publish) is one atomic step on the server: the value is kept only if
///   the lease's owner holds the key at that moment, together with the lease's owner and
///   fence as the term; otherwise nothing changes and the answer is
///   [`Error::NotHeld`]. A later publish of the same holder replaces the value;
/// - [`leader`](Self::leader) answers the key's current holder with the value it published,
///   and `None` when the key is free or its holder has not published (a value left by an
///   earlier holder is never answered for a later one);
/// - every publish, and every [`announce`](Self::announce), wakes the listeners of the key
///   ([`Backend::listen`](crate::Backend::listen)) in every process, so observers learn of a
///   new leader, a new value and a resignation without polling;
/// - every request is bounded by the timeout the lock's requests have.
///
/// Inputs are checked by the caller: backends may assume a valid key and a value of at
/// most [`MAX_LEADER_VALUE`] bytes.
#[async_trait]
pub trait LeaderValues: Send + Sync {
    /// Publishes `value` as the value of `lease`'s leadership, if `lease` still holds its
    /// key, and wakes the key's listeners.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the lease no longer holds the key; transient backend errors
    /// (the value may or may not have been published).
    ///
    /// # Cancel safety
    /// Dropping the future may leave the value published or not, as a transient error does.
    async fn publish(&self, lease: &Lease, value: &[u8]) -> Result<()>;

    /// The current leader of `key`: its holder, if it published a value.
    ///
    /// # Errors
    /// Transient backend errors.
    ///
    /// # Cancel safety
    /// A read only: dropping the future changes nothing.
    async fn leader(&self, key: &str) -> Result<Option<Leader>>;

    /// Wakes the listeners of `key` in every process after its leader released it (a plain
    /// release wakes only the waiters the server knows of).
    ///
    /// # Errors
    /// Transient backend errors: the observers then learn of the change at the leader's
    /// expiry instead.
    ///
    /// # Cancel safety
    /// A notice only: dropping the future may leave it unsent.
    async fn announce(&self, key: &str) -> Result<()>;
}

/// Checks a value to publish: at most [`MAX_LEADER_VALUE`] bytes.
///
/// # Errors
/// [`Error::InvalidKey`] naming the election when the value is too long.
pub fn check_value(key: &str, value: &[u8]) -> Result<()> {
    if value.len() > MAX_LEADER_VALUE {
        return Err(Error::InvalidKey {
            key: key.chars().take(64).collect(),
            reason: "a leader's value is at most 64 KiB",
        });
    }
    Ok(())
}
