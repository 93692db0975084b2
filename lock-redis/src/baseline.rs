//! The raw baseline ([`Baseline`]): one `SET NX PX` and one `DEL` of a key beside the lock,
//! on the node's shared connection, without the lock's scripts.

use async_trait::async_trait;
use lock_core::{Baseline, Result, Ttl};
use redis::Value;

use crate::backend::RedisBackend;
use crate::codec::key;
use crate::handle::RedisNode;

/// What one raw cycle sends ([`Baseline::description`]).
pub const BASELINE_CYCLE: &str = "SET NX PX + DEL";

/// The value the raw cycle writes: as long as an owner token, so the request is the size of
/// an acquisition's.
const RAW_VALUE: &[u8; 32] = b"00000000000000000000000000000000";

impl RedisNode {
    /// The Redis key of the raw baseline of `name`: `<prefix>{<name>}:baseline`. It cannot
    /// equal a lock key (those end with `}`), a fence counter (`:fence`) or a tombstone
    /// (`:x:<owner>`), so [`raw_cycle`](Self::raw_cycle) never touches a lock.
    pub fn baseline_key(&self, name: &str) -> String {
        key(self.prefix(), name, ":baseline")
    }

    /// One raw cycle on the [`baseline_key`](Self::baseline_key) of `name`:
    /// [`raw_set`](Self::raw_set), then [`raw_del`](Self::raw_del), two round trips on the
    /// connection the lock's operations use, each within the node's
    /// [`timeout`](Self::timeout). Unlike the lock's acquisitions and releases they go
    /// alone, not grouped with others (`lock_core::group`), and run no script.
    ///
    /// A cycle cut off between the two leaves the raw key, which expires after `ttl` (or
    /// is deleted by the next cycle on it); nothing else is written and no release is
    /// announced.
    ///
    /// # Errors
    /// As [`raw_set`](Self::raw_set) and [`raw_del`](Self::raw_del).
    pub async fn raw_cycle(&self, name: &str, ttl: Ttl) -> Result<()> {
        self.raw_set(name, ttl).await?;
        self.raw_del(name).await
    }

    /// `SET <baseline key> <32 bytes> NX PX <ttl>`: the write of a raw cycle. Whether the
    /// key was there already (the reply `nil`) is not looked at.
    ///
    /// # Errors
    /// As [`ping`](Self::ping): [`Error::Unavailable`](lock_core::Error::Unavailable) on a
    /// timeout or an I/O error, [`Error::Backend`](lock_core::Error::Backend) for a reply
    /// `SET` cannot give.
    pub async fn raw_set(&self, name: &str, ttl: Ttl) -> Result<()> {
        let mut set = redis::cmd("SET");
        set.arg(self.baseline_key(name))
            .arg(&RAW_VALUE[..])
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis());
        match self.send(&set, "baseline SET").await? {
            Value::Okay | Value::Nil => Ok(()),
            other => Err(self.unexpected("baseline SET", &other)),
        }
    }

    /// `DEL <baseline key>`: the deletion of a raw cycle.
    ///
    /// # Errors
    /// As [`raw_set`](Self::raw_set).
    pub async fn raw_del(&self, name: &str) -> Result<()> {
        let mut del = redis::cmd("DEL");
        del.arg(self.baseline_key(name));
        match self.send(&del, "baseline DEL").await? {
            Value::Int(0 | 1) => Ok(()),
            other => Err(self.unexpected("baseline DEL", &other)),
        }
    }
}

/// `SET NX PX` + `DEL` on the backend's node (`RedisNode::raw_cycle`).
#[async_trait]
impl Baseline for RedisBackend {
    fn description(&self) -> &'static str {
        BASELINE_CYCLE
    }

    async fn raw_cycle(&self, key: &str, ttl: Ttl) -> Result<()> {
        self.node.raw_cycle(key, ttl).await
    }
}
