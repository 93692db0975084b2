//! How a scheduler's replicas share the jobs: [`LeaderMode`], when one elected replica
//! fires them all (the lead task itself is in `leader.rs`).

use std::time::Duration;

/// The default TTL of a scheduler's leadership (see [`LeaderMode::ttl`]).
pub const DEFAULT_LEADER_TTL: Duration = Duration::from_secs(15);

/// A scheduler whose jobs fire on one elected replica only
/// ([`SchedulerBuilder::leader`](crate::SchedulerBuilder::leader)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaderMode {
    /// The election's name: every replica of one scheduler names the same.
    pub election: String,
    /// The leadership's TTL: a standby leads at most this long after the leader died
    /// (renewed every third of it while the leader lives).
    pub ttl: Duration,
}

impl LeaderMode {
    /// Leader mode on the election `election`, with [`DEFAULT_LEADER_TTL`].
    pub fn new(election: impl Into<String>) -> Self {
        LeaderMode {
            election: election.into(),
            ttl: DEFAULT_LEADER_TTL,
        }
    }

    /// Sets the leadership's TTL.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }
}
