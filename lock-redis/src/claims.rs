//! Fire-time claims on one Redis server: the node's operations
//! (`RedisNode::claim_fire_time`, `RedisNode::fire_claim`) and the backend's
//! [`FireClaims`].

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use lock_core::claims::{fire_millis, from_fire_millis, ClaimAnswer, FireClaim, FireClaims};
use lock_core::Result;
use redis::Value;

use crate::backend::RedisBackend;
use crate::codec::millis;
use crate::error::Failure;
use crate::handle::RedisNode;
use crate::scripts;

/// How long a job's claim is kept after its last won claim: 30 days. Each won claim sets
/// the claim key's expiry to this again, so the claim of a job that fires at least every
/// 30 days never expires, and the key of a job removed from the schedule goes by itself.
/// A replica whose clock is more than this late, or a job whose fire times are further
/// apart, finds no claim and wins the fire time it asks for.
pub const CLAIM_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

impl RedisNode {
    /// Claims `fire_time` of `job` for `replica`: if the fire time kept at the job's
    /// [`claim_key`](Self::claim_key) is older (or there is none), the key becomes this
    /// claim with the server's `TIME`, kept for `CLAIM_RETENTION`, and the answer is won;
    /// otherwise nothing changes and the answer carries the kept claim. The answer's
    /// `server_time` is the server's `TIME`. One script: one round trip, one atomic step,
    /// within the node's [`timeout`](Self::timeout). Touches no lock key.
    ///
    /// The inputs are taken as [`Locker::claim_fire_time`](lock_core::Locker::claim_fire_time)
    /// checks them ([`check_claim`](lock_core::claims::check_claim)); the fire time counts
    /// in whole milliseconds.
    ///
    /// # Errors
    /// As [`ping`](Self::ping); [`Error::InvalidKey`](lock_core::Error::InvalidKey) for a
    /// fire time before the Unix epoch; [`Error::Backend`](lock_core::Error::Backend) when
    /// a value that is not a claim sits at the claim key (it is left as it is).
    pub async fn claim_fire_time(
        &self,
        job: &str,
        fire_time: SystemTime,
        replica: &str,
    ) -> Result<ClaimAnswer> {
        let fire = fire_millis(job, fire_time)?.to_string();
        let key = self.claim_key(job);
        let reply = self
            .eval(&scripts::schedule::CLAIM, "claim_fire_time", |cmd| {
                cmd.arg(1)
                    .arg(&key)
                    .arg(&fire)
                    .arg(replica)
                    .arg(millis(CLAIM_RETENTION));
            })
            .await?;
        let op = "claim_fire_time";
        let items = self.claim_items(op, &key, &reply, 5)?;
        let won = match &items[0] {
            Value::Int(1) => true,
            Value::Int(0) => false,
            _ => return Err(self.unexpected(op, &reply)),
        };
        let claim = self.claim(op, &reply, &items[1..4])?;
        let server_time = self.millis_at(op, &reply, &items[4])?;
        Ok(ClaimAnswer::new(won, claim, Some(server_time)))
    }

    /// The claim kept for `job`, `None` when there is none: one read-only script, within
    /// the node's timeout.
    ///
    /// # Errors
    /// As [`ping`](Self::ping); [`Error::Backend`](lock_core::Error::Backend) when a value
    /// that is not a claim sits at the claim key.
    pub async fn fire_claim(&self, job: &str) -> Result<Option<FireClaim>> {
        let key = self.claim_key(job);
        let op = "fire_claim";
        let reply = self
            .eval(&scripts::schedule::CURRENT_CLAIM, op, |cmd| {
                cmd.arg(1).arg(&key);
            })
            .await?;
        if reply == Value::Nil {
            return Ok(None);
        }
        let items = self.claim_items(op, &key, &reply, 3)?;
        self.claim(op, &reply, items).map(Some)
    }

    /// The `n` items of a claim script's reply, or the error its `{'foreign', message}`
    /// reply says.
    fn claim_items<'a>(
        &self,
        op: &'static str,
        key: &str,
        reply: &'a Value,
        n: usize,
    ) -> Result<&'a [Value]> {
        match reply {
            Value::Array(items) if items.len() == n => Ok(items),
            Value::Array(items) if matches!(&items[..], [Value::BulkString(tag), _] if tag == b"foreign") =>
            {
                let why = crate::codec::text(&items[1]).unwrap_or_default();
                Err(self.failure(
                    op,
                    Failure::Reply(format!(
                        "the claim key `{key}` holds a value that is not a fire-time claim \
                         ({why}); it is left as it is"
                    )),
                ))
            }
            other => Err(self.unexpected(op, other)),
        }
    }

    /// The claim that `fire`, `replica` and `at` of a reply tell.
    fn claim(&self, op: &'static str, reply: &Value, items: &[Value]) -> Result<FireClaim> {
        let [fire, replica, at] = items else {
            return Err(self.unexpected(op, reply));
        };
        let replica = match replica {
            Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            _ => return Err(self.unexpected(op, reply)),
        };
        Ok(FireClaim::new(
            self.millis_at(op, reply, fire)?,
            replica,
            Some(self.millis_at(op, reply, at)?),
        ))
    }

    /// The time a reply's decimal milliseconds since the Unix epoch name.
    fn millis_at(&self, op: &'static str, reply: &Value, item: &Value) -> Result<SystemTime> {
        match item {
            Value::BulkString(bytes) => std::str::from_utf8(bytes)
                .ok()
                .and_then(|text| text.parse::<u64>().ok())
                .map(from_fire_millis)
                .ok_or_else(|| self.unexpected(op, reply)),
            _ => Err(self.unexpected(op, reply)),
        }
    }
}

/// Fire-time claims on this server: one hash per job, `<prefix>claim:{<job>}` (fields
/// `fire`, `replica`, `at`), written by one script that compares and sets in one atomic
/// step and reads the server's `TIME`, kept for `CLAIM_RETENTION` after the last won
/// claim. Each call is one round trip bounded by the backend's operation timeout; none
/// touches a lock, its fence counter, its waiters or the run records.
#[async_trait]
impl FireClaims for RedisBackend {
    /// One script (`RedisNode::claim_fire_time`).
    async fn claim(&self, job: &str, fire_time: SystemTime, replica: &str) -> Result<ClaimAnswer> {
        self.node.claim_fire_time(job, fire_time, replica).await
    }

    /// One read-only script (`RedisNode::fire_claim`).
    async fn current(&self, job: &str) -> Result<Option<FireClaim>> {
        self.node.fire_claim(job).await
    }
}
