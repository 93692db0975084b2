//! Fire-time claims: the optional ability of a lock server to decide, once for every
//! replica of a scheduler, which replica runs each fire time of a job ([`FireClaims`]).
//!
//! A lock on the job's name keeps two runs from overlapping, but it cannot say whether a
//! fire time already ran: a replica whose clock is late reaches the fire time after the
//! run on time ended and finds the lock free. A claim ties the run to its fire time: one
//! atomic step on the server, "if the fire time claimed for job J is older than f, it
//! becomes f", which exactly one replica wins per fire time whatever the replicas' clocks
//! say. The answer carries the server's clock where it has one, so a replica whose clock is
//! fast waits until the server's clock reaches the fire time.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use crate::error::{Error, Result};

/// Longest replica name a claim keeps, in bytes.
pub const MAX_REPLICA_LEN: usize = 256;

/// The claim a lock server keeps for a job: the newest fire time claimed, by whom, when.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FireClaim {
    /// The fire time claimed, in whole milliseconds (see [`fire_millis`]).
    pub fire_time: SystemTime,
    /// The replica that claimed it.
    pub replica: String,
    /// The server's clock when it was claimed; `None` on a server without a clock to read
    /// (etcd).
    pub claimed_at: Option<SystemTime>,
}

impl FireClaim {
    /// A claim of `fire_time` by `replica`, made at `claimed_at` on the server's clock.
    pub fn new(
        fire_time: SystemTime,
        replica: impl Into<String>,
        claimed_at: Option<SystemTime>,
    ) -> Self {
        FireClaim {
            fire_time,
            replica: replica.into(),
            claimed_at,
        }
    }
}

/// The answer to [`FireClaims::claim`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimAnswer {
    /// Whether this call claimed the fire time: true for exactly one call per job and fire
    /// time, the first to reach the server with a fire time newer than the one kept.
    pub won: bool,
    /// The claim the server keeps after this call: this call's when `won`, else the one
    /// that refused it (a fire time equal to or newer than the one asked for).
    pub claim: FireClaim,
    /// The server's clock when it answered; `None` on a server without a clock to read.
    pub server_time: Option<SystemTime>,
}

impl ClaimAnswer {
    /// An answer: `won` or not, the claim kept, the server's clock.
    pub fn new(won: bool, claim: FireClaim, server_time: Option<SystemTime>) -> Self {
        ClaimAnswer {
            won,
            claim,
            server_time,
        }
    }
}

/// A lock server keeping, per job, the newest fire time claimed.
///
/// Rules an implementation keeps (the conformance rule `fire_time_claims_are_won_once`
/// checks them):
/// - [`claim`](Self::claim) is one atomic step on the server: of any number of concurrent
///   calls for one job and one fire time, from any number of clients, exactly one wins;
///   a call for a fire time equal to or older than the one kept never wins and changes
///   nothing;
/// - the fire time is kept in whole milliseconds since the Unix epoch ([`fire_millis`]),
///   and claims of one job never go back: the fire time kept only grows;
/// - `claimed_at` and `server_time` are read from the server's own clock, never the
///   client's (or `None` where the server has no clock to read);
/// - claims live apart from every lock and run record: making or reading one never touches
///   a lock, fence counter or waiter, and the job name is a parameter, never spliced into a
///   query;
/// - a claim is kept at least as long as a job's runs are (a week or more after its last
///   claim), so a replica whose clock is late cannot claim a fire time that already ran;
/// - every request is bounded by the timeout the lock's requests have.
///
/// Inputs are checked by the caller ([`check_claim`]): backends may assume a valid job
/// name, a non-empty replica of at most [`MAX_REPLICA_LEN`] bytes and a fire time after the
/// Unix epoch.
#[async_trait]
pub trait FireClaims: Send + Sync {
    /// Claims `fire_time` of `job` for `replica`: if the fire time kept for `job` is older
    /// than `fire_time` (or there is none), it becomes `fire_time`, with `replica` and the
    /// server's clock, and the answer is won; otherwise nothing changes.
    ///
    /// # Errors
    /// Transient backend errors (server unreachable or too slow): the claim may or may not
    /// have been made.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the claim made or not, as a transient error does; a
    /// claim made and not heard of means that fire time runs nowhere.
    async fn claim(&self, job: &str, fire_time: SystemTime, replica: &str) -> Result<ClaimAnswer>;

    /// The claim kept for `job`, if any.
    ///
    /// # Errors
    /// Transient backend errors.
    ///
    /// # Cancel safety
    /// A read only: dropping the future changes nothing.
    async fn current(&self, job: &str) -> Result<Option<FireClaim>>;
}

/// `fire_time` in whole milliseconds since the Unix epoch, as claims keep it.
///
/// # Errors
/// [`Error::InvalidKey`] naming the job when the time is before the epoch (or too far
/// after it to count in milliseconds).
pub fn fire_millis(job: &str, fire_time: SystemTime) -> Result<u64> {
    fire_time
        .duration_since(UNIX_EPOCH)
        .ok()
        .and_then(|d| u64::try_from(d.as_millis()).ok())
        .ok_or_else(|| Error::InvalidKey {
            key: job.chars().take(64).collect(),
            reason: "a fire time must be after 1970-01-01T00:00:00Z",
        })
}

/// The time `millis` milliseconds after the Unix epoch.
pub fn from_fire_millis(millis: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(millis)
}

/// Checks a claim's inputs: a valid job name ([`validate_key`](crate::validate_key)), a
/// replica of 1 to [`MAX_REPLICA_LEN`] bytes, a fire time after the Unix epoch. Returns the
/// fire time rounded down to the millisecond, as it is kept.
///
/// # Errors
/// [`Error::InvalidKey`] saying which input is wrong.
pub fn check_claim(job: &str, fire_time: SystemTime, replica: &str) -> Result<SystemTime> {
    crate::validate_key(job)?;
    if replica.is_empty() || replica.len() > MAX_REPLICA_LEN {
        return Err(Error::InvalidKey {
            key: job.chars().take(64).collect(),
            reason: "a claim's replica name must be 1 to 256 bytes",
        });
    }
    Ok(from_fire_millis(fire_millis(job, fire_time)?))
}
