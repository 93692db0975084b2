//! Redis Cluster: the client a `redis+cluster://` configuration talks through ([`Target`],
//! [`ClusterLink`]) and the slot a key lives on ([`slot_of`]).
//!
//! The protocol does not change on a cluster: every script touches the keys of one lock
//! (or one job's records), which share the hash tag `{<name>}` (`{<job>}`) and so one slot,
//! and redis-rs's cluster client sends each call to the master of that slot, following
//! `MOVED`/`ASK` redirections and failovers. Grouped calls hold keys of one slot only
//! (`ops.rs`); release notices are plain `PUBLISH`es, which the cluster bus carries to
//! every node (`watch.rs` listens through any seed node).

use std::time::Duration;

use lock_core::{Error, Result};
use redis::aio::ConnectionLike;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ConnectionInfo, RedisResult, Value};

use crate::error::NAME;
use crate::sentinel::Endpoint;

/// Where a node handle's requests go. One per node handle, so the size of a variant does
/// not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Target {
    /// One server, named directly or found through sentinels.
    Endpoint(Endpoint),
    /// A Redis Cluster, through its seed nodes.
    Cluster(ClusterClient),
}

/// The open connection to a cluster: one multiplexed connection per node, behind one
/// handle that routes each request by the slot of its first key.
#[derive(Clone)]
pub(crate) struct ClusterLink(ClusterConnection);

impl ClusterLink {
    /// Connects to the seeds, reads the slot map and connects to the masters.
    pub(crate) async fn open(client: &ClusterClient) -> RedisResult<ClusterLink> {
        Ok(ClusterLink(client.get_async_connection().await?))
    }

    /// Sends `cmd` to the master of its first key's slot (a command without keys goes as
    /// redis-rs routes it: `PING` to every node).
    pub(crate) async fn send(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        self.0.req_packed_command(cmd).await
    }
}

/// The cluster client over `seeds` (connection settings, credentials included, per seed):
/// each connection attempt to a node bounded by half the operation `timeout` (so that a
/// dead or paused seed leaves time for another within one operation), each request by
/// `timeout`; the caller's own deadline bounds the whole operation.
pub(crate) fn client(seeds: Vec<ConnectionInfo>, timeout: Duration) -> Result<ClusterClient> {
    ClusterClientBuilder::new(seeds)
        .connection_timeout((timeout / 2).max(Duration::from_millis(1)))
        .response_timeout(timeout)
        .build()
        .map_err(|e| Error::backend(NAME, e))
}

/// The hash slot of `key` (CRC16 of its hash tag, or of the whole key without one), as
/// the cluster computes it: keys of one slot may go in one script call.
pub(crate) fn slot_of(key: &str) -> redis::cluster_routing::Slot {
    redis::cluster_routing::Slot::for_key(key)
}
