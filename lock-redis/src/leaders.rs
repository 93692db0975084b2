//! Leaders' values on one Redis server: the node's operations
//! (`RedisNode::publish_leader`, `RedisNode::leader`, `RedisNode::announce`) and the
//! backend's [`LeaderValues`], for elections ([`Locker::election`](lock_core::Locker::election)).

use std::time::Duration;

use async_trait::async_trait;
use lock_core::election::{Leader, LeaderValues};
use lock_core::{Lease, Owner, Result};
use redis::Value;

use crate::backend::RedisBackend;
use crate::codec::hex;
use crate::handle::RedisNode;
use crate::scripts::leaders;

impl RedisNode {
    /// Publishes `value` as the value of `owner`'s leadership of election `name` in term
    /// `term`, if `owner` holds the lock `name` at that moment: the hash at
    /// [`leader_key`](Self::leader_key) becomes `owner`, `term`, `value`, and the notice
    /// of `name` goes out on the [`release_channel`](Self::release_channel) so that the
    /// key's listeners in every process wake. `true` when published, `false` when `owner`
    /// does not hold the lock (then nothing changes and nothing is announced). One script:
    /// one round trip, one atomic step, within the node's [`timeout`](Self::timeout).
    ///
    /// # Errors
    /// As [`ping`](Self::ping); [`Error::Backend`](lock_core::Error::Backend) when a value
    /// of another type sits at the lock key or the leader key (nothing is written).
    pub async fn publish_leader(
        &self,
        name: &str,
        owner: Owner,
        term: u64,
        value: &[u8],
    ) -> Result<bool> {
        let (lock_key, leader_key) = (self.lock_key(name), self.leader_key(name));
        let (owner, term, notice) = (hex(owner), term.to_string(), self.notice(name));
        let reply = self
            .eval(&leaders::PUBLISH_LEADER, "publish_leader", |cmd| {
                cmd.arg(2)
                    .arg(&lock_key)
                    .arg(&leader_key)
                    .arg(&owner[..])
                    .arg(&term)
                    .arg(value)
                    .arg(self.release_channel())
                    .arg(&notice);
            })
            .await?;
        self.flag("publish_leader", reply)
    }

    /// The leader of election `name`: the holder of the lock `name` with the value, term
    /// and owner it published and the lock's remaining time (`None` without expiry);
    /// `None` when the lock is free or its holder has not published (a value published by
    /// an earlier holder is never answered). One read-only script, within the node's
    /// timeout.
    ///
    /// # Errors
    /// As [`ping`](Self::ping); [`Error::Backend`](lock_core::Error::Backend) when a value
    /// of another type sits at the lock key or the leader key.
    pub async fn leader(&self, name: &str) -> Result<Option<Leader>> {
        let (lock_key, leader_key) = (self.lock_key(name), self.leader_key(name));
        let op = "leader";
        let reply = self
            .eval(&leaders::LEADER, op, |cmd| {
                cmd.arg(2).arg(&lock_key).arg(&leader_key);
            })
            .await?;
        let items = match &reply {
            Value::Nil | Value::Boolean(false) => return Ok(None),
            Value::Array(items) => items.as_slice(),
            _ => return Err(self.unexpected(op, &reply)),
        };
        let [Value::BulkString(value), Value::BulkString(term), Value::BulkString(owner), Value::Int(pttl)] =
            items
        else {
            return Err(self.unexpected(op, &reply));
        };
        let term = std::str::from_utf8(term).ok().and_then(|t| t.parse().ok());
        let owner = std::str::from_utf8(owner).ok().and_then(Owner::parse);
        let (Some(term), Some(owner)) = (term, owner) else {
            return Err(self.unexpected(op, &reply));
        };
        let expires_in = u64::try_from(*pttl).ok().map(Duration::from_millis);
        Ok(Some(Leader::new(value.clone(), term, owner, expires_in)))
    }

    /// Announces a change of election `name`'s leadership (its leader resigned): the
    /// notice of `name` on the [`release_channel`](Self::release_channel), as a release
    /// of an awaited lock sends it. One script (routed by the lock key, so on a cluster it
    /// goes to the lock's master), within the node's timeout.
    ///
    /// # Errors
    /// As [`ping`](Self::ping).
    pub async fn announce(&self, name: &str) -> Result<()> {
        let lock_key = self.lock_key(name);
        let notice = self.notice(name);
        let reply = self
            .eval(&leaders::ANNOUNCE, "announce", |cmd| {
                cmd.arg(1)
                    .arg(&lock_key)
                    .arg(self.release_channel())
                    .arg(&notice);
            })
            .await?;
        match reply {
            Value::Int(1) => Ok(()),
            other => Err(self.unexpected("announce", &other)),
        }
    }
}

/// Leaders' values on this server: the value of election `name`'s leader is a hash at
/// `<prefix>{<name>}:leader` beside the lock `name` (fields `owner`, `term`, `value`),
/// written only by its holder in one script and kept without expiry until the next
/// leader's publish overwrites it (see the design notes). Notices go out on the release
/// channel, so [`listen`](lock_core::Backend::listen)ers in every process wake. Each call
/// is one round trip bounded by the backend's operation timeout, on one server, through
/// Sentinel or on a Cluster alike (every key of an election shares the name's hash tag).
#[async_trait]
impl LeaderValues for RedisBackend {
    /// One script (`RedisNode::publish_leader`). A lease of several permits holds no lock
    /// key, so it is answered `NotHeld` (a leadership is always a lock).
    async fn publish(&self, lease: &Lease, value: &[u8]) -> Result<()> {
        let key = lease.key();
        if !self
            .node
            .publish_leader(key, lease.owner(), lease.fence(), value)
            .await?
        {
            return Err(lease.not_held());
        }
        // Our own subscription skips our notices: this process's listeners are woken here.
        self.notices.notify(key);
        Ok(())
    }

    /// One read-only script (`RedisNode::leader`).
    async fn leader(&self, key: &str) -> Result<Option<Leader>> {
        self.node.leader(key).await
    }

    /// One `PUBLISH` from a script (`RedisNode::announce`); this process's listeners are
    /// woken first, whatever the server answers.
    async fn announce(&self, key: &str) -> Result<()> {
        self.notices.notify(key);
        self.node.announce(key).await
    }
}
